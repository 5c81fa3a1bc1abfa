"""The stateful reference on exact-logit scenarios with hand-written expected rows (public cases
C07, C09, C11, C13, C31; the kpool-algorithm.md §4.5 worked example is tests/test_worked_example.py).
Every step is also checked against the whole-history oracle (tests/reference_harness.py).
"""
from __future__ import annotations

import math

import pytest
import torch

from parity.checking.compare import assert_bitwise_equal
from tests.reference_harness import ONE_HEAD, Harness, Inputs, assert_universal, exact_harness, exact_inputs, rng, row


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
