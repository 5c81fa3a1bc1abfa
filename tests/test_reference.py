"""Tests of the stateful reference and the whole-history oracle (parity-contract.md §7).

(a) stateful == oracle bitwise on every step of multi-step schedules (indices, every compressed
    row the oracle says was written, every other cache byte unchanged, the ring = "each live
    token in row order at its ring slot");
(b) a ring too small for MTP (C = P, public case C21) makes the two DISAGREE;
(c) exact-logit scenarios with hand-written expected rows (kpool-algorithm.md §4.5 worked
    example; public cases C07, C09, C11, C13, C31);
(d) a GLM-5.3-Flash-sized prefill + boundary decode (slow).

The caches live in padded pages / ring blocks between guard bands, all filled with NaN
sentinels, so any stray or missing write shows up as a byte difference.
"""
from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kpool.cache import allocate_caches
from kpool.config import GLM53_FLASH, SMALL, KPoolConfig
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from reference import stateful
from reference.numerics import compress_pools
from reference.oracle import HistoryOracle
from parity.compare import assert_bitwise_equal, same_bits

REPO = Path(__file__).resolve().parents[1]
SENTINEL_BF16 = 0x7FC5        # a quiet-NaN bf16 with a payload
SENTINEL_FP32 = 0x7FA00001    # a signalling-NaN fp32 pattern


# --------------------------------------------------------------------------------------------
# harness: one set of caches driven by both references
# --------------------------------------------------------------------------------------------

@dataclass
class Inputs:
    k: torch.Tensor
    gate: torch.Tensor
    q: torch.Tensor
    weights: torch.Tensor


@dataclass
class Step:
    meta: object
    inputs: Inputs
    before: object
    out: object
    oracle: object
    entries: list


class Harness:
    """Caches (sentinel-filled, padded pages, guard bands), request tables, and a HistoryOracle."""

    def __init__(self, config: KPoolConfig, *, num_pages=24, page_size=2, num_tail_blocks=6, seed=0,
                 ape=None):
        self.cfg = config
        self.P, self.C = config.index_kpool, config.ring_capacity
        self.D, self.H = config.index_head_dim, config.index_n_heads
        self.B = page_size
        self.caches = allocate_caches(config, num_pages=num_pages, page_size=page_size,
                                      num_tail_blocks=num_tail_blocks, page_padding=3,
                                      ring_block_padding=5, guard=7, fill_bf16_bits=SENTINEL_BF16,
                                      fill_fp32_bits=SENTINEL_FP32)
        self.gen = torch.Generator().manual_seed(seed)
        self.free_pages = torch.randperm(num_pages, generator=self.gen).tolist()
        self.tables, self.ring_blocks = {}, {}
        self.oracle = HistoryOracle(index_kpool=self.P)
        self.ape = torch.randn(self.P, self.D, generator=self.gen) if ape is None else ape

    def add_request(self, rid, *, max_len, ring_block, shared_pages=()):
        """Give ``rid`` random physical pages for ``max_len`` tokens (first ones shared if given)."""
        n_pages = max(1, -(-(max_len // self.P) // self.B))
        pages = list(shared_pages) + [self.free_pages.pop() for _ in range(n_pages - len(shared_pages))]
        self.tables[rid] = pages
        self.ring_blocks[rid] = ring_block

    def random_inputs(self, T):
        g = self.gen
        return Inputs(k=torch.randn(T, self.D, generator=g), gate=2 * torch.randn(T, self.D, generator=g),
                      q=torch.randn(T, self.H, self.D, generator=g).bfloat16(),
                      weights=torch.rand(T, self.H, generator=g) * 2 - 0.5)

    def step(self, entries, *, inputs=None, compute_topk=True, output_buffer=None, pack_tail=True,
             score_mode="relu", meta_hook=None, **batch_kwargs) -> Step:
        """Run one step on both references. ``entries``: ``[(rid, cached_len, query_len)]``;
        ``inputs``: None (random), an :class:`Inputs`, or ``f(meta) -> Inputs``; ``meta_hook``:
        edits the built metadata in place (e.g. stale values in padded rows)."""
        specs = [RequestSpec(cached, ql, self.tables[rid], self.ring_blocks[rid]) for rid, cached, ql in entries]
        meta = build_metadata(BatchSpec(specs, **batch_kwargs), index_kpool=self.P, ring_capacity=self.C,
                              page_size=self.B)
        if meta_hook is not None:
            meta_hook(meta)
        if inputs is None:
            inputs = self.random_inputs(meta.num_tokens)
        elif callable(inputs):
            inputs = inputs(meta)
        q, w = (inputs.q, inputs.weights) if compute_topk else (None, None)
        common = dict(k=inputs.k, gate=inputs.gate, q=q, weights=w, ape=self.ape,
                      index_topk=self.cfg.index_topk, index_kpool=self.P, score_mode=score_mode,
                      pack_tail=pack_tail, compute_topk=compute_topk)
        before = self.caches.clone()
        out = stateful.forward(compressed_cache=self.caches.compressed_cache, tail_cache=self.caches.tail_cache,
                               output_buffer=output_buffer, **meta.forward_kwargs(), **common)
        ost = self.oracle.step(request_ids=[e[0] for e in entries], positions=meta.positions,
                               cum_query_lens=meta.cum_query_lens, raw_seq_lens=meta.raw_seq_lens,
                               seq_lens=meta.seq_lens, slot_mapping=meta.slot_mapping,
                               max_pool_seq_len=meta.max_pool_seq_len, num_tokens=meta.num_tokens,
                               num_cache_slots=self.caches.num_pages * self.B, **common)
        return Step(meta, inputs, before, out, ost, list(entries))

    def mismatches(self, step: Step) -> list:
        """Every way the stateful result of ``step`` differs from the oracle (empty = bitwise agreement)."""
        problems = []
        out, expected = step.out, step.oracle.indices
        if (out is None) != (expected is None):
            problems.append(f"indices: stateful {out is None and 'None'} vs oracle {expected is None and 'None'}")
        elif out is not None:
            if out.dtype != torch.int32 or out.shape != expected.shape:
                problems.append(f"indices: {out.dtype} {tuple(out.shape)} vs {tuple(expected.shape)}")
            elif not same_bits(out, expected):
                rows = (out != expected).any(-1).any(-1).nonzero().flatten().tolist()
                problems.append(f"indices differ in rows {rows}")
        # Compressed cache: exactly the oracle's pool writes, every other byte (guards, page
        # padding, other rows) unchanged.
        exp = step.before.clone()
        for _, _, slot, value in step.oracle.pool_writes:
            exp.compressed_cache[slot // self.B, slot % self.B, 0] = value
        if not same_bits(exp.compressed_backing, self.caches.compressed_backing):
            problems.append("compressed cache differs from the oracle's pool writes")
        # Ring (§5.4 net effect): each live token, in row order, at its ring slot.
        meta, C = step.meta, self.C
        T_live = meta.num_live_tokens
        for t in range(T_live):
            p, slot = int(meta.positions[t]), int(meta.tail_slot_mapping[t])
            if p >= 0 and 0 <= slot < self.caches.num_tail_blocks * C:
                exp.tail_cache[slot // C, 0, slot % C] = step.inputs.k[t]
                exp.tail_cache[slot // C, 1, slot % C] = step.inputs.gate[t]
        if not same_bits(exp.tail_backing, self.caches.tail_backing):
            problems.append("ring differs from 'each live token at its ring slot'")
        return problems

    def check(self, step: Step) -> Step:
        problems = self.mismatches(step)
        assert not problems, problems
        return step

    def pool_row(self, rid, j):
        """The stateful cache row of pool ``j`` of ``rid`` (bf16 [D])."""
        page = self.tables[rid][j // self.B]
        return self.caches.compressed_cache[page, j % self.B, 0]


# --------------------------------------------------------------------------------------------
# (a) stateful == oracle on multi-step schedules
# --------------------------------------------------------------------------------------------

def test_multi_request_prefill_then_decode_agree():
    """Prefill with tails 0..3, a request shorter than one pool, a zero-length request; then
    decode steps that cross pool boundaries at different steps (boundary and non-boundary)."""
    h = Harness(SMALL, seed=1)
    lens = {"a": 16, "b": 17, "z": 0, "c": 22, "d": 27, "e": 3}   # tails 0, 1, -, 2, 3, 3
    for i, (rid, n) in enumerate(lens.items()):
        h.add_request(rid, max_len=n + 8, ring_block=i % 6)
    first = h.check(h.step([(rid, 0, n) for rid, n in lens.items()]))
    # Rows of "d" see up to 6 pools > K_pool = 2: selection really prunes.
    assert (first.out[-4, 0] >= 0).sum() == 2 * 4 + 3
    for s in range(6):
        entries = [(rid, n + s, 1) for rid, n in lens.items() if rid != "z"]
        h.check(h.step(entries))


def test_chunked_prefill_every_residue_agree():
    """Chunk starts at every residue mod P (ring reads of 1..3 tokens), two requests at once."""
    h = Harness(SMALL, seed=2)
    h.add_request("a", max_len=32, ring_block=3)
    h.add_request("b", max_len=32, ring_block=0)
    a_chunks = [(0, 5), (5, 6), (11, 3), (14, 6), (20, 1), (21, 1), (22, 1), (23, 4)]   # starts 0,1,3,2,0,1,2,3
    b_chunks = [(0, 2), (2, 7), (9, 1), (10, 2), (12, 7), (19, 2), (21, 2), (23, 3)]    # starts 0,2,1,1,0,3,1,3
    starts = {c % 4 for c, _ in a_chunks}
    assert starts == {0, 1, 2, 3}
    for (ca, qa), (cb, qb) in zip(a_chunks, b_chunks):
        h.check(h.step([("a", ca, qa), ("b", cb, qb)]))


def test_decode_with_cache_only_steps_agree():
    """compute_topk=False steps still advance both caches (§5.5), return None on both sides."""
    h = Harness(SMALL, seed=3)
    h.add_request("a", max_len=40, ring_block=1)
    h.add_request("b", max_len=40, ring_block=2)
    h.check(h.step([("a", 0, 9), ("b", 0, 6)]))
    for s in range(8):
        step = h.check(h.step([("a", 9 + s, 1), ("b", 6 + s, 1)], compute_topk=(s % 2 == 1)))
        if s % 2 == 0:
            assert step.out is None and step.oracle.indices is None
        if s == 2:  # a: pos 11 completes pool 2 in a cache-only step
            assert [w[:2] for w in step.oracle.pool_writes] == [("a", 2)]


def test_mtp_verify_partial_accept_replay_c21():
    """Public case C21 with C = P + 3: committed through pos 5; verify 6..9 (7 completes pool 1);
    accept 6; replay 7', 8', 9'. Pool 1 = compress(k4, k5, k6, k7'); ring holds k8', k9'; the rows
    of pos 7..9 equal a run without speculation."""
    cfg = SMALL.with_(num_speculative_tokens=3)
    h = Harness(cfg, seed=4)
    h.add_request("r", max_len=16, ring_block=2)
    s0 = h.check(h.step([("r", 0, 6)]))
    s1 = h.check(h.step([("r", 6, 4)]))
    s2 = h.check(h.step([("r", 7, 3)]))
    k = torch.stack([s0.inputs.k[4], s0.inputs.k[5], s1.inputs.k[0], s2.inputs.k[0]])
    g = torch.stack([s0.inputs.gate[4], s0.inputs.gate[5], s1.inputs.gate[0], s2.inputs.gate[0]])
    want = compress_pools(k[None], g[None], h.ape)[0]
    assert_bitwise_equal(h.pool_row("r", 1), want)
    ring_k = h.caches.tail_cache[2, 0]
    assert_bitwise_equal(ring_k[8 % 7], s2.inputs.k[1])
    assert_bitwise_equal(ring_k[9 % 7], s2.inputs.k[2])

    # The same committed tokens without speculation give the same rows and the same pool.
    plain = Harness(cfg, seed=4)
    plain.add_request("r", max_len=16, ring_block=2)
    plain.check(plain.step([("r", 0, 6)], inputs=s0.inputs))
    first_row = Inputs(s1.inputs.k[:1], s1.inputs.gate[:1], s1.inputs.q[:1], s1.inputs.weights[:1])
    plain.check(plain.step([("r", 6, 1)], inputs=first_row))
    p2 = plain.check(plain.step([("r", 7, 3)], inputs=s2.inputs))
    assert_bitwise_equal(p2.out, s2.out)
    assert_bitwise_equal(plain.pool_row("r", 1), want)


def test_mtp_five_drafts_agree():
    """C21 'repeat with 5 draft tokens': C = P + 5, verify 6..11 (pools 1 and 2), accept 6, replay."""
    h = Harness(SMALL.with_(num_speculative_tokens=5), seed=5)
    h.add_request("r", max_len=24, ring_block=0)
    h.check(h.step([("r", 0, 6)]))
    h.check(h.step([("r", 6, 6)]))
    h.check(h.step([("r", 7, 6)]))
    h.check(h.step([("r", 13, 1)]))


def test_full_mode_padding_stale_slots_and_output_buffer():
    """FULL-mode replay: padded rows with stale positive ring slots (pointing at a live ring
    block) and, in later steps, stale pool-completing positions with a live compressed slot
    (only ``t < T_live`` may write, §3.2), padded zero-length requests, max_pool_seq_len = M*B,
    a strided output buffer wider than W: rows >= T untouched, columns >= W set to -1, padded
    rows all -1."""
    h = Harness(SMALL, seed=6)
    h.add_request("a", max_len=24, ring_block=0)
    h.add_request("b", max_len=24, ring_block=1)
    kw = dict(full_mode=True, num_padded_requests=2, stale_tail_slots=True, block_table_width=6)
    h.check(h.step([("a", 0, 9), ("b", 0, 5)], num_tokens=18, **kw))
    W = SMALL.output_width
    for s in range(4):
        big = torch.full((2 * 12, W + 5), 77, dtype=torch.int32)
        buf = big[::2]
        def stale_pool_slots(meta):
            meta.positions[meta.num_live_tokens:] = 3
            meta.slot_mapping[meta.num_live_tokens:] = h.tables["a"][0] * h.B
        step = h.check(h.step([("a", 9 + s, 1), ("b", 5 + s, 2)], num_tokens=8, output_buffer=buf,
                              meta_hook=stale_pool_slots, **kw))
        T, T_live = step.meta.num_tokens, step.meta.num_live_tokens
        assert step.meta.max_pool_seq_len == 6 * h.B
        assert step.out.data_ptr() == buf.data_ptr() and step.out.shape == (T, 1, W)
        assert (buf[:T, W:] == -1).all() and (buf[T_live:T] == -1).all()
        assert (buf[T:] == 77).all() and (big[1::2] == 77).all()
        assert (buf[:T_live, 0] >= 0).all()


def test_pool_aligned_prefix_resume_with_garbage_ring():
    """A new request inherits pools of another's pool-aligned prefix (shared page, fresh
    sentinel ring): it must never read its ring, and its rows see the shared pools."""
    h = Harness(SMALL, seed=7)
    h.add_request("a", max_len=20, ring_block=0)
    h.check(h.step([("a", 0, 13)]))
    h.oracle.fork("a", "b", 8)
    h.add_request("b", max_len=20, ring_block=4, shared_pages=h.tables["a"][:1])  # B=2: pools 0, 1
    h.check(h.step([("b", 8, 7), ("a", 13, 1)]))
    h.check(h.step([("b", 15, 1), ("a", 14, 1)]))


def test_empty_batches_touch_nothing():
    """T == 0 and R == 0 (with padded rows): caches byte-identical; the result is [T, 1, W] of -1
    (every row is a padding row, §4.5 step 4), or None; buffer rows >= T untouched."""
    h = Harness(SMALL, seed=8)
    W = SMALL.output_width
    for batch_kwargs, T in ((dict(), 0), (dict(num_tokens=3), 3)):
        for compute_topk in (True, False):
            step = h.check(h.step([], compute_topk=compute_topk, **batch_kwargs))
            if compute_topk:
                assert step.out.shape == (T, 1, W) and step.out.dtype == torch.int32
                assert (step.out == -1).all()
            else:
                assert step.out is None
    buf = torch.full((4, W + 2), 5, dtype=torch.int32)
    step = h.check(h.step([], num_tokens=3, output_buffer=buf))
    assert step.out.shape == (3, 1, W) and (buf[:3] == -1).all() and (buf[3] == 5).all()


def test_score_chunking_and_merged_mode_agree(monkeypatch):
    """Results are invariant to the score chunk size (one row per chunk), in both score modes,
    with fp32 and bf16 head weights."""
    for mode in ("relu", "merged"):
        outs = []
        for chunk in (1 << 20, 1):
            monkeypatch.setattr(stateful, "SCORE_CHUNK_ELEMENTS", chunk)
            h = Harness(SMALL, seed=9)
            h.add_request("a", max_len=30, ring_block=0)
            h.add_request("b", max_len=30, ring_block=1)
            def bf16_weights(meta):
                x = h.random_inputs(meta.num_tokens)
                return Inputs(x.k, x.gate, x.q, x.weights.bfloat16() if mode == "merged" else x.weights)
            s = h.check(h.step([("a", 0, 25), ("b", 0, 18)], inputs=bf16_weights, score_mode=mode,
                               pack_tail=(mode == "relu")))
            outs.append(s.out)
        assert_bitwise_equal(outs[0], outs[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_other_device_tensors_are_computed_on_cpu_and_copied_back():
    """Tensors on a CUDA device: same bytes in the caches and the output buffer as the CPU run,
    results returned on the device (the buffer's own view when a buffer is given)."""
    cfg, dev = SMALL, torch.device("cuda")
    W = cfg.output_width
    h = Harness(cfg, seed=13)
    h.add_request("a", max_len=20, ring_block=0)
    h.add_request("b", max_len=20, ring_block=1)
    cpu = h.caches.clone()
    gpu = h.caches.to(dev)
    for entries, use_buffer in (([("a", 0, 6), ("b", 0, 3)], True), ([("a", 6, 7), ("b", 3, 2)], False)):
        meta = build_metadata(BatchSpec([RequestSpec(c, n, h.tables[r], h.ring_blocks[r]) for r, c, n in entries],
                                        num_tokens=16), index_kpool=cfg.index_kpool,
                              ring_capacity=cfg.ring_capacity, page_size=h.B)
        x = h.random_inputs(meta.num_tokens)
        buf = torch.full((18, W + 3), 9, dtype=torch.int32) if use_buffer else None
        kw = dict(ape=h.ape, index_topk=cfg.index_topk, index_kpool=cfg.index_kpool)
        out_c = stateful.forward(k=x.k, gate=x.gate, q=x.q, weights=x.weights, compressed_cache=cpu.compressed_cache,
                                 tail_cache=cpu.tail_cache, output_buffer=buf, **meta.forward_kwargs(), **kw)
        buf_g = None if buf is None else torch.full_like(buf, 9).to(dev)
        kw["ape"] = h.ape.to(dev)
        out_g = stateful.forward(k=x.k.to(dev), gate=x.gate.to(dev), q=x.q.to(dev), weights=x.weights.to(dev),
                                 compressed_cache=gpu.compressed_cache, tail_cache=gpu.tail_cache,
                                 output_buffer=buf_g, **meta.to(dev).forward_kwargs(), **kw)
        assert out_g.device.type == "cuda" and same_bits(out_g.cpu(), out_c)
        if use_buffer:
            assert out_g.data_ptr() == buf_g.data_ptr() and same_bits(buf_g.cpu(), buf)
        assert_bitwise_equal(gpu.compressed_backing.cpu(), cpu.compressed_backing)
        assert_bitwise_equal(gpu.tail_backing.cpu(), cpu.tail_backing)


def test_reference_does_not_import_kpool():
    code = ("import sys; import reference.stateful, reference.oracle; "
            "bad = [m for m in sys.modules if m == 'kpool' or m.startswith('kpool.') or m == 'triton']; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# --------------------------------------------------------------------------------------------
# (b) the oracle catches a ring that is too small for MTP
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("drafts", [3, 5])
def test_ring_too_small_for_mtp_disagrees_c21(drafts):
    """C21 with C = P: the rejected drafts at pos 8, 9 overwrite k4, k5 in the ring, so the
    replayed pool 1 is wrong and the oracle must notice (steps before the replay still agree)."""
    h = Harness(SMALL, seed=4)          # C = P = 4
    assert h.C == h.P
    h.add_request("r", max_len=24, ring_block=2)
    h.check(h.step([("r", 0, 6)]))
    h.check(h.step([("r", 6, 1 + drafts)]))
    replay = h.step([("r", 7, 3)])
    problems = h.mismatches(replay)
    assert "compressed cache differs from the oracle's pool writes" in problems
    (rid, j, slot, value), = replay.oracle.pool_writes
    assert j == 1 and not same_bits(h.pool_row("r", 1), value)


# --------------------------------------------------------------------------------------------
# (c) exact logits: hand-written expected rows
# --------------------------------------------------------------------------------------------

ONE_HEAD = KPoolConfig(index_n_heads=1, index_head_dim=16, index_kpool=4, index_topk=8)


def exact_inputs(h: Harness, value_of):
    """Exact-logit inputs (public-cases.md "Exact-logit trick"): the key of every token is
    ``value_of(rid, pos) * e0``, gate 0 (APE 0 in the harness), one head, ``q = e0``, weight 1,
    so pool ``j``'s logit is ``ReLU(v_j)`` exactly."""
    def make(meta):
        T = meta.num_tokens
        k = torch.zeros(T, h.D)
        q = torch.zeros(T, h.H, h.D)
        q[:, :, 0] = 1
        ends = meta.cum_query_lens.tolist()
        for r, (qs, end) in enumerate(zip([0] + ends[:-1], ends)):
            for t in range(qs, end):
                k[t, 0] = value_of(r, int(meta.positions[t]))
        return Inputs(k=k, gate=torch.zeros(T, h.D), q=q.bfloat16(), weights=torch.ones(T, h.H))
    return make


def exact_harness(config=ONE_HEAD, **kw):
    return Harness(config, ape=torch.zeros(config.index_kpool, config.index_head_dim), **kw)


def row(*values, width):
    return list(values) + [-1] * (width - len(values))


def rng(a, b):
    return list(range(a, b + 1))


def assert_universal(step, W, P, K_pool):
    """Every valid entry < seq, count = min(n_pool, K)*P + seq % P, history = whole pools."""
    out = step.out[:, 0, :]
    for t in range(step.meta.num_live_tokens):
        seq = int(step.meta.positions[t]) + 1
        vals = [v for v in out[t].tolist() if v >= 0]
        assert all(v < seq for v in vals)
        assert len(vals) == min(seq // P, K_pool) * P + seq % P
        hist = [v for v in vals if v < (seq // P) * P]
        assert all(set(range(v - v % P, v - v % P + P)) <= set(hist) for v in hist)


@pytest.mark.parametrize("pack_tail", [True, False])
def test_worked_example_section_4_5(pack_tail):
    """kpool-algorithm.md §4.5 worked example: P=4, K_tok=8, W=11; pool logits v = [1, 4, 2, 3]."""
    h = exact_harness()
    h.add_request("r", max_len=20, ring_block=0)
    v = [1, 4, 2, 3, 1000]
    step = h.check(h.step([("r", 0, 19)], inputs=exact_inputs(h, lambda r, p: v[p // 4]), pack_tail=pack_tail))
    out = step.out[:, 0, :].tolist()
    W = 11
    if pack_tail:
        assert out[2] == row(0, 1, 2, width=W)
        assert out[3] == row(*rng(0, 3), width=W)
        assert out[6] == row(*rng(0, 3), 4, 5, 6, width=W)
    else:
        assert out[2] == [-1] * 8 + [0, 1, 2]
        assert out[3] == row(*rng(0, 3), width=W)
        assert out[6] == rng(0, 3) + [-1] * 4 + [4, 5, 6]
    assert out[10] == rng(4, 7) + rng(0, 3) + [8, 9, 10]
    assert out[18] == rng(4, 7) + rng(12, 15) + [16, 17, 18]
    if pack_tail:
        assert_universal(step, W, 4, 2)


def test_c07_short_rows_never_expand_garbage():
    """C07: req0 of length 3 (no pool), req1 of length 13 with v = [1, 3, 2]; buffers pre-filled
    with garbage; rows with fewer visible pools than K never expand uninitialised ids."""
    h = exact_harness()
    h.add_request("r0", max_len=3, ring_block=0)
    h.add_request("r1", max_len=13, ring_block=1)
    v = [1, 3, 2, 1000]
    W = 11
    buf = torch.tensor([0x7FFFFFFF, 12345], dtype=torch.int32).repeat(9 * W).view(18, W)
    garbage = buf.clone()
    step = h.check(h.step([("r0", 0, 3), ("r1", 0, 13)], output_buffer=buf,
                          inputs=exact_inputs(h, lambda r, p: 5 if r == 0 else v[p // 4])))
    out = step.out[:, 0, :].tolist()
    assert out[0] == row(0, width=W) and out[1] == row(0, 1, width=W) and out[2] == row(0, 1, 2, width=W)
    r1 = out[3:]
    assert r1[5] == row(*rng(0, 5), width=W)
    assert r1[7] == row(*rng(4, 7), *rng(0, 3), width=W)
    assert r1[11] == row(*rng(4, 11), width=W)
    assert r1[12] == row(*rng(4, 12), width=W)
    assert not ((buf[:16] == 0x7FFFFFFF) | (buf[:16] == 12345)).any()
    assert_bitwise_equal(buf[16:], garbage[16:])
    assert_universal(step, W, 4, 2)


def test_c09_prefill_never_admits_own_incomplete_pool():
    """C09: one prefill of 10 tokens, K_tok=4 (K=1, W=7), v = [1, 100] (incomplete pool 2: 1000)."""
    cfg = ONE_HEAD.with_(index_topk=4)
    h = exact_harness(cfg)
    h.add_request("r", max_len=10, ring_block=0)
    v = [1, 100, 1000]
    step = h.check(h.step([("r", 0, 10)], inputs=exact_inputs(h, lambda r, p: v[p // 4])))
    W = 7
    expected = [row(*rng(0, p), width=W) for p in range(4)] + [
        row(*rng(0, 4), width=W), row(*rng(0, 5), width=W), rng(0, 6),
        row(*rng(4, 7), width=W), row(*rng(4, 8), width=W), row(*rng(4, 9), width=W)]
    assert step.out[:, 0, :].tolist() == expected


def test_c11_pools_never_cross_a_request_boundary():
    """C11: flat batch of lengths 6 and 7, K[t] = (t+1)*e0, gate = APE = 0: pools are exact
    means 2.5*e0 and 8.5*e0; rings hold each request's own last tokens."""
    h = exact_harness()
    h.add_request("r0", max_len=6, ring_block=3)
    h.add_request("r1", max_len=7, ring_block=1)
    flat = {}

    def make(meta):
        inputs = exact_inputs(h, lambda r, p: 0.0)(meta)
        inputs.k[:13, 0] = torch.arange(1, 14, dtype=torch.float32)
        flat["k"] = inputs.k
        return inputs
    step = h.check(h.step([("r0", 0, 6), ("r1", 0, 7)], inputs=make))
    e0 = torch.eye(h.D)[0]
    assert_bitwise_equal(h.pool_row("r0", 0), (2.5 * e0).bfloat16())
    assert_bitwise_equal(h.pool_row("r1", 0), (8.5 * e0).bfloat16())   # not 6.5 (flat rows 4..7)
    assert len(step.oracle.pool_writes) == 2
    ring = h.caches.tail_cache
    k = flat["k"]
    # Ring slot p % C of each request's own last C = 4 rows: r0 = flat rows 2..5, r1 = 9..12.
    for slot, t in ((0, 4), (1, 5), (2, 2), (3, 3)):
        assert_bitwise_equal(ring[3, 0, slot], k[t])
    for slot, t in ((0, 10), (1, 11), (2, 12), (3, 9)):
        assert_bitwise_equal(ring[1, 0, slot], k[t])


def test_c13_tie_goes_to_lower_pool_id():
    """C13: decode at pos 12 with 3 visible pools, v = [3, 2, 2], K = 2: pool 0 then pool 1 (tie
    broken to the lower id), tail [12]; whole pools only."""
    h = exact_harness()
    h.add_request("r", max_len=16, ring_block=0)
    v = [3, 2, 2, 7]
    inputs = exact_inputs(h, lambda r, p: v[p // 4])
    pre = h.check(h.step([("r", 0, 12)], inputs=inputs))
    assert pre.out[11, 0].tolist() == row(*rng(0, 7), width=11)
    dec = h.check(h.step([("r", 12, 1)], inputs=inputs))
    assert dec.out[0, 0].tolist() == rng(0, 7) + [12, -1, -1]


@pytest.mark.parametrize("variant", ["A", "B"])
def test_c31_dimensionwise_softmax_prefill_equals_decode(variant):
    """C31: per-dimension softmax over slots with APE; prefill and decode completion (ring stores
    the raw gate, APE added once) give the same bf16 row = the exact values rounded once."""
    D = 16
    k = torch.zeros(4, D)
    gate = torch.zeros(4, D)
    for s in range(4):
        k[s, :3] = torch.tensor([s + 1, -(s + 1), 10 * s], dtype=torch.float32)
    gate[3, 0] = 5
    gate[0, 1] = 5
    ape = torch.zeros(4, D)
    if variant == "B":
        ape[3, 2] = math.log(3)
    e5 = math.exp(5)
    exact = [(1 + 2 + 3 + 4 * e5) / (3 + e5), (-e5 - 2 - 3 - 4) / (e5 + 3), 15.0 if variant == "A" else 20.0]
    assert [3.953125, -1.0390625] == [float(torch.tensor(x).bfloat16()) for x in exact[:2]]
    want = torch.zeros(D)
    want[:3] = torch.tensor(exact)
    want = want.bfloat16()

    def run(chunks):
        h = Harness(ONE_HEAD, ape=ape, seed=11)
        h.add_request("r", max_len=4, ring_block=1)
        start = 0
        for n in chunks:
            h.check(h.step([("r", start, n)], inputs=Inputs(k[start:start + n], gate[start:start + n],
                                                             torch.zeros(n, 1, D).bfloat16(), torch.ones(n, 1))))
            start += n
        return h.pool_row("r", 0).clone()
    for chunks in ([4], [3, 1], [1, 1, 1, 1]):
        assert_bitwise_equal(run(chunks), want, name=str(chunks))


# --------------------------------------------------------------------------------------------
# (d) GLM-5.3-Flash shapes
# --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_glm_size_prefill_and_boundary_decode():
    """H=32, D=128, P=4, K_tok=2048: a 2099-token prefill then a boundary decode at pos 2099
    (525 visible pools > K_pool = 512): exactly 512 whole pools are selected, tail empty, and
    both steps equal the oracle."""
    h = Harness(GLM53_FLASH, num_pages=20, page_size=32, num_tail_blocks=2, seed=12)
    h.add_request("r", max_len=2100, ring_block=1)
    t0 = time.perf_counter()
    pre = h.check(h.step([("r", 0, 2099)]))
    dec = h.check(h.step([("r", 2099, 1)]))
    elapsed = time.perf_counter() - t0
    print(f"GLM-size prefill(2099)+decode, stateful+oracle+checks: {elapsed:.1f} s")
    K_tok = GLM53_FLASH.index_topk
    for out, pos in ((pre.out[-1, 0], 2098), (dec.out[0, 0], 2099)):
        hist = out[:K_tok]
        assert (hist >= 0).all()
        pools = set((hist // 4).tolist())
        assert len(pools) == 512 and max(pools) < (pos + 1) // 4
        expected_tail = [2096, 2097, 2098] if pos == 2098 else [-1, -1, -1]
        assert out[K_tok:].tolist() == expected_tail
