"""A test harness for the stateful reference (tests/test_reference*.py, tests/test_worked_example.py):
one set of caches (sentinel-filled, padded pages and ring blocks between guard bands) driven by
``reference.stateful.forward`` step by step and checked after every step against
``reference.oracle.HistoryOracle`` (parity-contract.md §7), plus exact-logit inputs
(public-cases.md "Exact-logit trick") and the row builders of hand-written expected rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kpool.cache import allocate_caches
from kpool.config import KPoolConfig
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from parity.checking.compare import same_bits
from reference import stateful
from reference.oracle import HistoryOracle

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
# exact logits: hand-written expected rows
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
