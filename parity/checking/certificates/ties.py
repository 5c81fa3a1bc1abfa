"""parity-contract.md §3.2: index rows that differ only at a near-tie of the top-k boundary
(derivation: docs/certificates.md §2 and §4).

Each side's row is judged against the exact float64 scores of its *own* compressed cache
(kpool-algorithm.md §4.1-§4.2) and the per-pool bound ``b_j`` of
:func:`parity.checking.certificates.scores.score_bounds`: every conforming fp32 implementation's score
lies in ``[S_j - b_j, S_j + b_j]``. A row is certified ``tie-equivalent`` when its tail columns,
padding and ``-1`` slots agree and each side's row is the canonical top-k of *some* scores inside
those intervals (:func:`valid_top_k`), and on both sides' scores every pool in the symmetric
difference is within ``b_j + max b`` of the boundary score and every pair the rows rank in
opposite orders within ``b_a + b_b`` (:func:`_cross_check`).

Tie policies (:data:`TIE_POLICIES`):

* ``canonical`` (the contract's default): exact ties go to the lower pool id. Pools that tie
  exactly on every backend (:func:`exact_tie_classes`) must keep that order, and exact-data
  cases get no certificate at all (bitwise).
* ``any`` (an implementation whose top-k orders exactly equal scores arbitrarily, e.g.
  ``torch.topk``): the exact-tie order is free; on exact-data cases (every order gives the exact
  score, :attr:`TieContext.exact_scores`) a row passes when it is a valid top-k of the exact
  scores with zero tolerance.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .scores import FP32_MAX, ScoreBounds
from .tie_rows import TIE_POLICIES, TieContext, check_tie_policy, parse_row, row_scores_f64, visible_keys_f64

__all__ = ["TIE_POLICIES", "TieContext", "certify_tie_row", "certify_ties", "check_tie_policy",
           "exact_tie_classes", "parse_row", "row_scores_f64", "valid_top_k", "visible_keys_f64"]


def exact_tie_classes(ctx: TieContext, keys: np.ndarray, sb: ScoreBounds) -> list:
    """One hashable class per visible pool (``keys``: its :func:`visible_keys_f64`, ``sb``: its
    :func:`row_scores_f64`): pools of one class score bitwise alike on every backend, so under
    the ``canonical`` policy their order is fixed (lower id first, parity-contract.md §2).

    Two sources: bitwise-identical keys (the score of a pool is a function of the bits of
    ``q_t``, ``w_t`` and its key only), and in relu mode (kpool-algorithm.md §4.2 (R)) every
    head's dot at or below minus its bound (``sb.provably_zero``), so every backend's score is 0.
    """
    return [("relu-zero",) if z else ("key", keys[j].tobytes())
            for j, z in enumerate(sb.provably_zero.tolist())]


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


def _effective(sb: ScoreBounds):
    """``(scores, bounds)`` with the derived rules of docs/certificates.md §2.4 applied: a pool
    ``+inf`` in every order scores exactly :data:`FP32_MAX` (bound 0), one ``-inf`` or NaN in every
    order ``-inf`` (never selectable), a capped one the interval ``[S - b, FP32_MAX]``. Free pools
    (overflow in some order) keep their exact score; the callers give them the whole real line."""
    scores, bounds = sb.scores.copy(), sb.bounds.copy()
    low = scores[sb.capped] - bounds[sb.capped]            # [S - b, FP32_MAX] as a centre and a radius
    scores[sb.capped], bounds[sb.capped] = low / 2 + FP32_MAX / 2, FP32_MAX / 2 - low / 2
    scores[sb.saturated], bounds[sb.saturated] = FP32_MAX, 0.0
    scores[sb.dead | sb.nan], bounds[sb.dead | sb.nan] = -np.inf, 0.0
    return scores, bounds


def _nan_selected(pools: List[int], sb: ScoreBounds) -> Optional[str]:
    """Why a row is wrong when it selects a pool whose score is NaN, ``-inf`` or at most LOWEST in
    every order (never valid, kpool-algorithm.md §4.3), else None."""
    bad = [p for p in pools if 0 <= p < sb.nan.shape[0] and sb.nan[p]]
    if bad:
        return (f"pool {bad[0]} is selected although its score is NaN in every summation order "
                "(sanitized to LOWEST: never selectable)")
    dead = [p for p in pools if 0 <= p < sb.dead.shape[0] and sb.dead[p]]
    if dead:
        return (f"pool {dead[0]} is selected although its score is -inf or at most LOWEST in every summation "
                "order (never valid)")
    return None


def valid_top_k(pools: List[int], sb: ScoreBounds, classes: Optional[list] = None) -> Optional[str]:
    """None if ``pools`` (a row's slots in rank order, ``-1`` empty) is the top-k, in descending
    order, of some scores ``s_j`` in ``[S_j - b_j, S_j + b_j]`` (docs/certificates.md §4.1),
    else why not. With ``classes`` (``canonical`` policy), pools of one exact-tie class must
    also keep the lower id first.

    Such scores exist iff every pool ranked (or selected) before another may score at least as
    much: ``S_b - b_b <= min over earlier a of (S_a + b_a)``, and no unselected valid pool's
    lower end exceeds the smallest upper end of the selection (a greedy choice of decreasing
    values then fits every interval). A free pool (``sb.free``: overflows in some order, §2.4)
    may score anything, LOWEST included: it may be selected at any rank or left out.
    """
    scores, bounds = _effective(sb)
    free = sb.free
    v = scores.shape[0]
    sel = [p for p in pools if p >= 0]
    if any(p >= v for p in sel):
        return f"pool {max(sel)} is not visible ({v} visible pools)"
    why = _nan_selected(sel, sb)
    if why:
        return why
    if any(not np.isfinite(scores[p]) and not free[p] for p in sel):
        return "a selected pool has no finite score"
    definite = np.isfinite(scores) & ~free
    selectable = int(definite.sum())
    if len(sel) < min(len(pools), selectable):
        return f"{len(sel)} pools selected, {selectable} selectable"
    if len(sel) < len(pools):
        left = np.setdiff1d(np.flatnonzero(definite), np.asarray(sel, dtype=np.int64))
        if left.size:
            return f"pool {int(left[0])} is selectable but left out while a slot is empty"
    upper, top = np.inf, None                   # smallest S_a + b_a over the pools ranked so far
    for b in sel:
        if free[b]:
            continue
        if top is not None and scores[b] - bounds[b] > upper:
            return (f"pool {top} ranked above pool {b} although {scores[b] - scores[top]:.3g} lower "
                    f"(bounds {bounds[top]:.3g} + {bounds[b]:.3g})")
        if scores[b] + bounds[b] < upper:
            upper, top = scores[b] + bounds[b], b
    rest = np.setdiff1d(np.flatnonzero(definite), np.asarray(sel, dtype=np.int64))
    if top is not None and rest.size:
        best = int(rest[np.argmax(scores[rest] - bounds[rest])])
        if scores[best] - bounds[best] > upper:
            return (f"unselected pool {best} scores {scores[best] - scores[top]:.3g} above selected pool {top} "
                    f"(bounds {bounds[best]:.3g} + {bounds[top]:.3g})")
    return _exact_tie_order(sel, scores, classes) if classes is not None else None


def cache_slack(kernel_keys: np.ndarray, reference_keys: np.ndarray, kernel_sb: ScoreBounds,
                reference_sb: ScoreBounds) -> np.ndarray:
    """float64 ``[v]``: per visible pool, how far the two caches move its exact score,
    ``|S_kernel - S_reference|``, where every element of its two pooled keys is equal or one bf16
    ulp apart (what a certified rounding boundary can change, parity-contract.md §3.1); 0
    elsewhere (equal keys, or a difference no certificate passes: the cache check fails on it and
    the rows get no slack; docs/certificates.md §4.2)."""
    v = min(kernel_keys.shape[0], reference_keys.shape[0])
    slack = np.zeros(kernel_sb.scores.shape[0])
    if v == 0 or np.array_equal(kernel_keys[:v], reference_keys[:v]):
        return slack

    def order(keys):                 # bf16 values (exact in fp32) on a line where neighbours are 1 apart
        bits = keys[:v].astype(np.float32).view(np.int32).astype(np.int64) >> 16
        return np.where(bits < 0, -(bits & 0x7FFF), bits)
    close = (np.abs(order(kernel_keys) - order(reference_keys)) <= 1).all(axis=1)
    close &= ~np.isnan(kernel_keys[:v]).any(axis=1) & ~np.isnan(reference_keys[:v]).any(axis=1)
    sk, sr = _effective(kernel_sb)[0][:v], _effective(reference_sb)[0][:v]
    with np.errstate(invalid="ignore"):              # inf - inf where a side is not finite: masked out
        slack[:v] = np.where(close & np.isfinite(sk) & np.isfinite(sr), np.abs(sk - sr), 0.0)
    return slack


def _cross_check(sel_k: List[int], sel_r: List[int], K_pool: int, sb: ScoreBounds,
                 slack: Optional[np.ndarray] = None) -> Optional[str]:
    """The conditions between the two rows, on one side's scores (docs/certificates.md §4.2):
    every pool in the symmetric difference of the selections is within ``b_p + max b`` of the
    boundary score (the ``K_pool``-th largest exact score, parity-contract.md §3.2), and every
    two pools the rows rank in opposite orders are within ``b_a + b_b`` of each other. Both
    follow from :func:`valid_top_k` of both rows when the two caches agree; when they differ
    (a certified rounding boundary, or a cache fault) they are what ties the rows together;
    ``slack`` (:func:`cache_slack`) widens each pool's tolerance by what a one-ulp difference of
    its key (a rounding boundary) moved its score."""
    scores, bounds = _effective(sb)
    slack = np.zeros(scores.shape[0]) if slack is None else slack
    free = sb.free
    finite = np.isfinite(scores) & ~free
    if not finite.any():
        return None
    v = scores.shape[0]
    ranked = np.sort(scores[finite])[::-1]
    # free pools (§2.4) may take up to that many slots above the boundary: a band of boundaries
    last = min(K_pool, ranked.size) - 1
    low, high = ranked[last], ranked[max(last - int(free.sum()), 0)]
    b_max = float(bounds[finite].max()) + float(slack[finite].max())
    for p in sorted(set(sel_k) ^ set(sel_r)):
        if p >= v or free[p]:
            continue
        off = max(low - scores[p], scores[p] - high, 0.0)
        if off > bounds[p] + slack[p] + b_max:
            return (f"pool {p} is {off:.3g} from the boundary score {low:.6g}, "
                    f"beyond the accumulation bound {bounds[p] + slack[p] + b_max:.3g}")
    rank_r = {p: i for i, p in enumerate(sel_r)}
    common = np.array([p for p in sel_k if p in rank_r and p < v and not free[p]], dtype=np.int64)  # kernel order
    if common.size > 1:
        rr = np.array([rank_r[p] for p in common])
        swapped = np.triu(rr[:, None] > rr[None, :], k=1)            # a before b in kernel, after in reference
        gap = np.abs(scores[common][:, None] - scores[common][None, :])
        tol = (bounds + slack)[common][:, None] + (bounds + slack)[common][None, :]
        bad = np.argwhere(swapped & (gap > tol))
        if bad.size:
            a, b = (int(common[i]) for i in bad[0])
            return (f"pools {a} and {b} are ranked in opposite orders but differ by "
                    f"{abs(scores[a] - scores[b]):.3g} (bounds {bounds[a]:.3g} + {bounds[b]:.3g})")
    return None


def certify_tie_row(ctx: TieContext, t: int, kernel_row: Sequence[int], reference_row: Sequence[int],
                    tail: Sequence[bool], tie_policy: str = "canonical") -> Tuple[bool, str]:
    """parity-contract.md §3.2 for one live row whose tail columns already agree.

    Conditions (each side's scores come from its own compressed cache): both rows well formed
    (:func:`parse_row`); the same empty (``-1``) slots; no visible pool whose score no bound
    covers; each row a valid top-k for its own scores (:func:`valid_top_k`, with the exact-tie
    order under ``canonical``); on both sides' scores, every pool in the symmetric difference
    near the boundary score and every pair ranked in opposite orders within its bounds
    (:func:`_cross_check`).

    Args:
        tie_policy: ``"canonical"`` or ``"any"`` (:data:`TIE_POLICIES`).

    Returns:
        ``(certified, reason)``; ``reason`` is empty when certified, else the failed condition.
    """
    if ctx.exact_scores and tie_policy == "canonical":
        return False, "exact-data case: no certificate applies (ties=canonical)"
    kp, k_ok = parse_row(kernel_row, tail, index_topk=ctx.index_topk, index_kpool=ctx.index_kpool)
    rp, r_ok = parse_row(reference_row, tail, index_topk=ctx.index_topk, index_kpool=ctx.index_kpool)
    if not (k_ok and r_ok):
        return False, f"{'kernel' if not k_ok else 'reference'} row is not a well-formed selection"
    sel_k, sel_r = [p for p in kp if p >= 0], [p for p in rp if p >= 0]
    seen: dict = {}                             # both caches usually hold the same visible keys
    sides = []
    for name, pools, cache in (("kernel", kp, ctx.kernel_cache), ("reference", rp, ctx.reference_cache)):
        keys = visible_keys_f64(ctx, t, cache)
        sb = seen.get(keys.tobytes())
        if sb is None:
            sb = seen[keys.tobytes()] = row_scores_f64(ctx, t, cache, keys=keys)
        why = _nan_selected(pools, sb)
        if why:
            return False, f"{name} row: {why}"
        sides.append((name, pools, keys, sb))
    for name, _pools, _keys, sb in sides:
        if sb.uncertain.any():
            return False, (f"{name} side: pool {int(np.flatnonzero(sb.uncertain)[0])} has an infinite key or "
                           "a magnitude near fp32 overflow: no bound covers its score")
    # a free pool (§2.4) may be left out on one side only: the -1 slots may then differ
    if not any(sb.free.any() for *_, sb in sides) and [p < 0 for p in kp] != [p < 0 for p in rp]:
        return False, "the -1 slots differ"
    slack = cache_slack(sides[0][2], sides[1][2], sides[0][3], sides[1][3])
    for name, pools, keys, sb in sides:
        classes = exact_tie_classes(ctx, keys, sb) if tie_policy == "canonical" else None
        why = valid_top_k(pools, sb, classes) or _cross_check(sel_k, sel_r, len(kp), sb, slack)
        if why:
            return False, f"{name} row: {why}"
    return True, ""


def certify_ties(kernel_rows: torch.Tensor, reference_rows: torch.Tensor, rows: torch.Tensor,
                 context: Optional[TieContext], tail: Optional[torch.Tensor] = None,
                 tie_policy: str = "canonical"):
    """parity-contract.md §3.2 for each of ``rows``.

    Args:
        kernel_rows / reference_rows: int32 ``[T, W]`` (CPU).
        rows: int64 ``[n]`` live rows whose history columns differ and whose tail and padding
            columns agree (the caller excludes the others).
        context: :class:`TieContext`, or ``None`` (certify nothing).
        tail: bool ``[T, W]`` tail-column mask (:func:`parity.checking.compare.tail_column_mask`).
        tie_policy: ``"canonical"`` (default) or ``"any"`` (:data:`TIE_POLICIES`).

    Returns:
        ``(certified bool [n], reasons list of n str)``.

    Raises:
        ValueError: unknown ``tie_policy``.
    """
    check_tie_policy(tie_policy)
    n = int(rows.shape[0])
    cert = torch.zeros(n, dtype=torch.bool)
    if context is None:
        return cert, ["exact-data case: no certificate applies"] * n
    reasons = []
    for i, t in enumerate(rows.tolist()):
        tail_row = tail[t].tolist() if tail is not None else [False] * kernel_rows.shape[1]
        ok, why = certify_tie_row(context, int(t), kernel_rows[t].tolist(), reference_rows[t].tolist(), tail_row,
                                  tie_policy)
        cert[i] = ok
        reasons.append(why)
    return cert, reasons
