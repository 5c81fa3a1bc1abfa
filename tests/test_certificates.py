"""Certified exceptions, triage classes and localisation (parity-contract.md §3, §6).

Our kernels are bitwise-exact by construction, so these tests *construct* the differing outputs a
kernel with another ``exp`` or accumulation order would produce: a bf16 element flipped to the
adjacent value where the exact pooled value sits on the rounding midpoint, index rows with two
near-tied pools swapped. Each certificate is shown to pass exactly those and to fail a 2-ulp
difference, an adjacent value far from the midpoint, a swap far from the boundary, a changed tail,
and anything on exact data. Localisation is checked against the real kernels with probe mutants
that store their own ``tl.program_id`` instead of the result.

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_certificates.py``.
"""
from __future__ import annotations

import os
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from cases.spec import CacheGeometry, Case, Step
from cases.values import exact_logit_inputs, make_inputs
from kpool.config import SMALL
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from parity import certificates as certs
from parity import compare as cmp
from reference.numerics import canonical_topk, expand_row, pool_scores, sanitize_scores

P, K, W, D, H = SMALL.index_kpool, SMALL.index_topk, SMALL.output_width, SMALL.index_head_dim, SMALL.index_n_heads
MID = 1.0 + 2.0 ** -8            # midpoint of bf16 1.0 (0x3F80) and 1.0078125 (0x3F81)
ULP1 = 2.0 ** -23                # fp32 ulp at 1.0..2.0


def _reference_forward():
    from reference.stateful import forward
    return forward


def _run(case, kernel, **kw):
    from parity.runner import run_case
    return run_case(case, device=os.environ.get("KPOOL_DEVICE", "cpu"), kernel_forward=kernel, **kw)


# --------------------------------------------------------------------------- §3.1 unit level

def _window_case(k_value: float, budget=32):
    """A compressed cache [2, 2, 1, D] whose row (1, 0) was written from a window whose channel 0
    keys all equal ``k_value`` (so y64[0] == k_value up to float64 rounding) and channel 1 keys
    all 0.5 (y64 = 0.5, exactly a bf16 value); random gates and APE (non-trivial softmax)."""
    g = torch.Generator().manual_seed(3)
    kw = torch.randn(P, D, generator=g)
    kw[:, 0] = k_value
    kw[:, 1] = 0.5
    gate = torch.randn(P, D, generator=g) * 2
    ape = torch.randn(P, D, generator=g)
    win = certs.PoolWindow(row=7, position=7, request=0, k=kw, gate=gate)
    y = torch.tensor(certs.pooled_value_f64(kw.numpy(), gate.numpy(), ape.numpy()), dtype=torch.float32)
    ref = torch.zeros(2, 2, 1, D, dtype=torch.bfloat16)
    ref[1, 0, 0] = y.to(torch.bfloat16)
    ctx = certs.RoundingContext(windows={(1, 0): win}, ape=ape, budget_ulps=budget)
    return ref, ctx


def _flip(cache, where, delta):
    out = cache.clone()
    out.view(torch.int16)[where] += delta
    return out


def test_near_midpoint_element_is_certified():
    ref, ctx = _window_case(MID)
    bits = int(ref.view(torch.int16)[1, 0, 0, 0])
    assert bits in (0x3F80, 0x3F81)
    kern = _flip(ref, (1, 0, 0, 0), 1 if bits == 0x3F80 else -1)      # the other side of the midpoint
    rows = cmp.compare_compressed(kern, ref, context=ctx)
    assert [(r["verdict"], r["mismatches"], r["page"], r["page_row"], r["channel"]) for r in rows] == \
        [("rounding-boundary", 1, 1, 0, 0)]
    assert ctx.carried == {(1, 0, 0): (int(kern.view(torch.int16)[1, 0, 0, 0]), bits)}


def test_two_ulp_difference_fails_with_location():
    ref, ctx = _window_case(MID)
    kern = _flip(ref, (1, 0, 0, 0), 2)
    (row,) = cmp.compare_compressed(kern, ref, context=ctx)
    assert (row["verdict"], row["mismatches"], row["page"], row["page_row"], row["channel"]) == \
        ("cache-mismatch", 1, 1, 0, 0)
    assert "2 bf16 ulps apart" in row["detail"]


def test_adjacent_value_far_from_midpoint_fails():
    ref, ctx = _window_case(MID)
    assert float(ref[1, 0, 0, 1]) == 0.5          # y64 = 0.5 exactly: as far from a midpoint as can be
    kern = _flip(ref, (1, 0, 0, 1), 1)
    (row,) = cmp.compare_compressed(kern, ref, context=ctx)
    assert (row["verdict"], row["channel"]) == ("cache-mismatch", 1)
    assert "fp32 ulps from the midpoint" in row["detail"]


@pytest.mark.parametrize("offset_ulps, certified", [(0, True), (30, True), (-30, True), (34, False), (-34, False)])
def test_budget_is_the_boundary(offset_ulps, certified):
    """y64 = MID + offset * ulp: certified iff |offset| <= budget (32)."""
    ref, ctx = _window_case(MID + offset_ulps * ULP1)
    kern = _flip(ref, (1, 0, 0, 0), 1 if int(ref.view(torch.int16)[1, 0, 0, 0]) == 0x3F80 else -1)
    (row,) = cmp.compare_compressed(kern, ref, context=ctx)
    assert row["verdict"] == ("rounding-boundary" if certified else "cache-mismatch")


def test_no_certificate_without_context_or_window():
    ref, ctx = _window_case(MID)
    kern = _flip(ref, (1, 0, 0, 0), 1 if int(ref.view(torch.int16)[1, 0, 0, 0]) == 0x3F80 else -1)
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref)] == ["cache-mismatch"]   # exact data
    # a row the step did not write has no window: not certified (unless carried, below)
    moved_ref, moved_kern = torch.roll(ref, 1, 0), torch.roll(kern, 1, 0)
    (row,) = cmp.compare_compressed(moved_kern, moved_ref, context=ctx)
    assert row["verdict"] == "cache-mismatch" and "no window" in row["detail"]
    # carried: certified in an earlier step with the same bits; any other bits are judged afresh
    cmp.compare_compressed(kern, ref, context=ctx)
    later = certs.RoundingContext(windows={}, ape=ctx.ape, budget_ulps=32, carried=ctx.carried)
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref, context=later)] == ["rounding-boundary"]
    assert [r["verdict"] for r in cmp.compare_compressed(_flip(kern, (1, 0, 0, 0), 2), ref, context=later)] == \
        ["cache-mismatch"]


def test_nan_and_sign_of_zero_are_never_certified():
    ref, ctx = _window_case(MID)
    kern = ref.clone()
    kern[1, 0, 0, 0] = float("nan")
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref, context=ctx)] == ["nan-introduced"]
    zero_r, zero_k = ref.clone(), ref.clone()
    zero_r[1, 0, 0, 2], zero_k[1, 0, 0, 2] = 0.0, -0.0
    assert [r["verdict"] for r in cmp.compare_compressed(zero_k, zero_r, context=ctx)] == ["cache-mismatch"]


def test_budgets_are_declared_per_backend():
    assert set(certs.ROUNDING_BUDGET_ULPS) == {"cpu", "cuda", "npu"}
    assert all(10 <= b <= 100 for b in certs.ROUNDING_BUDGET_ULPS.values())   # "a few tens of ulps"
    import inspect
    src = inspect.getsource(certs)
    doc = src[src.index("ROUNDING_BUDGET_ULPS: Dict"):src.index("DEFAULT_BACKEND")]
    assert "platform-numerics.md §4.1" in doc and "tl.exp" in doc      # justified from the measurements
    assert certs.gamma(10) == pytest.approx(10 * 2.0 ** -24 / (1 - 10 * 2.0 ** -24))
    assert float(certs.fp32_ulp(np.array([1.0]))[0]) == ULP1


# --------------------------------------------------------------------------- §3.2 unit level

def _tie_setup():
    """One request of 17 tokens (positions 0..16, 4 complete pools on pages [0, 1], B=2) and a
    cache whose pools score, for every row: pool 0 highest, pools 1 and 2 tied to within 2^-27 of
    the score (far inside the fp32 bound), pool 3 far below. q = 1 (head 0) / 0.5 (head 1),
    weights = 1 / 0.5."""
    meta = build_metadata(BatchSpec([RequestSpec(0, 17, [0, 1], 0)]), index_kpool=P, ring_capacity=P, page_size=2)
    T = meta.num_tokens
    cache = torch.zeros(2, 2, 1, D, dtype=torch.bfloat16)
    cache[0, 0, 0] = 1.0                                  # pool 0
    cache[0, 1, 0] = 0.5                                  # pool 1
    cache[1, 0, 0] = 0.5                                  # pool 2 ~ pool 1
    cache[0, 1, 0, D - 1] = 2.0 ** -20
    cache[1, 0, 0, D - 1] = 2.0 ** -20 * (1 + 2.0 ** -7)
    cache[1, 1, 0] = 0.25                                 # pool 3
    q = torch.ones(T, H, D, dtype=torch.bfloat16)
    q[:, 1] = 0.5
    weights = torch.tensor([[1.0, 0.5]] * T)
    rows = []
    pools = torch.stack([cache[j // 2, j % 2, 0] for j in range(4)])
    for t in range(T):
        p = int(meta.positions[t])
        vis = torch.tensor([min((p + 1) // P, 4)])
        s = sanitize_scores(pool_scores(q[t:t + 1], weights[t:t + 1], pools, "relu"), vis)
        ids, valid = canonical_topk(s, 2)
        rows.append(expand_row(ids[0].tolist(), valid[0].tolist(), p, index_topk=K, index_kpool=P,
                               pack_tail=True, width=W))
    ref = torch.tensor(rows, dtype=torch.int32).unsqueeze(1)
    ctx = certs.TieContext(q=q, weights=weights, kernel_cache=cache, reference_cache=cache,
                           positions=meta.positions, cum_query_lens=meta.cum_query_lens, seq_lens=meta.seq_lens,
                           block_table=meta.block_table, index_topk=K, index_kpool=P)
    return meta, ref, ctx


def _swap_pool(rows, t, old, new):
    out = rows.clone()
    for c in range(K):
        if int(out[t, 0, c]) // P == old and int(out[t, 0, c]) >= 0:
            out[t, 0, c] = new * P + c % P
    return out


def _cmp(kern, ref, meta, ctx):
    return cmp.compare_indices(kern, ref, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
                               index_topk=K, index_kpool=P, pack_tail=True, compute_topk=True, context=ctx)


def test_near_tie_swap_at_the_boundary_is_certified():
    meta, ref, ctx = _tie_setup()
    # fp32 scores of pools 1 and 2 are equal (the 2^-27 difference is absorbed), so the canonical
    # row takes the lower id; exactly, pool 2 is higher: a kernel may well pick it.
    assert ref[16, 0, :8].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    kern = ref
    for t in (12, 16):                                                # rows that see pools 1 and 2
        kern = _swap_pool(kern, t, 1, 2)
    rows = _cmp(kern, ref, meta, ctx)
    assert [(r["verdict"], r["mismatches"], r["row"], r["position"], r["request"]) for r in rows] == \
        [("tie-equivalent", 8, 12, 12, 0)]


def test_near_tie_rank_swap_inside_the_selection_is_certified():
    meta, ref, ctx = _tie_setup()
    # make pool 1 and 2 the top two: then the kernel may rank them either way
    ctx.kernel_cache[0, 0, 0] = 0.125        # kernel_cache is reference_cache: scores 2 > 1 > 0 > 3
    t = 16
    row = expand_row([2, 1], [True, True], 16, index_topk=K, index_kpool=P, pack_tail=True, width=W)
    kern_row = expand_row([1, 2], [True, True], 16, index_topk=K, index_kpool=P, pack_tail=True, width=W)
    ref = ref.clone()
    ref[t, 0] = torch.tensor(row)
    kern = ref.clone()
    kern[t, 0] = torch.tensor(kern_row)
    assert [r["verdict"] for r in _cmp(kern, ref, meta, ctx)] == ["tie-equivalent"]


def test_swap_far_from_the_boundary_fails_with_location():
    meta, ref, ctx = _tie_setup()
    kern = _swap_pool(ref, 16, 1, 3)                                  # pool 3 is far below the boundary
    (row,) = _cmp(kern, ref, meta, ctx)
    assert (row["verdict"], row["mismatches"], row["row"], row["position"], row["request"], row["column"],
            row["pool_id"]) == ("wrong-index", 4, 16, 16, 0, 4, 1)
    assert "not a tie" in row["detail"] and "pool 3" in row["detail"]


def test_changed_tail_fails_and_blocks_the_tie_certificate():
    meta, ref, ctx = _tie_setup()
    kern = _swap_pool(_swap_pool(ref, 12, 1, 2), 16, 1, 2)
    kern[16, 0, 8] += 1                                               # p=16: tail column K_tok=8
    rows = {r["verdict"]: r for r in _cmp(kern, ref, meta, ctx)}
    assert set(rows) == {"wrong-tail", "tie-equivalent", "wrong-index"}
    assert (rows["wrong-tail"]["row"], rows["wrong-tail"]["column"], rows["wrong-tail"]["position"]) == (16, 8, 16)
    assert rows["tie-equivalent"]["row"] == 12 and rows["tie-equivalent"]["mismatches"] == 4
    assert rows["wrong-index"]["row"] == 16 and "tail columns differ" in rows["wrong-index"]["detail"]


def test_ties_need_a_context_and_well_formed_rows():
    meta, ref, ctx = _tie_setup()
    kern = _swap_pool(ref, 16, 1, 2)
    assert [r["verdict"] for r in _cmp(kern, ref, meta, None)] == ["wrong-index"]         # exact data
    dup = ref.clone()
    dup[16, 0, 4:8] = dup[16, 0, 0:4]                                                      # pool 0 twice
    (row,) = _cmp(dup, ref, meta, ctx)
    assert row["verdict"] == "wrong-index" and "well-formed" in row["detail"]
    empty = ref.clone()
    empty[16, 0, 4:8] = -1                                                                 # a -1 slot
    (row,) = _cmp(empty, ref, meta, ctx)
    assert row["verdict"] == "wrong-index" and "-1 slots differ" in row["detail"]


def test_tie_bound_is_the_proven_accumulation_bound():
    _, _, ctx = _tie_setup()
    scores, bounds = certs.row_scores_f64(ctx, 16, ctx.reference_cache)
    assert scores.shape == (4,) and scores[2] > scores[1] and scores[2] - scores[1] < 1e-8
    n = certs.score_terms(H, D)
    assert n == D + H + 1
    # pool 0: sum_{h,d} |w q c| = 16 * (1 * 1 + 0.5 * 0.5)
    assert bounds[0] == pytest.approx(certs.gamma(n) * 16 * 1.25)


# --------------------------------------------------------------------------- through the runner

def _geometry():
    return CacheGeometry(num_pages=8, page_size=2, num_tail_blocks=4, page_padding=3, ring_block_padding=5, guard=16)


def _midpoint_inputs(case, step, meta):
    """Generated inputs, with channel 0 of request 0's first pool (rows 0..3) equal to MID."""
    inputs = make_inputs(case, dataclasses.replace(step, inputs=None), meta)
    inputs["k"][0:4, 0] = MID
    return inputs


def _midpoint_case(values="random"):
    steps = [Step("prefill", BatchSpec([RequestSpec(0, 8, [4, 1], 1), RequestSpec(0, 5, [2], 2)]),
                  request_ids=[0, 1], seed=1, inputs=_midpoint_inputs),
             Step("draft", BatchSpec([RequestSpec(5, 3, [2], 2)]), request_ids=[1], seed=2, compute_topk=False)]
    return Case("midpoint", "small", SMALL, _geometry(), steps, seed=9, values=values)


def _flipping_kernel(delta_ulps):
    """The reference, then request 0's pool 0 (page 4 row 0) channel 0 moved by ``delta_ulps``
    bf16 ulps away from the reference in the first call only: what a kernel whose fp32 value lands
    on the other side of the rounding midpoint stores."""
    ref, calls = _reference_forward(), []

    def forward(**kw):
        out = ref(**kw)
        calls.append(1)
        if len(calls) == 1:
            bits = kw["compressed_cache"].view(torch.int16)
            b = int(bits[4, 0, 0, 0])
            assert b in (0x3F80, 0x3F81), hex(b)
            bits[4, 0, 0, 0] = b + (delta_ulps if b == 0x3F80 else -delta_ulps)
        return out
    return forward


def test_runner_certifies_a_rounding_boundary_and_carries_it():
    res = _run(_midpoint_case(), _flipping_kernel(1))
    assert res.ok, res.failures
    rb = res.findings[res.findings["verdict"] == "rounding-boundary"]
    assert list(rb["step"]) == [0, 1] and list(rb["mismatches"]) == [1, 1]
    first = rb.iloc[0]
    assert (first["page"], first["page_row"], first["channel"], first["row"], first["position"],
            first["request"], first["pool_id"]) == (4, 0, 0, 3, 3, 0, 0)
    assert "inherited" in rb.iloc[1]["detail"]


def test_runner_fails_two_ulps_and_exact_data():
    res = _run(_midpoint_case(), _flipping_kernel(2))
    bad = res.failures[res.failures["output"] == "compressed_cache"]
    assert set(bad["verdict"]) == {"cache-mismatch"} and list(bad["step"]) == [0, 1]
    assert (bad.iloc[0]["page"], bad.iloc[0]["channel"], bad.iloc[0]["row"]) == (4, 0, 3)
    res = _run(_midpoint_case(values="exact"), _flipping_kernel(1))
    assert "cache-mismatch" in set(res.failures["verdict"]) and "rounding-boundary" not in set(res.findings["verdict"])


def _tie_case(values="random", identical_keys=False):
    """Exact-logit pools [3, 2, 2, 1]: pools 1 and 2 tie exactly (K_pool = 2 picks 0 and 1).
    Their keys differ (pool 1 also has 1.0 in channel 1, which no query reads) unless
    ``identical_keys``: identical keys score identically on every backend, so no swap of them
    is ever a legitimate tie."""
    base = exact_logit_inputs({0: [3.0, 2.0, 2.0, 1.0]})

    def inputs(case, step, meta):
        x = base(case, step, meta)
        if not identical_keys:
            pool1 = (meta.positions.cpu() // P == 1) & (torch.arange(meta.num_tokens) < meta.num_live_tokens)
            x["k"][pool1, 1] = 1.0
        return x
    steps = [Step("prefill", BatchSpec([RequestSpec(0, 17, [4, 1], 1)]), request_ids=[0], seed=1, inputs=inputs)]
    return Case("tie", "small", SMALL, _geometry(), steps, ape=torch.zeros(P, D), seed=4, values=values)


def _swapping_kernel(new_pool, tail_row=None):
    ref = _reference_forward()

    def forward(**kw):
        out = ref(**kw)
        pos = kw["positions"]
        for t in range(out.shape[0]):
            if int(pos[t]) >= 11:                                    # rows that see pools 0, 1, 2
                for c in range(K):
                    if int(out[t, 0, c]) // P == 1 and int(out[t, 0, c]) >= 0:
                        out[t, 0, c] = new_pool * P + c % P
        if tail_row is not None:
            out[tail_row, 0, K] += 1
        return out
    return forward


def test_runner_certifies_a_tie_and_fails_a_far_swap_and_a_tail():
    res = _run(_tie_case(), _swapping_kernel(2))
    assert res.ok, res.failures
    (tie,) = res.findings[res.findings["verdict"] == "tie-equivalent"].to_dict("records")
    assert (tie["row"], tie["position"], tie["request"], tie["mismatches"]) == (11, 11, 0, 6 * 4)
    res = _run(_tie_case(), _swapping_kernel(3))
    (bad,) = res.failures.to_dict("records")
    assert (bad["verdict"], bad["row"], bad["column"], bad["pool_id"]) == ("wrong-index", 11, 4, 1)
    res = _run(_tie_case(), _swapping_kernel(2, tail_row=16))
    verdicts = dict(zip(res.findings["verdict"], res.findings["row"]))
    assert verdicts["wrong-tail"] == 16 and verdicts["wrong-index"] == 16 and verdicts["tie-equivalent"] == 11
    res = _run(_tie_case(values="exact"), _swapping_kernel(2))
    assert set(res.failures["verdict"]) == {"wrong-index"}
    # the same swap between pools with bitwise-identical keys: not a tie any backend can produce
    res = _run(_tie_case(identical_keys=True), _swapping_kernel(2))
    (bad,) = res.failures.to_dict("records")
    assert bad["verdict"] == "wrong-index" and "identical key" in bad["detail"], bad["detail"]


# --------------------------------------------------------------------------- determinism

def test_repeat_runs_must_be_bitwise_identical():
    ref, calls = _reference_forward(), []

    def flaky(**kw):     # every second call (the repeat) stores one different bit in the cache and the output
        out = ref(**kw)
        calls.append(1)
        if len(calls) % 2 == 0:
            kw["compressed_cache"].view(torch.int16)[4, 0, 0, 5] ^= 1
            if out is not None:
                out[2, 0, 1] += 100
        return out
    res = _run(_midpoint_case(), flaky, repeat=2)
    det = res.findings[res.findings["output"] == "determinism"]
    nd = det[det["verdict"] == "nondeterministic"].to_dict("records")
    located = {(r["step"], r["page"], r["page_row"], r["channel"], r["kernel"] if pd.notna(r["kernel"]) else None)
               for r in nd if pd.notna(r["page"])}
    assert located == {(0, 4, 0, 5, None), (1, 4, 0, 5, None)}       # a stand-in forward has no programs
    assert [(r["step"], r["row"], r["column"]) for r in nd if pd.isna(r["page"])] == [(0, 2, 1)]   # the indices
    ok = _run(_midpoint_case(), ref, repeat=3)
    assert ok.ok and set(ok.findings.loc[ok.findings["output"] == "determinism", "verdict"]) == {"exact"}
    with pytest.raises(ValueError):
        _run(_midpoint_case(), ref, repeat=0)


# --------------------------------------------------------------------------- program ids (real kernels)

PROBES = {
    # each kernel stores its own program id instead of its result (probe, not a fault)
    "probe-compress": ("ops/compress.py",
                       "tl.store(cache_ptr + dst[:, None] + dims[None, :] * stride_cache_d, bf16_rne_int16(out),",
                       "tl.store(cache_ptr + dst[:, None] + dims[None, :] * stride_cache_d, "
                       "(tl.zeros_like(out) + tl.program_id(0)).to(tl.int16),",
                       None),
    "probe-ring": ("ops/compress.py",
                   "tl.store(tail_ptr + dst[:, None] + dims[None, :] * stride_tail_d, kv, mask=mask)",
                   "tl.store(tail_ptr + dst[:, None] + dims[None, :] * stride_tail_d, tl.zeros_like(kv) + pid, mask=mask)",
                   None),
    "probe-expand": ("ops/expand.py",
                     "tl.store(out_ptr + row0.to(tl.int64) * stride_out_t + out_offs, val,",
                     "tl.store(out_ptr + row0.to(tl.int64) * stride_out_t + out_offs, tl.zeros_like(val) + pid,",
                     None),
}


def _probe_batch(torch_device):
    """Two requests of 150 and 110 rows: 260 live rows -> two compression tiles of 256 rows on the
    interpreter (and many ring-write and expansion tiles)."""
    from tests.helpers import small_batch
    return small_batch(SMALL, requests=((0, 150), (0, 110)), num_pages=40, seed=5, device=torch_device)


def test_program_ids_match_what_the_kernels_report(device, torch_device):
    from parity import programs
    from parity.mutants import load_mutant
    from kpool.platform import resolve_device
    resolve_device(device)
    caches, kw = _probe_batch(torch_device)
    T = kw["positions"].shape[0]
    pos, slots, tslots = kw["positions"].tolist(), kw["slot_mapping"].tolist(), kw["tail_slot_mapping"].tolist()
    cap = programs.grid_cap(device, torch_device)
    seen = set()
    # compression: every written compressed row holds the id of the program that wrote it
    load_mutant("probe-compress", mutation=PROBES["probe-compress"]).forward(**kw)
    for t in range(T):
        if slots[t] >= 0:
            want = programs.cache_update_program(t, num_rows=T, head_dim=D, backend=device, device=torch_device)
            got = int(caches.compressed_cache.cpu().view(torch.int16)[slots[t] // 2, slots[t] % 2, 0, 0])
            assert got == want, (t, got, want)
            seen.add(want)
    assert len(seen) > 1, "the probe batch should span several programs"
    # ring write: the K plane of every written ring row
    caches, kw = _probe_batch(torch_device)
    load_mutant("probe-ring", mutation=PROBES["probe-ring"]).forward(**kw)
    C = SMALL.ring_capacity
    for t in (146, 147, 148, 149, 256, 257, 258, 259):              # the last C rows of each request
        want = programs.cache_update_program(t, num_rows=T, head_dim=D, backend=device, kernel="ring_write",
                                             device=torch_device)
        assert int(caches.tail_cache.cpu().view(torch.int32)[tslots[t] // C, 0, tslots[t] % C, 0]) == want
    # expansion: every output element
    caches, kw = _probe_batch(torch_device)
    out = load_mutant("probe-expand", mutation=PROBES["probe-expand"]).forward(**kw)[:, 0].cpu()
    want = torch.tensor([[programs.expand_program(t, c, num_rows=T, width=W, backend=device) for c in range(W)]
                         for t in range(T)], dtype=torch.int32)
    assert torch.equal(out, want)


def test_findings_name_the_writing_program(device, torch_device):
    from parity import programs
    from parity.mutants import load_mutant
    from kpool.platform import resolve_device
    resolve_device(device)
    mutant = load_mutant("ape-reversed")
    steps = [Step("prefill", BatchSpec([RequestSpec(0, 60, list(range(8)), 1), RequestSpec(0, 40, list(range(8, 13)), 2)]),
                  request_ids=[0, 1], seed=1)]
    geo = CacheGeometry(num_pages=16, page_size=2, num_tail_blocks=4, guard=8)
    res = _run(Case("programs", "small", SMALL, geo, steps, seed=2), mutant.forward, check_oracle=False)
    (cache,) = res.failures[res.failures["output"] == "compressed_cache"].to_dict("records")
    assert cache["kernel"] == "compress" and cache["row"] == 3 and cache["pool_id"] == 0
    assert cache["program_id"] == programs.cache_update_program(3, num_live=100, head_dim=D, backend=device,
                                                                cap=programs.grid_cap(device, torch_device))
    idx = res.failures[res.failures["output"] == "indices"].to_dict("records")
    if idx:   # reversed APE changes the pooled keys; if it changes a selection, expansion is named
        r = idx[0]
        assert r["kernel"] == "expand"
        assert r["program_id"] == programs.expand_program(r["row"], r["column"], num_rows=100, width=W, backend=device)
        assert "_score_kernel" in r["detail"]


def test_exact_ties_broken_toward_the_higher_id_are_not_certified(monkeypatch):
    """Random-data seed case: rows whose relu scores are provably exactly zero (every head's dot
    below minus its accumulation bound) tie on every backend, so a top-k that breaks them toward
    the higher pool id is wrong-index, not tie-equivalent (it used to be certified)."""
    from cases.scenarios import prefill_topk
    from kpool.indexer import forward as kernel_forward
    from kpool.ops import indexer as ki

    real_select = ki.select_topk

    def ties_to_higher_id(keys, selected, out=None):
        # the fault: the low word keys the pool id itself (not inverted), so exact ties go to
        # the higher id
        n = keys.shape[1]
        flipped = (keys & ~0xFFFFFFFF) | torch.arange(n, dtype=torch.int64, device=keys.device)
        top = real_select(flipped, selected)
        fixed = (top & ~0xFFFFFFFF) | (0xFFFFFFFF - (top & 0xFFFFFFFF))
        if out is not None:
            out[0].copy_(fixed)
        return fixed

    monkeypatch.setattr(ki, "select_topk", ties_to_higher_id)
    res = _run(prefill_topk("small"), kernel_forward, check_oracle=False)
    assert "tie-equivalent" not in set(res.findings["verdict"])
    bad = res.failures[res.failures["verdict"] == "wrong-index"]
    assert not bad.empty and bad["detail"].str.contains("exact ties go to the lower id").any()
