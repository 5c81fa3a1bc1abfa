"""The harness's checks (parity/checking/sentinel.py, parity/checking/compare.py): sentinels and write sets, the
bitwise comparators and their triage classes, and ``assert_bitwise_equal``, the tests' one
bitwise assertion. No kernel runs here.
"""
from __future__ import annotations

import pytest
import torch

from cases.spec import OutputBufferSpec
from kpool.cache import allocate_caches
from kpool.config import SMALL
from kpool.errors import KPoolBlockIdError, KPoolMetadataError
from kpool.metadata import build_metadata
from parity.checking import compare as cmp
from parity.checking.compare import bits
from parity.checking import sentinel as sen
from tests.helpers import compare_rows, index_rows, padded_batch

P, K, W, D = SMALL.index_kpool, SMALL.index_topk, SMALL.output_width, SMALL.index_head_dim  # 4, 8, 11, 16
C = SMALL.ring_capacity  # 4


# --------------------------------------------------------------------------- fixtures

def _meta(batch=None):
    return build_metadata(batch or padded_batch(), index_kpool=P, ring_capacity=C, page_size=2)


def _caches():
    caches = allocate_caches(SMALL, num_pages=6, page_size=2, num_tail_blocks=2, page_padding=3,
                             ring_block_padding=5, guard=7)
    sen.lay_cache_sentinels(caches)
    return caches


def _write_set(meta=None, compute_topk=True):
    return sen.compute_write_set(meta or _meta(), index_kpool=P, ring_capacity=C, page_size=2,
                                 num_pages=6, num_tail_blocks=2, compute_topk=compute_topk)


def _fake_forward(caches, ws, skip_compressed=None, skip_ring=None):
    """Write 1.0 into every write-set element (what a correct kernel's writes look like), except
    channel 5 of compressed row ``skip_compressed`` and plane 1 of ring row ``skip_ring``."""
    for page, row in ws.compressed_rows:
        if skip_compressed == (page, row):
            caches.compressed_cache[page, row, 0, :5] = 1.0
            caches.compressed_cache[page, row, 0, 6:] = 1.0
        else:
            caches.compressed_cache[page, row, 0] = 1.0
    for block, slot in ws.ring_rows:
        caches.tail_cache[block, 0 if skip_ring == (block, slot) else slice(None), slot] = 1.0


# --------------------------------------------------------------------------- sentinels

def test_write_set_follows_metadata():
    ws = _write_set()
    # §5.1: p=3 of request 0 -> pool 0 -> page 3 row 0; p=3 of request 1 -> page 1 row 0.
    assert ws.compressed_rows == ((3, 0), (1, 0))
    # §5.4: last min(C, ql) rows; stale padding slots (rows 10, 11) are not in the set.
    assert ws.ring_rows == ((1, 3), (1, 0), (1, 1), (1, 2), (0, 2), (0, 3), (0, 0))
    assert ws.output_rows == 12
    assert _write_set(compute_topk=False).output_rows == 0
    # a planted out-of-range slot and a negative position write nothing
    meta = _meta()
    meta.slot_mapping[3] = 6 * 2
    meta.positions[8] = -1
    ws = _write_set(meta)
    assert ws.compressed_rows == ()
    assert (0, 3) not in ws.ring_rows


def test_sentinel_patterns_are_laid_everywhere():
    caches = _caches()
    assert torch.all(bits(caches.compressed_backing) == 0x7FA5)
    assert torch.all(bits(caches.tail_backing) == 0x7FA5A5A5)
    assert torch.isnan(caches.compressed_cache).all() and torch.isnan(caches.tail_cache).all()


def test_correct_writes_pass_sentinel_check():
    caches, ws = _caches(), _write_set()
    sen.relay_compressed_rows(caches, ws)
    before = sen.backing_bits(caches)
    _fake_forward(caches, ws)
    checks = sen.check_caches(caches, before, ws)
    assert [c.buffer for c in checks] == ["compressed_cache", "tail_ring"]
    assert all(c.ok for c in checks), checks


@pytest.mark.parametrize("plant, buffer, where", [
    (lambda c: bits(c.compressed_backing).__setitem__(0, 0),
     "compressed_cache", {"region": "guard-before"}),
    (lambda c: bits(c.compressed_backing).__setitem__(7 + 2 * D + 1, 0),  # page 0 padding
     "compressed_cache", {"region": "page-padding", "page": 0}),
    (lambda c: bits(c.compressed_cache).__setitem__((2, 1, 0, 9), 0),    # not written
     "compressed_cache", {"region": "view", "page": 2, "page_row": 1, "channel": 9}),
    (lambda c: bits(c.compressed_backing).__setitem__(-1, 0),
     "compressed_cache", {"region": "guard-after"}),
    (lambda c: bits(c.tail_cache).__setitem__((0, 1, 1, 4), 0),         # ring slot 1 of block 0
     "tail_ring", {"region": "view", "block": 0, "plane": 1, "slot": 1, "channel": 4}),
    (lambda c: bits(c.tail_backing).__setitem__(7 + 2 * C * D, 0),       # block 0 padding
     "tail_ring", {"region": "block-padding", "block": 0}),
])
def test_sentinel_catches_stray_write(plant, buffer, where):
    caches, ws = _caches(), _write_set()
    sen.relay_compressed_rows(caches, ws)
    before = sen.backing_bits(caches)
    _fake_forward(caches, ws)
    plant(caches)
    checks = {c.buffer: c for c in sen.check_caches(caches, before, ws)}
    assert checks[buffer].stray == 1 and checks[buffer].missing == 0
    assert checks[buffer].first_stray == where
    other = "tail_ring" if buffer == "compressed_cache" else "compressed_cache"
    assert checks[other].ok
    rows = cmp.sentinel_findings(checks.values(), "kernel")
    assert {(r["output"], r["verdict"]) for r in rows} == {
        (f"sentinel:{buffer}[kernel]", "stray-write"), (f"sentinel:{other}[kernel]", "exact")}


def test_sentinel_catches_missing_write():
    caches, ws = _caches(), _write_set()
    # an old value in the compressed row must not hide a skipped write: re-laying makes it visible
    caches.compressed_cache[1, 0, 0] = 2.0
    sen.relay_compressed_rows(caches, ws)
    before = sen.backing_bits(caches)
    _fake_forward(caches, ws, skip_compressed=(1, 0), skip_ring=(0, 3))
    checks = {c.buffer: c for c in sen.check_caches(caches, before, ws)}
    assert checks["compressed_cache"].stray == 0 and checks["compressed_cache"].missing == 1
    assert checks["compressed_cache"].first_missing == {"region": "view", "page": 1, "page_row": 0, "channel": 5}
    assert checks["tail_ring"].missing == D
    assert checks["tail_ring"].first_missing == {"region": "view", "block": 0, "plane": 1, "slot": 3, "channel": 0}
    verdicts = {r["verdict"] for r in cmp.sentinel_findings(checks.values(), "reference")}
    assert verdicts == {"missing-write"}


def test_output_buffer_guards():
    buf = sen.allocate_output_buffer(OutputBufferSpec(capacity=5, width=13, row_step=2))
    assert buf.view.shape == (5, 13) and buf.view.stride() == (2 * (13 + sen.DEFAULT_GUARD_COLS), 1)
    before = buf.backing.clone()
    buf.view[:3] = -1                       # a correct T=3 step
    assert buf.check(before, 3).ok
    for brow, bcol, region in ((0, 0, "guard-rows-before"), (sen.DEFAULT_GUARD_ROWS + 1, 4, "between-rows"),
                               (sen.DEFAULT_GUARD_ROWS + 2, 13, "guard-columns"),
                               (sen.DEFAULT_GUARD_ROWS + 6, 2, "view"), (buf.backing.shape[0] - 1, 0, "guard-rows-after")):
        planted = buf.backing.clone()
        buf.backing[brow, bcol] = 5
        chk = buf.check(before, 3)
        assert chk.stray == 1 and chk.first_stray["region"] == region, (region, chk)
        buf.backing.copy_(planted)
    assert buf.check(before, 3).first_stray is None
    buf.view[2, 12] = sen.INT32_SENTINEL    # missing write in a written row
    chk = buf.check(before, 3)
    assert chk.missing == 1 and chk.first_missing == {"region": "view", "row": 2, "column": 12}


# --------------------------------------------------------------------------- comparators

def test_indices_exact_and_padding_leak():
    meta, ref = index_rows()
    assert [r["verdict"] for r in compare_rows(ref.clone(), ref, meta)] == ["exact"]
    kern = ref.clone()
    kern[7, 0, 3] = 12
    rows = compare_rows(kern, ref, meta)
    assert [(r["verdict"], r["mismatches"], r["row"], r["column"], r["request"]) for r in rows] == [
        ("padding-leak", 1, 7, 3, 1)]


def test_indices_tail_column_is_wrong_tail():
    meta, ref = index_rows()
    kern = ref.clone()
    kern[6, 0, 5] += 1     # p=6: tail_start 4, packed tail columns 4..6
    rows = compare_rows(kern, ref, meta)
    assert [(r["verdict"], r["row"], r["position"], r["column"]) for r in rows] == [("wrong-tail", 6, 6, 5)]
    for col, verdict in ((3, "wrong-index"), (4, "wrong-tail"), (6, "wrong-tail"), (7, "wrong-index")):
        edge = ref.clone()
        edge[6, 0, col] += 1
        assert [r["verdict"] for r in compare_rows(edge, ref, meta)] == [verdict], col
    # fixed layout: the tail is at K_tok=8, so column 5 is history and column 9 is tail
    assert [r["verdict"] for r in compare_rows(kern, ref, meta, pack_tail=False)] == ["wrong-index"]
    kern = ref.clone()
    kern[6, 0, 9] += 1
    assert [r["verdict"] for r in compare_rows(kern, ref, meta, pack_tail=False)] == ["wrong-tail"]


def test_indices_history_is_wrong_index_with_location():
    meta, ref = index_rows()
    kern = ref.clone()
    kern[5, 0, 1] += 1     # p=5: tail columns 4..6, column 1 is history
    kern[7, 0, 0] = 3      # plus a padding leak: one finding per class
    rows = {r["verdict"]: r for r in compare_rows(kern, ref, meta)}
    assert set(rows) == {"wrong-index", "padding-leak"}
    hist = rows["wrong-index"]
    assert (hist["row"], hist["position"], hist["request"], hist["column"], hist["pool_id"], hist["mismatches"]) == \
        (5, 5, 0, 1, int(ref[5, 0, 1]) // P, 1)


def test_indices_alignment_columns_and_none():
    meta, ref = index_rows()
    kbuf = torch.full((10, 13), -1, dtype=torch.int32)
    rbuf = kbuf.clone()
    kbuf[:9, :W] = ref[:, 0]
    rbuf[:9, :W] = ref[:, 0]
    kbuf[2, 12] = 0        # alignment column >= W
    rows = compare_rows(kbuf[:9, :W].unsqueeze(1), rbuf[:9, :W].unsqueeze(1), meta, kernel_buffer=kbuf, reference_buffer=rbuf)
    assert [(r["verdict"], r["row"], r["column"]) for r in rows] == [("padding-leak", 2, 12)]
    none = dict(positions=meta.positions, cum_query_lens=meta.cum_query_lens, index_topk=K, index_kpool=P,
                pack_tail=True, compute_topk=False)
    assert [r["verdict"] for r in cmp.compare_indices(None, None, **none)] == ["exact"]
    assert [r["verdict"] for r in cmp.compare_indices(ref, None, **none)] == ["wrong-index"]
    assert [r["verdict"] for r in cmp.compare_indices(ref[:5], ref, **{**none, "compute_topk": True})] == ["wrong-index"]


def test_cache_comparator_bitwise_with_location():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 2, 1, D, generator=g).to(torch.bfloat16)
    assert [r["verdict"] for r in cmp.compare_compressed(ref.clone(), ref)] == ["exact"]
    kern = ref.clone()
    bits(kern)[2, 1, 0, 5] ^= 1   # one bf16 ulp
    (row,) = cmp.compare_compressed(kern, ref)
    assert (row["verdict"], row["mismatches"], row["page"], row["page_row"], row["channel"]) == \
        ("cache-mismatch", 1, 2, 1, 5)
    # bitwise, not by value: -0.0 vs +0.0 is a mismatch
    kern, ref0 = ref.clone(), ref.clone()
    ref0[0, 0, 0, 3], kern[0, 0, 0, 3] = 0.0, -0.0
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref0)] == ["cache-mismatch"]
    kern = ref.clone()
    kern[1, 0, 0, 2] = float("nan")
    bits(kern)[0, 1, 0, 0] ^= 4
    rows = {r["verdict"]: r for r in cmp.compare_compressed(kern, ref)}
    assert set(rows) == {"nan-introduced", "cache-mismatch"}
    assert (rows["nan-introduced"]["page"], rows["nan-introduced"]["channel"]) == (1, 2)


def test_ring_comparator_bitwise_with_location():
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(2, 2, C, D, generator=g)
    kern = ref.clone()
    bits(kern)[1, 1, 3, 7] += 1
    (row,) = cmp.compare_ring(kern, ref)
    assert (row["verdict"], row["block"], row["plane"], row["slot"], row["channel"]) == ("ring-mismatch", 1, 1, 3, 7)
    kern = ref.clone()
    kern[0, 0, 2, 0] = float("nan")
    assert [r["verdict"] for r in cmp.compare_ring(kern, ref)] == ["nan-introduced"]
    # NaN on both sides with the same payload is exact; a different payload is not
    ref[0, 0, 2, 0] = float("nan")
    assert [r["verdict"] for r in cmp.compare_ring(ref.clone(), ref)] == ["exact"]


def test_compare_errors():
    exp = KPoolMetadataError
    ok = cmp.compare_errors(KPoolBlockIdError("x"), ValueError("y"), exp)   # reference: builtin base
    assert [r["verdict"] for r in ok] == ["exact"]
    assert cmp.compare_errors(None, ValueError("y"), exp)[0]["verdict"] == "not-rejected"
    assert cmp.compare_errors(KPoolMetadataError("x"), None, exp)[0]["verdict"] == "not-rejected"
    assert cmp.compare_errors(TypeError("x"), TypeError("y"), exp)[0]["verdict"] == "crash"
    assert cmp.compare_errors(KPoolMetadataError("x"), KeyError("y"), exp)[0]["verdict"] == "crash"


def test_findings_frame_columns():
    df = cmp.findings_frame([cmp.finding("indices", "exact")], case="c", size="small", step=0, step_name="s")
    assert tuple(df.columns) == cmp.FINDING_COLUMNS
    with pytest.raises(ValueError):
        cmp.finding("indices", "almost-exact")



# --------------------------------------------------------------------------- the tests' assertion

def test_assert_bitwise_equal_names_count_location_and_bits():
    a = torch.zeros(4, 2, 1, 16, dtype=torch.bfloat16)
    b = a.clone()
    b[2, 1, 0, 9] = 1.0078125                          # 0x3F81
    b[3, 0, 0, 4] = 1.0
    with pytest.raises(AssertionError) as err:
        cmp.assert_bitwise_equal(b, a, name="compressed", dims=("page", "row", None, "ch"))
    assert str(err.value) == "compressed: 2/128 differ, first page=2 row=1 ch=9: 0x3F81 vs 0x0000"
    cmp.assert_bitwise_equal(b, b.clone())
    with pytest.raises(AssertionError, match=r"rows: 1/3 differ, first index=\(2,\): 3 vs 4"):
        cmp.assert_bitwise_equal(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4]), name="rows")


def test_assert_bitwise_equal_is_bitwise_not_by_value():
    """-0.0 and +0.0 are equal values but other bits; equal NaN payloads are the same bits."""
    with pytest.raises(AssertionError, match=r"1/1 differ.*0x80000000 vs 0x00000000"):
        cmp.assert_bitwise_equal(torch.tensor([-0.0]), torch.tensor([0.0]))
    nan = torch.tensor([float("nan")])
    cmp.assert_bitwise_equal(nan, nan.clone())
    assert cmp.same_bits(nan, nan.clone()) and not torch.equal(nan, nan.clone())
    for a, b, why in ((torch.zeros(2), torch.zeros(3), r"\[2\] vs expected torch.float32\[3\]"),
                      (torch.zeros(2), torch.zeros(2, dtype=torch.float64), "float64"),
                      (None, torch.zeros(1), "actual is None")):
        with pytest.raises(AssertionError, match=why):
            cmp.assert_bitwise_equal(a, b)
    cmp.assert_bitwise_equal(None, None)


def test_bits_views_every_float_width_without_copying():
    for dtype, width in ((torch.bfloat16, torch.int16), (torch.float16, torch.int16), (torch.float32, torch.int32),
                         (torch.float64, torch.int64)):
        x = torch.ones(3, 4, dtype=dtype)[:, 1:]             # non-contiguous
        assert bits(x).dtype == width and bits(x).data_ptr() == x.data_ptr()
    assert bits(torch.tensor([1.0])).item() == 0x3F800000
    ints = torch.arange(3)
    assert bits(ints) is ints


def test_a_nan_payload_is_certified_only_without_a_bitwise_claim(monkeypatch):
    """A vendor kernel compiled on CUDA writes a NaN pooled key as 0x7FFF where the reference
    writes 0x7FC0: both NaN. With certificates on and no bitwise claim the payload is certified
    (IEEE 754 leaves it open); claimed bitwise (kpool) or exact data, it is a cache-mismatch."""
    import parity.checking.compare as compare_module
    monkeypatch.setattr(compare_module, "certify_rounding_boundaries",
                        lambda a, b, d, context: (torch.zeros_like(d), "no boundary"))
    ref = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    ker = ref.clone()
    ref.view(torch.int16)[0, 2, 0, 4], ker.view(torch.int16)[0, 2, 0, 4] = 0x7FC0, 0x7FFF
    ker.view(torch.int16)[0, 1, 0, 1] = 0x3F80                       # a real difference stays one
    certified = compare_module.compare_compressed(ker, ref, context=object())
    assert {f["verdict"]: f["mismatches"] for f in certified} == {"rounding-boundary": 1, "cache-mismatch": 1}
    for kwargs in (dict(context=object(), claimed_bitwise=True), dict(context=None)):
        found = compare_module.compare_compressed(ker, ref, **kwargs)
        assert {f["verdict"]: f["mismatches"] for f in found} == {"cache-mismatch": 2}
