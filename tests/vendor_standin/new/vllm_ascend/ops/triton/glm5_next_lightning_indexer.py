"""Stand-in for vLLM-Ascend's ``glm5_next_lightning_indexer.py`` (test data, not vLLM-Ascend code):
its signature, our kernels (``tests/vendor_standin/standin_ops.py``), its imports."""
from vllm.triton_utils import tl, triton

from vllm_ascend.ops.triton.triton_utils import get_vectorcore_num

from tests.vendor_standin import standin_ops

TIES = "lower-id-first"


@triton.jit
def _copy_rows_kernel(src_ptr, dst_ptr, num_rows, width, stride_src, stride_dst, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    for t in range(pid, num_rows, tl.num_programs(0)):
        for c0 in range(0, width, BLOCK):
            m = c0 + cols < width
            v = tl.load(src_ptr + t * stride_src + c0 + cols, mask=m)
            tl.store(dst_ptr + t * stride_dst + c0 + cols, v, mask=m)


def _copy_rows(src, dst):
    cores = max(1, min(get_vectorcore_num(), src.shape[0]))
    _copy_rows_kernel[(cores,)](src, dst, src.shape[0], src.shape[1], src.stride(0), dst.stride(0), BLOCK=32)


def glm5_next_lightning_indexer_triton(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens,
                                       indexer_block_table, positions, *, index_topk, index_kpool, max_pool_seq_len,
                                       output_buffer=None, pack_tail=False, allow_cache_packing=True):
    """int32 [T, index_topk + index_kpool - 1] token ids of the head-merged lightning indexer."""
    return standin_ops.lightning_indexer(
        query, indexer_cache, weights, cum_query_lens, indexer_seq_lens, indexer_block_table, positions,
        index_topk=index_topk, index_kpool=index_kpool, max_pool_seq_len=max_pool_seq_len,
        output_buffer=output_buffer, pack_tail=pack_tail, ties=TIES, copy_rows=_copy_rows)
