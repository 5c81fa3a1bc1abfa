"""The exact top-k kernels (``kpool.ops.topk``: bitwise select, tie fix-up, compaction, ranking)
against the stable-sort definition (``reference.numerics.canonical_topk``, parity-contract.md §2)
on adversarial rows, bit for bit: all equal, ``-0.0``/``+0.0``, LOWEST, dense near-ties, fewer
valid pools than K, K = 1, K = width, widths at the register tile's edges. Runs on the resolved
device (the CPU interpreter by default, ``--device cuda`` on the H200).
"""
import os

os.environ.setdefault("KPOOL_DEVICE", "cpu")
from kpool.platform import resolve_device, torch_device  # noqa: E402

DEVICE = resolve_device()
DEV = torch_device(DEVICE)

import pytest  # noqa: E402
import torch  # noqa: E402

from kpool.ops import plan  # noqa: E402
from kpool.ops import topk  # noqa: E402
from reference import numerics as rn  # noqa: E402

pytestmark = pytest.mark.interpreter_ok
LOWEST = torch.finfo(torch.float32).min
FLT_MAX = torch.finfo(torch.float32).max


def _want(scores: torch.Tensor, selected: int) -> torch.Tensor:
    """The canonical top-k keys by the stable-sort definition (sorted on the host)."""
    every = torch.zeros(scores.shape[0], dtype=torch.int64) + scores.shape[1]
    ids, _ = rn.canonical_topk(rn.sanitize_scores(scores, every), selected)
    return topk.canonical_keys(scores).gather(1, ids)


def _adversarial(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    palette = torch.tensor([-1.0, 0.0, -0.0, 2.0, LOWEST, FLT_MAX, float("inf"), float("-inf"), float("nan")])
    rows = [palette[torch.randint(0, len(palette), (n,), generator=gen)]]
    rows.append(torch.full((n,), 1.5))                                         # all equal
    rows.append(torch.where(torch.arange(n) % 2 == 0, 0.0, -0.0))             # -0.0 / +0.0 tie
    rows.append(torch.full((n,), LOWEST))                                      # nothing valid
    one = torch.tensor(1.0).view(torch.int32)
    rows.append((one + torch.arange(n, dtype=torch.int32) % 3).view(torch.float32))   # dense near-ties
    sparse = torch.full((n,), LOWEST)
    sparse[torch.randperm(n, generator=gen)[:3]] = 0.25                        # fewer valid than K
    rows.append(sparse)
    rows.append(-torch.ones(n).cumsum(0))                                      # strictly decreasing
    rows.append(torch.ones(n).cumsum(0))                                       # strictly increasing
    rows.append(torch.randn(n, generator=gen))
    rows.append(torch.randint(-2, 3, (n,), generator=gen).float())            # many ties at every value
    return torch.stack(rows)


@pytest.mark.parametrize("n", [1, 16, 23, 257, 2100])
def test_select_topk_kernel_equals_the_stable_sort(n):
    scores = _adversarial(n, n)
    keys = topk.canonical_keys(scores)
    for selected in sorted({1, min(5, n), n // 2 or 1, n}):
        got = topk.select_topk(keys.to(DEV), selected).cpu()
        assert torch.equal(got, _want(scores, selected)), (n, selected)


@pytest.mark.parametrize("n", [40, 700])
def test_any_unique_keys_give_torch_topk(n):
    """Keys that are not canonical (the low word any value, not ``-1 - pool``; few high words, so
    ties cross the K-th place): still the K largest, in descending order, as ``torch.topk``."""
    gen = torch.Generator().manual_seed(n)
    hi = torch.randint(-3, 3, (5, n), generator=gen)
    low = torch.stack([torch.randperm(2 ** 20, generator=gen)[:n] * 4093 for _ in range(5)])   # unique per row
    keys = (hi << 32) | (low & 0xFFFFFFFF)
    keys[0] = (keys[0] & 0xFFFFFFFF) | (7 << 32)                   # one high word: the low words decide all
    for selected in (1, 3, n // 3, n):
        got = topk.select_topk(keys.to(DEV), selected).cpu()
        assert torch.equal(got, torch.topk(keys, selected, dim=1).values), selected


def test_live_rows_only_and_buffers_given():
    """Rows at or past T_live (read on the device) are left as they were; the result lands in the
    given ``out`` rows, compacted through the given ``work`` rows."""
    gen = torch.Generator().manual_seed(7)
    scores = torch.randint(-3, 4, (6, 40), generator=gen).float()
    keys = topk.canonical_keys(scores).to(DEV)
    out = torch.full((6, 9), 123, dtype=torch.int64, device=DEV)
    work = torch.empty((6, 12), dtype=torch.int64, device=DEV)
    cum = torch.tensor([1, 4, 5], dtype=torch.int32, device=DEV)   # T_live = 5: batch rows 2..4 live
    topk.select_topk(keys[:4], 9, out=out[1:], work=work, cum_query_lens=cum, row_start=2)
    want = _want(scores[:4], 9)
    got = out.cpu()
    assert torch.equal(got[1:4], want[:3])
    assert (got[0] == 123).all() and (got[4:] == 123).all()


@pytest.mark.parametrize("backend", ["cuda", "npu"], ids=["plan-for-cuda", "plan-for-npu"])
def test_compiled_plans_use_few_shapes_and_fall_back_past_them(backend):
    """Compiled backends: whole rows take two select tiles, split rows the powers of two that hold
    a segment or the merge's candidates, and the ranking tiles of ``TILES`` cover every shape (one
    compile each); rows wider than the largest tile return None (the caller's torch.topk
    fallback); any K is ranked (its blocks loop at run time)."""
    whole, split = set(), set()
    tune = plan.TUNING["topk_select"][backend]
    order = plan.TUNING["topk_order"][backend]
    for width in (w for w in (1, 300, 2048, 2049, 4096, 9000, 16384) if w <= tune["NT_MAX"] * tune["T"]):
        for selected in (1, 64, 512):
            for rows in (1, 64, 4096):
                p = plan.topk_plans(rows, width, min(selected, width), backend, cores=8)
                nt, t = p.select.constexprs["NT"], p.select.constexprs["T"]
                assert nt * t >= p.segment_width and p.segments * p.segment_width >= width
                (split if p.segments > 1 else whole).add(nt)
                ranked = rows * (p.segments * p.selected) ** 2 <= order["RANK_MERGE"]
                if p.segments > 1:
                    assert rows * p.segments <= 8 and p.segments <= tune["MAX_SEGMENTS"]
                    assert width - (p.segments - 1) * p.segment_width >= p.selected == min(selected, width)
                if p.segments > 1 and not ranked:
                    assert p.merge.constexprs["NT"] * t >= p.segments * p.selected and p.merge.tiles == rows
                    assert p.work_width == (p.segments + 1) * p.selected and p.candidates == p.selected
                else:   # unsplit, or the ranking merges the candidates
                    assert p.merge is None and p.work_width == p.candidates == p.segments * p.selected
                assert p.order.tiles == rows * -(-p.candidates // p.order.constexprs["CH"])
                assert (p.order.constexprs["KB"], p.order.constexprs["CH"]) in order["TILES"]
    assert len(whole) <= 2 and all(nt & (nt - 1) == 0 and nt <= tune["NT_MAX"] for nt in split)
    assert bool(split) == (tune["MAX_SEGMENTS"] > 1)
    assert plan.topk_plans(4, tune["NT_MAX"] * tune["T"] + 1, 8, backend, cores=8) is None
    assert plan.topk_plans(4096, 300, 8, backend, cores=8) is not None    # no row limit: any score chunk
    assert plan.topk_plans(4, 4000, 3001, backend, cores=8) is not None  # no K limit


def test_rows_split_only_into_segments_that_pay():
    """cuda: a batch of fewer rows than cores splits each row into a power of two of segments, as
    many as the cores allow, about sqrt(width / K), each holding >= K keys; a given work buffer
    bounds them; prefill chunks and MTP batches stay whole."""
    def segments(rows, width, selected, **kw):
        return plan.topk_plans(rows, width, selected, "cuda", cores=132, **kw).segments
    assert segments(1, 16384, 512) == 4            # 4 x 4096 lanes, then 2048 candidates
    assert segments(64, 16384, 512) == 2           # 128 programs on 132 cores
    assert segments(66, 16384, 512) == 2 and segments(67, 16384, 512) == 1
    assert segments(256, 16384, 512) == 1 and segments(2048, 16384, 512) == 1
    assert segments(1, 16384, 4096) == 2 and segments(1, 16384, 8192) == 1
    assert segments(1, 2047, 512) == 1             # 2 segments of 1024 would be fewer lanes than the merge's
    assert segments(1, 16384, 512, max_segments=2) == 2 and segments(1, 16384, 512, max_segments=1) == 1
    for width, selected in ((16384, 512), (8193, 1024), (5000, 600), (2048, 512)):
        s = plan.topk_segments(1, width, selected, 132, 8)
        assert width - (s - 1) * -(-width // s) >= selected and s * s * selected <= width or s == 1


def _split_cpu(monkeypatch, segments, chunk, rank_merge=0):
    """Interpreter plans that split rows into up to ``segments``, compact ``chunk`` lanes at a time
    and let the ranking merge the candidates up to ``rank_merge`` compares."""
    tune = dict(plan.TUNING["topk_select"]["cpu"], MAX_SEGMENTS=segments, SPLIT_CORES=128, CHUNK=chunk)
    monkeypatch.setitem(plan.TUNING["topk_select"], "cpu", tune)
    monkeypatch.setitem(plan.TUNING["topk_order"], "cpu", dict(plan.TUNING["topk_order"]["cpu"], RANK_MERGE=rank_merge))


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter plans (SPLIT_CORES stands in for cores)")
@pytest.mark.parametrize("segments,chunk,rank_merge", [(1, 16, 0), (2, 32, 0), (4, 16, 0), (8, 64, 0),
                                                       (2, 16, 2 ** 30), (8, 32, 2 ** 30)])
def test_split_rows_and_chunked_compaction_give_the_stable_sort(monkeypatch, segments, chunk, rank_merge):
    """Rows split into segments (the K largest of each, then of the candidates: by a merge launch,
    or by the ranking itself when ``rank_merge`` allows) and compaction a chunk at a time: the same
    canonical top-k, bit for bit, as one whole-row pass; adversarial rows (ties across segment
    edges, nothing valid, fewer valid than K), a last segment shorter than the rest, live rows only,
    a given work buffer too narrow for every segment."""
    _split_cpu(monkeypatch, segments, chunk, rank_merge)
    for n, selected in ((257, 5), (700, 40), (1000, 1), (1000, 250), (130, 16)):
        scores = _adversarial(n, n + segments)
        keys = topk.canonical_keys(scores).to(DEV)
        p = plan.topk_plans(scores.shape[0], n, selected, DEV)
        assert p.segments == max(s for s in (1, 2, 4, 8) if s <= segments
                                 and plan.topk_segments(scores.shape[0], n, selected, 128, s) == s)
        assert (p.merge is None) == (p.segments == 1 or rank_merge > 0)
        got = topk.select_topk(keys, selected).cpu()
        assert torch.equal(got, _want(scores, selected)), (n, selected, p.segments)
        narrow = torch.full((scores.shape[0], selected * 2), 5, dtype=torch.int64, device=DEV)
        fits = plan.topk_plans(scores.shape[0], n, selected, DEV, work_columns=selected * 2).segments
        assert fits == (min(2, p.segments) if rank_merge else 1)
        assert torch.equal(topk.select_topk(keys, selected, work=narrow).cpu(), got)
    scores = torch.randint(-3, 4, (6, 600), generator=torch.Generator().manual_seed(segments)).float()
    keys = topk.canonical_keys(scores).to(DEV)
    out = torch.full((6, 30), 123, dtype=torch.int64, device=DEV)
    cum = torch.tensor([1, 4, 5], dtype=torch.int32, device=DEV)   # T_live = 5: batch rows 2..4 live
    topk.select_topk(keys[:4], 30, out=out[1:], cum_query_lens=cum, row_start=2)
    got = out.cpu()
    assert torch.equal(got[1:4], _want(scores[:4], 30)[:3])
    assert (got[0] == 123).all() and (got[4:] == 123).all()


def test_ranking_tiles_narrow_for_few_rows():
    """cuda: a decode batch's rows are ranked in narrow tiles (enough tiles for every core), a
    prefill chunk's in the widest."""
    tiles = plan.TUNING["topk_order"]["cuda"]["TILES"]
    for rows, want in ((1, tiles[-1]), (64, tiles[-1]), (2048, tiles[0])):
        got = plan.topk_plans(rows, 16384, 512, "cuda", cores=132).order.constexprs
        assert (got["KB"], got["CH"]) == want, rows
    assert min(t[1] for t in tiles) == tiles[-1][1] and max(t[1] for t in tiles) == tiles[0][1]


@pytest.mark.parametrize("kb,ch", [(16, 16), (16, 32), (32, 16), (32, 128), (128, 32)])
def test_order_kernel_ranks_across_blocks_and_tiles(kb, ch):
    """The ranking launch alone, at the compiled backends' block and tile sizes (the interpreter's
    own plan takes one block a row): work rows in any order, K not a multiple of either, keys at
    both int64 ends, live rows only; each row comes out in descending key order, and when it ranks
    more candidates than it keeps (a split row's merge) only the K largest are written."""
    gen = torch.Generator().manual_seed(kb * 1000 + ch)
    rows, width = 5, 200
    work = torch.randint(-2 ** 62, 2 ** 62, (rows, width), generator=gen) * 2 + 1     # odd: unique ends below
    work[0, 3], work[0, 7] = -2 ** 63, 2 ** 63 - 1
    work[1] = torch.randperm(width, generator=gen) - 99                               # small, dense
    for candidates in (1, kb - 1, kb + 1, ch + 3, width):
        row_keys = torch.stack([r[torch.randperm(width, generator=gen)[:candidates]] for r in work])
        assert all(len(set(r.tolist())) == candidates for r in row_keys)
        for selected in sorted({candidates, max(1, candidates // 3)}):
            out = torch.full((rows, selected + 2), 7, dtype=torch.int64)
            cum = torch.tensor([2, 4], dtype=torch.int32)                                 # T_live = 4
            w, o = row_keys.contiguous().to(DEV), out.to(DEV)
            tiles = rows * -(-candidates // ch)
            topk._order_kernel[(min(tiles, 3),)](w, w.stride(0), o, o.stride(0), cum.to(DEV), 2, 0, rows,
                                                 candidates, selected, KB=kb, CH=ch)
            got = o.cpu()
            want = torch.sort(row_keys[:4], dim=1, descending=True).values[:, :selected]
            assert torch.equal(got[:4, :selected], want), (candidates, selected)
            assert (got[4] == 7).all() and (got[:, selected:] == 7).all()


def test_fallback_equals_the_kernel(monkeypatch):
    """The torch.topk fallback (a shape outside the tiles) gives the kernel's keys."""
    scores = _adversarial(40, 3)
    keys = topk.canonical_keys(scores).to(DEV)
    kernel = topk.select_topk(keys, 11).cpu()
    monkeypatch.setattr(plan, "topk_plans", lambda *a, **k: None)
    assert torch.equal(topk.select_topk(keys, 11).cpu(), kernel)
    assert torch.equal(kernel, _want(scores, 11))


def test_bad_buffers_are_named_errors():
    from kpool.errors import KPoolDtypeError, KPoolShapeError
    keys = topk.canonical_keys(torch.zeros(2, 8)).to(DEV)
    with pytest.raises(KPoolShapeError):
        topk.select_topk(keys, 9)
    with pytest.raises(KPoolShapeError):
        topk.select_topk(keys, 4, out=torch.empty((1, 4), dtype=torch.int64, device=DEV))
    with pytest.raises(KPoolDtypeError):
        topk.select_topk(keys, 4, work=torch.empty((2, 4), dtype=torch.int32, device=DEV))
