"""Stand-in for the OLDER revision of vLLM-Ascend's ``glm5_next_kpool_tail_compress.py``: no
``tail_slot_mapping`` argument, the ring addressed by ``tail_block_table[r, 0]`` and ``p % C``
(test data, not vLLM-Ascend code)."""
from vllm.triton_utils import triton  # noqa: F401  (imported like the real file: exercises the stand-in)

from tests.vendor_standin import standin_ops


def glm5_next_kpool_tail_compress_and_write_cache_triton(tail_cache, indexer_cache, k, gate_score, ape, positions,
                                                         cum_query_lens, seq_lens, tail_block_table,
                                                         indexer_slot_mapping, index_kpool):
    """Compress completed pools into indexer_cache and write the tail ring; seq_lens are raw lengths."""
    ape = ape.contiguous()
    slots = standin_ops.ring_slots(positions, cum_query_lens, tail_block_table, tail_cache.shape[2])
    standin_ops.compress_and_write_cache(tail_cache, indexer_cache, k, gate_score, ape, positions, cum_query_lens,
                                         seq_lens, slots, tail_block_table, indexer_slot_mapping, index_kpool)
