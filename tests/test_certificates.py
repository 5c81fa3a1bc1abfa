"""Certified exceptions, triage classes and localisation (parity-contract.md §3, §6).

Our kernels are bitwise-exact by construction, so these tests *construct* the differing outputs a
kernel with another ``exp`` or accumulation order would produce: a bf16 element flipped to the
adjacent value where the exact pooled value sits on the rounding midpoint, index rows with two
near-tied pools swapped. Each certificate is shown to pass exactly those and to fail a 2-ulp
difference, an adjacent value far from the midpoint, a swap far from the boundary, a changed tail,
and anything on exact data. (Program ids of the real kernels, with probe mutants that store their
own ``tl.program_id``: ``tests/test_programs.py``.)

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_certificates.py``.
"""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from cases.spec import Case, Step
from cases.values import make_inputs
from kpool.config import SMALL
from kpool.metadata import BatchSpec, RequestSpec
from parity.checking import certificates as certs
from reference.numerics import expand_row
from tests.certificate_cases import (K, P, W, compare_rows, geometry, run, swap_pool, swapping_kernel, tie_case,
                                     tie_setup)
from parity.checking.compare import bits

MID = 1.0 + 2.0 ** -8            # midpoint of bf16 1.0 (0x3F80) and 1.0078125 (0x3F81)


def _reference_forward():
    from reference.stateful import forward
    return forward


# --------------------------------------------------------------------------- §3.2 unit level

def test_near_tie_swap_at_the_boundary_is_certified():
    meta, ref, ctx = tie_setup()
    # fp32 scores of pools 1 and 2 are equal (the 2^-27 difference is absorbed), so the canonical
    # row takes the lower id; exactly, pool 2 is higher: a kernel may well pick it.
    assert ref[16, 0, :8].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    kern = ref
    for t in (12, 16):                                                # rows that see pools 1 and 2
        kern = swap_pool(kern, t, 1, 2)
    rows = compare_rows(kern, ref, meta, ctx)
    assert [(r["verdict"], r["mismatches"], r["row"], r["position"], r["request"]) for r in rows] == \
        [("tie-equivalent", 8, 12, 12, 0)]


def test_near_tie_rank_swap_inside_the_selection_is_certified():
    meta, ref, ctx = tie_setup()
    # make pool 1 and 2 the top two: then the kernel may rank them either way
    ctx.kernel_cache[0, 0, 0] = 0.125        # kernel_cache is reference_cache: scores 2 > 1 > 0 > 3
    t = 16
    row = expand_row([2, 1], [True, True], 16, index_topk=K, index_kpool=P, pack_tail=True, width=W)
    kern_row = expand_row([1, 2], [True, True], 16, index_topk=K, index_kpool=P, pack_tail=True, width=W)
    ref = ref.clone()
    ref[t, 0] = torch.tensor(row)
    kern = ref.clone()
    kern[t, 0] = torch.tensor(kern_row)
    assert [r["verdict"] for r in compare_rows(kern, ref, meta, ctx)] == ["tie-equivalent"]


def test_swap_far_from_the_boundary_fails_with_location():
    meta, ref, ctx = tie_setup()
    kern = swap_pool(ref, 16, 1, 3)                                  # pool 3 is far below the boundary
    (row,) = compare_rows(kern, ref, meta, ctx)
    assert (row["verdict"], row["mismatches"], row["row"], row["position"], row["request"], row["column"],
            row["pool_id"]) == ("wrong-index", 4, 16, 16, 0, 4, 1)
    assert "not a tie" in row["detail"] and "pool 3" in row["detail"]


def test_changed_tail_fails_and_blocks_the_tie_certificate():
    meta, ref, ctx = tie_setup()
    kern = swap_pool(swap_pool(ref, 12, 1, 2), 16, 1, 2)
    kern[16, 0, 8] += 1                                               # p=16: tail column K_tok=8
    rows = {r["verdict"]: r for r in compare_rows(kern, ref, meta, ctx)}
    assert set(rows) == {"wrong-tail", "tie-equivalent", "wrong-index"}
    assert (rows["wrong-tail"]["row"], rows["wrong-tail"]["column"], rows["wrong-tail"]["position"]) == (16, 8, 16)
    assert rows["tie-equivalent"]["row"] == 12 and rows["tie-equivalent"]["mismatches"] == 4
    assert rows["wrong-index"]["row"] == 16 and "tail columns differ" in rows["wrong-index"]["detail"]


def test_ties_need_a_context_and_well_formed_rows():
    meta, ref, ctx = tie_setup()
    kern = swap_pool(ref, 16, 1, 2)
    assert [r["verdict"] for r in compare_rows(kern, ref, meta, None)] == ["wrong-index"]         # exact data
    dup = ref.clone()
    dup[16, 0, 4:8] = dup[16, 0, 0:4]                                                      # pool 0 twice
    (row,) = compare_rows(dup, ref, meta, ctx)
    assert row["verdict"] == "wrong-index" and "well-formed" in row["detail"]
    empty = ref.clone()
    empty[16, 0, 4:8] = -1                                                                 # a -1 slot
    (row,) = compare_rows(empty, ref, meta, ctx)
    assert row["verdict"] == "wrong-index" and "-1 slots differ" in row["detail"]


def test_tie_bound_is_the_derived_any_order_bound():
    """docs/certificates.md §2.2 by hand for pool 0 of row 16 (key 1.0 in all 16 channels, q = 1 /
    0.5, w = 1 / 0.5): D-sums of 16 equal products (Phi = 135 a), the weight products, the head sum."""
    _, _, ctx = tie_setup()
    sb = certs.row_scores_f64(ctx, 16, ctx.reference_cache)
    assert sb.scores.shape == (4,) and sb.scores[2] > sb.scores[1] and sb.scores[2] - sb.scores[1] < 1e-8
    u, kappa, eta = 2.0 ** -23, 1.25, 2.0 ** -126
    rel = lambda n: kappa * u * (1 + kappa * (n - 1) * u / (1 - kappa * (n - 1) * u))   # noqa: E731
    E0 = rel(16) * 135 * 1.0 + eta * 15 + eta * (16 + 16 + 16)
    E1 = rel(16) * 135 * 0.5 + eta * 15 + eta * (16 + 8 + 16)
    e0 = 1.0 * E0 * (1 + u) + u * 1.0 * (16 + E0) + eta
    e1 = 0.5 * E1 * (1 + u) + u * 0.5 * (8 + E1) + eta
    heads = rel(2) * ((16 + e0) + (4 + e1)) + eta
    assert sb.scores[0] == 20.0
    assert sb.bounds[0] == pytest.approx((e0 + e1 + heads) * (1 + 2.0 ** -20), rel=1e-12)
    # equal terms: Phi / sum = 135 / 16 ~ 8.4 roundings of kappa u each (half of gamma_15), plus the heads
    assert 1.0e-6 < sb.bounds[0] / 20.0 < 2.0e-6


# --------------------------------------------------------------------------- through the runner

def _midpoint_inputs(case, step, meta):
    """Generated inputs, with channel 0 of request 0's first pool (rows 0..3) equal to MID."""
    inputs = make_inputs(case, dataclasses.replace(step, inputs=None), meta)
    inputs["k"][0:4, 0] = MID
    return inputs


def _midpoint_case(values="random"):
    steps = [Step("prefill", BatchSpec([RequestSpec(0, 8, [4, 1], 1), RequestSpec(0, 5, [2], 2)]),
                  request_ids=[0, 1], seed=1, inputs=_midpoint_inputs),
             Step("draft", BatchSpec([RequestSpec(5, 3, [2], 2)]), request_ids=[1], seed=2, compute_topk=False)]
    return Case("midpoint", "small", SMALL, geometry(), steps, seed=9, values=values)


def _flipping_kernel(delta_ulps):
    """The reference, then request 0's pool 0 (page 4 row 0) channel 0 moved by ``delta_ulps``
    bf16 ulps away from the reference in the first call only: what a kernel whose fp32 value lands
    on the other side of the rounding midpoint stores."""
    ref, calls = _reference_forward(), []

    def forward(**kw):
        out = ref(**kw)
        calls.append(1)
        if len(calls) == 1:
            raw = bits(kw["compressed_cache"])
            b = int(raw[4, 0, 0, 0])
            assert b in (0x3F80, 0x3F81), hex(b)
            raw[4, 0, 0, 0] = b + (delta_ulps if b == 0x3F80 else -delta_ulps)
        return out
    return forward


def test_runner_certifies_a_rounding_boundary_and_carries_it():
    res = run(_midpoint_case(), _flipping_kernel(1))
    assert res.ok, res.failures
    rb = res.findings[res.findings["verdict"] == "rounding-boundary"]
    assert list(rb["step"]) == [0, 1] and list(rb["mismatches"]) == [1, 1]
    first = rb.iloc[0]
    assert (first["page"], first["page_row"], first["channel"], first["row"], first["position"],
            first["request"], first["pool_id"]) == (4, 0, 0, 3, 3, 0, 0)
    assert "inherited" in rb.iloc[1]["detail"]


def test_runner_fails_two_ulps_and_exact_data():
    res = run(_midpoint_case(), _flipping_kernel(2))
    bad = res.failures[res.failures["output"] == "compressed_cache"]
    assert set(bad["verdict"]) == {"cache-mismatch"} and list(bad["step"]) == [0, 1]
    assert (bad.iloc[0]["page"], bad.iloc[0]["channel"], bad.iloc[0]["row"]) == (4, 0, 3)
    res = run(_midpoint_case(values="exact"), _flipping_kernel(1))
    assert "cache-mismatch" in set(res.failures["verdict"]) and "rounding-boundary" not in set(res.findings["verdict"])


def test_runner_certifies_a_tie_and_fails_a_far_swap_and_a_tail():
    res = run(tie_case(), swapping_kernel(2))
    assert res.ok, res.failures
    (tie,) = res.findings[res.findings["verdict"] == "tie-equivalent"].to_dict("records")
    assert (tie["row"], tie["position"], tie["request"], tie["mismatches"]) == (11, 11, 0, 6 * 4)
    res = run(tie_case(), swapping_kernel(3))
    (bad,) = res.failures.to_dict("records")
    assert (bad["verdict"], bad["row"], bad["column"], bad["pool_id"]) == ("wrong-index", 11, 4, 1)
    res = run(tie_case(), swapping_kernel(2, tail_row=16))
    verdicts = dict(zip(res.findings["verdict"], res.findings["row"]))
    assert verdicts["wrong-tail"] == 16 and verdicts["wrong-index"] == 16 and verdicts["tie-equivalent"] == 11
    res = run(tie_case(values="exact"), swapping_kernel(2))
    assert set(res.failures["verdict"]) == {"wrong-index"}
    # the same swap between pools with bitwise-identical keys: not a tie any backend can produce
    res = run(tie_case(identical_keys=True), swapping_kernel(2))
    (bad,) = res.failures.to_dict("records")
    assert bad["verdict"] == "wrong-index" and "identical key" in bad["detail"], bad["detail"]


# --------------------------------------------------------------------------- determinism

def test_repeat_runs_must_be_bitwise_identical():
    ref, calls = _reference_forward(), []

    def flaky(**kw):     # every second call (the repeat) stores one different bit in the cache and the output
        out = ref(**kw)
        calls.append(1)
        if len(calls) % 2 == 0:
            bits(kw["compressed_cache"])[4, 0, 0, 5] ^= 1
            if out is not None:
                out[2, 0, 1] += 100
        return out
    res = run(_midpoint_case(), flaky, repeat=2)
    det = res.findings[res.findings["output"] == "determinism"]
    nd = det[det["verdict"] == "nondeterministic"].to_dict("records")
    located = {(r["step"], r["page"], r["page_row"], r["channel"], r["kernel"] if pd.notna(r["kernel"]) else None)
               for r in nd if pd.notna(r["page"])}
    assert located == {(0, 4, 0, 5, None), (1, 4, 0, 5, None)}       # a stand-in forward has no programs
    assert [(r["step"], r["row"], r["column"]) for r in nd if pd.isna(r["page"])] == [(0, 2, 1)]   # the indices
    ok = run(_midpoint_case(), ref, repeat=3)
    assert ok.ok and set(ok.findings.loc[ok.findings["output"] == "determinism", "verdict"]) == {"exact"}
    with pytest.raises(ValueError):
        run(_midpoint_case(), ref, repeat=0)
