"""Classification of every difference between our outputs and HF's (docs/hf-oracle.md §3-§4).

Index rows are compared as token multisets, split into the causal tail (exact) and the history
(pool sets). A history difference is an **exact tie** (HF's ``torch.topk`` saw equal fp32
scores and may return any of them), a **near tie** (the float64 margin between the swapped pools
is within the derived bounds of both sides), **non-finite** (a semantic difference: HF does not
sanitize, kpool-algorithm.md §4.3, §10) or **real**.

The margin is measured on ``S*``: the exact score (float64) with the exact pooled keys ``c*``
(HF's pooling formula in float64, kpool-algorithm.md §5.3). Each side's fp32 score lies within
its bound of ``S*`` (docs/hf-oracle.md §3):

* ours: ``B_o = b(c_o) + |S(c_o) - S*|``: the any-order fp32 bound of :func:`parity.checking.certificates.
  score_bounds` on our bf16 pooled keys ``c_o`` plus the exact effect of their bf16 rounding
  (every ``c_o`` is separately checked against ``bf16(c*)``, :func:`classify_pools`);
* HF: ``B_h = (1 + 2^-10) b(c_h) + 7 u M + |S(c_h) - S*|`` with HF's fp32 pooled keys ``c_h``,
  ``M = sum_h |w_h| sum_d |q_hd c_h,d|``: fp32 x bf16 products round (``u``), and the scale
  constants ``fl(w sqrt(HD))``, ``fl(H^-0.5)``, ``fl(D^-0.5)`` and their two products add ``5 u``.

Pooled keys: our bf16 value against one RNE rounding of ``c*``; a difference passes through the
rounding-boundary certificate (:func:`parity.checking.certificates.certify_rounding_boundaries`: adjacent,
``c*`` within the bound of the midpoint) or, for a value with heavy cancellation, when its bf16
rounding cell lies within the same bound of ``c*`` (``cancellation``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ..checking.certificates import (PoolWindow, RoundingContext, U_FAITHFUL, certify_rounding_boundaries,
                                     pooled_value_and_bound_f64, score_bounds)

ROW_CLASSES = ("agree", "exact-tie", "near-tie", "non-finite", "real")
"""Classes of a compared index row (module docstring); only ``real`` is a failure."""
POOL_CLASSES = ("exact", "rounding-boundary", "cancellation", "non-finite", "real")
"""Classes of a compared pooled-key element; only ``real`` is a failure. ``cancellation``: not
adjacent to ``bf16(c*)``, but its bf16 rounding cell is within the term-scaled fp32 bound of ``c*``
(``|c*|`` far below ``sum_j |a_j K_j|``, docs/hf-oracle.md §3.4)."""
HF_SCALE_ULPS = 7
"""``u`` multiples on ``M`` in HF's bound: 1 for the rounded products, 5 for the scale constants
and their products, 1 of slack (docs/hf-oracle.md §3.2)."""
SECOND_ORDER = 1.0 + 2.0 ** -10
F32_LOWEST = float(torch.finfo(torch.float32).min)


def bf16_rne_bits(x: np.ndarray) -> np.ndarray:
    """int16 bit patterns of ``x`` (finite float64, any shape) rounded once to bf16, to nearest,
    ties to even: not via fp32, whose own rounding could move a value onto a bf16 midpoint.

    Raises:
        ValueError: a non-finite value.
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("bf16_rne_bits needs finite values")
    a = np.abs(x)
    t = (a.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).astype(np.int64)
    cands = np.stack([np.maximum(t - 0x10000, 0), t, t + 0x10000])          # magnitudes, fp32 bits
    vals = cands.astype(np.uint32).view(np.float32).astype(np.float64)
    dist = np.abs(vals - a[None])
    best = dist.min(axis=0)
    tie_even = (dist == best[None]) & (((cands >> 16) & 1) == 0)
    pick = np.where((dist == best[None]).sum(axis=0) > 1, tie_even.argmax(axis=0), dist.argmin(axis=0))
    mag = np.take_along_axis(cands, pick[None], axis=0)[0] >> 16
    sign = np.where(np.signbit(x), 0x8000, 0)
    return (mag | sign).astype(np.uint16).view(np.int16)


@dataclass
class RowVerdict:
    """One compared row: ``cls`` in :data:`ROW_CLASSES`, why, and for ties the largest
    ``|margin| / bound`` over the swapped pairs (``None`` otherwise)."""

    cls: str
    detail: str = ""
    ratio: Optional[float] = None


@dataclass
class RequestView:
    """What the row classifier needs about one request's scored rows of one step.

    Attributes:
        index_kpool: ``P``.
        q: float64 ``[n, H, D]`` the rows' queries; w: float64 ``[n, H]`` their head weights.
        ours_keys: float64 ``[v, D]`` our pooled keys of the visible pools (kernel cache).
        exact_keys: float64 ``[n_pools, D]`` ``c*``; hf_keys: float64 ``[n_pools, D]`` HF's.
        exact_bounds: float64 ``[n_pools, D]`` the term-scaled fp32 bound ``B`` of ``c*`` for the
            kernel backend (:func:`parity.checking.certificates.pooled_value_and_bound_f64`; NaN: none).
        hf_scores: float64 ``[n, n_pools]`` what HF's topk ranked (invisible = fp32 lowest).
        finite_tokens: bool ``[S]`` tokens whose HF inputs are finite (:class:`parity.oracles.hf_oracle.HFCall`).
        finite_ape: the APE is finite.
    """

    index_kpool: int
    q: np.ndarray
    w: np.ndarray
    ours_keys: np.ndarray
    exact_keys: np.ndarray
    hf_keys: np.ndarray
    hf_scores: np.ndarray
    finite_tokens: np.ndarray
    finite_ape: bool
    exact_bounds: Optional[np.ndarray] = None


def _pools_of(tokens: Sequence[int], P: int):
    """``(Counter pool -> count, malformed pool or None)``: every pool must hold its P lanes once."""
    lanes: Dict[int, List[int]] = {}
    for x in tokens:
        lanes.setdefault(x // P, []).append(x % P)
    for j, got in lanes.items():
        if sorted(got) != list(range(P)):
            return lanes, j
    return lanes, None


def _nonfinite_reason(view: RequestView, i: int, position: int) -> str:
    P = view.index_kpool
    tail_start = (position + 1) // P * P
    if not (np.isfinite(view.q[i]).all() and np.isfinite(view.w[i]).all()):
        return "the row's q or head weights are not finite"
    seen = view.finite_tokens[:position + 1]
    if not seen.all():
        return f"token {int(np.flatnonzero(~seen)[0])} of the row's history has a non-finite k, gate or weight"
    if tail_start and not view.finite_ape:
        return "the APE is not finite"
    return ""


def _hf_bounds(view: RequestView, i: int, pools: np.ndarray):
    """``(S*, B_h, unbounded)`` over ``pools`` for row ``i`` (module docstring)."""
    q, w = view.q[i], view.w[i]
    star = score_bounds(q, w, view.exact_keys[pools])
    hf = score_bounds(q, w, view.hf_keys[pools])
    mag = (np.abs(w)[None, :, None] * np.abs(q)[None] * np.abs(view.hf_keys[pools])[:, None, :]).sum(axis=(1, 2))
    b_h = SECOND_ORDER * hf.bounds + HF_SCALE_ULPS * U_FAITHFUL * mag + np.abs(hf.scores - star.scores)
    return star.scores, b_h, bool(star.unbounded.any() or hf.unbounded.any())


def _bounds(view: RequestView, i: int, pools: np.ndarray):
    """``(S*, B_o, B_h, S_hf, problem)`` over ``pools`` for row ``i`` (module docstring)."""
    star, b_h, unbounded = _hf_bounds(view, i, pools)
    ours = score_bounds(view.q[i], view.w[i], view.ours_keys[pools])
    if unbounded or ours.unbounded.any():
        return None, None, None, None, "a pool's score has no finite bound (a huge or infinite key)"
    b_o = ours.bounds + np.abs(ours.scores - star)
    return star, b_o, b_h, view.hf_scores[i, pools], ""


def _illegitimate_key(view: RequestView, pools: np.ndarray) -> Optional[int]:
    """The first of ``pools`` whose bf16 key ``c_o`` is not a legitimate rounding of ``c*``
    (``|c_o - c*| <= B + ulp_bf16(c_o) / 2`` per channel), or ``None``. Only then is the exact
    effect ``|S(c_o) - S*|`` in ``B_o`` a rounding and not a fault (docs/hf-oracle.md §3.1)."""
    if view.exact_bounds is None:
        return None
    c_o, c_star, bound = view.ours_keys[pools], view.exact_keys[pools], view.exact_bounds[pools]
    half_ulp = np.spacing(np.abs(c_o).astype(np.float32)).astype(np.float64) * 2.0 ** 15
    ok = (c_o == c_star) | (np.abs(c_o - c_star) <= np.nan_to_num(bound, nan=0.0) + half_ulp)
    bad = ~ok.all(axis=1)
    return int(pools[np.flatnonzero(bad)[0]]) if bad.any() else None


def check_hf_scores(view: RequestView, i: int, position: int) -> str:
    """``""`` if HF's fp32 score of every visible pool of row ``i`` lies within ``B_h`` of ``S*``
    (the driver's claim that HF computes our score: scale recipe, ReLU placement, head weights),
    else why not. Rows with non-finite inputs are not checked (HF does not sanitize)."""
    v = (position + 1) // view.index_kpool
    if v == 0 or _nonfinite_reason(view, i, position):
        return ""
    pools = np.arange(v)
    star, b_h, unbounded = _hf_bounds(view, i, pools)
    if unbounded:
        return ""
    off = np.abs(view.hf_scores[i, pools] - star) > b_h
    if off.any():
        j = int(np.flatnonzero(off)[0])
        return (f"HF's fp32 score of pool {j} at position {position} is {view.hf_scores[i, j]!r}, "
                f"{abs(view.hf_scores[i, j] - star[j]):.3g} from its exact value {star[j]!r}, beyond HF's bound "
                f"{b_h[j]:.3g}: the driver's recipe or the bound is wrong")
    return ""


def classify_row(ours: Sequence[int], theirs: Sequence[int], position: int, i: int, view: RequestView) -> RowVerdict:
    """Class of one live row (module docstring; docs/hf-oracle.md §4).

    Args:
        ours / theirs: our row and HF's row (ints, ``-1`` unused; any widths and layouts).
        position: the row's position ``p``; i: its index among ``view``'s rows.
        view: :class:`RequestView` of the row's request.

    Returns:
        :class:`RowVerdict`.
    """
    P = view.index_kpool
    tail_start = (position + 1) // P * P
    mine = [int(x) for x in ours if x >= 0]
    hf = [int(x) for x in theirs if x >= 0]
    for who, tokens in (("ours", mine), ("HF", hf)):
        if tokens and max(tokens) > position:
            return RowVerdict("real", f"{who} holds token {max(tokens)}, after the row's position {position}")
    tail_o = sorted(x for x in mine if x >= tail_start)
    tail_h = sorted(x for x in hf if x >= tail_start)
    if tail_o != tail_h:
        return RowVerdict("real", f"tail tokens differ: ours {tail_o}, HF {tail_h}")
    hist_o = [x for x in mine if x < tail_start]
    hist_h = [x for x in hf if x < tail_start]
    if Counter(hist_o) == Counter(hist_h):
        return RowVerdict("agree")
    if set(hist_o) == set(hist_h):
        return RowVerdict("real", "the same history tokens with other multiplicities")
    why = _nonfinite_reason(view, i, position)
    if why:
        return RowVerdict("non-finite", f"semantic (HF does not sanitize scores): {why}")
    for name, tokens in (("our", hist_o), ("HF's", hist_h)):
        lanes, bad = _pools_of(tokens, P)
        if bad is not None:
            return RowVerdict("real", f"{name} row holds lanes {sorted(lanes[bad])} of pool {bad}, not one full pool")
    sel_o, sel_h = set(x // P for x in hist_o), set(x // P for x in hist_h)
    if len(sel_o) != len(sel_h):
        return RowVerdict("real", f"ours selects {len(sel_o)} pools, HF {len(sel_h)}")
    visible = (position + 1) // P
    X, Y = sorted(sel_o - sel_h), sorted(sel_h - sel_o)
    if max(X) >= visible or max(Y) >= visible:
        who, j = ("ours", max(X)) if max(X) >= visible else ("HF", max(Y))
        return RowVerdict("real", f"{who} selects pool {j}, not visible at position {position} ({visible} visible)")
    pools = np.array(X + Y, dtype=np.int64)
    if pools.max() >= view.ours_keys.shape[0]:
        return RowVerdict("real", f"pool {int(pools.max())} is not in our cache's visible pools")
    bad_key = _illegitimate_key(view, pools)
    if bad_key is not None:
        return RowVerdict("real", f"our key of swapped pool {bad_key} is no rounding of c* (a cache difference)")
    star, b_o, b_h, s_hf, problem = _bounds(view, i, pools)
    if problem:
        return RowVerdict("non-finite", f"semantic: {problem}")
    off = np.abs(s_hf - star) > b_h
    if off.any():
        j = int(np.flatnonzero(off)[0])
        return RowVerdict("real", f"HF's fp32 score of pool {int(pools[j])} is {abs(s_hf[j] - star[j]):.3g} from its "
                                  f"exact value, beyond HF's bound {b_h[j]:.3g}: the driver or the bound is wrong")
    nx = len(X)
    m = star[nx:][None, :] - star[:nx, None]                 # [x, y]: how much y beats x
    bo = b_o[:nx, None] + b_o[None, nx:]
    bh = b_h[:nx, None] + b_h[None, nx:]
    for mask, who, bound in ((m > bo, "ours", bo), (-m > bh, "HF", bh)):
        if mask.any():
            a, b = np.argwhere(mask)[0]
            x, y = (int(X[a]), int(Y[b])) if who == "ours" else (int(Y[b]), int(X[a]))
            return RowVerdict("real", f"{who} selects pool {x} over pool {y}, which scores {abs(m[a, b]):.3g} higher "
                                      f"(beyond the bound {bound[a, b]:.3g})")
    ratio = float((np.abs(m) / np.maximum(bo + bh, 1e-300)).max())
    tied = (s_hf[:nx, None] == s_hf[None, nx:]).all()
    if tied:
        return RowVerdict("exact-tie", f"HF's fp32 scores tie for pools {X} / {Y}", ratio)
    return RowVerdict("near-tie", f"pools {X} / {Y}: margin within {ratio:.3g} of the bound", ratio)


def check_hf_pooling(hf_keys: np.ndarray, k_windows: np.ndarray, gate_windows: np.ndarray, ape: np.ndarray,
                     budget_ulps: float) -> str:
    """``""`` if HF's fp32 pooled keys are within the rounding bound of ``c*`` (the claim that HF
    pools the formula of kpool-algorithm.md §5.3 from the first token, APE per slot), else why not.

    Args:
        hf_keys: float64 ``[n, D]``; k_windows, gate_windows: ``[n, P, D]``; ape: ``[P, D]``.
    """
    if not hf_keys.size:
        return ""
    finite = np.isfinite(k_windows).all(axis=(1, 2)) & np.isfinite(gate_windows).all(axis=(1, 2))
    if not np.isfinite(ape).all():
        return ""
    y, bound, _ = pooled_value_and_bound_f64(k_windows, gate_windows, ape, budget_ulps=budget_ulps)
    bad = finite[:, None] & np.isfinite(bound) & (np.abs(hf_keys - y) > bound)
    if bad.any():
        j, d = (int(v) for v in np.argwhere(bad)[0])
        return (f"HF's pooled key {j} channel {d} = {hf_keys[j, d]!r} is {abs(hf_keys[j, d] - y[j, d]):.3g} from "
                f"the formula's {y[j, d]!r} (bound {bound[j, d]:.3g})")
    return ""


def classify_pools(ours_bits: torch.Tensor, k_windows: torch.Tensor, gate_windows: torch.Tensor,
                   ape: torch.Tensor, budget_ulps: float) -> dict:
    """Classes of the pooled-key elements written in a step (module docstring).

    Args:
        ours_bits: int16 ``[n, D]`` our bf16 pooled keys (bits); k_windows, gate_windows: fp32
            ``[n, P, D]`` their windows from the whole history; ape: fp32 ``[P, D]``;
        budget_ulps: the kernel backend's :data:`parity.checking.certificates.ROUNDING_BUDGET_ULPS`.

    Returns:
        ``{class: elements}`` over :data:`POOL_CLASSES`, plus ``"detail"``: the first real
        difference (empty when none).
    """
    out = {c: 0 for c in POOL_CLASSES}
    out["detail"] = ""
    n, D = (int(s) for s in ours_bits.shape)
    if n == 0:
        return out
    kw, gw = k_windows.to(torch.float32), gate_windows.to(torch.float32)
    finite = torch.isfinite(kw).all(2).all(1) & torch.isfinite(gw).all(2).all(1) & bool(torch.isfinite(ape).all())
    out["non-finite"] = int((~finite).sum()) * D
    idx = finite.nonzero().flatten()
    if not idx.numel():
        return out
    y = pooled_value_and_bound_f64(kw[idx].numpy(), gw[idx].numpy(), ape.to(torch.float32).numpy(), budget_ulps=0.0)[0]
    theirs = torch.from_numpy(bf16_rne_bits(y))
    mine = ours_bits[idx]
    differing = mine != theirs
    out["exact"] = int((~differing).sum())
    if differing.any():
        ctx = RoundingContext(windows={(i, 0): PoolWindow(row=-1, position=-1, request=-1, k=kw[int(j)], gate=gw[int(j)])
                                       for i, j in enumerate(idx.tolist())},
                              ape=ape.to(torch.float32), budget_ulps=budget_ulps)
        cert, why = certify_rounding_boundaries(mine[:, None, None, :], theirs[:, None, None, :],
                                                differing[:, None, None, :], ctx)
        out["rounding-boundary"] = int(cert.sum())
        left = differing & ~cert[:, 0, 0, :]
        if left.any():
            near = _cell_within_bound(mine, kw[idx].numpy(), gw[idx].numpy(), ape.to(torch.float32).numpy(),
                                      budget_ulps) & left
            out["cancellation"] = int(near.sum())
            left &= ~near
        out["real"] = int(left.sum())
        if out["real"]:
            i = int(left.any(1).nonzero()[0])
            out["detail"] = f"pool #{i} of the step: {why}"
    return out


def _cell_within_bound(bits: torch.Tensor, k_windows, gate_windows, ape, budget_ulps: float) -> torch.Tensor:
    """bool ``[n, D]``: the bf16 rounding cell of each value (``bits``) meets ``[c* - B, c* + B]``,
    ``B`` the term-scaled bound of :func:`parity.checking.certificates.pooled_value_and_bound_f64`."""
    from ..checking.certificates import bf16_bits_to_f64
    y, bound, _ = pooled_value_and_bound_f64(k_windows, gate_windows, ape, budget_ulps=budget_ulps)
    v = bf16_bits_to_f64(bits)
    b = bits.to(torch.int32) & 0xFFFF
    up = bf16_bits_to_f64((b + 1).to(torch.int16))        # the magnitude neighbours (same sign)
    down = bf16_bits_to_f64(torch.where((b & 0x7FFF) > 0, b - 1, b).to(torch.int16))
    lo, hi = np.minimum(up, down), np.maximum(up, down)
    cell_lo, cell_hi = (v + np.minimum(lo, v)) / 2, (v + np.maximum(hi, v)) / 2
    ok = np.isfinite(bound) & np.isfinite(v) & (cell_lo <= y + bound) & (cell_hi >= y - bound)
    return torch.from_numpy(ok)
