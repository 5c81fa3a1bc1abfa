"""Numerical certificates: the only non-bitwise passes (parity-contract.md §3).

Two certificates, both computed from float64 recomputations of the *same* fp32 / bf16 inputs
the two sides consumed, never from a blanket ``atol``/``rtol``:

* **rounding boundary** (§3.1, compressed cache, bf16): the two bf16 values are adjacent and the
  exact pooled value ``y64`` (kpool-algorithm.md §5.3 evaluated in float64 from the fp32 window
  and APE) lies within ``budget * ulp_fp32(y64)`` of their midpoint. ``budget`` is the declared
  per-backend fp32 error budget :data:`ROUNDING_BUDGET_ULPS`.
* **tie** (§3.2, index rows): every pool whose membership or rank differs between the two rows
  has a float64 score (kpool-algorithm.md §4.2 from the bf16 cache rows, q and weights) within
  ``2 * max_j gamma_n * sum|terms_j|`` of the row's boundary score, both rows are well-formed
  canonical rows under those scores to the same tolerance, and their ``-1`` slots agree.

Exact-data cases (``Case.values == "exact"``) get no certificate: the runner passes no context,
and every function here certifies nothing without one.

Both contexts are plain dataclasses the runner builds per step (:class:`RoundingContext`,
:class:`TieContext`); nothing here imports Triton or the kernels.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

# --------------------------------------------------------------------------- budgets

ROUNDING_BUDGET_ULPS: Dict[str, int] = {"cpu": 32, "cuda": 64, "npu": 64}
"""Declared fp32 error budget of a pooled value ``y`` (kpool-algorithm.md §5.3), in ulps of
``y``, per kernel backend: how far any conforming fp32 implementation's ``y`` may be from the
exact ``y64``. A bf16 difference is certified only when ``y64`` is this close to the rounding
midpoint (parity-contract.md §3.1).

Derivation, for ``y = sum_j (e_j / Z) K_j`` with ``e_j = exp(s_j - m)``, ``s_j = g_j + ape_j``,
P = 4 terms and no cancellation in the final sum (``|y| = sum_j |a_j K_j|``); errors in ulps of the
quantity they touch, taken from the measurements of platform-numerics.md §4.1:

* fp32 rounding of ``s_j`` and ``s_j - m``: an absolute error of about ``ulp(|m|)`` in the exponent
  argument is a relative error of ``|m| * 2^-23`` in ``e_j``: <= 16 ulp for model-scale logits
  ``|m| <= 16`` (gate std 2 plus APE);
* ``exp``: interpreter ``tl.exp`` (numpy) <= 2 ulp, CUDA ``tl.exp`` (``ex2.approx``) <= 13 ulp
  (the software ``exp_fp32`` of ``reference.numerics``: <= 2 ulp); NPU unmeasured. It enters
  twice, through ``e_j`` and through ``Z``;
* ``Z``: P-1 = 3 additions of positive terms, <= 3 ulp;
* ``e_j / Z``: IEEE <= 0.5 ulp; CUDA ``a / b`` (``div.full``) <= 2 ulp;
* ``a_j * K_j``: 0.5 ulp; the final sum: P-1 = 3 additions, <= 3 ulp.

Total: interpreter 16 + 2*2 + 3 + 0.5 + 0.5 + 3 = 27 -> **32**; CUDA 16 + 2*13 + 3 + 2 + 0.5 + 3
= 50.5 -> **64**; NPU: no measurement exists (platform-numerics.md §6.4 item 3) -> the CUDA figure,
**64**, until measured. "A few tens of ulps", as the contract asks. An element whose sum
cancels (keys of mixed sign) has a larger relative error than this and is *not* certified: the
budget errs towards failing, never towards a false pass."""

DEFAULT_BACKEND = "cpu"

U32 = 2.0 ** -24
"""Unit roundoff of fp32 (round to nearest)."""


def gamma(n: int, u: float = U32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: a sum or dot product of ``n`` terms evaluated in
    any order in fp32 (no FMA needed, FMA allowed) is within ``gamma_n * sum |terms|`` of the
    exact value.

    Raises:
        ValueError: ``n u >= 1`` (the bound does not exist).
    """
    if n * u >= 1:
        raise ValueError(f"gamma_{n} undefined for u={u}")
    return n * u / (1.0 - n * u)


def score_terms(num_heads: int, head_dim: int) -> int:
    """``n`` of the score accumulation bound (parity-contract.md §3.2; kpool-algorithm.md §4.2).

    Mode (R) ``sum_h w_h relu(sum_d q_hd c_d)``: D-1 additions and one (exact for bf16 x bf16,
    counted anyway) product per inner term, one product by ``w_h``, H-1 outer additions; mode (M)
    ``sum_d (sum_h w_h q_hd) c_d``: H products/additions then D products/additions. ``relu`` is
    1-Lipschitz. Both are covered by ``n = D + H + 1`` with terms ``|w_h q_hd c_d|``.
    TF32 ``tl.dot`` inputs are *not* covered (they round the inputs to 10 bits)."""
    return int(head_dim) + int(num_heads) + 1


def fp32_ulp(x: np.ndarray) -> np.ndarray:
    """ulp of fp32 at ``|x|`` (float64 array in, float64 array out): the gap from ``fp32(|x|)``
    to the next larger fp32 (``2^-149`` at zero)."""
    ax = np.abs(np.asarray(x, dtype=np.float64)).astype(np.float32)
    return np.spacing(ax).astype(np.float64)


def bf16_bits_to_f64(bits: torch.Tensor) -> np.ndarray:
    """float64 values of int16 bf16 bit patterns (any shape)."""
    b = bits.cpu().to(torch.int32) & 0xFFFF
    return (b << 16).view(torch.float32).to(torch.float64).numpy()


def bf16_order_key(bits: torch.Tensor) -> torch.Tensor:
    """int32 key, monotone in the bf16 value: adjacent representable values differ by 1
    (``+0`` and ``-0`` share key 0)."""
    b = bits.cpu().to(torch.int32) & 0xFFFF
    return torch.where(b >= 0x8000, -(b & 0x7FFF), b)


def bf16_is_nan(bits: torch.Tensor) -> torch.Tensor:
    """bool: the int16 bf16 bit patterns that are NaN (incl. the harness sentinel 0x7FA5)."""
    b = bits.to(torch.int32) & 0x7FFF
    return b > 0x7F80


# --------------------------------------------------------------------------- §3.1 rounding boundary

def pooled_value_f64(k_window: np.ndarray, gate_window: np.ndarray, ape: np.ndarray) -> np.ndarray:
    """Exact pooled keys in float64 (kpool-algorithm.md §5.3 steps 1-5, no rounding to bf16).

    Args:
        k_window, gate_window: ``[..., P, D]`` fp32 values (any float array).
        ape: ``[P, D]``.
    Returns:
        float64 ``[..., D]``: ``sum_j softmax_j(g + ape) K_j`` per channel.
    """
    s = np.asarray(gate_window, np.float64) + np.asarray(ape, np.float64)
    m = s.max(axis=-2, keepdims=True)
    e = np.exp(s - m)
    return (e / e.sum(axis=-2, keepdims=True) * np.asarray(k_window, np.float64)).sum(axis=-2)


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
        budget_ulps: the backend's :data:`ROUNDING_BUDGET_ULPS` entry.
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
        finite, adjacent bf16 values, its row was written this step, and
        ``|y64 - midpoint| <= budget * ulp_fp32(y64)``. ``reason`` explains the first element
        that was *not* certified (empty when all were). New certificates are added to
        ``context.carried``.
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
    # float64 pooled values of the rows involved, computed once per row.
    y_of_row: Dict[Tuple[int, int], np.ndarray] = {}
    ape = context.ape.detach().cpu()
    for n, (page, prow, _, ch) in enumerate(idx):
        kbit, rbit = int(kb_all[n]), int(rb_all[n])
        if context.carried.get((page, prow, ch)) == (kbit, rbit):
            cert[page, prow, 0, ch] = True
            continue
        if nan_any[n] or not math.isfinite(kv[n]) or not math.isfinite(rv[n]):
            reasons.append(f"page={page} row={prow} ch={ch}: NaN or infinite value")
            continue
        if int(key_gap[n]) != 1:
            reasons.append(f"page={page} row={prow} ch={ch}: {int(key_gap[n])} bf16 ulps apart, not adjacent")
            continue
        win = context.window(page, prow)
        if win is None:
            reasons.append(f"page={page} row={prow} ch={ch}: row not written this step, no window")
            continue
        if (page, prow) not in y_of_row:
            y_of_row[(page, prow)] = pooled_value_f64(win.k.cpu().numpy(), win.gate.cpu().numpy(), ape.numpy())
        y64 = float(y_of_row[(page, prow)][ch])
        mid = 0.5 * (kv[n] + rv[n])
        ulp = float(fp32_ulp(np.array([y64]))[0])
        dist = abs(y64 - mid) / ulp
        if dist <= context.budget_ulps:
            cert[page, prow, 0, ch] = True
            context.carried[(page, prow, ch)] = (kbit, rbit)
        else:
            reasons.append(f"page={page} row={prow} ch={ch}: y64={y64!r} is {dist:.3g} fp32 ulps from the "
                           f"midpoint {mid!r} (budget {context.budget_ulps})")
    return cert, (reasons[0] if reasons else "")


# --------------------------------------------------------------------------- §3.2 ties

@dataclass
class TieContext:
    """What the §3.2 certificate needs for one step (all host or device tensors; read on host).

    Attributes:
        q: bf16 ``[T, H, D]``; weights: fp32 or bf16 ``[T, H]``.
        kernel_cache / reference_cache: bf16 ``[N, B, 1, D]`` each side's compressed cache
            after the step (each row is judged against the scores of its own side's cache).
        positions, cum_query_lens, seq_lens, block_table: the step's metadata.
        index_topk, index_kpool: ``K_tok``, ``P``; score_mode: ``"relu"`` or ``"merged"``;
        pack_tail: the tail layout.
    """

    q: torch.Tensor
    weights: torch.Tensor
    kernel_cache: torch.Tensor
    reference_cache: torch.Tensor
    positions: torch.Tensor
    cum_query_lens: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    index_topk: int
    index_kpool: int
    score_mode: str = "relu"
    pack_tail: bool = True
    _host: dict = field(default_factory=dict, repr=False)

    def host(self, name: str) -> torch.Tensor:
        """CPU copy of a tensor field, made once."""
        if name not in self._host:
            self._host[name] = getattr(self, name).detach().cpu()
        return self._host[name]


def visible_keys_f64(ctx: TieContext, t: int, cache: torch.Tensor) -> np.ndarray:
    """float64 ``[v, D]`` pooled keys of row ``t``'s visible pools, ``v = min((p+1)//P,
    seq_lens[r])``, read through the block table (kpool-algorithm.md §4.1)."""
    P = ctx.index_kpool
    cum = [int(c) for c in ctx.host("cum_query_lens").tolist()]
    r = bisect.bisect_right(cum, t)
    p = int(ctx.host("positions")[t])
    v = max(0, min((p + 1) // P, int(ctx.host("seq_lens")[r])))
    N, B, _, D = cache.shape
    bt = ctx.host("block_table")[r]
    M = int(bt.shape[0])
    pages = [min(max(int(bt[min(j // B, M - 1)]), 0), N - 1) for j in range(v)]
    # The kernel side's cache lives on the device: gather there, compute on the host.
    return cache[pages, [j % B for j in range(v)], 0].cpu().to(torch.float64).numpy() if v else np.zeros((0, D))


def row_scores_f64(ctx: TieContext, t: int, cache: torch.Tensor, *, keys: Optional[np.ndarray] = None):
    """float64 scores and accumulation bounds of every visible pool of row ``t``
    (kpool-algorithm.md §4.1-§4.2).

    Returns:
        ``(scores float64 [v], bounds float64 [v])`` with ``v = min((p+1)//P, seq_lens[r])``;
        ``bounds[j] = gamma_n * sum_{h,d} |w_h q_hd c_jd|`` (:func:`score_terms`). A pool whose
        score is NaN (a NaN key) gets ``-inf`` (sanitized, never selectable). ``keys``: the
        row's :func:`visible_keys_f64` when the caller already gathered them.
    """
    c = visible_keys_f64(ctx, t, cache) if keys is None else keys
    D = c.shape[1]
    v = c.shape[0]
    q = ctx.host("q")[t].to(torch.float64).numpy()                    # [H, D]
    w = ctx.host("weights")[t].to(torch.float64).numpy()              # [H]
    if ctx.score_mode == "relu":
        dots = c @ q.T                                                # [v, H]
        scores = np.where(dots < 0, 0.0, dots) @ w
    else:
        scores = c @ (w @ q)
    mag = np.abs(c) @ (np.abs(q).T @ np.abs(w)) if v else np.zeros(0)  # sum_{h,d} |w_h q_hd c_jd|
    bounds = gamma(score_terms(q.shape[0], D)) * mag
    scores = np.where(np.isnan(scores), -np.inf, scores)
    return scores, bounds


def parse_row(row: Sequence[int], tail: Sequence[bool], *, index_topk: int, index_kpool: int):
    """The selection encoded in one index row's history columns (kpool-algorithm.md §4.5 step 1).

    Args:
        row: the ``W`` ints of a row; tail: bool per column, True for the row's tail columns.

    Returns:
        ``(pools, valid)``: ``pools`` lists the pool id of each slot (``-1`` for an empty slot)
        and ``valid`` says whether the history columns are well formed (each slot the full
        expansion ``pool * P + c % P`` of one pool, or all ``-1``; pools distinct; empty slots
        only after the filled ones).
    """
    P, K = index_kpool, index_topk
    pools: List[int] = []
    ok = True
    for s in range(K // P):
        cols = [c for c in range(s * P, (s + 1) * P) if not tail[c]]
        vals = [int(row[c]) for c in cols]
        if not vals or all(v == -1 for v in vals):
            pools.append(-1)
            continue
        pool = vals[0] // P if vals[0] >= 0 else -1
        if pool < 0 or any(v != pool * P + c % P for v, c in zip(vals, cols)):
            ok = False
            pools.append(-2)
            continue
        pools.append(pool)
    filled = [p for p in pools if p >= 0]
    if len(set(filled)) != len(filled):
        ok = False
    first_empty = next((i for i, p in enumerate(pools) if p < 0), len(pools))
    if any(p >= 0 for p in pools[first_empty:]):
        ok = False
    return pools, ok


def exact_tie_classes(ctx: TieContext, t: int, keys: np.ndarray) -> list:
    """One hashable class per visible pool of row ``t`` (``keys``: its :func:`visible_keys_f64`): pools of one class score bitwise alike
    on every backend, so their order is fixed by parity-contract.md §2 (lower id first).

    Two sources: bitwise-identical keys (the same operations on the same bits), and in relu mode
    (kpool-algorithm.md §4.2 (R)) every head's dot product provably negative, i.e. below
    ``-gamma_D * sum_d |q_hd c_jd|``, so every backend's score is exactly zero.
    """
    classes = [("key", keys[j].tobytes()) for j in range(keys.shape[0])]
    if ctx.score_mode == "relu" and keys.shape[0]:
        q = ctx.host("q")[t].to(torch.float64).numpy()                # [H, D]
        dots, mags = keys @ q.T, np.abs(keys) @ np.abs(q).T           # [v, H]
        zero = (dots < -gamma(q.shape[1]) * mags).all(axis=1)
        classes = [("relu-zero",) if z else c for c, z in zip(classes, zero.tolist())]
    return classes


def _exact_tie_order(sel: List[int], scores: np.ndarray, classes: list) -> Optional[str]:
    """None unless two visible pools of one :func:`exact_tie_classes` class break their tie
    toward the higher pool id: the lower id comes first, and a higher id is never selected while
    the lower one is left out."""
    rank = {p: i for i, p in enumerate(sel)}
    groups: dict = {}
    for j, cls in enumerate(classes):
        if np.isfinite(scores[j]):
            groups.setdefault(cls, []).append(j)
    for cls, ids in groups.items():
        for a, b in zip(ids, ids[1:]):         # a < b, one exact-tie class
            if b in rank and (a not in rank or rank[a] > rank[b]):
                where = "left out" if a not in rank else "ranked below it"
                why = "a provably zero score" if cls == ("relu-zero",) else "the identical key"
                return (f"pool {b} selected while pool {a} with {why} is {where} "
                        "(exact ties go to the lower id)")
    return None


def _canonical_within(pools: List[int], scores: np.ndarray, tol: float,
                      classes: Optional[list] = None) -> Optional[str]:
    """None if ``pools`` (filled slots, in rank order) is the canonical top-k of some scores
    within ``tol`` of ``scores`` (pairwise necessary conditions, and the exact tie order within
    each :func:`exact_tie_classes` class when given), else why not."""
    v = scores.shape[0]
    sel = [p for p in pools if p >= 0]
    if any(p >= v for p in sel):
        return f"pool {max(sel)} is not visible ({v} visible pools)"
    if any(not np.isfinite(scores[p]) for p in sel):
        return "a selected pool has no finite score"
    for a, b in zip(sel, sel[1:]):
        if scores[b] - scores[a] > tol:
            return f"pool {a} ranked above pool {b} although {scores[b] - scores[a]:.3g} lower (tolerance {tol:.3g})"
    finite_unsel = [j for j in range(v) if j not in set(sel) and np.isfinite(scores[j])]
    if sel and finite_unsel:
        best = max(finite_unsel, key=lambda j: scores[j])
        if scores[best] - scores[sel[-1]] > tol:
            return (f"unselected pool {best} scores {scores[best] - scores[sel[-1]]:.3g} above the last "
                    f"selected pool {sel[-1]} (tolerance {tol:.3g})")
    if len(sel) < min(len(pools), int(np.isfinite(scores).sum())):
        return f"{len(sel)} pools selected, {int(np.isfinite(scores).sum())} selectable"
    return _exact_tie_order(sel, scores, classes) if classes is not None else None


def certify_tie_row(ctx: TieContext, t: int, kernel_row: Sequence[int], reference_row: Sequence[int],
                    tail: Sequence[bool]) -> Tuple[bool, str]:
    """parity-contract.md §3.2 for one live row whose tail columns already agree.

    Conditions (each side's scores come from its own compressed cache):
    both rows well formed (:func:`parse_row`); the same empty (``-1``) slots; every pool in the
    symmetric difference of the two selections, and every pair ranked in opposite orders, within
    ``tol = 2 * max_j bound_j`` of the boundary score (the ``K_pool``-th largest float64 score)
    respectively of each other; each row canonical for its own scores within ``tol``
    (:func:`_canonical_within`), pools that tie exactly on every backend in id order
    (:func:`exact_tie_classes`). ``tol`` is proven: if every fp32 score is within ``bound_max``
    of its exact value, the fp32 top-k can only differ from the exact one in pools within
    ``2 * bound_max`` of the exact boundary.

    Returns:
        ``(certified, reason)``; ``reason`` is empty when certified, else the failed condition.
    """
    kp, k_ok = parse_row(kernel_row, tail, index_topk=ctx.index_topk, index_kpool=ctx.index_kpool)
    rp, r_ok = parse_row(reference_row, tail, index_topk=ctx.index_topk, index_kpool=ctx.index_kpool)
    if not (k_ok and r_ok):
        return False, f"{'kernel' if not k_ok else 'reference'} row is not a well-formed selection"
    if [p < 0 for p in kp] != [p < 0 for p in rp]:
        return False, "the -1 slots differ"
    kkeys, rkeys = visible_keys_f64(ctx, t, ctx.kernel_cache), visible_keys_f64(ctx, t, ctx.reference_cache)
    ks, kb = row_scores_f64(ctx, t, ctx.kernel_cache, keys=kkeys)
    rs, rb = row_scores_f64(ctx, t, ctx.reference_cache, keys=rkeys)
    tol = 2.0 * float(max(kb.max(initial=0.0), rb.max(initial=0.0)))
    for name, pools, scores, keys in (("kernel", kp, ks, kkeys), ("reference", rp, rs, rkeys)):
        why = _canonical_within(pools, scores, tol, classes=exact_tie_classes(ctx, t, keys))
        if why:
            return False, f"{name} row: {why}"
    sel_k, sel_r = [p for p in kp if p >= 0], [p for p in rp if p >= 0]
    K_pool = len(kp)
    for scores in (ks, rs):
        finite = np.sort(scores[np.isfinite(scores)])[::-1]
        if finite.size == 0:
            continue
        boundary = finite[min(K_pool, finite.size) - 1]
        for p in sorted(set(sel_k) ^ set(sel_r)):
            if abs(scores[p] - boundary) > tol:
                return False, (f"pool {p} is {abs(scores[p] - boundary):.3g} from the boundary score "
                               f"{boundary:.6g}, beyond the accumulation bound {tol:.3g}")
        common = [p for p in sel_k if p in set(sel_r)]
        rank_r = {p: i for i, p in enumerate(sel_r)}
        for i, a in enumerate(common):
            for b in common[i + 1:]:
                if rank_r[a] > rank_r[b] and abs(scores[a] - scores[b]) > tol:
                    return False, (f"pools {a} and {b} are ranked in opposite orders but differ by "
                                   f"{abs(scores[a] - scores[b]):.3g} (bound {tol:.3g})")
    return True, ""


def certify_ties(kernel_rows: torch.Tensor, reference_rows: torch.Tensor, rows: torch.Tensor,
                 context: Optional[TieContext], tail: Optional[torch.Tensor] = None):
    """parity-contract.md §3.2 for each of ``rows``.

    Args:
        kernel_rows / reference_rows: int32 ``[T, W]`` (CPU).
        rows: int64 ``[n]`` live rows whose history columns differ and whose tail and padding
            columns agree (the caller excludes the others).
        context: :class:`TieContext`, or ``None`` (exact-data case: certify nothing).
        tail: bool ``[T, W]`` tail-column mask (:func:`parity.compare.tail_column_mask`).

    Returns:
        ``(certified bool [n], reasons list of n str)``.
    """
    n = int(rows.shape[0])
    cert = torch.zeros(n, dtype=torch.bool)
    if context is None:
        return cert, ["exact-data case: no certificate applies"] * n
    reasons = []
    for i, t in enumerate(rows.tolist()):
        tail_row = tail[t].tolist() if tail is not None else [False] * kernel_rows.shape[1]
        ok, why = certify_tie_row(context, int(t), kernel_rows[t].tolist(), reference_rows[t].tolist(), tail_row)
        cert[i] = ok
        reasons.append(why)
    return cert, reasons
