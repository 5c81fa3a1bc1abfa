"""The derived rules for non-finite and overflowing pool scores (docs/certificates.md §2.4;
parity.checking.certificates.scores, parity.checking.certificates.ties): a pool ``+inf`` in every summation order
ties at exactly fp32 max, one NaN in every order is never selectable (and a row that selects it
is named), a finite pool that overflows fp32 in some order may take any rank or none; every
other difference of the row is still judged by the bounds (a real difference is not certified).
"""
from __future__ import annotations

import numpy as np

from parity.checking.certificates import score_bounds, valid_top_k
from parity.checking.certificates.scores import FP32_MAX
from parity.checking.certificates.ties import _cross_check

INF = np.inf


def _row(q_inf=None, keys=None):
    """One merged-mode row: H=2, D=4, unit weights; ``q_inf`` = (h, d, sign) plants an infinity."""
    q = np.array([[1.0, 0.5, -0.25, 2.0], [0.5, 1.0, 1.0, -1.0]])
    if q_inf is not None:
        h, d, sign = q_inf
        q[h, d] = sign * INF
    w = np.array([1.0, 0.5])
    return q, w, np.asarray(keys, dtype=np.float64)


def test_infinite_query_classifies_every_pool_by_its_products():
    keys = [[1.0, 0, 0, 0],          # +inf * 1: +inf in every order
            [-1.0, 0, 0, 0],         # -inf: never selectable
            [0.0, 1, 1, 1],          # inf * 0 = NaN
            [2.0, 1, 0, 0]]
    sb = score_bounds(*_row((0, 0, 1.0), keys), "merged")
    assert sb.saturated.tolist() == [True, False, False, True]
    assert sb.dead.tolist() == [False, True, True, False] and sb.nan.tolist() == [False, False, True, False]
    assert not sb.uncertain.any()
    q, w, _ = _row((0, 0, 1.0))
    q[1, 1] = -INF
    both = score_bounds(q, w, np.array([[2.0, -1, 0, 0],     # +inf and (-inf * -1): +inf
                                        [2.0, 1, 0, 0]]), "merged")      # +inf and -inf: NaN
    assert both.saturated.tolist() == [True, False] and both.nan.tolist() == [False, True]


def test_saturated_pools_tie_at_fp32_max_and_a_real_difference_still_fails():
    keys = [[1.0, 0, 0, 0], [3.0, 0, 0, 0], [-1.0, 0, 0, 0]]          # pools 0, 1 saturated, 2 -inf
    sb = score_bounds(*_row((0, 0, 1.0), keys), "merged")
    assert valid_top_k([1, 0], sb) is None and valid_top_k([0, 1], sb) is None     # exact tie at FP32_MAX
    assert _cross_check([1, 0], [0, 1], 2, sb) is None
    assert "-inf or at most LOWEST" in valid_top_k([2, 0], sb)         # the -inf pool is never selectable
    assert "selectable" in valid_top_k([0, -1], sb)                    # a saturated pool left out


def test_a_selected_nan_pool_is_named():
    keys = [[0.0, 1, 1, 1], [1.0, 0, 0, 0]]
    sb = score_bounds(*_row((0, 0, 1.0), keys), "merged")
    assert "pool 0 is selected although its score is NaN" in valid_top_k([0, 1], sb)
    assert valid_top_k([1, -1], sb) is None
    nan_key = score_bounds(*_row(None, [[np.nan, 0, 0, 0], [1.0, 1, 1, 1]]), "merged")
    assert "pool 0" in valid_top_k([0, 1], nan_key) and valid_top_k([1, -1], nan_key) is None


def test_a_pool_that_overflows_in_some_order_is_free_and_nothing_else_is():
    big = 2.0 ** 127
    q, w, _ = _row()
    keys = np.array([[big, big, big, big],     # products up to 2^128: positives first overflow
                     [5.0, 0, 0, 0],           # finite: 5 + 0.25 = 5.25
                     [1.0, 0, 0, 0],           # 1.25
                     [-1.0, 0, 0, 0]])         # -1.25
    sb = score_bounds(q, w, keys, "merged")
    assert sb.free.tolist() == [True, False, False, False] and not sb.uncertain.any()
    for row in ([0, 1, 2], [1, 0, 2], [1, 2, 0], [1, 2, 3]):         # the free pool anywhere, or left out
        assert valid_top_k(row, sb) is None, row
    assert "ranked above" in valid_top_k([2, 1, 0], sb)              # the finite pools keep their order
    assert "selectable" in valid_top_k([1, 0, -1], sb)               # pool 2 missing while a slot is empty
    assert _cross_check([1, 2, 3], [0, 1, 2], 3, sb) is None
    assert "boundary" in _cross_check([1, 3, 0], [1, 2, 0], 3, score_bounds(q, w, keys * [[1], [1], [1], [-40]],
                                                                           "merged"))


def _fp32_merged_orders(q, w, c):
    """The merged route of one pool in fp32, heads and channels summed forwards and backwards."""
    out = []
    for order in (slice(None), slice(None, None, -1)):
        qbar = np.zeros(q.shape[1], dtype=np.float32)
        for h in range(q.shape[0])[order]:
            qbar = qbar + np.float32(w[h]) * q[h].astype(np.float32)
        acc = np.float32(0.0)
        for d in range(q.shape[1])[order]:
            acc = acc + qbar[d] * np.float32(c[d])
        out.append(float(acc))
    return out


def test_partial_sums_below_the_ceiling_keep_their_bound():
    # keys near 2^118: the score is far from overflow in every order, so the bound holds
    q, w, _ = _row()
    keys = np.array([[2.0 ** 118, -(2.0 ** 118), 0.0, 0.0]])
    sb = score_bounds(q, w, keys, "merged")
    assert not sb.unbounded[0] and not sb.uncertain[0] and 0 < sb.bounds[0] < np.inf
    for got in _fp32_merged_orders(q, w, keys[0]):
        assert abs(got - sb.scores[0]) <= sb.bounds[0]


def test_mixed_signs_near_the_limit_stay_uncertain():
    # sums of magnitudes past fp32 max, same-sign parts below 2^128: may or may not overflow, to
    # either infinity: no rule covers the pool, so a row that sees it is never certified
    q, w, _ = _row()
    keys = np.array([[2.0 ** 127, -(2.0 ** 127), 0.0, 0.0]])
    sb = score_bounds(q, w, keys, "merged")
    assert sb.unbounded[0] and not sb.free[0] and not sb.capped[0] and sb.uncertain[0]
    assert sb.scores[0] != FP32_MAX


def test_exact_extremes_are_exact_saturated_or_dead_in_every_order():
    # value-range's exact step: w = (FP32_MAX, 0), q = (e0, -e0), keys v * e0: one nonzero
    # product per score, so FP32_MAX and FP32_MAX / 2 are exact in every order (bound 0), 2 and
    # 4 times FP32_MAX overflow to +inf in every order, -2 FP32_MAX (merged) to -inf
    q, w = np.array([[1.0, 0.0], [-1.0, 0.0]]), np.array([FP32_MAX, 0.0])
    keys = np.array([[1.0, 0.0], [2.0, 0.0], [0.5, 0.0], [-1.0, 0.0], [-2.0, 0.0], [4.0, 0.0]])
    merged = score_bounds(q, w, keys, "merged")
    assert not merged.uncertain.any()
    assert merged.bounds[[0, 2, 3]].tolist() == [0.0, 0.0, 0.0] and merged.scores[0] == FP32_MAX
    assert merged.saturated.tolist() == [False, True, False, False, False, True]
    # -FP32_MAX is LOWEST exactly and -2 FP32_MAX is -inf: never valid (kpool-algorithm.md §4.3)
    assert merged.dead.tolist() == [False, False, False, True, True, False]
    for row in ([1, 0, 5, 2, -1, -1], [0, 1, 5, 2, -1, -1], [5, 1, 0, 2, -1, -1]):    # FP32_MAX ties: any order
        assert valid_top_k(row, merged) is None, row
    assert "ranked above" in valid_top_k([2, 0, 1, 5], merged)     # FP32_MAX / 2 above FP32_MAX
    assert "-inf or at most LOWEST" in valid_top_k([0, 1, 5, 4], merged)          # -inf in every order
    assert "pool 3 is selected" in valid_top_k([0, 1, 5, 2, 3, -1], merged)       # LOWEST exactly
    assert "4 selectable" in valid_top_k([0, 1, 5, -1, -1, -1], merged)    # the valid pool 2 left out
    relu = score_bounds(q, w, keys, "relu")
    assert not relu.uncertain.any() and relu.bounds[0] == 0.0 and relu.scores[[3, 4]].tolist() == [0.0, 0.0]


def test_one_signed_pools_at_the_top_are_capped_at_fp32_max():
    # two nonzero products per score (not exact): 2^127 (1 + 1) can only end at +inf (FP32_MAX) or
    # within its bound; the pools below keep their intervals
    q, w = np.array([[1.0, 1.0]]), np.array([2.0 ** 127])
    keys = np.array([[1.0, 1.0], [2.0 ** -20, 2.0 ** -20], [2.0 ** -21, 2.0 ** -21]])
    sb = score_bounds(q, w, keys, "merged")
    assert (sb.capped[0] or sb.saturated[0]) and not sb.uncertain.any()
    assert valid_top_k([0, 1, 2], sb) is None
    assert "ranked above" in valid_top_k([1, 0, 2], sb) and "ranked above" in valid_top_k([0, 2, 1], sb)
    # the same pool with one product of the other sign could end at -inf too: not capped
    mixed = score_bounds(np.array([[1.0, -(2.0 ** -30)]]), w, keys[:1], "merged")
    assert not mixed.capped[0] and not mixed.saturated[0]


def test_opposite_infinite_products_across_heads_are_not_nan_on_every_route():
    # An infinite key channel met by heads of opposite signs: the per-head route sums +inf and
    # -inf (NaN), but the merged query sum_h w_h q_hd = 0.5 is finite and positive, so the
    # merged route scores +inf; under (R) relu(-inf) = 0 leaves +inf. The pool may be selected
    # first on either mode: neither NaN nor dead (a correct kernel selecting it is no finding).
    q, w, keys = np.array([[1.0], [-0.5]]), np.array([1.0, 1.0]), np.array([[INF], [1.0]])
    for mode in ("merged", "relu"):
        sb = score_bounds(q, w, keys, mode)
        assert not sb.nan[0] and not sb.dead[0], mode
        # +inf on one route, NaN on the other: FP32_MAX or LOWEST, so any rank or none
        assert sb.free[0] and not sb.uncertain[0], mode
    # a NaN key is NaN on every route (score -inf: never selectable)
    sb = score_bounds(q, w, np.array([[np.nan], [1.0]]), "merged")
    assert sb.nan[0] and sb.scores[0] == -INF
    # opposite infinities inside one head's dot are NaN on both routes of (M) when qbar is
    # one-signed: +inf * 1 and -inf * 1 in one dot, qbar_d > 0 for both channels
    sb = score_bounds(np.array([[1.0, 1.0]]), np.array([1.0]), np.array([[INF, -INF]]), "merged")
    assert sb.nan[0] and sb.dead[0]
