"""Stand-in for vLLM-Ascend's newest ``glm5_next_lightning_indexer.py`` shape (``output_buffer``,
``pack_tail``, a shared-query decode kernel that slices row pairs with triton-ascend's
``extract_slice``; test data, not vLLM-Ascend code): its signature and imports, our kernels
(``tests/vendor_standin/standin_ops.py``)."""
import torch
from vllm.triton_utils import tl, triton
from vllm.utils.math_utils import next_power_of_2

from vllm_ascend.ops.triton.triton_utils import extract_slice, get_vectorcore_num, init_device_properties_triton

from tests.vendor_standin import standin_ops

TIES = "lower-id-first"
SHARED_QUERY_MAX_TOKENS = 8
PAIR = 2


@triton.jit
def _copy_rows_kernel(src_ptr, dst_ptr, num_rows, width, stride_src, stride_dst, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    for t in range(pid, num_rows, tl.num_programs(0)):
        for c0 in range(0, width, BLOCK):
            m = c0 + cols < width
            v = tl.load(src_ptr + t * stride_src + c0 + cols, mask=m)
            tl.store(dst_ptr + t * stride_dst + c0 + cols, v, mask=m)


@triton.jit
def _shared_query_copy_kernel(src_ptr, dst_ptr, num_rows, width, stride_src, stride_dst, ROWS: tl.constexpr,
                              PAIR_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # every row of a column tile resident at once, stored pair by pair through extract_slice
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    for c0 in range(tl.program_id(0) * BLOCK, width, tl.num_programs(0) * BLOCK):
        live = (rows[:, None] < num_rows) & (c0 + cols[None, :] < width)
        tile = tl.load(src_ptr + rows[:, None] * stride_src + c0 + cols[None, :], mask=live, other=-1)
        for start in range(0, num_rows, PAIR_ROWS):
            pair = extract_slice(tile, (start, 0), (PAIR_ROWS, BLOCK), (1, 1))
            pair_rows = start + tl.arange(0, PAIR_ROWS)
            mask = (pair_rows[:, None] < num_rows) & (c0 + cols[None, :] < width)
            tl.store(dst_ptr + pair_rows[:, None] * stride_dst + c0 + cols[None, :], pair, mask=mask)


def _copy_rows(src, dst):
    init_device_properties_triton()
    rows, width = src.shape
    if 1 < rows <= SHARED_QUERY_MAX_TOKENS:
        grid = (max(1, min(get_vectorcore_num(), triton.cdiv(width, 32))),)
        _shared_query_copy_kernel[grid](src, dst, rows, width, src.stride(0), dst.stride(0),
                                        ROWS=next_power_of_2(rows), PAIR_ROWS=PAIR, BLOCK=32)
    else:
        cores = max(1, min(get_vectorcore_num(), rows))
        _copy_rows_kernel[(cores,)](src, dst, rows, width, src.stride(0), dst.stride(0), BLOCK=32)


def glm5_next_lightning_indexer_triton(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens,
                                       indexer_block_table, positions, *, index_topk, index_kpool, max_pool_seq_len,
                                       output_buffer=None, pack_tail=False, allow_cache_packing=True):
    """int32 [T, 1, index_topk + index_kpool - 1] token ids of the head-merged lightning indexer.
    Token rows without any request are refused, as the newest public revision refuses them."""
    if positions.numel() and cum_query_lens.numel() == 0:
        raise ValueError("stand-in: token rows without request boundaries")
    rows = standin_ops.lightning_indexer(
        query, indexer_cache, weights, cum_query_lens, indexer_seq_lens, indexer_block_table, positions,
        index_topk=index_topk, index_kpool=index_kpool, max_pool_seq_len=max_pool_seq_len,
        output_buffer=None, pack_tail=pack_tail, ties=TIES)
    T, W = rows.shape
    if output_buffer is None:
        output = torch.empty((T, W), dtype=torch.int32, device=query.device)
    else:
        output = output_buffer[:T]
        output[:, W:] = -1
    if T:
        _copy_rows(rows, output[:, :W])
    return output[:, :W].unsqueeze(1)
