"""Hypothesis strategies and generated batches (cases.strategies, cases.genvalues, cases.patches,
parity.findings.coverage, parity.running.generated).

* the bit-pattern value constructors and every value family are bit-exact by construction;
* drawn configs and batches are valid (metadata builds; bad-metadata steps are rejected by the
  harness-side check exactly when the kernel's validation rejects them);
* the ``ci`` budget of generated batches passes kernel vs reference vs oracle and reports its
  coverage;
* planted faults (parity.implementations.mutants) are found within that budget and shrink to small cases that
  the corpus keeps.

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_strategies.py``.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from cases import genvalues as gv
from cases.patches import MetadataPatch
from cases.steps import step_metadata
from parity.checking.checked_reference import check_metadata
from cases.strategies import TINY, batch_cases, configs, engine_cases, scaled
from kpool.config import KPoolConfig
from kpool.errors import KPoolBlockIdError
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from tests.helpers import assert_generated_run_covers, assert_planted_fault_found_and_shrunk
from parity.checking.compare import assert_bitwise_equal, bits, same_bits

QUICK = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- bit-exact values ---------------------------------------------------------------------------

def test_bf16_and_fp32_from_fields_are_the_bit_patterns():
    one = gv.bf16_from_fields(torch.tensor([0, 1, 0]), torch.tensor([127, 128, 0]), torch.tensor([0, 64, 1]))
    assert bits(one).tolist() == [0x3F80, (0xC000 | 0x40) - 0x10000, 1]
    assert one.to(torch.float32).tolist()[:2] == [1.0, -3.0]
    assert one[2].item() == 2.0 ** -133                                   # a bf16 subnormal, exactly
    f = gv.fp32_from_fields(torch.tensor([1]), torch.tensor([127]), torch.tensor([1]))
    assert bits(f).item() == -(2 ** 31) + (127 << 23) + 1


def test_random_values_are_generated_from_bits():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x = gv.random_bf16((64,), g1, -3, 1)
    sign = torch.randint(0, 2, (64,), generator=g2)
    exp = torch.randint(124, 129, (64,), generator=g2)
    man = torch.randint(0, 128, (64,), generator=g2)
    raw = bits(x).to(torch.int32) & 0xFFFF
    assert_bitwise_equal(raw >> 15, sign.to(torch.int32))
    assert_bitwise_equal((raw >> 7) & 0xFF, exp.to(torch.int32))
    assert_bitwise_equal(raw & 0x7F, man.to(torch.int32))
    y = gv.random_fp32((256,), torch.Generator().manual_seed(1), -3, 2)
    e = (bits(y) >> 23) & 0xFF
    assert int(e.min()) >= 124 and int(e.max()) <= 129


def _meta(config, requests, **kw):
    return build_metadata(BatchSpec([RequestSpec(c, q, bt, ring) for c, q, bt, ring in requests], **kw),
                          index_kpool=config.index_kpool, ring_capacity=config.ring_capacity, page_size=2)


@pytest.mark.parametrize("family", gv.FAMILIES)
def test_value_families_are_exact_and_deterministic(family):
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=8, index_kpool=4, index_topk=8)
    meta = _meta(cfg, [(0, 9, [0, 1, 2], 1), (5, 3, [3, 4], 0)], num_tokens=14, full_mode=True)
    spec = gv.ValueSpec(family=family, seed=3, pool_seed=7, weights_bf16=family == "random")
    a = gv.generate_inputs(spec, cfg, meta, [10, 11])
    b = gv.generate_inputs(spec, cfg, meta, [10, 11])
    for name in a:
        assert_bitwise_equal(a[name], b[name], name=name)
    assert a["k"].dtype == torch.float32 and a["q"].dtype == torch.bfloat16
    # every K is a bf16 value widened to fp32 (the ring holds such values, kpool-algorithm.md §2)
    assert_bitwise_equal(a["k"].to(torch.bfloat16).to(torch.float32), a["k"])
    if family == "exact":
        assert same_bits(a["k"][:12] * 4, (a["k"][:12] * 4).round()) and float(a["k"][:12].abs().max()) <= 1
        assert not a["gate"][:12].any()
    if family in ("ties", "near-ties"):
        values = gv.TIE_VALUES if family == "ties" else gv.NEAR_TIE_VALUES
        pos = meta.positions.tolist()
        for t in range(12):
            rid = 10 if t < 9 else 11
            assert float(a["k"][t, 0]) == gv.pool_value(values, 7, rid, pos[t] // 4)
            assert not a["k"][t, 1:].any()
    assert a["weights"].dtype == (torch.bfloat16 if spec.weights_bf16 else torch.float32)
    # padding rows get the large garbage of cases.values
    assert float(a["k"][12:].min()) >= 96.0


def test_tie_values_are_a_function_of_request_and_pool_only():
    cfg = KPoolConfig(index_n_heads=1, index_head_dim=4, index_kpool=4, index_topk=8)
    spec = gv.ValueSpec(family="ties", seed=1, pool_seed=9)
    chunked = gv.generate_inputs(spec, cfg, _meta(cfg, [(6, 2, [0, 1], 0)]), [3])
    other_step = gv.generate_inputs(gv.ValueSpec(family="ties", seed=2, pool_seed=9), cfg,
                                    _meta(cfg, [(4, 4, [0, 1], 0)]), [3])
    # positions 6, 7 (pool 1) agree across two different steps
    assert_bitwise_equal(chunked["k"][:2], other_step["k"][2:4])


def test_specials_are_injected_where_asked_and_nowhere_else():
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=4, index_kpool=4, index_topk=8)
    meta = _meta(cfg, [(0, 5, [0, 1, 2], 0)])
    plain = gv.generate_inputs(gv.ValueSpec(seed=4), cfg, meta, [0])
    specials = (gv.Special("q", 7, 6, "nan"), gv.Special("weights", 2, 3, "+inf"),
                gv.Special("k", 1, 2, "-inf"), gv.Special("gate", 0, 0, "nan"))
    hit = gv.generate_inputs(gv.ValueSpec(seed=4, specials=specials), cfg, meta, [0])
    assert torch.isnan(hit["q"][2, 1, 2].float()) and hit["weights"][2, 1] == float("inf")
    assert hit["k"][1, 2] == float("-inf") and torch.isnan(hit["gate"][0, 0])
    for name, where in (("q", (2, 1, 2)), ("weights", (2, 1)), ("k", (1, 2)), ("gate", (0, 0))):
        a, b = plain[name].clone().float(), hit[name].clone().float()
        a[where] = b[where] = 0
        assert_bitwise_equal(a, b, name=str(name))
    spec = gv.ValueSpec(family="near-ties", seed=1, specials=specials, weights_bf16=True)
    assert gv.ValueSpec.from_json(spec.to_json()) == spec


# ---- configs and batches ------------------------------------------------------------------------

@QUICK
@given(configs())
def test_configs_are_valid_and_within_bounds(cfg):
    P = cfg.index_kpool
    assert P in TINY.kpools and cfg.index_topk % P == 0 and 1 <= cfg.topk_pools <= TINY.max_topk_pools
    assert cfg.ring_capacity >= P + cfg.num_speculative_tokens
    assert cfg.index_n_heads <= TINY.max_heads and cfg.index_head_dim in TINY.head_dims


@QUICK
@given(configs(scaled(TINY, undersized_ring=True)))
def test_undersized_ring_bounds_plant_c_equal_p(cfg):
    assert cfg.ring_capacity == cfg.index_kpool and cfg.num_speculative_tokens >= 2


def _check_case_metadata(case):
    """Every non-error step builds; bad-metadata steps are rejected by check_metadata and by the
    kernel's validation, with the out-of-range ring block the patch planted."""
    from kpool.validation import validate_forward
    cfg, geo = case.config, case.geometry
    for step in case.steps:
        meta = step_metadata(case, step)
        shapes = dict(compressed_cache=torch.empty(geo.num_pages, geo.page_size, 1, cfg.index_head_dim,
                                                   dtype=torch.bfloat16),
                      tail_cache=torch.empty(geo.num_tail_blocks, 2, cfg.ring_capacity, cfg.index_head_dim))
        T, H, D = meta.num_tokens, cfg.index_n_heads, cfg.index_head_dim
        kwargs = dict(k=torch.zeros(T, D), gate=torch.zeros(T, D), q=torch.zeros(T, H, D, dtype=torch.bfloat16),
                      weights=torch.zeros(T, H), ape=torch.zeros(cfg.index_kpool, D), **shapes,
                      **meta.forward_kwargs(), index_topk=cfg.index_topk, index_kpool=cfg.index_kpool,
                      score_mode=cfg.score_mode, compute_topk=step.compute_topk, output_buffer=None)
        if step.expect_error is None:
            check_metadata(**kwargs)
            assert validate_forward(**kwargs) == meta.num_live_tokens
            assert len(set(r.ring_block for r in step.batch.requests)) == len(step.batch.requests)
        else:
            with pytest.raises(ValueError, match="metadata rejected"):
                check_metadata(**kwargs)
            with pytest.raises(KPoolBlockIdError):
                validate_forward(**kwargs)


@QUICK
@given(batch_cases())
def test_batch_cases_are_valid(case):
    assert 1 <= len(case.steps) <= 2 and case.name.startswith("gen-batch-")
    _check_case_metadata(case)


@QUICK
@given(engine_cases())
def test_engine_cases_are_valid(case):
    assert 1 <= len(case.steps) <= TINY.max_steps
    _check_case_metadata(case)


def test_ring_block_patch_and_stale_lengths():
    cfg = KPoolConfig(index_n_heads=1, index_head_dim=4, index_kpool=4, index_topk=8)
    meta = _meta(cfg, [(0, 3, [0], 1), (2, 2, [1], 0)], num_tokens=6, full_mode=True, num_padded_requests=2,
                 block_table_width=2)
    bad = MetadataPatch("ring-block-out-of-range", (1, 3537, 4))(meta)
    assert bad.tail_block_table[:, 0].tolist() == [1, 3537, 0, 0]
    assert bad.tail_slot_mapping[3:5].tolist() == [3537 * 4 + 2, 3537 * 4 + 3]
    assert_bitwise_equal(bad.tail_slot_mapping[:3], meta.tail_slot_mapping[:3])
    stale = MetadataPatch("stale-padded-lengths", (2, 15, 4))(meta)
    assert stale.raw_seq_lens.tolist() == [3, 4, 15, 15] and stale.seq_lens.tolist() == [0, 1, 3, 3]
    patch = MetadataPatch("stale-padded-lengths", (2, 15, 4))
    assert MetadataPatch.from_json(patch.to_json()) == patch
    with pytest.raises(ValueError):
        MetadataPatch("unknown", ())


def _forward_kwargs(cfg, meta, *, N=8, B=2, blocks=3):
    T, H, D = meta.num_tokens, cfg.index_n_heads, cfg.index_head_dim
    return dict(k=torch.zeros(T, D), gate=torch.zeros(T, D), q=torch.zeros(T, H, D, dtype=torch.bfloat16),
                weights=torch.zeros(T, H), ape=torch.zeros(cfg.index_kpool, D),
                compressed_cache=torch.empty(N, B, 1, D, dtype=torch.bfloat16),
                tail_cache=torch.empty(blocks, 2, cfg.ring_capacity, D), **meta.forward_kwargs(),
                index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, score_mode=cfg.score_mode,
                compute_topk=True, output_buffer=None)


def _bad(meta, field, index, value):
    meta = meta.clone()
    getattr(meta, field)[index] = value
    return meta


def test_reference_side_metadata_check_rejects_what_the_kernel_rejects():
    """parity.checking.checked_reference.check_metadata (the harness's reference-side check, parity-contract.md §5)
    passes valid metadata and rejects each kind of bad metadata the kernel's validation rejects."""
    from kpool.errors import KPoolMetadataError
    from kpool.validation import validate_forward
    cfg = KPoolConfig(index_n_heads=1, index_head_dim=4, index_kpool=4, index_topk=8)
    meta = _meta(cfg, [(0, 9, [0, 1, 2], 1), (5, 3, [3, 4], 0)])
    check_metadata(**_forward_kwargs(cfg, meta))
    bad = {
        "ring block": MetadataPatch("ring-block-out-of-range", (1, 3, 4))(meta),
        "ring slot": _bad(meta, "tail_slot_mapping", 2, 12),
        "compressed slot": _bad(meta, "slot_mapping", 3, 16),
        "page": _bad(meta, "block_table", (0, 0), 8),
        "seq_lens": _bad(meta, "seq_lens", 0, 3),
        "position": _bad(meta, "positions", 4, 7),
        "raw < query": _bad(_bad(meta, "raw_seq_lens", 1, 2), "seq_lens", 1, 0),
    }
    for what, m in bad.items():
        kw = _forward_kwargs(cfg, m)
        with pytest.raises(ValueError, match="metadata rejected"):
            check_metadata(**kw)
        with pytest.raises(KPoolMetadataError):
            validate_forward(**kw)


# ---- generated runs (the ci budget) -------------------------------------------------------------

@pytest.mark.integration
def test_generated_batches_pass_and_report_coverage(device, warm_kernels, capsys):
    assert_generated_run_covers("batch", device, capsys, min_passed=10, classes=(
        "visible=0", "visible<K", "visible>K", "cache-only step", "chunk read from ring",
        "mid-chunk pool completion", "merged score mode", "fixed tail layout"), complete_residues=True)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["visible-off-by-one", "ring-capacity-p"])
def test_planted_fault_found_by_generated_batches_and_shrunk(name, device, warm_kernels, tmp_path):
    """'own incomplete pool visible' (C09) and 'P-slot ring' (C21): the ci budget of generated
    batches finds each, shrinks it to a tiny case, and the corpus entry replays the failure."""
    assert_planted_fault_found_and_shrunk("batch", name, device, tmp_path)
