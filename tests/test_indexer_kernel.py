"""Kernel-level tests of ``kpool.ops.indexer`` against ``reference.numerics`` (kpool-algorithm.md
§4.1-§4.5, §7, §11): scores bitwise, canonical top-k, row expansion exactly.

Runs on the device the project resolves (default: the CPU Triton interpreter); tensors are
created on the host and moved to that device, results are compared on the host.
"""
import os

os.environ.setdefault("KPOOL_DEVICE", "cpu")
from kpool.platform import resolve_device, torch_device  # noqa: E402

DEVICE = resolve_device()
DEV = torch_device(DEVICE)

import pytest  # noqa: E402
import torch  # noqa: E402

from kpool.cache import allocate_caches  # noqa: E402
from kpool.config import KPoolConfig  # noqa: E402
from kpool.metadata import BatchSpec, RequestSpec, build_metadata  # noqa: E402
from kpool.ops import indexer as ix  # noqa: E402
from reference import numerics as rn  # noqa: E402

LOWEST = rn.LOWEST
FLT_MAX = rn.FLT_MAX
P, B, D, K_TOK = 4, 3, 16, 8
NAN_BF16 = 0x7FC1  # a NaN payload laid over page padding and guards: a wrong stride reads it
# Also run by `make test-ascend-interp` (triton-ascend 3.2's interpreter).
pytestmark = pytest.mark.interpreter_ok


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().cpu().contiguous().view(torch.int32)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = bits(got), bits(want)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].tolist()
        raise AssertionError(f"{int((got != want).sum())} cells differ, first {bad}")


def with_subnormals(x: torch.Tensor, gen: torch.Generator, fraction: float = 0.05) -> torch.Tensor:
    """Replace a fraction of a bf16 tensor's elements by bf16 subnormals (the interpreter's own
    bf16 -> fp32 cast gets these wrong; the kernels must upcast exactly)."""
    bits = x.view(torch.int16).clone()
    pick = torch.rand(x.shape, generator=gen) < fraction
    sub = torch.randint(1, 0x80, x.shape, generator=gen, dtype=torch.int16)
    sub = torch.where(torch.rand(x.shape, generator=gen) < 0.5, sub, sub | -0x8000)   # either sign
    return torch.where(pick, sub, bits).view(torch.bfloat16)


# --------------------------------------------------------------------------- batch fixture

class Batch:
    """A multi-request batch (prefill from 0, chunked prefill, a zero-length request, a decode
    row, a second chunk) with permuted pages, a padded page stride, guard bands, a
    non-contiguous block table holding one out-of-range page id, and two padded rows."""

    def __init__(self, H: int, weights_dtype=torch.float32, full_mode: bool = False, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.H = H
        cfg = KPoolConfig(index_n_heads=H, index_head_dim=D, index_kpool=P, index_topk=K_TOK)
        shape = [(0, 9), (13, 5), (0, 0), (30, 1), (5, 4)]          # (cached_len, query_len)
        pages_needed = [-(-((c + q) // P) // B) for c, q in shape]
        num_pages = sum(pages_needed) + 2
        perm = torch.randperm(num_pages, generator=gen).tolist()
        tables, k = [], 0
        for n in pages_needed:
            tables.append(perm[k:k + n])
            k += n
        width = max(pages_needed) + 1
        reqs = [RequestSpec(c, q, tables[i], i) for i, (c, q) in enumerate(shape)]
        meta = build_metadata(BatchSpec(reqs, num_tokens=sum(q for _, q in shape) + 2, full_mode=full_mode,
                                        block_table_width=width),
                              index_kpool=P, ring_capacity=P, page_size=B)
        self.caches = allocate_caches(cfg, num_pages=num_pages, page_size=B, num_tail_blocks=len(shape),
                                      page_padding=5, guard=7, fill_bf16_bits=NAN_BF16, device=DEV)
        cache = self.caches.compressed_cache
        host = with_subnormals(torch.randn(cache.shape, generator=gen).to(torch.bfloat16), gen)
        # A pool key made only of subnormals (request 0, pool 1): its scores are tiny and
        # expose any inexact bf16 -> fp32 upcast (isolated subnormals vanish in the sums).
        host[tables[0][0], 1, 0, :] = with_subnormals(host[tables[0][0], 1, 0, :], gen, fraction=1.0)
        cache.copy_(host.to(DEV))
        # Logical page 2 of the decode request (pools 6..8, pool 6 visible) points far outside
        # the cache: the kernel clamps it to page N-1 (address legality only, §4.6).
        bt = meta.block_table.clone()
        bt[3, 2] = 10 ** 6
        self.block_table_host = bt
        R, M = bt.shape
        big = torch.full((R, 2 * M + 1), -9, dtype=torch.int32, device=DEV)
        self.block_table = big[:, 1::2]                                # stride (2M+1, 2)
        self.block_table.copy_(bt.to(DEV))
        assert not self.block_table.is_contiguous()
        self.meta = meta
        self.T = meta.num_tokens
        self.t_live = meta.num_live_tokens
        self.q = with_subnormals(torch.randn(self.T, H, D, generator=gen).to(torch.bfloat16), gen)
        self.q[11] = with_subnormals(self.q[11], gen, fraction=1.0)     # a query of subnormals only
        self.weights = torch.randn(self.T, H, generator=gen).to(weights_dtype)

    def kwargs(self, max_pool_seq_len=None):
        m = self.meta
        return dict(q=self.q.to(DEV), weights=self.weights.to(DEV),
                    compressed_cache=self.caches.compressed_cache, positions=m.positions.to(DEV),
                    cum_query_lens=m.cum_query_lens.to(DEV), seq_lens=m.seq_lens.to(DEV),
                    block_table=self.block_table, index_kpool=P,
                    max_pool_seq_len=m.max_pool_seq_len if max_pool_seq_len is None else max_pool_seq_len)

    def score(self, mode, row_start=0, num_rows=None, out=None, **extra):
        num_rows = self.t_live if num_rows is None else num_rows
        kw = self.kwargs()
        if out is None:
            out = torch.empty(num_rows, kw["max_pool_seq_len"], dtype=torch.float32, device=DEV)
        return ix.score_pools(**kw, score_mode=mode, row_start=row_start, num_rows=num_rows, out=out, **extra)

    def reference(self, mode, rows=None):
        """``pool_scores`` + ``sanitize_scores`` on host gathers of each row's pools."""
        m = self.meta
        rows = torch.arange(self.t_live) if rows is None else rows
        cum = m.cum_query_lens.tolist()
        R = len(cum)
        req = torch.tensor([min(sum(c <= t for c in cum), R - 1) for t in rows.tolist()])
        cache = self.caches.compressed_cache.cpu()
        N = cache.shape[0]
        j = torch.arange(m.max_pool_seq_len)
        page = self.block_table_host[req][:, j // B].long().clamp(0, N - 1)
        pools = cache[page, (j % B)[None, :].expand_as(page), 0, :]
        visible = torch.minimum((m.positions[rows] + 1) // P, m.seq_lens[req].long())
        raw = rn.pool_scores(self.q[rows], self.weights[rows], pools, mode)
        return rn.sanitize_scores(raw, visible), visible


# --------------------------------------------------------------------------- score_pools

@pytest.mark.parametrize("mode", ["relu", "merged"])
@pytest.mark.parametrize("H,wdtype", [(1, torch.float32), (2, torch.bfloat16), (3, torch.float32)])
def test_scores_bitwise_equal_reference(mode, H, wdtype):
    batch = Batch(H, wdtype, seed=H)
    got = batch.score(mode)
    want, visible = batch.reference(mode)
    assert got.shape == (batch.t_live, batch.meta.max_pool_seq_len)
    assert_bits_equal(got, want)
    # Non-vacuous: visible cells carry real scores, invisible ones LOWEST.
    j = torch.arange(want.shape[1])[None, :]
    assert (want[j < visible[:, None]] > LOWEST).all() and (want[j >= visible[:, None]] == LOWEST).all()
    assert int((j < visible[:, None]).sum()) > 20


@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_full_mode_capacity_and_tile_size_invariance(mode):
    batch = Batch(3, full_mode=True, seed=7)
    assert batch.meta.max_pool_seq_len == batch.block_table.shape[1] * B
    want, _ = batch.reference(mode)
    results = [batch.score(mode, block_rows=br, block_pools=bp)
               for br, bp in [(None, None), (16, 128), (1, 4), (2, 8), (4, 2)]]
    for got in results:
        assert_bits_equal(got, want)


def test_grid_stride_loop_with_capped_grid(monkeypatch):
    batch = Batch(2, seed=3)
    want, _ = batch.reference("relu")
    monkeypatch.setattr(ix, "MAX_GRID", 3)
    assert_bits_equal(batch.score("relu", block_rows=2, block_pools=2), want)


def test_row_chunking_uses_global_rows_and_leaves_scratch_tail():
    batch = Batch(2, seed=11)
    mps = batch.meta.max_pool_seq_len
    for mode in ("relu", "merged"):
        want, _ = batch.reference(mode)
        pieces = []
        for start in range(0, batch.t_live, 5):
            n = min(5, batch.t_live - start)
            scratch = torch.full((5, mps + 3), 12345.0, dtype=torch.float32, device=DEV)
            got = batch.score(mode, row_start=start, num_rows=n, out=scratch)
            assert got.data_ptr() == scratch.data_ptr() and got.shape == (n, mps)
            host = scratch.cpu()
            assert (host[:, mps:] == 12345.0).all() and (host[n:] == 12345.0).all()
            pieces.append(got.cpu().clone())
        assert_bits_equal(torch.cat(pieces), want)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy (interpreter) warns on inf - inf
@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_nan_and_inf_are_sanitized(mode):
    batch = Batch(2, seed=5)
    m = batch.meta
    cache = batch.caches.compressed_cache
    bt = batch.block_table_host
    # Request 1 (rows 9..13, positions 13..17, 4 pools): pool 0 channel 3 = +inf with positive
    # q and w there -> +inf score -> FLT_MAX; pool 1 channel 5 = -inf; pool 2 one NaN channel.
    rows1 = slice(9, 14)
    batch.q[rows1, :, 3] = batch.q[rows1, :, 3].abs() + 1
    batch.q[rows1, :, 5] = batch.q[rows1, :, 5].abs() + 1
    batch.weights[rows1] = batch.weights[rows1].abs() + 0.5
    cache[int(bt[1, 0]), 0, 0, 3] = float("inf")
    cache[int(bt[1, 0]), 1, 0, 5] = float("-inf")
    cache[int(bt[1, 0]), 2, 0, 7] = float("nan")
    # Request 0: a NaN query element (row 8) and an infinite head weight (row 6).
    batch.q[8, 1, 2] = float("nan")
    batch.weights[6, 0] = float("inf")
    got = batch.score(mode)
    want, visible = batch.reference(mode)
    assert_bits_equal(got, want)
    assert (want[rows1, 0] == FLT_MAX).all()
    assert (want[rows1, 2] == LOWEST).all()                        # NaN pool
    assert (want[8, :int(visible[8])] == LOWEST).all()              # NaN query
    if mode == "merged":
        assert (want[rows1, 1] == LOWEST).all()                    # -inf score


@pytest.mark.slow
def test_glm_shaped_scores():
    """GLM-5.3-Flash head geometry (H=32, D=128), a few rows, 2050 pools."""
    gen = torch.Generator().manual_seed(1)
    H, Dg, Bg = 32, 128, 16
    cfg = KPoolConfig(index_n_heads=H, index_head_dim=Dg, index_kpool=P, index_topk=2048)
    pools = 2050
    pages = -(-pools // Bg)
    caches = allocate_caches(cfg, num_pages=pages + 1, page_size=Bg, num_tail_blocks=1, page_padding=2 * Dg,
                             device=DEV)
    caches.compressed_cache.copy_(torch.randn(caches.compressed_cache.shape, generator=gen).bfloat16().to(DEV))
    table = torch.randperm(pages + 1, generator=gen)[:pages].tolist()
    meta = build_metadata(BatchSpec([RequestSpec(pools * P - 6, 6, table, 0)]), index_kpool=P,
                          ring_capacity=P, page_size=Bg)
    q = torch.randn(6, H, Dg, generator=gen).bfloat16()
    w = (torch.randn(6, H, generator=gen) / 64).bfloat16()
    for mode in ("relu", "merged"):
        out = torch.empty(6, pools, device=DEV)
        got = ix.score_pools(q=q.to(DEV), weights=w.to(DEV), compressed_cache=caches.compressed_cache,
                             positions=meta.positions.to(DEV), cum_query_lens=meta.cum_query_lens.to(DEV),
                             seq_lens=meta.seq_lens.to(DEV), block_table=meta.block_table.to(DEV),
                             max_pool_seq_len=pools, index_kpool=P, score_mode=mode, row_start=0, num_rows=6,
                             out=out)
        j = torch.arange(pools)
        c = caches.compressed_cache.cpu()[meta.block_table[0][j // Bg].long(), j % Bg, 0, :]
        visible = (meta.positions + 1) // P
        want = rn.sanitize_scores(rn.pool_scores(q, w, c, mode), visible)
        assert_bits_equal(got, want)


# --------------------------------------------------------------------------- select_topk

def _check_topk(scores: torch.Tensor, selected: int) -> None:
    ids, values = ix.select_topk(scores.to(DEV), selected)
    assert ids.dtype == torch.int32 and values.dtype == torch.float32
    assert ids.shape == values.shape == (scores.shape[0], selected)
    want_ids, want_valid = rn.canonical_topk(scores, selected)
    assert torch.equal(ids.cpu().long(), want_ids)
    assert_bits_equal(values, scores.gather(1, want_ids))
    assert torch.equal(values.cpu() > LOWEST, want_valid)


def test_select_topk_matches_canonical_with_ties_and_signed_zeros():
    gen = torch.Generator().manual_seed(2)
    palette = torch.tensor([-1.0, 0.0, -0.0, 2.0, 3.0, LOWEST, FLT_MAX, 2.5e-38], dtype=torch.float32)
    scores = palette[torch.randint(0, len(palette), (9, 23), generator=gen)]
    scores[0] = 0.0
    scores[0, ::2] = -0.0                                    # -0.0 and +0.0 tie: ascending pool id
    scores[1] = LOWEST                                       # nothing valid
    scores[2] = torch.randn(23, generator=gen)               # no ties
    for selected in (0, 1, 5, 23):
        _check_topk(scores, selected)
    ids, _ = ix.select_topk(scores[:1].to(DEV), 23)
    assert ids.cpu().tolist() == [list(range(23))]


def test_select_topk_random_rows():
    gen = torch.Generator().manual_seed(4)
    scores = torch.randint(-3, 4, (40, 70), generator=gen).to(torch.float32)
    scores[scores == -3] = LOWEST
    _check_topk(scores, 17)


# --------------------------------------------------------------------------- expand_indices

def _expected_rows(ids, scores, positions, t_live, T, width, K, Pp, pack):
    rows = []
    for t in range(T):
        if t < t_live:
            rows.append(rn.expand_row(ids[t].tolist(), (scores[t] > LOWEST).tolist(), int(positions[t]),
                                      index_topk=K, index_kpool=Pp, pack_tail=pack, width=width))
        else:
            rows.append([-1] * width)
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("Pp,K", [(1, 8), (4, 8), (8, 16)])
@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("which", ["none", "partial", "all"])
def test_expand_matches_expand_row_in_strided_buffer(Pp, K, pack, which):
    gen = torch.Generator().manual_seed(Pp * 10 + K + pack)
    k_pool = K // Pp
    selected = {"none": 0, "partial": max(k_pool - 1, 1), "all": k_pool}[which]
    W = K + Pp - 1
    positions = torch.tensor([0, 1, Pp - 1, Pp, K - 1, K + 2, 999, 37, 5, 12, 0, 0, 0], dtype=torch.int64)
    T, t_live = positions.shape[0], 10
    positions[t_live:] = torch.tensor([3, 17, 40])            # padding rows: ignored
    # Selection tensors as strided views (slices of wider buffers).
    ids_full = torch.randint(0, 300, (t_live, selected + 3), generator=gen, dtype=torch.int32)
    sc_full = torch.randn(t_live, selected + 3, generator=gen)
    sc_full[torch.rand(t_live, selected + 3, generator=gen) < 0.3] = LOWEST    # invalid slots
    sc_full[0, :] = float("-inf")                              # -inf is invalid too
    ids, scores = ids_full[:, 1:1 + selected], sc_full[:, 1:1 + selected]
    width = W + 5
    cap_rows = T + 2
    big = torch.full((2 * cap_rows, width + 3), -777, dtype=torch.int32, device=DEV)
    out = big[0::2][:T, :width]
    ix.expand_indices(pool_ids=ids.to(DEV),
                      pool_scores=scores.to(DEV), positions=positions.to(DEV), num_live_tokens=t_live,
                      index_topk=K, index_kpool=Pp, pack_tail=pack, out=out)
    want = _expected_rows(ids, scores, positions, t_live, T, width, K, Pp, pack)
    host = big.cpu()
    assert torch.equal(host[0::2][:T, :width], want)
    assert (host[1::2] == -777).all()                         # interleaved rows untouched
    assert (host[0::2][T:] == -777).all()                     # rows beyond T untouched
    assert (host[:, width:] == -777).all()                    # beyond the view's width untouched
    assert (want[:, W:] == -1).all() and (want[t_live:] == -1).all()
    if selected:
        assert (want[:t_live, :K] >= 0).any()


def test_expand_tile_sizes_and_capped_grid(monkeypatch):
    gen = torch.Generator().manual_seed(9)
    Pp, K, T, t_live, selected = 4, 16, 9, 7, 4
    positions = torch.randint(0, 90, (T,), generator=gen)
    ids = torch.randint(0, 40, (t_live, selected), generator=gen, dtype=torch.int32)
    scores = torch.randn(t_live, selected, generator=gen)
    scores[1, 2] = LOWEST
    width = K + Pp - 1 + 2
    want = _expected_rows(ids, scores, positions, t_live, T, width, K, Pp, True)
    monkeypatch.setattr(ix, "MAX_GRID", 2)
    for br, bc in [(None, None), (1, 4), (4, 8), (16, 2)]:
        out = torch.full((T, width), -777, dtype=torch.int32, device=DEV)
        ix.expand_indices(pool_ids=ids.to(DEV), pool_scores=scores.to(DEV), positions=positions.to(DEV),
                          num_live_tokens=t_live, index_topk=K, index_kpool=Pp, pack_tail=True, out=out,
                          block_rows=br, block_cols=bc)
        assert torch.equal(out.cpu(), want)


def test_worked_example_of_section_4_5():
    """kpool-algorithm.md §4.5: P=4, K_tok=8, W=11, positions 2, 3, 6, 10, 18."""
    positions = torch.tensor([2, 3, 6, 10, 18])
    ids = torch.tensor([[0, 1], [0, 1], [0, 1], [1, 0], [3, 1]], dtype=torch.int32)
    scores = torch.tensor([[LOWEST, LOWEST], [1.0, LOWEST], [2.0, LOWEST], [5.0, 3.0], [9.0, 7.0]])
    out = {}
    for pack in (True, False):
        buf = torch.full((5, 11), -777, dtype=torch.int32, device=DEV)
        ix.expand_indices(pool_ids=ids.to(DEV), pool_scores=scores.to(DEV), positions=positions.to(DEV),
                          num_live_tokens=5, index_topk=8, index_kpool=4, pack_tail=pack, out=buf)
        out[pack] = buf.cpu().tolist()
    n = -1
    assert out[True] == [
        [0, 1, 2, n, n, n, n, n, n, n, n],
        [0, 1, 2, 3, n, n, n, n, n, n, n],
        [0, 1, 2, 3, 4, 5, 6, n, n, n, n],
        [4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10],
        [12, 13, 14, 15, 4, 5, 6, 7, 16, 17, 18],
    ]
    assert out[False][0] == [n] * 8 + [0, 1, 2]
    assert out[False][2] == [0, 1, 2, 3, n, n, n, n, 4, 5, 6]
    assert out[False][3:] == out[True][3:]


# --------------------------------------------------------------------------- chained

@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_score_select_expand_chain_matches_reference(mode):
    batch = Batch(2, torch.bfloat16, seed=13)
    m = batch.meta
    selected = min(K_TOK // P, m.max_pool_seq_len)
    ids, top = ix.select_topk(batch.score(mode), selected)
    out = torch.full((batch.T, K_TOK + P - 1), -777, dtype=torch.int32, device=DEV)
    ix.expand_indices(pool_ids=ids, pool_scores=top, positions=m.positions.to(DEV), num_live_tokens=batch.t_live,
                      index_topk=K_TOK, index_kpool=P, pack_tail=True, out=out)
    want_scores, _ = batch.reference(mode)
    want_ids, want_valid = rn.canonical_topk(want_scores, selected)
    want = []
    for t in range(batch.T):
        if t < batch.t_live:
            want.append(rn.expand_row(want_ids[t].tolist(), want_valid[t].tolist(), int(m.positions[t]),
                                      index_topk=K_TOK, index_kpool=P, pack_tail=True, width=K_TOK + P - 1))
        else:
            want.append([-1] * (K_TOK + P - 1))
    assert out.cpu().tolist() == want
