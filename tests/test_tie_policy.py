"""Tie policies of the §3.2 certificate (issue 11 point 2; docs/certificates.md §4.3).

``canonical`` (the contract's default): exact ties go to the lower pool id, and exact-data cases
match bitwise with no exception. ``any`` (an implementation whose top-k orders equal scores
arbitrarily, e.g. ``torch.topk``): a row passes when it is a valid top-k of the exact scores
(exact data, zero tolerance) or of scores within the any-order bound (random data), with the
tail and ``-1`` slots identical. An exact-tie reordering passes only under ``any``; a
difference that is not a tie fails under both.
"""
from __future__ import annotations

import pytest
import torch

from parity.checking import certificates as certs
from reference.numerics import expand_row
from tests.certificate_cases import (D, K, P, W, compare_rows, run, swap_pool, swapping_kernel, tie_case,
                                     tie_setup)

POLICIES = ("canonical", "any")


def _exact_tie_setup(identical_keys=False, exact_scores=True):
    """tie_setup's rows and metadata with pools 1 and 2 tied *exactly*: same multiset of key
    values (0.5 everywhere, one 0.25) in different channels, so every query (uniform over d per
    head) scores them alike in every order, yet the keys differ (unless ``identical_keys``)."""
    meta, ref, ctx = tie_setup(exact_scores=exact_scores)
    cache = ctx.reference_cache.clone()
    cache[0, 1, 0] = 0.5
    cache[1, 0, 0] = 0.5
    cache[0, 1, 0, D - 1] = 0.25
    cache[1, 0, 0, D - 1 if identical_keys else D - 2] = 0.25
    ctx.kernel_cache = ctx.reference_cache = cache
    return meta, ref, ctx


def _verdicts(rows):
    return [r["verdict"] for r in rows]


@pytest.mark.parametrize("policy", POLICIES)
def test_exact_tie_choice_passes_only_under_any(policy):
    meta, ref, ctx = _exact_tie_setup()
    sb = certs.row_scores_f64(ctx, 16, ctx.reference_cache)
    assert sb.scores[1] == sb.scores[2] and sb.bounds.max() == 0          # exact data: zero tolerance
    assert ref[16, 0, :8].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]           # canonical: pool 1 (lower id)
    kern = swap_pool(swap_pool(ref, 12, 1, 2), 16, 1, 2)                  # pool 2 chosen instead
    rows = compare_rows(kern, ref, meta, ctx, tie_policy=policy)
    if policy == "any":
        assert [(r["verdict"], r["row"], r["mismatches"]) for r in rows] == [("tie-equivalent", 12, 8)]
        assert "ties=any" in rows[0]["detail"]
    else:
        assert _verdicts(rows) == ["wrong-index"] and "ties=canonical" in rows[0]["detail"]


@pytest.mark.parametrize("policy", POLICIES)
def test_exact_tie_order_inside_the_selection_passes_only_under_any(policy):
    meta, ref, ctx = _exact_tie_setup()
    ctx.reference_cache[0, 0, 0] = 0.125                                # pools 1, 2 now the top two
    ref = ref.clone()
    ref[16, 0] = torch.tensor(expand_row([1, 2], [True, True], 16, index_topk=K, index_kpool=P, pack_tail=True,
                                         width=W))
    kern = ref.clone()
    kern[16, 0] = torch.tensor(expand_row([2, 1], [True, True], 16, index_topk=K, index_kpool=P, pack_tail=True,
                                          width=W))
    rows = compare_rows(kern, ref, meta, ctx, tie_policy=policy)
    assert _verdicts(rows) == (["tie-equivalent"] if policy == "any" else ["wrong-index"])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("exact_scores", [True, False])
def test_a_difference_that_is_no_tie_fails_under_both(policy, exact_scores):
    meta, ref, ctx = _exact_tie_setup(exact_scores=exact_scores)
    kern = swap_pool(ref, 16, 1, 3)                                       # pool 3 scores far lower
    (row,) = compare_rows(kern, ref, meta, ctx, tie_policy=policy)
    assert row["verdict"] == "wrong-index" and row["row"] == 16
    empty = ref.clone()
    empty[16, 0, 4:8] = -1                                                # a -1 slot instead of a pool
    assert _verdicts(compare_rows(empty, ref, meta, ctx, tie_policy=policy)) == ["wrong-index"]


def test_identical_keys_on_random_data_are_free_only_under_any():
    """Random-data context: identical keys tie on every backend; canonical fixes their order."""
    meta, ref, ctx = _exact_tie_setup(identical_keys=True, exact_scores=False)
    kern = swap_pool(ref, 16, 1, 2)
    (row,) = compare_rows(kern, ref, meta, ctx, tie_policy="canonical")
    assert row["verdict"] == "wrong-index" and "identical key" in row["detail"]
    assert _verdicts(compare_rows(kern, ref, meta, ctx, tie_policy="any")) == ["tie-equivalent"]


def test_unknown_tie_policy_is_rejected():
    meta, ref, ctx = tie_setup()
    with pytest.raises(ValueError, match="tie_policy"):
        compare_rows(ref, ref, meta, ctx, tie_policy="lowest")
    with pytest.raises(ValueError, match="tie_policy"):
        run(tie_case(), swapping_kernel(2), tie_policy="lowest")
    assert certs.TIE_POLICIES == POLICIES


# ---- through the runner: exact-data cases get a zero-tolerance context only under ``any`` ----------

@pytest.mark.parametrize("policy", POLICIES)
def test_runner_exact_data_tie_reordering(policy):
    res = run(tie_case(values="exact"), swapping_kernel(2), tie_policy=policy)
    if policy == "any":
        assert res.ok, res.failures
        (tie,) = res.findings[res.findings["verdict"] == "tie-equivalent"].to_dict("records")
        assert (tie["row"], tie["mismatches"]) == (11, 6 * 4) and "ties=any" in tie["detail"]
    else:
        assert set(res.failures["verdict"]) == {"wrong-index"}
        assert "tie-equivalent" not in set(res.findings["verdict"])


@pytest.mark.parametrize("policy", POLICIES)
def test_runner_far_swap_and_tail_fail_under_both(policy):
    for values in ("exact", "random"):
        res = run(tie_case(values=values), swapping_kernel(3), tie_policy=policy)
        (bad,) = res.failures.to_dict("records")
        assert (bad["verdict"], bad["row"], bad["pool_id"]) == ("wrong-index", 11, 1)
        res = run(tie_case(values=values), swapping_kernel(2, tail_row=16), tie_policy=policy)
        assert {"wrong-tail", "wrong-index"} <= set(res.failures["verdict"])


def test_runner_identical_keys_pass_only_under_any():
    assert not run(tie_case(identical_keys=True), swapping_kernel(2)).ok
    assert run(tie_case(identical_keys=True), swapping_kernel(2), tie_policy="any").ok
    assert run(tie_case(identical_keys=True, values="exact"), swapping_kernel(2), tie_policy="any").ok


@pytest.mark.parametrize("policy", POLICIES)
def test_real_kernel_breaking_exact_ties_toward_the_higher_id(monkeypatch, policy):
    """The kernel's top-k replaced by one that breaks exact ties toward the higher pool id (what an
    arbitrary-order ``torch.topk`` may do), on a random-data seed case. Rows whose relu scores are
    provably zero (every head's dot below minus its bound) tie on every backend: under canonical
    the row is wrong-index (it used to be certified), under ``any`` it is certified."""
    from cases.scenarios import prefill_topk
    from kpool.indexer import forward as kernel_forward
    from kpool.ops import indexer as ki

    real_select = ki.select_topk

    def ties_to_higher_id(keys, selected, out=None, **kwargs):
        # the fault: the low word keys the pool id itself (not inverted), so exact ties go to
        # the higher id
        n = keys.shape[1]
        flipped = (keys & ~0xFFFFFFFF) | torch.arange(n, dtype=torch.int64, device=keys.device)
        top = real_select(flipped, selected)
        fixed = (top & ~0xFFFFFFFF) | (0xFFFFFFFF - (top & 0xFFFFFFFF))
        if out is not None:
            out[:fixed.shape[0]].copy_(fixed)
        return fixed

    monkeypatch.setattr(ki, "select_topk", ties_to_higher_id)
    res = run(prefill_topk("small"), kernel_forward, check_oracle=False, tie_policy=policy)
    ties = res.findings[res.findings["verdict"] == "tie-equivalent"]
    if policy == "any":
        assert res.ok, res.failures[["step", "verdict", "detail"]].to_string()
        assert len(ties) and ties["detail"].str.contains("ties=any").all()
    else:
        assert ties.empty
        bad = res.failures[res.failures["verdict"] == "wrong-index"]
        assert not bad.empty and bad["detail"].str.contains("exact ties go to the lower id").any()


@pytest.mark.parametrize("ulps, verdict", [(1, "tie-equivalent"), (2, "wrong-index")])
def test_a_rounding_boundary_of_the_cache_may_move_the_selection(ulps, verdict):
    """docs/certificates.md §4.2: each side's row follows its own cache. Pool 2's key one bf16
    ulp higher in the kernel's cache (a certifiable rounding boundary, §3.1) lifts it above its
    near-tie pool 1, so the kernel selects pool 2 where the reference selects pool 1, 4.9e-3 apart
    on the kernel's scores, far beyond the fp32 bounds: the score move the one-ulp key explains is
    allowed. Two ulps (no certificate passes that cache) explain nothing: the rows fail."""
    meta, ref, ctx = tie_setup()
    kernel_cache = ctx.reference_cache.clone()
    kernel_cache[1, 0, 0, 0] = 0.5 + ulps * 2.0 ** -8          # pool 2, channel 0: 0.5 + n bf16 ulps
    ctx.kernel_cache = kernel_cache
    rows = [t for t in range(ref.shape[0]) if int(meta.positions[t]) >= 11]   # pool 2 visible
    assert all(int(ref[t, 0, 4]) == 4 for t in rows)             # the reference picks pool 1 there
    kern = ref
    for t in rows:
        kern = swap_pool(kern, t, 1, 2)
    found = compare_rows(kern, ref, meta, ctx, tie_policy="canonical")
    assert _verdicts(found) == [verdict], found
