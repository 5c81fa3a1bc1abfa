"""Memory aliasing of a forward's tensors (kpool.aliasing; issue 9 point 6): a written tensor
(either cache, the output buffer) that overlaps itself or shares a byte with any other argument
is rejected before any launch with every tensor byte-identical; read-only tensors may share
memory, and interleaved views of one allocation that share no byte give the separate-storage
result."""
import pytest
import torch

from kpool import SMALL
from kpool import errors
from kpool.aliasing import MAX_RUNS, overlaps, self_overlaps
from kpool.indexer import forward
from kpool.validation import validate_forward
from tests.helpers import small_batch
from tests.rejection import assert_rejected
from parity.checking.compare import assert_bitwise_equal

pytestmark = pytest.mark.interpreter_ok

D, P, W = SMALL.index_head_dim, SMALL.index_kpool, SMALL.output_width
GUARD = 8          # small_batch's guard elements before the first page / ring block


def _output_in_ring(kw, caches):
    T = kw["k"].shape[0]
    kw["output_buffer"] = caches.tail_backing.view(torch.int32)[GUARD:GUARD + T * W].view(T, W)


def _k_in_ring(kw, caches):
    kw["k"] = kw["tail_cache"].reshape(-1, D)[:kw["k"].shape[0]]


def _gate_in_compressed_cache(kw, caches):
    T = kw["k"].shape[0]
    kw["gate"] = caches.compressed_backing.view(torch.float32)[GUARD:GUARD + T * D].view(T, D)


def _compressed_cache_in_ring(kw, caches):
    N, B = kw["compressed_cache"].shape[:2]
    kw["compressed_cache"] = caches.tail_backing.view(torch.bfloat16)[:N * B * D].view(N, B, 1, D)


def _q_shares_the_compressed_cache_allocation(kw, caches):
    N, B = kw["compressed_cache"].shape[:2]
    store = torch.zeros(4 * N * B * D, dtype=torch.bfloat16, device=kw["k"].device)
    kw["compressed_cache"] = store[:N * B * D].view(N, B, 1, D)
    kw["q"] = store[N * B * D // 2:][:kw["q"].numel()].view(kw["q"].shape)     # overlaps the cache's second half


def _weights_in_output(kw, caches):
    T, H = kw["weights"].shape
    store = torch.zeros(T * W + T * H, dtype=torch.int32, device=kw["k"].device)
    kw["output_buffer"] = store[:T * W].view(T, W)
    kw["weights"] = store.view(torch.float32)[T * W - 1:T * W - 1 + T * H].view(T, H)   # one element shared


def _positions_in_ring(kw, caches):
    T = kw["k"].shape[0]
    store = caches.tail_backing.view(torch.int64)[GUARD:GUARD + T]
    store.copy_(kw["positions"])
    kw["positions"] = store


def _block_table_in_output(kw, caches):
    R, M = kw["block_table"].shape
    T = kw["k"].shape[0]
    store = torch.zeros(T * W, dtype=torch.int32, device=kw["k"].device)
    store[-R * M:] = kw["block_table"].flatten()
    kw["output_buffer"] = store.view(T, W)
    kw["block_table"] = store[-R * M:].view(R, M)


def _compressed_pages_one_row(kw, caches):
    t = kw["compressed_cache"]
    kw["compressed_cache"] = t.as_strided(t.shape, (0,) + t.stride()[1:])            # every page is page 0


def _ring_blocks_one_block(kw, caches):
    t = kw["tail_cache"]
    kw["tail_cache"] = t.as_strided(t.shape, (0,) + t.stride()[1:])


def _ring_planes_one_plane(kw, caches):
    t = kw["tail_cache"]
    kw["tail_cache"] = t.as_strided(t.shape, (t.stride(0), 0) + t.stride()[2:])    # K and gate on one plane


ALIASES = [
    (_output_in_ring, "written-aliases"), (_k_in_ring, "written-aliases"),
    (_gate_in_compressed_cache, "written-aliases"), (_compressed_cache_in_ring, "written-aliases"),
    (_q_shares_the_compressed_cache_allocation, "written-aliases"), (_weights_in_output, "written-aliases"),
    (_positions_in_ring, "written-aliases"), (_block_table_in_output, "written-aliases"),
    (_compressed_pages_one_row, "written-self-overlap"), (_ring_blocks_one_block, "written-self-overlap"),
    (_ring_planes_one_plane, "written-self-overlap"),
]


@pytest.mark.parametrize("alias, rule", ALIASES, ids=[a.__name__.strip("_") for a, _ in ALIASES])
def test_aliasing_a_written_tensor_is_rejected_before_any_launch(alias, rule, torch_device):
    # 64 pages: the compressed cache holds a whole [T, D] fp32 gate; 16: the ring holds the cache
    caches, kw = small_batch(SMALL, device=torch_device, num_pages=16 if alias is _compressed_cache_in_ring else 64)
    alias(kw, caches)
    extra = (caches.compressed_backing, caches.tail_backing)
    assert_rejected(lambda: forward(**kw), errors.KPoolAliasingError, rule, kw, extra)


def _validate(kw):
    return validate_forward(**{"score_mode": "relu", "compute_topk": True, "output_buffer": None, **kw})


def test_read_only_tensors_may_share_memory(torch_device):
    """k and gate as the two halves of one projection output, k itself passed as gate, an
    expanded (stride-0) ape, positions and slot_mapping rows of one tensor: nothing writes them."""
    _, kw = small_batch(SMALL, device=torch_device)
    T = kw["k"].shape[0]
    joint = torch.cat([kw["k"], kw["gate"]], dim=1)
    assert _validate(dict(kw, k=joint[:, :D], gate=joint[:, D:])) == T
    assert _validate(dict(kw, gate=kw["k"])) == T
    assert _validate(dict(kw, ape=kw["ape"][:1].expand(P, D))) == T
    rows = torch.stack([kw["positions"], kw["slot_mapping"]])
    assert _validate(dict(kw, positions=rows[0], slot_mapping=rows[1])) == T


def _interleaved_caches(caches, device):
    """Both caches as views of one byte allocation: each compressed page is followed by a gap
    that holds one ring block (the layout of a shared KV-cache pool); no byte is shared."""
    N, B, _, _ = caches.compressed_cache.shape
    blocks, _, C, _ = caches.tail_cache.shape
    page_bytes, block_bytes = B * D * 2, 2 * C * D * 4
    stride_bytes = page_bytes + block_bytes
    raw = torch.zeros(N * stride_bytes, dtype=torch.uint8, device=device)
    compressed = raw.view(torch.bfloat16).as_strided((N, B, 1, D), (stride_bytes // 2, D, D, 1))
    ring = raw.view(torch.float32).as_strided((blocks, 2, C, D), (stride_bytes // 4, C * D, D, 1), page_bytes // 4)
    compressed.copy_(caches.compressed_cache)
    ring.copy_(caches.tail_cache)
    return compressed, ring


def test_interleaved_views_that_share_no_byte_give_the_separate_result(torch_device):
    """The test is exact: caches interleaved in one allocation, and an output buffer whose row
    gaps hold the block table, are accepted and give the indices and caches of separate storage."""
    caches, kw = small_batch(SMALL, device=torch_device)
    twin = caches.clone()
    want = forward(**dict(kw, compressed_cache=twin.compressed_cache, tail_cache=twin.tail_cache))
    compressed, ring = _interleaved_caches(caches, torch_device)
    T = kw["k"].shape[0]
    R, M = kw["block_table"].shape
    store = torch.full((T, W + M), -5, dtype=torch.int32, device=torch_device)
    store[:R, W:] = kw["block_table"]
    assert overlaps(compressed, ring) is False and overlaps(store[:, :W], store[:R, W:]) is False
    got = forward(**dict(kw, compressed_cache=compressed, tail_cache=ring, output_buffer=store[:, :W],
                         block_table=store[:R, W:]))
    assert_bitwise_equal(got, want)
    assert_bitwise_equal(compressed, twin.compressed_cache)
    assert_bitwise_equal(ring, twin.tail_cache)


def test_overlap_is_exact_on_byte_intervals():
    base = torch.zeros(64, dtype=torch.float32)
    grid = base.view(8, 8)
    assert overlaps(grid[:, :4], grid[:, 4:]) is False              # interleaved column halves
    assert overlaps(grid[:, :5], grid[:, 4:]) is True               # one shared column
    assert overlaps(grid[::2], grid[1::2]) is False                 # alternate rows
    assert overlaps(base[:10], base.view(torch.int16)[19:21]) is True    # bytes 38..41 inside element 9
    assert overlaps(base[:10], base.view(torch.int16)[20:22]) is False
    assert overlaps(base[:0], base) is False
    assert overlaps(base, torch.zeros(64)) is False                 # another allocation
    assert self_overlaps(base.as_strided((4, 4), (4, 1))) is False
    assert self_overlaps(base.as_strided((4, 4), (3, 1))) is True   # rows overlap by one element
    assert self_overlaps(base.as_strided((4, 4), (1, 4))) is False  # transposed view
    assert self_overlaps(base.as_strided((2, 4, 2), (1, 8, 25))) is True    # 1 + 3 * 8 == 25
    assert self_overlaps(base[:1].expand(5)) is True
    assert self_overlaps(base.as_strided((2, 2, 2), (2, 8, 1))) is False   # non-nested strides, disjoint
    assert MAX_RUNS >= 2 ** 20
