"""Bad input raises a named error before any launch and writes nothing (parity-contract.md §5,
kpool-algorithm.md §2)."""
import pytest
import torch

from kpool import SMALL
from kpool import errors
from kpool.config import INT32_MAX
from kpool.indexer import forward
from tests.helpers import small_batch
from tests.rejection import assert_corrupted_small_batch_rejected, assert_rejected
from parity.checking.compare import assert_bitwise_equal, bits, same_bits

# The kernel-side forward, pre-launch checks and one real launch: also run by
# `make test-ascend-interp` (triton-ascend 3.2's interpreter).
pytestmark = pytest.mark.interpreter_ok


def _snapshot(caches):
    return bits(caches.compressed_backing).clone(), bits(caches.tail_backing).clone()


def _bad_dtype_k(kw):
    kw["k"] = kw["k"].double()


def _bad_dtype_cache(kw):
    kw["compressed_cache"] = kw["compressed_cache"].float()


def _bad_weights_dtype(kw):
    kw["weights"] = kw["weights"].half()


def _bad_q_shape(kw):
    kw["q"] = kw["q"][:, :, :-1]


def _bad_topk(kw):
    kw["index_topk"] = kw["index_kpool"] * 2 + 1


def _ring_too_small(kw):
    kw["tail_cache"] = kw["tail_cache"][:, :, :3]


def _block_out_of_range(kw):
    kw["block_table"] = kw["block_table"].clone()
    kw["block_table"][1, 0] = 10_000


def _negative_block(kw):
    kw["block_table"] = kw["block_table"].clone()
    kw["block_table"][0, 0] = -1


def _ring_block_out_of_range(kw):
    kw["tail_block_table"] = kw["tail_block_table"].clone()
    kw["tail_block_table"][2, 0] = 99


def _slot_out_of_range(kw):
    kw["slot_mapping"] = kw["slot_mapping"].clone()
    kw["slot_mapping"][3] = 10_000


def _tail_slot_out_of_range(kw):
    kw["tail_slot_mapping"] = kw["tail_slot_mapping"].clone()
    kw["tail_slot_mapping"][0] = 3537 * 4  # public case C05(b)


def _non_monotonic(kw):
    kw["cum_query_lens"] = kw["cum_query_lens"].flip(0).contiguous()


def _raw_lens_as_pools(kw):
    kw["seq_lens"] = kw["raw_seq_lens"].clone()  # pitfall §9.2: token lengths passed as pool lengths


def _positions_gap(kw):
    kw["positions"] = kw["positions"].clone()
    kw["positions"][5] += 1


def _max_pool_too_small(kw):
    kw["max_pool_seq_len"] = 0


def _max_query_len_too_small(kw):
    kw["max_query_len"] = 9        # the launch hint below the longest query (10 rows)


def _cum_beyond_rows(kw):
    kw["cum_query_lens"] = kw["cum_query_lens"].clone()
    kw["cum_query_lens"][-1] = kw["k"].shape[0] + 1


def _narrow_output(kw):
    kw["output_buffer"] = torch.zeros(kw["k"].shape[0], 5, dtype=torch.int32)


def _bad_ape(kw):
    kw["ape"] = kw["ape"][:2]


def _overlapping_output_rows(kw):
    T, W = kw["k"].shape[0], kw["index_topk"] + kw["index_kpool"] - 1
    kw["output_buffer"] = torch.zeros(T + W, dtype=torch.int32, device=kw["k"].device).as_strided((T, W), (1, 1))


def _broadcast_output_rows(kw):
    T, W = kw["k"].shape[0], kw["index_topk"] + kw["index_kpool"] - 1
    kw["output_buffer"] = torch.zeros(1, W, dtype=torch.int32, device=kw["k"].device).expand(T, W)


def _unallocatable_topk(kw):
    kw["index_topk"] = 2 ** 30 * kw["index_kpool"]     # a [T, ~2^32] output: cannot be allocated


def _cache_inner_stride(kw):
    N, B, _, D = kw["compressed_cache"].shape
    kw["compressed_cache"] = torch.zeros(N, B, 1, 2 * D, dtype=torch.bfloat16, device=kw["k"].device)[..., ::2]


def _empty_cache(kw):
    kw["compressed_cache"] = kw["compressed_cache"][:0]


def _no_tail_block_column(kw):
    kw["tail_block_table"] = kw["tail_block_table"][:, :0]


def _no_q_heads(kw):
    kw["q"], kw["weights"] = kw["q"][:, :0], kw["weights"][:, :0]


def _output_column_stride(kw):
    T, W = kw["k"].shape[0], kw["index_topk"] + kw["index_kpool"] - 1
    kw["output_buffer"] = torch.zeros(T, 2 * W, dtype=torch.int32, device=kw["k"].device)[:, ::2]


def _k_not_a_tensor(kw):
    kw["k"] = kw["k"].tolist()


def _k_on_another_device(kw):
    kw["k"] = kw["k"].to("meta")


def _max_pool_beyond_table(kw):
    kw["max_pool_seq_len"] = kw["block_table"].shape[1] * kw["compressed_cache"].shape[1] + 1


def _query_longer_than_raw(kw):
    kw["raw_seq_lens"] = kw["raw_seq_lens"].clone()
    kw["raw_seq_lens"][0] = 3                             # request 0 has 7 query rows
    kw["seq_lens"] = kw["raw_seq_lens"] // kw["index_kpool"]


def _index_kpool_zero(kw):
    kw["index_kpool"] = 0


def _score_mode_unknown(kw):
    kw["score_mode"] = "softmax"


# (corrupt, error, rule); rule None: forward's own allocation guard, not a validation rule
CASES = [
    (_bad_dtype_k, errors.KPoolDtypeError, "dtype"), (_bad_dtype_cache, errors.KPoolDtypeError, "dtype"),
    (_bad_weights_dtype, errors.KPoolDtypeError, "dtype"), (_bad_q_shape, errors.KPoolShapeError, "shape"),
    (_bad_topk, errors.KPoolConfigError, "index-topk-multiple"),
    (_ring_too_small, errors.KPoolShapeError, "ring-capacity"),
    (_block_out_of_range, errors.KPoolBlockIdError, "block-table-range"),
    (_negative_block, errors.KPoolBlockIdError, "block-table-range"),
    (_ring_block_out_of_range, errors.KPoolBlockIdError, "ring-block-range"),
    (_slot_out_of_range, errors.KPoolBlockIdError, "slot-range"),
    (_tail_slot_out_of_range, errors.KPoolBlockIdError, "tail-slot-range"),
    (_non_monotonic, errors.KPoolMetadataError, "cum-query-lens-order"),
    (_raw_lens_as_pools, errors.KPoolMetadataError, "seq-lens-pools"),
    (_positions_gap, errors.KPoolMetadataError, "positions-contiguous"),
    (_max_pool_too_small, errors.KPoolMetadataError, "max-pool-seq-len-below-pools"),
    (_cum_beyond_rows, errors.KPoolMetadataError, "cum-query-lens-rows"),
    (_max_query_len_too_small, errors.KPoolMetadataError, "max-query-len-range"),
    (_narrow_output, errors.KPoolShapeError, "output-buffer-shape"), (_bad_ape, errors.KPoolShapeError, "shape"),
    (_overlapping_output_rows, errors.KPoolShapeError, "output-buffer-row-overlap"),
    (_broadcast_output_rows, errors.KPoolShapeError, "output-buffer-row-overlap"),
    (_unallocatable_topk, errors.KPoolShapeError, None),
    (_cache_inner_stride, errors.KPoolShapeError, "cache-inner-stride"),
    (_empty_cache, errors.KPoolShapeError, "cache-empty"),
    (_no_tail_block_column, errors.KPoolShapeError, "tail-block-table-columns"),
    (_no_q_heads, errors.KPoolShapeError, "q-heads"),
    (_output_column_stride, errors.KPoolShapeError, "output-buffer-column-stride"),
    (_k_not_a_tensor, errors.KPoolDtypeError, "tensor-type"),
    (_k_on_another_device, errors.KPoolShapeError, "one-device"),
    (_max_pool_beyond_table, errors.KPoolMetadataError, "max-pool-seq-len-range"),
    (_query_longer_than_raw, errors.KPoolMetadataError, "query-len-exceeds-raw"),
    (_index_kpool_zero, errors.KPoolConfigError, "index-kpool-positive"),
    (_score_mode_unknown, errors.KPoolConfigError, "score-mode"),
]


@pytest.mark.parametrize("corrupt, error, rule", CASES, ids=[c.__name__.strip("_") for c, _, _ in CASES])
def test_bad_input_raises_named_error_and_writes_nothing(corrupt, error, rule, torch_device):
    assert_corrupted_small_batch_rejected(corrupt, error, rule, torch_device)


def test_errors_keep_builtin_types():
    """Callers catching the public implementations' ValueError / NotImplementedError still work."""
    assert issubclass(errors.KPoolConfigError, ValueError)
    assert issubclass(errors.KPoolBlockIdError, errors.KPoolMetadataError)
    assert issubclass(errors.KPoolUnsupportedError, NotImplementedError)


def test_valid_batch_passes_and_writes(torch_device):
    """The unmodified batch is accepted and does write the caches (the checks above are not vacuous)."""
    caches, kw = small_batch(SMALL, device=torch_device)
    before = _snapshot(caches)
    out = forward(**kw)
    assert out.shape == (kw["k"].shape[0], 1, SMALL.output_width)
    assert not same_bits(before[0], _snapshot(caches)[0])
    assert not same_bits(before[1], _snapshot(caches)[1])


def _huge_position_batch(device, pos):
    """One decode row at ``pos`` (completing a pool, compute_topk=False) whose request has
    ``(pos + 1) // 4`` pools: a block table of 2^14 logical pages that all map to the one
    physical page of 2^15 rows (legal: pages are only read through it; one pool is written)."""
    D, P, C, B, M = 16, 4, 4, 2 ** 15, 2 ** 14
    g = torch.Generator().manual_seed(0)
    cache = torch.zeros(1, B, 1, D, dtype=torch.bfloat16, device=device)
    tail = torch.randn(1, 2, C, D, generator=g).to(device)
    i32 = dict(dtype=torch.int32, device=device)
    raw = pos + 1
    pool = pos // P
    kw = dict(k=torch.randn(1, D, generator=g).to(device), gate=torch.randn(1, D, generator=g).to(device),
              q=None, weights=None, ape=torch.randn(P, D, generator=g).to(device),
              compressed_cache=cache, tail_cache=tail, positions=torch.tensor([pos], device=device),
              cum_query_lens=torch.tensor([1], **i32), raw_seq_lens=torch.tensor([raw], **i32),
              seq_lens=torch.tensor([raw // P], **i32), block_table=torch.zeros(1, M, **i32),
              slot_mapping=torch.tensor([pool % B], device=device), tail_block_table=torch.tensor([[0]], **i32),
              tail_slot_mapping=torch.tensor([pos % C], device=device), max_pool_seq_len=raw // P,
              index_topk=8, index_kpool=P, compute_topk=False)
    return cache, tail, kw


def test_positions_must_leave_room_for_the_kernels_int32_window(torch_device):
    """The compress kernel's int32 window arithmetic needs ``p + P < INT32_MAX``; a larger position
    used to pass validation and then the pool was silently not written."""
    P = 4
    cache, tail, kw = _huge_position_batch(torch_device, INT32_MAX - P)     # the first pool end rejected
    assert_rejected(lambda: forward(**kw), errors.KPoolMetadataError, "positions-int32-window", kw,
                    match="INT32_MAX - P")
    cache, tail, kw = _huge_position_batch(torch_device, INT32_MAX - P - 4)  # the largest pool end allowed
    forward(**kw)
    assert bool((cache != 0).any())                                          # the pool was written


@pytest.mark.parametrize("name", ["positions", "cum_query_lens", "seq_lens", "raw_seq_lens", "slot_mapping",
                                  "tail_slot_mapping", "block_table", "tail_block_table"])
def test_strided_metadata_gives_the_contiguous_result(name, torch_device):
    """Every metadata tensor may be a strided view: same indices and caches as contiguous."""
    caches, kw = small_batch(SMALL, device=torch_device)
    twin = caches.clone()
    want = forward(**dict(kw, compressed_cache=twin.compressed_cache, tail_cache=twin.tail_cache))
    t = kw[name]
    wide = torch.full((t.shape[0], 2) + tuple(t.shape[1:]), -7, dtype=t.dtype, device=t.device)
    wide[:, 0] = t
    kw[name] = wide[:, 0]                       # same values, row stride doubled
    assert not kw[name].is_contiguous()
    got = forward(**kw)
    assert_bitwise_equal(got, want)
    assert_bitwise_equal(caches.compressed_backing, twin.compressed_backing)
    assert_bitwise_equal(caches.tail_backing, twin.tail_backing)
