"""Tests of the stateful reference and the whole-history oracle (parity-contract.md §7).

(a) stateful == oracle bitwise on every step of multi-step schedules (indices, every compressed
    row the oracle says was written, every other cache byte unchanged, the ring = "each live
    token in row order at its ring slot");
(b) a ring too small for MTP (C = P, public case C21) makes the two DISAGREE;
(c) exact-logit scenarios with hand-written expected rows: tests/test_reference_exact.py and
    tests/test_worked_example.py (the harness: tests/reference_harness.py);
(d) a GLM-5.3-Flash-sized prefill + boundary decode (slow).

The caches live in padded pages / ring blocks between guard bands, all filled with NaN
sentinels, so any stray or missing write shows up as a byte difference.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kpool.config import GLM53_FLASH, SMALL
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from parity.checking.compare import assert_bitwise_equal, same_bits
from reference import stateful
from reference.numerics import compress_pools
from tests.reference_harness import Harness, Inputs

REPO = Path(__file__).resolve().parents[1]


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
