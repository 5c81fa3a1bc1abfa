"""Stand-in for the state-cache era's ``glm5_next_lightning_indexer.py`` shape with
``compact_indices`` (False: the fixed layout, tail at column ``index_topk``; True: the packed
layout with padding rows masked, written in one post-processing pass; no
``output_buffer``/``pack_tail``; test data, not vLLM-Ascend code): its signature, our kernels."""
from vllm.triton_utils import triton  # noqa: F401  (imported like the real file: exercises the stand-in)

from tests.vendor_standin import standin_ops


def glm5_next_lightning_indexer_triton(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens,
                                       indexer_block_table, positions, *, index_topk, index_kpool,
                                       max_pool_seq_len, compact_indices=False):
    """int32 [T, 1, index_topk + index_kpool - 1] token ids (packed when compact_indices)."""
    if compact_indices:
        return standin_ops.lightning_indexer(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens,
                                             indexer_block_table, positions, index_topk=index_topk,
                                             index_kpool=index_kpool, max_pool_seq_len=max_pool_seq_len,
                                             pack_tail=True).unsqueeze(1)
    return standin_ops.fixed_layout_rows(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens,
                                         indexer_block_table, positions, index_topk=index_topk,
                                         index_kpool=index_kpool, max_pool_seq_len=max_pool_seq_len).unsqueeze(1)
