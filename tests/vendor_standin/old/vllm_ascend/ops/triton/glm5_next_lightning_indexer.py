"""Stand-in for an older vLLM-Ascend ``glm5_next_lightning_indexer.py`` shape (no
``output_buffer``/``pack_tail``: the fixed layout, tail at column ``index_topk``; a kernel that
reads positions with triton-ascend's ``get_element``; test data, not vLLM-Ascend code): its
signature and imports, our kernels (``tests/vendor_standin/standin_ops.py``)."""
import torch
from vllm.triton_utils import tl, triton

from vllm_ascend.ops.triton.triton_utils import get_element

from tests.vendor_standin import standin_ops

TIES = "lower-id-first"
ROW_BLOCK = 16


@triton.jit
def _write_tail_kernel(out_ptr, positions_ptr, num_rows, stride, TOPK: tl.constexpr, POOL: tl.constexpr,
                       TAIL: tl.constexpr, ROW_BLOCK: tl.constexpr):
    # the causal tail at the fixed column TOPK, from each row's position (read with get_element)
    lanes = tl.arange(0, TAIL)
    for r0 in range(0, num_rows, ROW_BLOCK):
        rows = r0 + tl.arange(0, ROW_BLOCK)
        block = tl.load(positions_ptr + rows, mask=rows < num_rows, other=0)
        for i in range(0, min(ROW_BLOCK, num_rows - r0)):
            p = get_element(block, (i,))
            start = (p + 1) // POOL * POOL
            values = tl.where(lanes < p + 1 - start, start + lanes, -1)
            tl.store(out_ptr + (r0 + i) * stride + TOPK + lanes, values.to(tl.int32), mask=lanes < POOL - 1)


def glm5_next_lightning_indexer_triton(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens,
                                       indexer_block_table, positions, *, index_topk, index_kpool,
                                       max_pool_seq_len):
    """int32 [T, 1, index_topk + index_kpool - 1] token ids, tail at column index_topk."""
    rows = standin_ops.fixed_layout_rows(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens,
                                         indexer_block_table, positions, index_topk=index_topk,
                                         index_kpool=index_kpool, max_pool_seq_len=max_pool_seq_len, ties=TIES)
    T = rows.shape[0]
    if T and index_kpool > 1:
        tail = max(2, 1 << (index_kpool - 2).bit_length())
        _write_tail_kernel[(1,)](rows, positions, T, rows.stride(0), TOPK=index_topk, POOL=index_kpool,
                                 TAIL=tail, ROW_BLOCK=ROW_BLOCK)
    return rows.unsqueeze(1)
