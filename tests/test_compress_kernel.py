"""Bit-exact tests of the cache-update kernels (kpool/ops/compress.py: tiles inside one request
take the pool-per-lane path, other tiles the row-per-lane path) under the Triton CPU interpreter (the shared device helpers:
tests/test_portable_numerics.py).

Oracle: ``reference.numerics`` (exp_fp32, compress_pools) applied to the *whole* raw-key
history of each request (no ring), so a kernel that reads a wrong ring slot, a wrong input row
or a stale value cannot agree. Every check compares complete backing buffers (guards and
paddings included, pre-filled with sentinel bit patterns) through integer views, so NaN
payloads and stray writes count. Public cases: C01, C03, C05(b), C11, C31
(/work/shared/cases/public-cases.md); math: kpool-algorithm.md §5.
"""
from __future__ import annotations

import math
import os

# The device the repo conftest resolved (``--device`` / KPOOL_DEVICE); the CPU interpreter when
# the file runs on its own. ``pytest --device cuda`` runs the same bitwise checks compiled.
os.environ.setdefault("KPOOL_DEVICE", os.environ.get("KPOOL_COMPRESS_TEST_DEVICE", "cpu"))

import kpool.platform  # noqa: E402

BACKEND = kpool.platform.resolve_device()

import pytest  # noqa: E402
import torch  # noqa: E402

import kpool.ops.compress as compress_mod  # noqa: E402
from kpool.cache import allocate_caches  # noqa: E402
from kpool.config import KPoolConfig  # noqa: E402
from kpool.metadata import BatchSpec, RequestSpec, build_metadata  # noqa: E402
from kpool.ops.compress import compress_and_write_cache  # noqa: E402
from reference.numerics import compress_pools  # noqa: E402
from reference.numerics import exp_fp32 as ref_exp_fp32  # noqa: E402

I16, I32, F32 = torch.int16, torch.int32, torch.float32
DEV = kpool.platform.torch_device(BACKEND)
# numpy warns on the inf/NaN lanes that the kernels compute and then discard (or propagate).
# interpreter_ok: also run by `make test-ascend-interp` (triton-ascend 3.2's interpreter).
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.interpreter_ok]

SENT16 = 0x7FA5            # bf16 NaN with a payload: the compressed-cache sentinel
SENT32 = 0x7F8A5A5A        # fp32 signalling-NaN pattern: the ring sentinel
BF16_NAN = 0x7FC0          # the kernel's canonical bf16 NaN


def _bits_to_f32(bits) -> torch.Tensor:
    t = torch.as_tensor(bits, dtype=torch.int64)
    t = torch.where(t >= 2 ** 31, t - 2 ** 32, t)
    return t.to(I32).view(F32)


def _f32_bits(value: float) -> int:
    return int(torch.tensor(value, dtype=F32).view(I32)) & 0xFFFFFFFF


# ----------------------------------------------------------------------------------------------
# Cache update: a simulator holding whole histories, the kernel's caches and the expected caches.

def _copy_bits(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.view(I32).copy_(src.view(I32))


def _row_strided(x: torch.Tensor) -> torch.Tensor:
    """Same values on DEV with row stride 2*D+5 and column stride 2 (NaN filler in between)."""
    T, D = x.shape
    base = torch.full((T, 2 * D + 5), float("nan"), device=DEV)
    view = base[:, 3:3 + 2 * D:2]
    _copy_bits(view, x)
    return view


def _col_major(x: torch.Tensor) -> torch.Tensor:
    """Same values on DEV with strides (1, T)."""
    out = torch.empty(x.shape[1], x.shape[0], device=DEV).t()
    _copy_bits(out, x)
    return out


class Sim:
    """Requests with full random K/gate histories, caches laid on sentinel-filled backings
    with padded pages / ring blocks and guards, and the expected caches maintained from the
    whole-history oracle (``compress_pools`` per complete pool, ring = last C rows)."""

    def __init__(self, *, P, C, lengths, D=16, B=2, seed=0, num_tail_blocks=None, ring_blocks=None,
                 page_padding=3, ring_block_padding=5, guard=4, fill32=SENT32, extra_pages=1):
        g = torch.Generator().manual_seed(seed)
        self.P, self.C, self.D, self.B = P, C, D, B
        cfg = KPoolConfig(index_n_heads=2, index_head_dim=D, index_kpool=P, index_topk=2 * P,
                          tail_ring_capacity=C)
        R = len(lengths)
        pages_needed = [max(1, -(-(L // P) // B)) for L in lengths]
        N = sum(pages_needed) + extra_pages
        perm = torch.randperm(N, generator=g).tolist()
        self.tables, i = [], 0
        for n in pages_needed:
            self.tables.append(perm[i:i + n])
            i += n
        ntb = num_tail_blocks or R + 2
        self.ring_blocks = ring_blocks or torch.randperm(ntb, generator=g)[:R].tolist()
        self.K = [torch.randn(L, D, generator=g) for L in lengths]
        self.G = [torch.randn(L, D, generator=g) * 2 for L in lengths]
        self.ape = torch.randn(P, D, generator=g)
        self.caches = allocate_caches(cfg, num_pages=N, page_size=B, num_tail_blocks=ntb,
                                      page_padding=page_padding, ring_block_padding=ring_block_padding,
                                      guard=guard, fill_bf16_bits=SENT16, fill_fp32_bits=fill32,
                                      device=DEV)
        self.expected = self.caches.to("cpu")
        self.cached = [0] * R
        self.calls = 0

    # -- expectations --------------------------------------------------------------------
    def pool(self, r, j, k=None, gate=None) -> torch.Tensor:
        """Oracle bf16 row of pool j of request r (optionally from edited windows)."""
        w = slice(j * self.P, (j + 1) * self.P)
        k = self.K[r][w] if k is None else k
        gate = self.G[r][w] if gate is None else gate
        row = compress_pools(k[None], gate[None], self.ape)[0]
        # The kernel stores NaN as the canonical quiet NaN 0x7FC0 on every backend; torch's own
        # fp32 -> bf16 NaN bits vary (2.13 CPU: 0xFFFF, CUDA: 0x7FFF).
        return torch.where(torch.isnan(row), torch.tensor(BF16_NAN, dtype=I16).view(torch.bfloat16), row)

    def expect_pool(self, r, j, row=None) -> None:
        row = self.pool(r, j) if row is None else row
        page = self.tables[r][j // self.B]
        self.expected.compressed_cache[page, j % self.B, 0].view(I16).copy_(row.view(I16))

    def expect_ring(self, r, p) -> None:
        blk = self.ring_blocks[r]
        _copy_bits(self.expected.tail_cache[blk, 0, p % self.C], self.K[r][p])
        _copy_bits(self.expected.tail_cache[blk, 1, p % self.C], self.G[r][p])

    # -- one forward ---------------------------------------------------------------------
    def metadata(self, sched, *, num_tokens=None, stale=False):
        specs = [RequestSpec(self.cached[r], ql, self.tables[r], self.ring_blocks[r]) for r, ql in sched]
        return build_metadata(BatchSpec(specs, num_tokens=num_tokens, stale_tail_slots=stale),
                              index_kpool=self.P, ring_capacity=self.C, page_size=self.B, device=DEV)

    def step(self, sched, *, num_tokens=None, stale=False, edit=None, expect=True, check=True,
             launch_options=None):
        """Run the kernel for ``sched = [(request, query_len), ...]`` (row order)."""
        md = self.metadata(sched, num_tokens=num_tokens, stale=stale)
        T, D = md.num_tokens, self.D
        g = torch.Generator().manual_seed(1000 + self.calls)
        k = torch.randn(T, D, generator=g) * 100          # padded rows: garbage
        gate = torch.randn(T, D, generator=g) * 100
        row = 0
        for r, ql in sched:
            c = self.cached[r]
            _copy_bits(k[row:row + ql], self.K[r][c:c + ql])
            _copy_bits(gate[row:row + ql], self.G[r][c:c + ql])
            row += ql
        if edit is not None:
            edit(md)
        # Non-trivial strides on both inputs and on the APE.
        k_in, gate_in = _row_strided(k), _col_major(gate)
        ape_in = _col_major(self.ape)
        compress_and_write_cache(
            k=k_in, gate=gate_in, ape=ape_in,
            compressed_cache=self.caches.compressed_cache, tail_cache=self.caches.tail_cache,
            positions=md.positions, cum_query_lens=md.cum_query_lens, raw_seq_lens=md.raw_seq_lens,
            slot_mapping=md.slot_mapping, tail_block_table=md.tail_block_table,
            tail_slot_mapping=md.tail_slot_mapping,
            index_kpool=self.P, launch_options=launch_options)
        self.calls += 1
        if expect:
            for r, ql in sched:
                c = self.cached[r]
                for p in range(c, c + ql):
                    if (p + 1) % self.P == 0:
                        self.expect_pool(r, p // self.P)
                for p in range(max(c, c + ql - self.C), c + ql):
                    self.expect_ring(r, p)
        for r, ql in sched:
            self.cached[r] += ql
        if check:
            self.check()
        return md

    def check(self) -> None:
        """Both whole backings (guards, page / block padding included) equal the expectation."""
        for name, view in (("compressed", I16), ("ring", I32)):
            got = getattr(self.caches, f"{name}_backing" if name == "compressed" else "tail_backing").cpu().view(view)
            exp = getattr(self.expected, f"{name}_backing" if name == "compressed" else "tail_backing").view(view)
            if not torch.equal(got, exp):
                bad = (got != exp).nonzero().flatten()
                raise AssertionError(f"{name} backing: {bad.numel()} elements differ, first at "
                                     f"{bad[:8].tolist()} (call {self.calls})")


def _chunk_sizes(P):
    """Per-step query lengths of 3 requests: req0 chunks of P+1 start at residues 1, 2, ...
    mod P, req2 chunks of 2P-1 at residues -1, -2, ..., req1 takes a first pool-aligned chunk
    of P, then a zero-length step, then a pool-aligned resume and 1/2-token steps."""
    steps = max(3, P // 2 + 1)
    req1 = [P, 0] + [1 + k % 2 for k in range(steps - 2)]
    return [[P + 1, req1[k], 2 * P - 1] for k in range(steps)]


def _chunked_prefill_against_oracle(P: int, extra: int) -> None:
    C = P + extra
    sizes = _chunk_sizes(P)
    lengths = [sum(s[i] for s in sizes) for i in range(3)]
    sim = Sim(P=P, C=C, lengths=lengths, seed=10 * P + extra, B=3 if P == 2 else 2)
    residues = set()
    for s in sizes:
        residues |= {sim.cached[i] % P for i in range(3) if sim.cached[i] > 0 and s[i] > 0}
        sim.step([(0, s[0]), (1, s[1]), (2, s[2])])
    assert sim.cached == lengths
    assert residues == set(range(P))   # every chunk-start residue (0 = pool-aligned resume)


@pytest.mark.parametrize("P,extra", [(1, 0), (1, 3), (2, 0), (2, 3), (4, 0), (4, 3), (8, 0), (8, 3)])
def test_chunked_multi_request_prefill_matches_oracle(P, extra):
    """Multi-request chunked prefill, chunk starts at every residue mod P (pools straddling a
    chunk boundary read the ring seeded by the previous call), ring capacity C in {P, P+3}:
    both caches bitwise equal the whole-history oracle after every call (C11: no pooling across
    request boundaries; ring = the last C rows of each request, bit-exact)."""
    _chunked_prefill_against_oracle(P, extra)


@pytest.mark.parametrize("P,extra", [(1, 3), (4, 0), (4, 3)])
def test_compiled_backends_tiling_matches_oracle(P, extra, monkeypatch):
    """The compiled backends' tiling under the interpreter: one pool per lane in tiles inside
    one request (the chunk interiors), P row groups elsewhere (request edges, decode rows),
    channels split over tiles."""
    from kpool.ops import plan
    monkeypatch.setitem(plan.TUNING["compress"], "cpu", dict(BLOCK_J=2, BLOCK_D=4, D_SPLIT=8, window=2 ** 20, cap=2))
    assert not plan.compress_plan(64, 16, P, "cpu").constexprs["ROWS_AT_ONCE"]
    long = Sim(P=P, C=P + extra, lengths=[5 + 61, 40], seed=P + extra)   # long chunks: one-request tiles
    long.step([(0, 5), (1, 17)])
    long.step([(0, 61), (1, 23)])
    _chunked_prefill_against_oracle(P, extra)


@pytest.mark.parametrize("P,extra", [(1, 3), (3, 0), (4, 3)])
def test_latency_tiling_matches_oracle(P, extra, monkeypatch):
    """The compiled backends' latency tile (launches of at most ``latency_rows`` rows: one
    pool's P rows x BLOCK_D channels, rows at once) under the interpreter, with fewer programs
    than tiles: decode steps of several requests, padded rows, chunked prefill (P=3: a tile of
    3 rows in 4 lanes)."""
    from kpool.ops import plan
    monkeypatch.setitem(plan.TUNING["compress"], "cpu", dict(BLOCK_J=64, BLOCK_D=8, D_SPLIT=0, window=2 ** 20,
                                                             cap=3, latency_rows=10 ** 6))
    tiles = plan.compress_plan(9, 16, P, "cpu").constexprs
    assert tiles["ROWS_AT_ONCE"] and tiles["BLOCK_J"] == 1 and tiles["D_SPLIT"] == 8
    first = [P + 1, 2, max(1, P - 1)]
    sim = Sim(P=P, C=P + extra, lengths=[n + P + 1 for n in first], seed=7 * P + extra)
    sim.step(list(enumerate(first)))
    for _ in range(P + 1):                                    # decode rows, every residue mod P
        sim.step([(0, 1), (1, 1), (2, 1)], num_tokens=5)      # 2 padded rows
    _chunked_prefill_against_oracle(P, extra)


def test_grid_stride_loop_and_partial_blocks(monkeypatch):
    """Tiny tiles (one pool lane, channel chunks of 4) and a tiny grid force several grid-stride
    iterations per program, tiles across request boundaries (the per-row path) and partial last
    tiles; results unchanged (bitwise vs oracle). Also checks an explicit empty
    ``launch_options`` dict."""
    from kpool.ops import plan
    monkeypatch.setitem(plan.TUNING["compress"], "cpu", dict(BLOCK_J=1, BLOCK_D=4, D_SPLIT=8, window=2 ** 20, cap=3))
    assert not plan.compress_plan(8, 16, 4, "cpu").constexprs["ROWS_AT_ONCE"]   # the compiled backends' path
    monkeypatch.setitem(plan.TUNING["ring_write"], "cpu", dict(BLOCK_T=2, cap=3))
    sim = Sim(P=4, C=7, lengths=[12, 5, 8], seed=5)
    sim.step([(0, 7), (1, 2), (2, 5)])        # ring: 3 requests x 4 chunks of 2 rows (C = 7) on 3 programs
    sim.step([(0, 5), (1, 3), (2, 3)], launch_options={})


def test_decode_sequence_equals_prefill_c01():
    """C01: one request, P=4, 32 tokens: (A) one prefill, (B) 32 single-token decode steps,
    (C) prefill of 10 then 22 decodes. Pools 0-7 are bitwise identical across A, B, C and
    equal the oracle; after every decode step ring slot t%4 holds token t exactly."""
    sims = [Sim(P=4, C=4, lengths=[32], seed=7) for _ in range(3)]
    sims[0].step([(0, 32)])
    for t in range(32):
        sims[1].step([(0, 1)])
        blk = sims[1].ring_blocks[0]
        assert torch.equal(sims[1].caches.tail_cache[blk, 0, t % 4].cpu().view(I32), sims[1].K[0][t].view(I32))
        assert torch.equal(sims[1].caches.tail_cache[blk, 1, t % 4].cpu().view(I32), sims[1].G[0][t].view(I32))
    sims[2].step([(0, 10)])
    for _ in range(22):
        sims[2].step([(0, 1)], check=False)
    sims[2].check()
    a = sims[0].caches.compressed_backing.cpu().view(I16)
    assert torch.equal(a, sims[1].caches.compressed_backing.cpu().view(I16))
    assert torch.equal(a, sims[2].caches.compressed_backing.cpu().view(I16))
    assert int((a != SENT16).sum()) == 8 * 16          # exactly the 8 pool rows were written


@pytest.mark.parametrize("C", [4, 7])
def test_padded_rows_write_nothing(C):
    """FULL-mode padding (§6): rows >= T_live never write, even with stale positive ring slots,
    a pool-completing position and a valid compressed slot; live rows with slot -1 write no
    pool. Whole backings (sentinel-filled) are compared before/after."""
    sim = Sim(P=4, C=C, lengths=[9, 6], seed=11)

    def poison_padding(md):
        t_live = md.num_live_tokens
        md.positions[t_live:] = 7                                   # completes pool 1
        md.slot_mapping[t_live] = sim.tables[0][0] * sim.B + 1      # a real, valid slot
        md.tail_slot_mapping[t_live + 1] = sim.ring_blocks[1] * C   # a real ring row
        assert (md.tail_slot_mapping[t_live:] >= 0).all()

    sim.step([(0, 6), (1, 3)], num_tokens=13, stale=True, edit=poison_padding)
    sim.step([(0, 3), (1, 3)], num_tokens=10, stale=True, edit=poison_padding)
    assert sim.cached == [9, 6]


def _wrong_orders(k: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor) -> list:
    """bf16 pools of windows ``[n, P, D]`` under plausible non-canonical rounding orders:
    divide once at the end (the CUDA kernel's order, §5.3), pairwise Z, fused multiply-add
    accumulation, ``torch.exp`` instead of ``exp_fp32``."""
    P = k.shape[1]
    s = gate + ape[None]
    m = s[:, 0]
    for j in range(1, P):
        m = torch.maximum(m, s[:, j])

    def seq(terms):
        acc = terms[0]
        for t in terms[1:]:
            acc = acc + t
        return acc

    outs = []
    for exp in (ref_exp_fp32, torch.exp):
        e = [exp(s[:, j] - m) for j in range(P)]
        z = seq(e)
        outs.append(seq([(e[j] / z) * k[:, j] for j in range(P)]))          # only exp differs
        outs.append(seq([e[j] * k[:, j] for j in range(P)]) / z)            # divide once
        if P >= 4:
            zp = seq([e[j] + e[j + 1] for j in range(0, P, 2)])
            outs.append(seq([(e[j] / zp) * k[:, j] for j in range(P)]))     # pairwise Z
        acc = (e[0] / z) * k[:, 0]
        for j in range(1, P):                                              # FMA
            acc = (acc.double() + (e[j] / z).double() * k[:, j].double()).float()
        outs.append(acc)
    return [o.to(torch.bfloat16) for o in outs[1:]]


@pytest.mark.parametrize("P", [4, 8])
def test_rounding_order_is_canonical(P):
    """Windows chosen so that their bf16 pool under the canonical order (§11: normalize, then
    sequential products-then-adds, software exp) differs from a wrong order (divide once,
    pairwise Z, FMA, torch.exp) in at least one channel, 3 windows per wrong order: the
    kernel must equal the canonical one bitwise. (Random data almost never exposes fp32
    order differences through the bf16 rounding; these windows do.)"""
    g = torch.Generator().manual_seed(41 + P)
    cand, D, per_order = 4096, 16, 3
    # Keys within a few fp32 ulps of a bf16 midpoint: the pooled value then sits on a bf16
    # rounding boundary, so its last fp32 bits decide the bf16 result.
    mid = (torch.randn(cand, 1, D, generator=g).to(torch.bfloat16).float().view(I32) + 0x8000)
    jitter = torch.randint(-3, 4, (cand, P, D), generator=g, dtype=I32)
    k = (mid + jitter).view(F32)
    gate = torch.randn(cand, P, D, generator=g) * 3
    ape = torch.randn(P, D, generator=g)
    ref = compress_pools(k, gate, ape).view(I16)
    picks = []
    for wrong in _wrong_orders(k, gate, ape):
        hits = (wrong.view(I16) != ref).any(dim=1).nonzero().flatten()
        assert hits.numel() >= per_order
        picks += hits[:per_order].tolist()
    pick = torch.tensor(sorted(set(picks)))
    n = pick.numel()
    sim = Sim(P=P, C=P, D=D, lengths=[n * P], seed=43)
    sim.K[0] = k[pick].reshape(n * P, D).clone()
    sim.G[0] = gate[pick].reshape(n * P, D).clone()
    sim.ape = ape
    sim.step([(0, n * P)])


@pytest.mark.parametrize("bad_block", [3537, -2])
def test_out_of_range_slots_and_ring_blocks_write_nothing_c05(bad_block):
    """C05(b) and bad metadata in general: ring slots of block 3537 (or negative), a compressed
    slot >= N*B, a negative slot other than -1, and a negative position never write; an
    out-of-range ring block is read as 0.0 for the window positions before the chunk
    (kpool-algorithm.md §5.2); no fault, guards intact."""
    P, C = 4, 4
    sim = Sim(P=P, C=C, lengths=[10, 12], seed=13)
    sim.step([(0, 6), (1, 5)])
    nb = sim.caches.num_pages * sim.B

    def corrupt(md):
        # rows 0..3: request 0 at positions 6..9; rows 4..10: request 1 at positions 5..11.
        md.tail_block_table[0, 0] = bad_block
        md.tail_slot_mapping[0:4] = bad_block * C + md.positions[0:4] % C
        assert int(md.slot_mapping[6]) >= 0                    # pos 7 of request 1 completes pool 1
        md.slot_mapping[6] = nb + 3
        md.slot_mapping[10] = -5                               # pos 11 completes pool 2
        md.tail_slot_mapping[9] = -3                           # pos 10 of request 1
        md.positions[8] = -4                                   # pos 9 of request 1

    sim.step([(0, 4), (1, 7)], edit=corrupt, expect=False, check=False)
    # Request 0, pool 1 = positions 4..7: 4, 5 come from the (out-of-range) ring -> zeros.
    k = sim.K[0][4:8].clone()
    gate = sim.G[0][4:8].clone()
    k[:2] = 0.0
    gate[:2] = 0.0
    sim.expect_pool(0, 1, sim.pool(0, 1, k=k, gate=gate))
    # Request 1: pools 1 and 2 not written; ring rows for positions 8 and 11 only
    # (10: slot -3, 9: position -4; last C=4 rows are positions 8..11).
    sim.expect_ring(1, 8)
    sim.expect_ring(1, 11)
    sim.check()
    assert not torch.equal(sim.pool(0, 1), sim.expected.compressed_cache[sim.tables[0][0], 1, 0])


def test_padded_stride_ring_view_c03():
    """C03: the ring is a padded-block-stride view (block stride 2*P*D + 256) of a backing
    filled with -123.0; the request owns block 3. Prefill positions 0..10 then decode 11:
    tail[3, :, 0..2] hold tokens 8..10, the dense-address location of block 3 and every
    padding element still hold -123, pool 2 = compress(k8, k9, k10, k11)."""
    P = C = 4
    D = 16
    sent = _f32_bits(-123.0)
    sim = Sim(P=P, C=C, D=D, lengths=[12], seed=17, num_tail_blocks=6, ring_blocks=[3],
              ring_block_padding=256, guard=8, fill32=sent)
    tail = sim.caches.tail_cache
    assert tail.stride(0) == 2 * P * D + 256 and not tail.is_contiguous()
    sim.step([(0, 11)])
    for s in range(3):
        assert torch.equal(tail[3, 0, s].cpu().view(I32), sim.K[0][8 + s].view(I32))
        assert torch.equal(tail[3, 1, s].cpu().view(I32), sim.G[0][8 + s].view(I32))
    backing = sim.caches.tail_backing.cpu().view(I32)
    for s in range(C):
        dense = 8 + 3 * 2 * P * D + s * D
        assert (backing[dense:dense + D] == sent - 2 ** 32).all(), "dense-address write"
    sim.step([(0, 1)])
    row = sim.caches.compressed_cache[sim.tables[0][2 // sim.B], 2 % sim.B, 0].cpu()
    backing = sim.caches.tail_backing.cpu().view(I32)
    assert torch.equal(row.view(I16), sim.pool(0, 2).view(I16))
    assert int((backing == sent - 2 ** 32).sum()) == backing.numel() - 2 * C * D


def _bf16_of_exact(values) -> torch.Tensor:
    """bf16 RNE of float64 values, asserting each is far from a bf16 rounding boundary (so the
    fp32 kernel result must round the same way)."""
    out = []
    for v in values:
        b = torch.tensor(v, dtype=torch.float64).to(F32).to(torch.bfloat16)
        ulp = 2.0 ** (math.frexp(abs(v))[1] - 8) if v != 0 else 0.0
        if v != 0:
            frac = abs(v) / ulp - math.floor(abs(v) / ulp)
            assert abs(frac - 0.5) > 1e-3, f"{v} is too close to a bf16 midpoint"
        out.append(b)
    return torch.stack(out)


@pytest.mark.parametrize("variant", ["A", "B"])
def test_dimensionwise_softmax_values_c31(variant):
    """C31: one pool, P=4, k_s = [s+1, -(s+1), 10 s], gates dim0 [0,0,0,5], dim1 [5,0,0,0],
    dim2 0; variant B adds APE ln 3 on dim 2 slot 3. The bf16 row equals the float64 values
    (3.96037, -1.03963, 15 or 20) rounded once, for prefill and decode (the ring stores the raw
    gate; APE is added once)."""
    P, D = 4, 16
    rows = {}
    for mode in ("prefill", "decode"):
        sim = Sim(P=P, C=P, D=D, lengths=[4], seed=19)
        k = torch.zeros(4, D)
        gate = torch.zeros(4, D)
        for s in range(4):
            k[s, :3] = torch.tensor([s + 1.0, -(s + 1.0), 10.0 * s])
        gate[3, 0] = 5.0
        gate[0, 1] = 5.0
        ape = torch.zeros(P, D)
        if variant == "B":
            ape[3, 2] = math.log(3.0)
        sim.K[0], sim.G[0], sim.ape = k, gate, ape
        if mode == "prefill":
            sim.step([(0, 4)])
        else:
            for _ in range(4):
                sim.step([(0, 1)])
        rows[mode] = sim.caches.compressed_cache[sim.tables[0][0], 0, 0].cpu()
    # float64 from the same fp32 inputs
    ape3 = float(torch.tensor(math.log(3.0), dtype=F32)) if variant == "B" else 0.0
    e5 = math.exp(5.0)
    d0 = (1 + 2 + 3 + 4 * e5) / (3 + e5)
    d1 = (-e5 - 2 - 3 - 4) / (e5 + 3)
    w = [1.0, 1.0, 1.0, math.exp(ape3)]
    d2 = sum(wi * 10.0 * s for s, wi in enumerate(w)) / sum(w)
    assert abs(d0 - 3.96037) < 1e-5 and abs(d1 + 1.03963) < 1e-5
    assert abs(d2 - (20.0 if variant == "B" else 15.0)) < 1e-5
    expected = torch.zeros(D, dtype=torch.bfloat16)
    expected[:3] = _bf16_of_exact([d0, d1, d2])
    assert torch.equal(rows["prefill"].view(I16), expected.view(I16))
    assert torch.equal(rows["decode"].view(I16), expected.view(I16))


def test_nonfinite_inputs_bitwise():
    """NaN (with payloads, signalling, negative) and +-inf in K and gate: pools equal the
    oracle bitwise (NaN pools -> canonical bf16 NaN 0x7FC0) and the ring copies carry the exact
    input bit patterns."""
    sim = Sim(P=4, C=5, lengths=[12, 9], seed=23)
    specials = _bits_to_f32([0x7FC01234, 0x7F800001, 0xFFC00000, 0x7F800000, 0xFF800000])
    sim.G[0][2, 1] = float("inf")
    sim.G[0][5, 2] = float("-inf")
    _copy_bits(sim.G[0][9, 3:8], specials)
    _copy_bits(sim.K[0][6, 0:5], specials)
    _copy_bits(sim.K[1][3, 4:9], specials)
    sim.G[1][7, :] = float("-inf")
    sim.step([(0, 5), (1, 4)])
    sim.step([(0, 7), (1, 5)])
    got = sim.caches.compressed_cache[sim.tables[0][0], 0, 0].cpu().view(I16)
    assert int(got[1]) == 0x7FC0                       # inf gate -> inf - inf -> NaN pool


@pytest.mark.parametrize("P", [4, 16])
def test_signed_zero_pools_bitwise(P):
    """A pool whose every K row is -0.0 compresses to -0.0 (bf16 0x8000), one with +0.0 and -0.0
    rows to +0.0, as the oracle's sums that start at their first term (the kernel's sums start
    at -0.0, the identity of fp32 addition; P = 16 walks its slots in unrolled groups of 4)."""
    sim = Sim(P=P, C=P + 1, lengths=[3 * P], seed=31)
    sim.K[0][0:P] = -0.0
    sim.K[0][P:2 * P] = -0.0
    sim.K[0][P + 1, :] = 0.0
    sim.step([(0, 3 * P)])
    got = sim.caches.compressed_cache[sim.tables[0][0], 0, 0].cpu().view(I16)
    assert (got == torch.tensor(0x8000, dtype=torch.int32).to(I16)).all(), got        # -0.0 everywhere
    second = sim.caches.compressed_cache[sim.tables[0][1 // sim.B], 1 % sim.B, 0].cpu().view(I16)
    assert (second == 0).all(), second                                                 # +0.0


class _NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError("a kernel was launched for an empty batch")


@pytest.mark.parametrize("empty", ["tokens", "requests"])
def test_empty_batch_launches_nothing(empty, monkeypatch):
    """§9 item 3: T_live == 0 or R == 0 -> no launch, caches untouched (even with padded rows
    carrying stale positive ring slots)."""
    monkeypatch.setattr(compress_mod, "_compress_kernel", _NoLaunch())
    monkeypatch.setattr(compress_mod, "_ring_write_kernel", _NoLaunch())
    sim = Sim(P=4, C=4, lengths=[4], seed=29)
    if empty == "tokens":
        sim.step([(0, 0)])
    else:
        sim.step([], num_tokens=4, stale=True)
    sim.check()


@pytest.mark.slow
def test_glm_shape_chunked_prefill_and_decode():
    """GLM-5.3-Flash shapes (D=128, P=4, B=32 pools per page, C=7 with 3 MTP tokens): mixed
    chunked prefill (unaligned chunk starts) and multi-token decode over 4 requests, bitwise
    vs the oracle with padded pages and ring blocks."""
    sim = Sim(P=4, C=7, D=128, B=32, lengths=[150, 71, 133, 9], seed=31, page_padding=64,
              ring_block_padding=32)
    sim.step([(0, 61), (1, 37), (2, 90), (3, 1)])
    sim.step([(0, 85), (1, 30), (2, 39), (3, 4)], num_tokens=170, stale=True)
    sim.step([(0, 4), (1, 4), (2, 4), (3, 4)])
    assert sim.cached == [150, 71, 133, 9]
