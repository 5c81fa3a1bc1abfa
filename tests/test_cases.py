"""The seed scenarios and input generators (cases.scenarios, cases.values).

Checks, from the *built* metadata, that every scenario has the properties its description claims
(kpool-algorithm.md §9, §11 "Harness scenarios"), that inputs are deterministic, and that exact data
is exact. No kernel runs here.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from cases.scenarios import SCENARIOS, SIZES, config_for, seed_cases
from cases.spec import Case
from cases.steps import step_metadata
from cases.values import (VALUE_FAMILIES, EXACT_INT_RANGE, PAD_K, case_ape, exact_logit_inputs, exact_logit_tensors,
                          exact_score_bound, make_ape, make_inputs, row_requests)
from kpool.config import GLM53_FLASH, SMALL
from parity.checking.compare import assert_bitwise_equal, same_bits
from parity.findings.coverage import case_stats
from reference.numerics import compress_pools, pool_scores, relu_fp32, visible_pools


@functools.lru_cache(maxsize=None)
def _case(name: str, size: str) -> Case:
    return SCENARIOS[name](size)


@functools.lru_cache(maxsize=None)
def _metas(name: str, size: str):
    case = _case(name, size)
    return tuple(step_metadata(case, s) for s in case.steps)


ALL = [(n, s) for s in SIZES for n in SCENARIOS]
FAR_ABOVE = {"small": 10, "glm5.3-flash": 560}


def _query_lens(meta) -> torch.Tensor:
    cum = meta.cum_query_lens.to(torch.int64)
    return torch.diff(cum, prepend=torch.zeros(1, dtype=torch.int64))


def _scored_rows(name, size):
    """(step, meta, row, position, request index, query_len of its request, visible) of scored live rows."""
    case = _case(name, size)
    P = case.config.index_kpool
    for step, meta in zip(case.steps, _metas(name, size)):
        if not step.compute_topk:
            continue
        req, ql = row_requests(meta), _query_lens(meta)
        for t in range(meta.num_live_tokens):
            p, r = int(meta.positions[t]), int(req[t])
            yield step, meta, t, p, r, int(ql[r]), visible_pools(p, int(meta.seq_lens[r]), P)


# ---- structure every case shares ---------------------------------------------------------------

def test_registry_and_seed_cases():
    cases = seed_cases()
    assert [c.case_id for c in cases] == [f"{n}[{s}]" for s in SIZES for n in SCENARIOS]
    assert len({c.case_id for c in cases}) == 2 * len(SCENARIOS)
    assert [c.size for c in seed_cases(("small",))] == ["small"] * len(SCENARIOS)
    with pytest.raises(ValueError):
        config_for("huge")


@pytest.mark.parametrize("name,size", ALL)
def test_case_builds_and_is_coherent(name, size):
    case = _case(name, size)
    metas = _metas(name, size)  # build_metadata ran on every step without error
    cfg = case.config
    assert case.name == name and case.size == size and case.description
    base = config_for(size)
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_kpool, cfg.index_topk) == (
        base.index_n_heads, base.index_head_dim, base.index_kpool, base.index_topk)
    assert case.values in VALUE_FAMILIES
    assert len(case.steps) >= 3
    assert len({s.name for s in case.steps}) == len(case.steps)
    assert len({s.seed for s in case.steps}) == len(case.steps)
    geo = case.geometry
    last_raw, ring_of, pages_of = {}, {}, {}
    for step, meta in zip(case.steps, metas):
        if step.expect_error is not None:   # a bad-input step changes nothing (bad-metadata, bad-arguments)
            continue
        reqs = step.batch.requests
        assert len(step.request_ids) == len(reqs) == len(set(step.request_ids))
        assert meta.num_live_tokens == sum(r.query_len for r in reqs)
        for i, (rid, r) in enumerate(zip(step.request_ids, reqs)):
            # Ring block: stable per id, never the id nor the batch index, in range.
            assert r.ring_block != rid and r.ring_block != i
            assert 0 <= r.ring_block < geo.num_tail_blocks
            assert ring_of.setdefault(rid, r.ring_block) == r.ring_block
            assert int(meta.tail_block_table[i, 0]) == r.ring_block
            # History continues where the previous step of this request ended.
            assert r.cached_len == last_raw.get(rid, 0), (step.name, rid)
            last_raw[rid] = r.raw_seq_len
            # Block tables only grow, pages in range.
            table = list(r.block_table)
            assert all(0 <= p < geo.num_pages for p in table)
            prev = pages_of.get(rid, [])
            assert table[:len(prev)] == prev[:len(table)]
            if len(table) > len(prev):
                pages_of[rid] = table
    # Ring blocks and pages are owned exclusively.
    assert len(set(ring_of.values())) == len(ring_of)
    owned = [p for table in pages_of.values() for p in table]
    assert len(owned) == len(set(owned))
    assert len(owned) < geo.num_pages  # spare pages exist (stray-write targets)
    # Non-contiguous block tables: some table is not a run of consecutive pages.
    assert any(len(t) >= 2 and t != list(range(t[0], t[0] + len(t))) for t in pages_of.values())


@pytest.mark.parametrize("size", SIZES)
def test_padded_strides_present(size):
    cases = seed_cases((size,))
    assert any(c.geometry.page_padding > 0 for c in cases)
    assert any(c.geometry.ring_block_padding > 0 for c in cases)
    assert {c.values for c in cases} == set(VALUE_FAMILIES)


NO_DROP = ("non-finite", "bad-metadata", "bad-arguments", "value-range", "strided-layouts")
"""Scenarios about values and rejections, kept short at the GLM size (the cost budget below):
their GLM rows see fewer than K_pool pools."""


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n not in NO_DROP])
def test_glm_cases_drop_pools(name):
    """Every GLM case has scored rows whose visible pools exceed K_pool = 512."""
    K = GLM53_FLASH.topk_pools
    assert any(vis > K for *_, vis in _scored_rows(name, "glm5.3-flash"))


def test_glm_cost_budget():
    """All six GLM cases together score no more than ~4 single 2200-token prefills."""
    one_prefill = sum((p + 1) // 4 for p in range(2200))
    total = sum(case_stats(c)["scored_pairs"] for c in seed_cases(("glm5.3-flash",)))
    assert total <= 4 * one_prefill, (total, one_prefill)


# ---- per-scenario claims -----------------------------------------------------------------------

@pytest.mark.parametrize("size", SIZES)
def test_prefill_tail(size):
    case, P = _case("prefill-tail", size), 4
    tails, short = set(), False
    for step, meta in zip(case.steps, _metas("prefill-tail", size)):
        ql, raw = _query_lens(meta), meta.raw_seq_lens.to(torch.int64)
        fresh = (ql == raw) & (ql > 0)           # prefill from position 0
        if step.compute_topk and int(fresh.sum()) >= 2:
            tails |= set((raw[fresh] % P).tolist())
            short |= bool(((raw < P) & fresh).any())
    assert tails == {0, 1, 2, 3} and short
    # A zero-length request sits in a later batch, and a chunk resumes mid-pool.
    assert any(0 in _query_lens(m).tolist() for m in _metas("prefill-tail", size))
    assert any(r.cached_len % P and r.query_len > 1 for s in case.steps for r in s.batch.requests)


@pytest.mark.parametrize("size", SIZES)
def test_decode_tail(size):
    residues, seen_prefill, decodes_after_prefill = set(), False, 0
    for step, meta in zip(_case("decode-tail", size).steps, _metas("decode-tail", size)):
        ql = _query_lens(meta)
        if int(ql.max()) > 1:
            seen_prefill = True
            continue
        assert step.compute_topk
        decodes_after_prefill += seen_prefill
        residues |= set(((meta.positions[:meta.num_live_tokens] + 1) % 4).tolist())
    assert decodes_after_prefill >= 3
    assert {1, 2, 3} <= residues


@pytest.mark.parametrize("size", SIZES)
def test_pool_boundary_decode(size):
    K = config_for(size).topk_pools
    boundary_vis, mid_chunk = set(), False
    for step, meta, t, p, r, ql, vis in _scored_rows("pool-boundary-decode", size):
        if (p + 1) % 4:
            continue
        assert int(meta.slot_mapping[t]) >= 0          # this row completes (writes) the pool ...
        assert vis == (p + 1) // 4                     # ... and sees it
        if ql == 1:
            boundary_vis.add(vis)
        elif ql <= 4 and t != int(meta.cum_query_lens[r]) - 1:
            mid_chunk = True                           # a later row of the chunk sees it too
    assert any(v < K for v in boundary_vis) and K in boundary_vis and any(v > K for v in boundary_vis)
    assert mid_chunk


@pytest.mark.parametrize("size", SIZES)
def test_prefill_topk(size):
    K = config_for(size).topk_pools
    vis = {v for step, meta, t, p, r, ql, v in _scored_rows("prefill-topk", size) if ql > 1}
    assert {K - 1, K, K + 1} <= vis
    assert max(vis) >= FAR_ABOVE[size]
    # The chunk that crosses K_pool starts mid-pool (reads the ring).
    steps = _case("prefill-topk", size).steps
    assert any(r.cached_len % 4 and r.query_len > 1 for s in steps if s.compute_topk for r in s.batch.requests)


@pytest.mark.parametrize("size", SIZES)
def test_full_padding(size):
    case = _case("full-padding", size)
    W = case.config.output_width
    full = [(s, m) for s, m in zip(case.steps, _metas("full-padding", size)) if s.batch.full_mode]
    assert len(full) >= 2
    shapes = set()
    for step, meta in full:
        T, T_live = meta.num_tokens, meta.num_live_tokens
        live_reqs = len(step.batch.requests)
        assert T > T_live and step.batch.num_padded_requests > 0 and step.batch.stale_tail_slots
        assert meta.num_requests == live_reqs + step.batch.num_padded_requests
        assert (_query_lens(meta)[live_reqs:] == 0).all()
        assert (meta.seq_lens[live_reqs:] == 0).all()
        assert (meta.slot_mapping[T_live:] == -1).all()
        assert (meta.tail_slot_mapping[T_live:] >= 0).any()        # stale positive ring slots
        assert (meta.positions[T_live:] == 0).all()
        assert meta.max_pool_seq_len == meta.block_table.shape[1] * case.geometry.page_size
        buf = step.output_buffer
        assert buf is not None and buf.width > W and buf.row_step == 2 and buf.capacity > T
        assert step.compute_topk
        shapes.add((T, meta.num_requests, tuple(meta.block_table.shape), meta.max_pool_seq_len, buf))
    assert len(shapes) == 1          # a captured graph: every replay has the same shapes
    assert not case.steps[-1].batch.full_mode and case.steps[-1].compute_topk   # eager step after replays


@pytest.mark.parametrize("size", SIZES)
def test_cache_only(size):
    case = _case("cache-only", size)
    flags = [s.compute_topk for s in case.steps]
    between = [i for i in range(1, len(flags) - 1) if not flags[i] and flags[i - 1] is True
               and any(flags[i + 1:])]
    assert len(between) >= 2
    # A pool completed by a cache-only step is visible to a later scored row of the same request.
    completed = {}
    for step, meta in zip(case.steps, _metas("cache-only", size)):
        if step.compute_topk:
            continue
        req = row_requests(meta)
        for t in range(meta.num_live_tokens):
            if int(meta.slot_mapping[t]) >= 0:
                rid = step.request_ids[int(req[t])]
                completed[rid] = max(completed.get(rid, -1), int(meta.positions[t]) // 4)
    assert completed
    later = [(step.request_ids[r], vis) for step, meta, t, p, r, ql, vis in _scored_rows("cache-only", size)]
    assert all(any(rid == rr and vis > pool for rr, vis in later) for rid, pool in completed.items())
    assert case.config.ring_capacity > case.config.index_kpool


# ---- inputs ---------------------------------------------------------------------------------------

def _same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["decode-tail", "full-padding", "cache-only", "prefill-tail"])
def test_inputs_deterministic_and_shaped(name):
    case = _case(name, "small")
    cfg = case.config
    metas = _metas(name, "small")
    first = [make_inputs(case, s, m) for s, m in zip(case.steps, metas)]
    again = [make_inputs(_case(name, "small"), s, m) for s, m in zip(case.steps, metas)]
    for a, b, m in zip(first, again, metas):
        assert _same_bits(a, b)
        T, H, D = m.num_tokens, cfg.index_n_heads, cfg.index_head_dim
        assert a["k"].shape == (T, D) and a["k"].dtype == torch.float32
        assert a["gate"].shape == (T, D) and a["gate"].dtype == torch.float32
        assert a["q"].shape == (T, H, D) and a["q"].dtype == torch.bfloat16
        assert a["weights"].shape == (T, H) and a["weights"].dtype == torch.float32
    # Another case seed or step seed gives other values.
    other = dataclasses.replace(case, seed=case.seed + 1)
    assert not same_bits(make_inputs(other, case.steps[1], metas[1])["q"], first[1]["q"])
    s2 = dataclasses.replace(case.steps[1], seed=case.steps[1].seed + 100)
    assert not same_bits(make_inputs(case, s2, metas[1])["q"], first[1]["q"])
    assert_bitwise_equal(case_ape(case), case_ape(case), name="ape")


def test_random_family_values():
    case = _case("full-padding", "small")
    metas = _metas("full-padding", "small")
    step, meta = case.steps[1], metas[1]
    x = make_inputs(case, step, meta)
    T_live = meta.num_live_tokens
    k = x["k"][:T_live]
    assert_bitwise_equal(k, k.bfloat16().float())                    # bf16-valued fp32 keys
    assert not same_bits(x["gate"], x["gate"].bfloat16().float())  # gate is genuinely fp32
    assert (x["k"][T_live:] >= PAD_K).all()                         # padding rows hold garbage
    ape = make_ape(case.config, case.seed)
    assert ape.shape == (4, case.config.index_head_dim) and ape.dtype == torch.float32 and ape.abs().sum() > 0
    assert_bitwise_equal(ape, make_ape(case.config, case.seed), name="ape")
    assert case.ape is None and same_bits(case_ape(case), ape)


@pytest.mark.parametrize("name", ["prefill-tail", "pool-boundary-decode", "cache-only"])
def test_exact_family_is_bf16_exact(name):
    case = _case(name, "small")
    assert case.values == "exact" and same_bits(case_ape(case), torch.zeros(4, case.config.index_head_dim))
    assert_bitwise_equal(make_ape(case.config, 1, "exact"), torch.zeros(4, case.config.index_head_dim))
    for step, meta in zip(case.steps, _metas(name, "small")):
        x = make_inputs(case, step, meta)
        for key in ("k", "gate", "weights"):
            assert_bitwise_equal(x[key], x[key].bfloat16().float(), name=str(key))
        n = EXACT_INT_RANGE
        assert ((x["k"] * 4).round() == x["k"] * 4).all() and x["k"].abs().max() <= 1
        assert (x["gate"] == 0).all()
        assert ((x["weights"] * 64).round() == x["weights"] * 64).all() and (x["weights"] * 64).abs().max() <= n
        assert (x["q"].float().round() == x["q"].float()).all() and x["q"].float().abs().max() <= n
        # Canonical compression of any 4 rows is their exact mean (bf16-representable).
        k = x["k"][:4 * (x["k"].shape[0] // 4)].view(-1, 4, x["k"].shape[1])
        pooled = compress_pools(k, torch.zeros_like(k), case_ape(case))
        assert_bitwise_equal(pooled.float(), (k.double().mean(dim=1)).float())


@pytest.mark.parametrize("config", [SMALL, GLM53_FLASH], ids=["small", "glm"])
def test_exact_scores_are_order_independent(config):
    """Exact data: fp32 scores in the canonical order equal the float64 scores exactly."""
    assert exact_score_bound(config) < 2 ** 24
    g = torch.Generator().manual_seed(7)
    H, D, n = config.index_n_heads, config.index_head_dim, EXACT_INT_RANGE
    # Worst case: every magnitude at its maximum, signs chosen to make every dot product positive.
    q = torch.full((1, H, D), float(n)).bfloat16()
    w = torch.full((1, H), n / 64.0)
    pools = torch.ones(1, D).bfloat16()
    worst = pool_scores(q, w, pools)
    assert float(worst) == n * n * D * H / 64.0
    q = torch.randint(-n, n + 1, (3, H, D), generator=g).bfloat16()
    w = torch.randint(-n, n + 1, (3, H), generator=g).float() / 64
    pools = (torch.randint(-16, 17, (5, D), generator=g).float() / 16).bfloat16()
    for mode in ("relu", "merged"):
        got = pool_scores(q, w, pools, mode)
        dots = torch.einsum("thd,jd->tjh", q.double(), pools.double())
        want = (relu_fp32(dots) * w.double()[:, None, :]).sum(-1) if mode == "relu" else dots.mul(
            w.double()[:, None, :]).sum(-1)
        assert_bitwise_equal(got.double(), want, name=str(mode))


def test_step_inputs_override():
    case = _case("prefill-tail", "small")
    sentinel = dict(k=torch.ones(1), gate=torch.ones(1), q=None, weights=None)
    step = dataclasses.replace(case.steps[0], inputs=lambda c, s, m: sentinel)
    assert make_inputs(case, step, _metas("prefill-tail", "small")[0]) is sentinel


# ---- exact-logit trick ------------------------------------------------------------------------

def test_exact_logit_inputs_force_pool_logits():
    """public-cases.md "Exact-logit trick": the pooled key is v_j * e0 and the logit ReLU(v_j),
    whatever the APE."""
    cfg = SMALL
    case = _case("prefill-topk", "small")
    step = case.steps[0]                       # request 1, positions 0..44 (11 pools)
    meta = _metas("prefill-topk", "small")[0]
    values = [1.0, 3.0, -2.0, 2.0, 0.5, 2.0, -0.25, 7.0, 1.5, 96.0, 0.125]
    fn = exact_logit_inputs({step.request_ids[0]: values, 99: [5.0]})
    x = fn(case, step, meta)
    assert _same_bits(x, exact_logit_tensors(cfg, meta, step.request_ids, {step.request_ids[0]: values, 99: [5.0]}))
    k = x["k"][:44].view(11, 4, cfg.index_head_dim)
    for ape in (torch.zeros(4, cfg.index_head_dim), make_ape(cfg, 3)):
        pooled = compress_pools(k, x["gate"][:44].view(11, 4, -1), ape)
        want = torch.zeros(11, cfg.index_head_dim)
        want[:, 0] = torch.tensor(values)
        assert_bitwise_equal(pooled.float(), want)
        scores = pool_scores(x["q"][:1], x["weights"][:1], pooled)[0]
        assert_bitwise_equal(scores, relu_fp32(torch.tensor(values)))
    assert float(x["k"][44, 0]) == 0.0          # pool 11 has no entry: default 0


def test_exact_logit_rejects_inexact_values_and_fills_padding():
    case = _case("full-padding", "small")
    step, meta = case.steps[1], _metas("full-padding", "small")[1]
    with pytest.raises(ValueError):
        exact_logit_tensors(SMALL, meta, step.request_ids, [1.0, 0.1])
    x = exact_logit_tensors(SMALL, meta, step.request_ids, [1.0, 2.0])
    assert (x["k"][meta.num_live_tokens:] >= PAD_K).all()
    assert (x["weights"][:meta.num_live_tokens, 1:] == 0).all()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_small_steps_pass_forward_validation(name):
    """Every step is a valid forward for the production validator (no kernel launched)."""
    from kpool.cache import allocate_caches
    from kpool.validation import validate_forward

    case = _case(name, "small")
    geo, cfg = case.geometry, case.config
    caches = allocate_caches(cfg, num_pages=geo.num_pages, page_size=geo.page_size,
                             num_tail_blocks=geo.num_tail_blocks, page_padding=geo.page_padding,
                             ring_block_padding=geo.ring_block_padding, guard=geo.guard)
    for step, meta in zip(case.steps, _metas(name, "small")):
        if step.expect_error is not None:   # bad-input steps: tests/test_selftest.py runs them
            continue
        buf = None
        if step.output_buffer is not None:
            spec = step.output_buffer
            buf = torch.full((spec.capacity * spec.row_step, spec.width), -777, dtype=torch.int32)[::spec.row_step]
        t_live = validate_forward(**make_inputs(case, step, meta), ape=case_ape(case),
                                  compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
                                  index_topk=cfg.index_topk, index_kpool=cfg.index_kpool,
                                  score_mode=cfg.score_mode, compute_topk=step.compute_topk,
                                  output_buffer=buf, **meta.forward_kwargs())
        assert t_live == meta.num_live_tokens


def test_case_caches_keep_every_padding():
    """parity.checking.sentinel.case_caches lays the caches out as the case's geometry declares: padded
    page and ring-block strides and guard bands, so the sentinel checks cover padding the kernels
    must not touch."""
    from cases.spec import CacheGeometry
    from kpool.config import SMALL
    from parity.checking.sentinel import case_caches
    geo = CacheGeometry(num_pages=3, page_size=2, num_tail_blocks=2, page_padding=5, ring_block_padding=7, guard=11)
    caches = case_caches(Case("geo", "small", SMALL, geo, steps=()))
    D, C = SMALL.index_head_dim, SMALL.ring_capacity
    assert caches.compressed_cache.stride(0) == 2 * D + 5 and caches.compressed_cache.storage_offset() == 11
    assert caches.tail_cache.stride(0) == 2 * C * D + 7 and caches.tail_cache.storage_offset() == 11
    assert caches.compressed_backing.numel() == 2 * 11 + 3 * (2 * D + 5)
