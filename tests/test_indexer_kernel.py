"""Kernel-level tests of the lightning-indexer kernels (``kpool.ops.score``, ``.topk``,
``.expand``) against ``reference.numerics`` (kpool-algorithm.md §4.1-§4.5, §7, §11).

Scores are ``tl.dot`` accumulations, so they equal the reference bit for bit on exact data (every
partial sum exact: small integers and dyadic fractions) and lie within the certified fp32
accumulation bound of the tie certificate (parity-contract.md §3.2, docs/certificates.md §2) of the
exact float64 score on random data. Kernel against kernel (tiles, grids, chunks, the decode or
prefill tiling) everything is bitwise. Selection and expansion are exact everywhere.

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
from kpool.ops import plan  # noqa: E402
from parity.checking.certificates import score_bounds  # noqa: E402
from reference import numerics as rn  # noqa: E402

LOWEST = rn.LOWEST
FLT_MAX = rn.FLT_MAX
P, B, D, K_TOK = 4, 3, 16, 8
NAN_BF16 = 0x7FC1  # a NaN payload laid over page padding and guards: a wrong stride reads it
# Also run by `make test-ascend-interp` (triton-ascend 3.2's interpreter).
pytestmark = pytest.mark.interpreter_ok


def certified_bounds(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, mode: str) -> torch.Tensor:
    """float64 ``[T, N]`` any-order fp32 bounds of the tie certificate (docs/certificates.md §2,
    :func:`parity.checking.certificates.score_bounds`) of rows ``q [T, H, D]``, ``w [T, H]`` against their
    keys ``[T, N, D]`` (float64 tensors of bf16 / fp32 values)."""
    if q.shape[0] == 0:
        return torch.zeros(0, keys.shape[1], dtype=torch.float64)
    return torch.stack([torch.from_numpy(score_bounds(q[t].numpy(), w[t].numpy(), keys[t].numpy(), mode).bounds)
                        for t in range(q.shape[0])])


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


def exact_values(shape, gen, scale: float, dtype=torch.bfloat16) -> torch.Tensor:
    """Integers in [-4, 4] times a power of two: every score partial sum is exact in fp32."""
    return (torch.randint(-4, 5, shape, generator=gen).to(torch.float32) * scale).to(dtype)


# --------------------------------------------------------------------------- batch fixture

class Batch:
    """A multi-request batch (prefill from 0, chunked prefill, a zero-length request, a decode
    row, a second chunk) with permuted pages, a padded page stride, guard bands, a
    non-contiguous block table holding one out-of-range page id, and two padded rows. Requests
    of 9 rows go to the prefill kernel, those of 1, 4 and 5 rows to the decode kernel.

    ``values="random"``: N(0, 1) data with bf16 subnormals; ``"exact"``: small dyadic values."""

    def __init__(self, H: int, weights_dtype=torch.float32, full_mode: bool = False, seed: int = 0,
                 values: str = "random", head_dim: int = D):
        gen = torch.Generator().manual_seed(seed)
        self.H, self.D = H, head_dim
        cfg = KPoolConfig(index_n_heads=H, index_head_dim=head_dim, index_kpool=P, index_topk=K_TOK)
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
        self.T = meta.num_tokens
        if values == "exact":
            host = exact_values(cache.shape, gen, 0.25)
            self.q = exact_values((self.T, H, head_dim), gen, 1.0)
            self.weights = exact_values((self.T, H), gen, 2.0 ** -6, weights_dtype)
        else:
            host = with_subnormals(torch.randn(cache.shape, generator=gen).to(torch.bfloat16), gen)
            # A pool key made only of subnormals (request 0, pool 1): its scores are tiny and
            # expose any inexact bf16 -> fp32 upcast (isolated subnormals vanish in the sums).
            host[tables[0][0], 1, 0, :] = with_subnormals(host[tables[0][0], 1, 0, :], gen, fraction=1.0)
            self.q = with_subnormals(torch.randn(self.T, H, head_dim, generator=gen).to(torch.bfloat16), gen)
            self.q[11] = with_subnormals(self.q[11], gen, fraction=1.0)     # a query of subnormals only
            self.weights = torch.randn(self.T, H, generator=gen).to(weights_dtype)
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
        self.t_live = meta.num_live_tokens

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

    def keys(self, mode, row_start=0, num_rows=None):
        num_rows = self.t_live if num_rows is None else num_rows
        kw = self.kwargs()
        keys = torch.full((num_rows, kw["max_pool_seq_len"]), 7, dtype=torch.int64, device=DEV)
        return ix.score_keys(**kw, score_mode=mode, row_start=row_start, num_rows=num_rows, keys=keys)

    def pools(self, rows):
        """Host gathers ``[rows, max_pool_seq_len, D]`` of each row's pools, the visible counts and
        the request of each row."""
        m = self.meta
        cum = m.cum_query_lens.tolist()
        R = len(cum)
        req = torch.tensor([min(sum(c <= t for c in cum), R - 1) for t in rows.tolist()])
        cache = self.caches.compressed_cache.cpu()
        N = cache.shape[0]
        j = torch.arange(m.max_pool_seq_len)
        page = self.block_table_host[req][:, j // B].long().clamp(0, N - 1)
        pools = cache[page, (j % B)[None, :].expand_as(page), 0, :]
        visible = torch.minimum((m.positions[rows] + 1) // P, m.seq_lens[req].long())
        return pools, visible

    def reference(self, mode, rows=None):
        """``pool_scores`` + ``sanitize_scores`` on host gathers of each row's pools."""
        rows = torch.arange(self.t_live) if rows is None else rows
        pools, visible = self.pools(rows)
        raw = rn.pool_scores(self.q[rows], self.weights[rows], pools, mode)
        return rn.sanitize_scores(raw, visible), visible

    def exact_f64(self, mode):
        """float64 scores and the certified bound ``gamma_n * sum |w q c|`` of every live cell."""
        rows = torch.arange(self.t_live)
        pools, visible = self.pools(rows)
        c = pools.to(torch.float64)
        q = self.q[rows].to(torch.float64)
        w = self.weights[rows].to(torch.float64)
        dots = torch.einsum("tnd,thd->tnh", c, q)
        terms = dots.clamp_min(0) if mode == "relu" else dots
        score = torch.einsum("tnh,th->tn", terms, w)
        return score, certified_bounds(q, w, c, mode), visible


# --------------------------------------------------------------------------- score_keys

@pytest.mark.parametrize("mode", ["relu", "merged"])
@pytest.mark.parametrize("H,wdtype", [(1, torch.float32), (2, torch.bfloat16), (3, torch.float32),
                                      (20, torch.bfloat16)])
def test_exact_data_scores_bitwise_equal_reference(mode, H, wdtype):
    batch = Batch(H, wdtype, seed=H, values="exact")
    got = batch.score(mode)
    want, visible = batch.reference(mode)
    assert got.shape == (batch.t_live, batch.meta.max_pool_seq_len)
    assert_bits_equal(got, want.where(want != 0, torch.zeros_like(want)))   # -0.0 is keyed as +0.0
    # Non-vacuous: visible cells carry real scores (not all zero), invisible ones LOWEST.
    j = torch.arange(want.shape[1])[None, :]
    assert (want[j < visible[:, None]] > LOWEST).all() and (want[j >= visible[:, None]] == LOWEST).all()
    assert int((want[j < visible[:, None]] != 0).sum()) > 10


@pytest.mark.parametrize("mode", ["relu", "merged"])
@pytest.mark.parametrize("H,wdtype,head_dim", [(2, torch.float32, 16), (3, torch.bfloat16, 16),
                                               (5, torch.float32, 8), (2, torch.float32, 32)])
def test_random_scores_within_the_certified_bound(mode, H, wdtype, head_dim):
    batch = Batch(H, wdtype, seed=20 + H, head_dim=head_dim)
    got = batch.score(mode).cpu().to(torch.float64)
    exact, bound, visible = batch.exact_f64(mode)
    ref, _ = batch.reference(mode)
    vis = torch.arange(got.shape[1])[None, :] < visible[:, None]
    err = (got - exact).abs()[vis]
    assert (err <= bound[vis]).all(), float((err - bound[vis]).max())
    assert ((ref.to(torch.float64) - exact).abs()[vis] <= bound[vis]).all()     # the bound is real
    assert (got[~vis] == LOWEST).all()
    # Non-vacuous: the bound is a few fp32 ulps of the terms, far below any real score error.
    assert float((bound[vis] / exact.abs()[vis].clamp_min(1e-30)).median()) < 1e-4


@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_keys_are_the_canonical_keys_of_the_scores(mode):
    """The fused epilogue writes exactly ``topk.canonical_keys`` of the scores it computed."""
    batch = Batch(3, seed=8)
    keys = batch.keys(mode).cpu()
    assert torch.equal(keys, ix.canonical_keys(ix.key_scores(keys)))
    assert torch.equal(ix.key_pool_ids(keys), torch.arange(keys.shape[1], dtype=torch.int32).expand_as(keys))


def _kernel_runs(batch, mode, tunings):
    """Scores of ``batch`` under each ``TUNING`` override of the interpreter's plan."""
    out = []
    for override in tunings:
        saved = {k: dict(v["cpu"]) for k, v in plan.TUNING.items()}
        try:
            for kernel, values in override.items():
                plan.TUNING[kernel]["cpu"].update(values)
            out.append(batch.score(mode).cpu())
        finally:
            for k, v in saved.items():
                plan.TUNING[k]["cpu"] = v
    return out


@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_full_mode_capacity_tile_and_grid_invariance(mode):
    batch = Batch(3, full_mode=True, seed=7)
    assert batch.meta.max_pool_seq_len == batch.block_table.shape[1] * B
    runs = _kernel_runs(batch, mode, [
        {}, {"score_decode": {"BLOCK_N": 16}, "score_prefill": {"BLOCK_M": 16, "BLOCK_N": 16}},
        {"score_decode": {"BLOCK_N": 32, "cap": 1}, "score_prefill": {"BLOCK_N": 64, "cap": 3}},
        {"score_decode": {"cap": 2}, "score_prefill": {"BLOCK_M": 32, "BLOCK_N": 16, "cap": 1}}])
    for got in runs[1:]:
        assert_bits_equal(got, runs[0])
    exact, bound, visible = batch.exact_f64(mode)
    vis = torch.arange(runs[0].shape[1])[None, :] < visible[:, None]
    assert ((runs[0].to(torch.float64) - exact).abs()[vis] <= bound[vis]).all()


@pytest.mark.parametrize("decode_rows", [0, 4, 100])
def test_decode_or_prefill_tiling_exact_data_bitwise(monkeypatch, decode_rows):
    """Every request through the prefill kernel (0), the split of the default batch (4), or
    every request through the decode kernel (100): exact data equals the reference bitwise."""
    monkeypatch.setattr(plan, "DECODE_ROWS", decode_rows)
    for mode in ("relu", "merged"):
        batch = Batch(2, torch.bfloat16, seed=31, values="exact")
        want, _ = batch.reference(mode)
        assert_bits_equal(batch.score(mode), want.where(want != 0, torch.zeros_like(want)))


def test_row_chunking_uses_global_rows_and_leaves_scratch_tail():
    batch = Batch(2, seed=11)
    mps = batch.meta.max_pool_seq_len
    for mode in ("relu", "merged"):
        whole = batch.score(mode).cpu()
        pieces = []
        for start in range(0, batch.t_live, 5):
            n = min(5, batch.t_live - start)
            scratch = torch.full((5, mps + 3), 12345.0, dtype=torch.float32, device=DEV)
            got = batch.score(mode, row_start=start, num_rows=n, out=scratch)
            assert got.data_ptr() == scratch.data_ptr() and got.shape == (n, mps)
            host = scratch.cpu()
            assert (host[:, mps:] == 12345.0).all() and (host[n:] == 12345.0).all()
            pieces.append(got.cpu().clone())
        assert_bits_equal(torch.cat(pieces), whole)


def test_padding_rows_are_never_written():
    batch = Batch(2, seed=12)
    keys = batch.keys("relu", num_rows=batch.T).cpu()
    assert (keys[batch.t_live:] == 7).all()                  # the scratch's fill survives
    assert not (keys[:batch.t_live] == 7).any()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy (interpreter) warns on inf - inf
@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_nan_and_inf_are_sanitized(mode):
    batch = Batch(2, seed=5, values="exact")
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
    # Request 0 (prefill kernel): a NaN query element (row 8) and an infinite head weight
    # (row 6); request 4 (decode kernel, rows 15..18): an infinite weight on row 17.
    batch.q[8, 1, 2] = float("nan")
    batch.weights[6, 0] = float("inf")
    batch.weights[17, 1] = float("-inf")
    got = batch.score(mode)
    want, visible = batch.reference(mode)
    assert_bits_equal(got, want.where(want != 0, torch.zeros_like(want)))
    assert (want[rows1, 0] == FLT_MAX).all()
    assert (want[rows1, 2] == LOWEST).all()                        # NaN pool
    assert (want[8, :int(visible[8])] == LOWEST).all()              # NaN query
    if mode == "merged":
        assert (want[rows1, 1] == LOWEST).all()                    # -inf score


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy (interpreter) warns on inf - inf
@pytest.mark.parametrize("decode_rows", [8, 100])
@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_decode_rows_sharing_a_key_tile_are_scored_as_alone(monkeypatch, mode, decode_rows):
    """The decode kernel reads each key tile once per request, up to the largest visibility among
    the request's rows, and scores it for every row (issue 20 point 3). On random data, rows of
    the 4- and 5-row requests (and, with ``DECODE_ROWS = 100``, the 9-row one, whose rows see 0-2
    pools) see different numbers of pools, and a non-finite key sits at a pool only the longer
    rows of each request see: every row's keys equal its keys scored alone (a one-row chunk,
    whose tile holds only the row's own visible pools), pools past a row's visibility are LOWEST,
    and in mode (M) the rows that see the non-finite key take the exact fallback (bitwise the
    reference) while the shorter rows keep the split dot's bits (which differ from the
    reference's here, so a wrongly taken fallback would show)."""
    monkeypatch.setattr(plan, "DECODE_ROWS", decode_rows)
    batch = Batch(3, seed=4)
    cache, bt = batch.caches.compressed_cache, batch.block_table_host
    # (request, its rows, pool, channel, value): only the longer rows of the request see the pool.
    planted = [(1, range(9, 14), 3, 2, float("inf")), (4, range(15, 19), 1, 4, float("nan"))]
    if decode_rows > 8:
        planted.append((0, range(0, 9), 1, 0, float("-inf")))
    for r, _, pool, ch, value in planted:
        cache[int(bt[r, pool // B]), pool % B, 0, ch] = value
    keys = batch.keys(mode).cpu()
    alone = torch.cat([batch.keys(mode, row_start=t, num_rows=1).cpu() for t in range(batch.t_live)])
    differ = (keys != alone).nonzero()[:5].tolist()
    assert not differ, f"cells (row, pool) differ from the row scored alone: {differ}"
    scores = ix.key_scores(keys)
    want, visible = batch.reference(mode)
    j = torch.arange(keys.shape[1])[None, :]
    assert (scores[j >= visible[:, None]] == LOWEST).all()
    differs = 0
    for r, rows, pool, _, _ in planted:
        rows = torch.tensor(list(rows))
        longer, shorter = rows[visible[rows] > pool], rows[visible[rows] <= pool]
        assert len(longer) and len(shorter)                         # rows of one request see different pools
        if mode == "merged":
            assert_bits_equal(scores[longer], want[longer].where(want[longer] != 0, torch.zeros(())))
        seen = j[0, :int(visible[shorter].max())]
        differs += int((bits(scores[shorter][:, seen]) != bits(want[shorter][:, seen])).sum())
    if mode == "merged":
        assert differs > 0


@pytest.mark.slow
def test_glm_shaped_scores():
    """GLM-5.3-Flash head geometry (H=32, D=128), 6 rows (decode kernel) and 20 rows (prefill
    kernel), 2050 pools: exact data bitwise, random data within the certified bound."""
    gen = torch.Generator().manual_seed(1)
    H, Dg, Bg = 32, 128, 16
    cfg = KPoolConfig(index_n_heads=H, index_head_dim=Dg, index_kpool=P, index_topk=2048)
    pools = 2050
    pages = -(-pools // Bg)
    caches = allocate_caches(cfg, num_pages=pages + 1, page_size=Bg, num_tail_blocks=1, page_padding=2 * Dg,
                             device=DEV)
    table = torch.randperm(pages + 1, generator=gen)[:pages].tolist()
    for rows in (6, 20):
        meta = build_metadata(BatchSpec([RequestSpec(pools * P - rows, rows, table, 0)]), index_kpool=P,
                              ring_capacity=P, page_size=Bg)
        for values in ("exact", "random"):
            if values == "exact":
                cache = exact_values(caches.compressed_cache.shape, gen, 0.25)
                q, w = exact_values((rows, H, Dg), gen, 1.0), exact_values((rows, H), gen, 2.0 ** -6)
            else:
                cache = torch.randn(caches.compressed_cache.shape, generator=gen).bfloat16()
                q, w = torch.randn(rows, H, Dg, generator=gen).bfloat16(), (torch.randn(rows, H, generator=gen) / 64).bfloat16()
            caches.compressed_cache.copy_(cache.to(DEV))
            j = torch.arange(pools)
            c = caches.compressed_cache.cpu()[meta.block_table[0][j // Bg].long(), j % Bg, 0, :]
            visible = (meta.positions + 1) // P
            for mode in ("relu", "merged"):
                out = torch.empty(rows, pools, device=DEV)
                got = ix.score_pools(q=q.to(DEV), weights=w.to(DEV), compressed_cache=caches.compressed_cache,
                                     positions=meta.positions.to(DEV), cum_query_lens=meta.cum_query_lens.to(DEV),
                                     seq_lens=meta.seq_lens.to(DEV), block_table=meta.block_table.to(DEV),
                                     max_pool_seq_len=pools, index_kpool=P, score_mode=mode, row_start=0,
                                     num_rows=rows, out=out).cpu()
                want = rn.sanitize_scores(rn.pool_scores(q, w, c, mode), visible)
                if values == "exact":
                    assert_bits_equal(got, want.where(want != 0, torch.zeros_like(want)))
                    continue
                cd, qd, wd = c.double(), q.double(), w.double()
                dots = torch.einsum("nd,thd->tnh", cd, qd)
                exact = torch.einsum("tnh,th->tn", dots.clamp_min(0) if mode == "relu" else dots, wd)
                bound = certified_bounds(qd, wd, cd.expand(qd.shape[0], -1, -1), mode)
                vis = j[None, :] < visible[:, None]
                assert ((got.double() - exact).abs()[vis] <= bound[vis]).all()


# --------------------------------------------------------------------------- select_topk

def _check_topk(scores: torch.Tensor, selected: int) -> None:
    """Keys of ``scores`` -> select_topk -> the reference's stable descending sort, bit for bit."""
    top = ix.select_topk(ix.canonical_keys(scores).to(DEV), selected).cpu()
    assert top.dtype == torch.int64 and top.shape == (scores.shape[0], selected)
    every = torch.zeros(scores.shape[0], dtype=torch.int64) + scores.shape[1]
    sanitized = rn.sanitize_scores(scores, every)                       # §4.3: NaN, -inf, +inf
    want_ids, want_valid = rn.canonical_topk(sanitized, selected)
    assert torch.equal(ix.key_pool_ids(top).long(), want_ids)
    assert torch.equal(ix.key_valid(top), want_valid)
    want_scores = sanitized.gather(1, want_ids)
    assert_bits_equal(ix.key_scores(top), torch.where(want_scores == 0, torch.zeros_like(want_scores), want_scores))


def test_select_topk_matches_a_stable_sort_on_adversarial_rows():
    gen = torch.Generator().manual_seed(2)
    n = 23
    palette = torch.tensor([-1.0, 0.0, -0.0, 2.0, 3.0, LOWEST, FLT_MAX, 2.5e-38, float("inf"), float("-inf")])
    scores = palette[torch.randint(0, len(palette), (12, n), generator=gen)]
    scores[0] = 0.0
    scores[0, ::2] = -0.0                                    # -0.0 and +0.0 tie: ascending pool id
    scores[1] = LOWEST                                       # nothing valid
    scores[2] = torch.randn(n, generator=gen)               # no ties
    scores[3] = 1.5                                          # all equal
    one = torch.tensor(1.0).view(torch.int32)                # dense near-ties: 1 + (k % 4) ulp
    scores[4] = torch.stack([(one + k % 4).view(torch.float32) for k in range(n)])
    scores[5] = LOWEST
    scores[5, [3, 17]] = torch.tensor([0.5, 0.5])           # fewer valid pools than selected
    scores[6, :] = float("nan")
    scores[6, 4] = 1.0                                       # NaN sanitized to LOWEST
    scores[7] = torch.tensor([FLT_MAX, float("inf")] * 11 + [3.0])   # +inf clamps to FLT_MAX: ties
    scores[8, :] = torch.finfo(torch.float32).tiny * torch.arange(n).remainder(3)    # tiny ties
    for selected in (0, 1, 5, n):
        _check_topk(scores, selected)
    top = ix.select_topk(ix.canonical_keys(scores[:1]).to(DEV), n).cpu()
    assert ix.key_pool_ids(top).tolist() == [list(range(n))]


def test_select_topk_random_rows():
    gen = torch.Generator().manual_seed(4)
    scores = torch.randint(-3, 4, (40, 70), generator=gen).to(torch.float32)
    scores[scores == -3] = LOWEST
    _check_topk(scores, 17)
    _check_topk(torch.randn(8, 5000, generator=gen), 512)


# --------------------------------------------------------------------------- expand_indices

def _top_keys(ids, scores):
    """int64 selected keys of pool ``ids`` with sanitized ``scores`` (the selection's output)."""
    image = ix.canonical_keys(scores) >> 32
    return (image << 32) | (0xFFFFFFFF - ids.to(torch.int64))


def _expected_rows(ids, scores, positions, t_live, T, width, K, Pp, pack):
    rows = []
    for t in range(T):
        if t < t_live:
            rows.append(rn.expand_row(ids[t].tolist(), (scores[t] > LOWEST).tolist(), int(positions[t]),
                                      index_topk=K, index_kpool=Pp, pack_tail=pack, width=width))
        else:
            rows.append([-1] * width)
    return torch.tensor(rows, dtype=torch.int32)


def _cum(t_live):
    return torch.tensor([t_live], dtype=torch.int32, device=DEV)


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
    # The selected keys as a strided view (a slice of a wider buffer).
    ids_full = torch.randint(0, 300, (T, selected + 3), generator=gen, dtype=torch.int32)
    sc_full = torch.randn(T, selected + 3, generator=gen)
    sc_full[torch.rand(T, selected + 3, generator=gen) < 0.3] = LOWEST    # invalid slots
    sc_full[0, :] = float("-inf")                              # -inf is invalid too
    ids, scores = ids_full[:, 1:1 + selected], sc_full[:, 1:1 + selected]
    keys = _top_keys(ids_full, sc_full)[:, 1:1 + selected]
    width = W + 5
    cap_rows = T + 2
    big = torch.full((2 * cap_rows, width + 3), -777, dtype=torch.int32, device=DEV)
    out = big[0::2][:T, :width]
    ix.expand_indices(top_keys=keys.to(DEV), positions=positions.to(DEV), cum_query_lens=_cum(t_live),
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
    ids = torch.randint(0, 40, (T, selected), generator=gen, dtype=torch.int32)
    scores = torch.randn(T, selected, generator=gen)
    scores[1, 2] = LOWEST
    width = K + Pp - 1 + 2
    want = _expected_rows(ids, scores, positions, t_live, T, width, K, Pp, True)
    for br, bc, cap in [(16, 256, 65535), (1, 4, 2), (4, 8, 2), (16, 2, 1)]:
        monkeypatch.setitem(plan.TUNING["expand"], "cpu", dict(BLOCK_ROWS=br, BLOCK_COLS=bc, cap=cap))
        out = torch.full((T, width), -777, dtype=torch.int32, device=DEV)
        ix.expand_indices(top_keys=_top_keys(ids, scores).to(DEV), positions=positions.to(DEV),
                          cum_query_lens=_cum(t_live), index_topk=K, index_kpool=Pp, pack_tail=True, out=out)
        assert torch.equal(out.cpu(), want)


def test_worked_example_of_section_4_5():
    """kpool-algorithm.md §4.5: P=4, K_tok=8, W=11, positions 2, 3, 6, 10, 18."""
    positions = torch.tensor([2, 3, 6, 10, 18])
    ids = torch.tensor([[0, 1], [0, 1], [0, 1], [1, 0], [3, 1]], dtype=torch.int32)
    scores = torch.tensor([[LOWEST, LOWEST], [1.0, LOWEST], [2.0, LOWEST], [5.0, 3.0], [9.0, 7.0]])
    out = {}
    for pack in (True, False):
        buf = torch.full((5, 11), -777, dtype=torch.int32, device=DEV)
        ix.expand_indices(top_keys=_top_keys(ids, scores).to(DEV), positions=positions.to(DEV), cum_query_lens=_cum(5),
                          index_topk=8, index_kpool=4, pack_tail=pack, out=buf)
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
def test_score_select_expand_chain_matches_reference_on_exact_data(mode):
    batch = Batch(2, torch.bfloat16, seed=13, values="exact")
    m = batch.meta
    selected = min(K_TOK // P, m.max_pool_seq_len)
    top = torch.zeros(batch.T, selected, dtype=torch.int64, device=DEV)
    top[:batch.t_live] = ix.select_topk(batch.keys(mode), selected)
    out = torch.full((batch.T, K_TOK + P - 1), -777, dtype=torch.int32, device=DEV)
    ix.expand_indices(top_keys=top, positions=m.positions.to(DEV), cum_query_lens=m.cum_query_lens.to(DEV),
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
    assert int((want_valid.sum(1) > 0).sum()) > 5                          # real selections happened


# --------------------------------------------------------------------------- helper kernels

def _guarded(n, dtype, fill, guard=64):
    big = torch.full((n + 2 * guard,), fill, dtype=dtype, device=DEV)
    return big, big[guard:guard + n]


def _guards_intact(big, n, fill, guard=64):
    host = big.cpu()
    return bool((host[:guard] == fill).all() and (host[guard + n:] == fill).all())


def test_helper_kernels_write_only_their_buffers():
    """The prefill-block and head-merge kernels store reduction results and masked tails inside
    their buffers only (triton-ascend 3.2's interpreter stored int32 sums as 8-byte values, past
    the end, until ``_portable.int32_of``)."""
    from kpool.ops import merged, score
    cum = torch.tensor([5, 20, 21, 60], dtype=torch.int32, device=DEV)
    big, blocks = _guarded(6, torch.int32, 7)
    score._prefill_blocks_kernel[(1,)](cum, blocks, 4, 0, 60, BLOCK_M=16, DECODE_ROWS=8, BLOCK_R=128)
    # requests of 5, 15, 1, 39 rows: blocks 0, 1, 1, 4 -> ends [0, 1, 1, 4]; the chunk: blocks [0, 4)
    assert blocks.cpu().tolist() == [0, 1, 1, 4, 0, 4] and _guards_intact(big, 6, 7)
    T, H, D = 6, 3, 16
    gen = torch.Generator().manual_seed(3)
    q = exact_values((T, H, D), gen, 1.0).to(DEV)
    w = exact_values((T, H), gen, 2.0 ** -6).to(DEV)
    bufs = {name: _guarded(n, dtype, 7) for name, n, dtype in
            (("split", T * 3 * D, torch.int16), ("unit", T * 3, torch.float32), ("qbar", T * D, torch.float32),
             ("nonfinite", T, torch.int32))}
    p = plan.merge_heads_plan(T, D, DEV)
    merged._merge_heads_kernel[(p.grid,)](
        q.view(torch.int16), q.stride(0), q.stride(1), q.stride(2), w.view(torch.int16), 0, w.stride(0), w.stride(1), 1,
        bufs["split"][1], 3 * D, D, bufs["unit"][1], bufs["qbar"][1], D, bufs["nonfinite"][1], 0, T,
        H, D, **p.constexprs, **p.options)
    for name, (big, view) in bufs.items():
        assert _guards_intact(big, view.numel(), 7), name
    want = (w.float().cpu()[:, :, None] * q.float().cpu()).sum(1)          # exact data: any order
    assert torch.equal(bufs["qbar"][1].cpu().view(T, D), want)
    assert (bufs["nonfinite"][1].cpu() == 0).all()
