"""Stand-in for the older ``glm5_next_kpool_state_compress.py`` (state cache ``[blocks,
block_size, 2D]`` fp32, ``[k | gate]`` rows paged by position; test data, not vLLM-Ascend code):
its signature and imports, our kernels."""
from vllm.triton_utils import triton  # noqa: F401  (imported like the real file: exercises the stand-in)

from tests.vendor_standin import standin_ops


def glm5_next_kpool_state_compress_and_write_cache_triton(state_cache, indexer_cache, k, gate_score, ape, positions,
                                                          cum_query_lens, seq_lens, state_slot_mapping,
                                                          state_block_table, indexer_slot_mapping, index_kpool):
    """Compress completed pools into indexer_cache and write every live token's state row."""
    if k.shape[0] == 0:
        return
    standin_ops.state_compress_and_write_cache(state_cache, indexer_cache, k, gate_score, ape.contiguous(),
                                               positions, cum_query_lens, seq_lens, state_slot_mapping,
                                               state_block_table, indexer_slot_mapping, index_kpool)
