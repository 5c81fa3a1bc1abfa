"""parity-contract.md §3.1: a bf16 compressed-cache element on a rounding boundary
(derivation: docs/certificates.md §3).

Two bf16 values that differ pass only if they are adjacent and the exact pooled value ``y64``
(kpool-algorithm.md §5.3 in float64 from the same fp32 window and APE) lies within ``B`` of
their midpoint, where ``B`` bounds the fp32 error of *any* conforming implementation by the
magnitudes of the terms and of the exp arguments (:func:`pooled_value_and_bound_f64`):

``B = (1 + 2^-10) u [beta * A + sum_j |a_j K_j| xi_j + A * sum_j a_j xi_j]``,
``A = sum_j |a_j K_j|``, ``xi_j = |s_j| + 2 |s_j - m|``, ``u = 2^-23``,
``beta = ROUNDING_BUDGET_ULPS[backend]``.

An element with heavy cancellation (``|y| << A``) gets a bound in proportion to its terms; a
well-conditioned one about ``beta`` fp32 ulps of ``y``.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .floats import ETA, KAPPA_BLOCK, U_FAITHFUL, bf16_bits_to_f64, bf16_is_nan, bf16_order_key

ROUNDING_BUDGET_ULPS: Dict[str, int] = {"cpu": 32, "cuda": 64, "npu": 64}
"""Declared fp32 operation budget of a pooled value ``y`` (kpool-algorithm.md §5.3), per kernel
backend, in ulps of the terms (``u * sum_j |a_j K_j|``); the exp arguments' share is added
from their actual magnitudes (:func:`pooled_value_and_bound_f64`). The budgets exceed the
operation counts derived in docs/certificates.md §3.2 from the measurements of
platform-numerics.md §4.1 (:data:`EXP_DIV_ULPS`, :func:`operation_ulps`): interpreter
``tl.exp`` (numpy) <= 2 ulp -> 15.5 <= **32**; CUDA ``tl.exp`` (``ex2.approx``) <= 13 ulp and
``div.full`` <= 2 ulp -> 39.5 <= **64**; NPU unmeasured (platform-numerics.md §6.4 item 3) ->
the CUDA figure, **64**. (Before docs/certificates.md §3 the budget was in ulps of ``y`` and
assumed ``|m| <= 16`` and no cancellation.)"""

EXP_DIV_ULPS: Dict[str, Tuple[float, float]] = {"cpu": (3.0, 1.0), "cuda": (14.0, 3.0), "npu": (14.0, 3.0)}
"""Per backend: error of ``exp`` and of the division against the exact result, in ulps of the
result (measured against torch in platform-numerics.md §4.1, plus torch's own <= 1 ulp for exp
and 0.5 for the division)."""

DEFAULT_BACKEND = "cpu"
SECOND_ORDER = 1.0 + 2.0 ** -10
"""Factor covering the second-order terms of the first-order bound, valid while the bound is
below ``2^-11`` of ``A`` (:data:`FIRST_ORDER_LIMIT`)."""
FIRST_ORDER_LIMIT = 2.0 ** -11


def operation_ulps(index_kpool: int, backend: str) -> float:
    """The operation count of docs/certificates.md §3.2 in ulps of the terms:
    ``2 E_exp + E_div + 1 + 2 kappa (P - 1)`` (exp through ``e_j`` and ``Z``, the division, the
    product by ``K_j``, the two P-term sums). :data:`ROUNDING_BUDGET_ULPS` must not be below it.

    Raises:
        KeyError: unknown backend.
    """
    e_exp, e_div = EXP_DIV_ULPS[backend]
    return 2 * e_exp + e_div + 1 + 2 * KAPPA_BLOCK * (index_kpool - 1)


def pooled_value_f64(k_window: np.ndarray, gate_window: np.ndarray, ape: np.ndarray) -> np.ndarray:
    """Exact pooled keys in float64 (kpool-algorithm.md §5.3 steps 1-5, no rounding to bf16).

    Args:
        k_window, gate_window: ``[..., P, D]`` fp32 values (any float array).
        ape: ``[P, D]``.
    Returns:
        float64 ``[..., D]``: ``sum_j softmax_j(g + ape) K_j`` per channel.
    """
    return pooled_value_and_bound_f64(k_window, gate_window, ape, budget_ulps=0.0)[0]


def pooled_value_and_bound_f64(k_window: np.ndarray, gate_window: np.ndarray, ape: np.ndarray, *,
                               budget_ulps: float, u: float = U_FAITHFUL):
    """Exact pooled keys and the term-scaled bound ``B`` on any conforming fp32 implementation's
    error (docs/certificates.md §3; kpool-algorithm.md §5.3).

    Args:
        k_window, gate_window: ``[..., P, D]`` fp32 values; ape: ``[P, D]``.
        budget_ulps: ``beta``, the backend's :data:`ROUNDING_BUDGET_ULPS` entry.
        u: unit roundoff of the error model (faithful fp32).

    Returns:
        ``(y64, bound, terms)``, float64 ``[..., D]`` each: the exact value, ``B`` (NaN, i.e.
        no certificate, where the first-order bound exceeds :data:`FIRST_ORDER_LIMIT` of the
        terms) and ``A = sum_j |a_j K_j|``.
    """
    s = np.asarray(gate_window, np.float64) + np.asarray(ape, np.float64)
    x = s - s.max(axis=-2, keepdims=True)
    e = np.exp(x)
    a = e / e.sum(axis=-2, keepdims=True)
    k = np.asarray(k_window, np.float64)
    terms = np.abs(a * k)
    A = terms.sum(axis=-2)
    xi = np.abs(s) + 2.0 * np.abs(x)              # rounding of s_j, of s_j - m, of x * log2(e)
    first = u * (budget_ulps * A + (terms * xi).sum(axis=-2) + A * (a * xi).sum(axis=-2))
    # Underflow (the relative model misses it): each a_j may lose up to ETA (an exp or a division
    # below the normal range, flushed or subnormal), each product and add ETA more. Without it a
    # window whose weights underflow (logits hundreds apart: exact a_j ~ 1e-260) and tiny keys
    # had a zero bound although fp32 can only give 0 there.
    P = k.shape[-2]
    underflow = ETA * (np.abs(k).sum(axis=-2) + 2 * P)
    bound = np.where(first <= FIRST_ORDER_LIMIT * A, first * SECOND_ORDER + underflow, np.nan)
    return (a * k).sum(axis=-2), bound, A


@dataclass
class PoolWindow:
    """The fp32 inputs of one compressed row written in a step (kpool-algorithm.md §5.1-§5.2).

    Attributes:
        row: token row that wrote it; position: its position ``p``; request: its request index.
        k: fp32 ``[P, D]`` raw keys of the window; gate: fp32 ``[P, D]`` raw gate logits.
    """

    row: int
    position: int
    request: int
    k: torch.Tensor
    gate: torch.Tensor


def step_windows(meta, inputs: dict, ring_before: torch.Tensor, *, index_kpool: int, num_pages: int,
                 page_size: int) -> Dict[Tuple[int, int], PoolWindow]:
    """The window of every compressed row a step writes (kpool-algorithm.md §5.1-§5.2), from the
    step inputs and the ring as it was before the step (the same fp32 inputs both sides read).

    Args:
        meta: the step's :class:`kpool.metadata.KPoolMetadata` (any device).
        inputs: ``{"k": fp32 [T, D], "gate": fp32 [T, D], ...}``.
        ring_before: fp32 ``[blocks, 2, C, D]`` ring before the step.
        index_kpool: ``P``; num_pages: ``N``; page_size: ``B``.

    Returns:
        ``{(page, page_row): PoolWindow}``; the last writer of a slot wins (row order).
    """
    P, B = index_kpool, page_size
    k = inputs["k"].detach().cpu().to(torch.float32)
    g = inputs["gate"].detach().cpu().to(torch.float32)
    ring = ring_before.detach().cpu()
    pos = meta.positions.detach().cpu().tolist()
    slots = meta.slot_mapping.detach().cpu().tolist()
    cum = [int(c) for c in meta.cum_query_lens.detach().cpu().tolist()]
    raw = [int(c) for c in meta.raw_seq_lens.detach().cpu().tolist()]
    tbt = meta.tail_block_table.detach().cpu()
    blocks, C, D = int(ring.shape[0]), int(ring.shape[2]), int(k.shape[1])
    T = len(pos)
    t_live = min(cum[-1], T) if cum else 0
    out: Dict[Tuple[int, int], PoolWindow] = {}
    for t in range(t_live):
        p, s = int(pos[t]), int(slots[t])
        if p < 0 or (p + 1) % P or not 0 <= s < num_pages * B:
            continue
        r = bisect.bisect_right(cum, t)
        qs = cum[r - 1] if r > 0 else 0
        qs_pos = raw[r] - (cum[r] - qs)
        blk = int(tbt[r, 0])
        kw = torch.zeros(P, D, dtype=torch.float32)
        gw = torch.zeros(P, D, dtype=torch.float32)
        for j in range(P):
            w = p - (P - 1) + j
            if w >= qs_pos:
                kw[j], gw[j] = k[qs + w - qs_pos], g[qs + w - qs_pos]
            elif 0 <= blk < blocks:
                kw[j], gw[j] = ring[blk, 0, w % C], ring[blk, 1, w % C]
        out[(s // B, s % B)] = PoolWindow(row=t, position=p, request=r, k=kw, gate=gw)
    return out


@dataclass
class RoundingContext:
    """What the §3.1 certificate needs for one step.

    Attributes:
        windows: :func:`step_windows` of the step (compressed rows written in it), or a
            zero-argument callable returning it (evaluated on first use: most steps have no
            difference to certify).
        ape: fp32 ``[P, D]``.
        budget_ulps: the backend's :data:`ROUNDING_BUDGET_ULPS` entry (``beta``).
        carried: ``{(page, page_row, channel): (kernel_bits, reference_bits)}`` certified in
            earlier steps; still certified while both bit patterns are unchanged (lockstep keeps
            a certified difference in both caches until the row is rewritten). Updated in place.
    """

    windows: object
    ape: torch.Tensor
    budget_ulps: float
    carried: Dict[Tuple[int, int, int], Tuple[int, int]] = field(default_factory=dict)

    def window(self, page: int, page_row: int) -> Optional[PoolWindow]:
        """The window of compressed row ``(page, page_row)``, or ``None`` if the step did not write it."""
        if callable(self.windows):
            self.windows = self.windows()
        return self.windows.get((page, page_row))


def certify_rounding_boundaries(kernel_bits: torch.Tensor, reference_bits: torch.Tensor,
                                differing: torch.Tensor, context: Optional[RoundingContext]):
    """parity-contract.md §3.1 for every differing compressed-cache element.

    Args:
        kernel_bits / reference_bits: int16 ``[N, B, 1, D]`` bf16 bits (CPU).
        differing: bool ``[N, B, 1, D]``.
        context: :class:`RoundingContext`, or ``None`` (exact-data case: certify nothing).

    Returns:
        ``(certified bool [N, B, 1, D], reason str)``: an element is certified when it was
        certified earlier with the same bits (``context.carried``), or when both values are
        finite, adjacent bf16 values (or ``+0`` and ``-0``, midpoint 0), its row was written this
        step, and ``|y64 - midpoint| <= B`` (:func:`pooled_value_and_bound_f64`). ``reason`` explains the
        first element that was *not* certified (empty when all were). New certificates are
        added to ``context.carried``.
    """
    cert = torch.zeros_like(differing)
    if context is None or not differing.any():
        return cert, "" if context is not None else "exact-data case: no certificate applies"
    reasons: List[str] = []
    idx = differing.nonzero().tolist()
    kb_all, rb_all = kernel_bits[differing], reference_bits[differing]
    key_gap = (bf16_order_key(kb_all) - bf16_order_key(rb_all)).abs()
    nan_any = bf16_is_nan(kb_all) | bf16_is_nan(rb_all)
    kv = bf16_bits_to_f64(kb_all)
    rv = bf16_bits_to_f64(rb_all)
    # float64 pooled values and bounds of the rows involved, computed once per row.
    of_row: Dict[Tuple[int, int], tuple] = {}
    ape = context.ape.detach().cpu().numpy()
    for n, (page, prow, _, ch) in enumerate(idx):
        kbit, rbit = int(kb_all[n]), int(rb_all[n])
        where = f"page={page} row={prow} ch={ch}"
        if context.carried.get((page, prow, ch)) == (kbit, rbit):
            cert[page, prow, 0, ch] = True
            continue
        if nan_any[n] or not math.isfinite(kv[n]) or not math.isfinite(rv[n]):
            reasons.append(f"{where}: NaN or infinite value")
            continue
        # +0 against -0 (the same value, another sign: docs/certificates.md §2.4 "Signed zeros")
        # is judged like an adjacent pair with midpoint 0: either sign is conforming when the
        # exact value is within the bound of 0
        zeros = kv[n] == 0 and rv[n] == 0
        adjacent = int(key_gap[n]) == 1 or zeros
        # the exact value: needed to certify, and said for the first non-adjacent element (which side moved)
        win = context.window(page, prow) if adjacent or not reasons else None
        if win is not None and (page, prow) not in of_row:
            of_row[(page, prow)] = pooled_value_and_bound_f64(win.k.cpu().numpy(), win.gate.cpu().numpy(), ape,
                                                              budget_ulps=context.budget_ulps)
        if not adjacent:
            exact = ""
            if win is not None:
                y, bound = float(of_row[(page, prow)][0][ch]), float(of_row[(page, prow)][1][ch])
                exact = (f"; exact y64={y!r}: kernel {abs(kv[n] - y):.3g} and reference {abs(rv[n] - y):.3g} "
                         f"from it, fp32 error bound {bound:.3g}")
            reasons.append(f"{where}: {int(key_gap[n])} bf16 ulps apart, not adjacent{exact}")
            continue
        if win is None:
            reasons.append(f"{where}: row not written this step, no window")
            continue
        y, bound, terms = (float(v[ch]) for v in of_row[(page, prow)])
        mid = float(0.5 * (kv[n] + rv[n]))
        if math.isnan(bound):
            reasons.append(f"{where}: exp arguments too large for the first-order error bound")
        elif abs(y - mid) <= bound:
            cert[page, prow, 0, ch] = True
            context.carried[(page, prow, ch)] = (kbit, rbit)
        else:
            reasons.append(f"{where}: y64={y!r} is {abs(y - mid):.3g} from the midpoint {mid!r}, beyond the fp32 "
                           f"error bound {bound:.3g} (budget {context.budget_ulps} ulps of the terms "
                           f"sum|a_j K_j|={terms:.3g}, plus the exp arguments)")
    return cert, (reasons[0] if reasons else "")
