"""What the stand-in vendor checkouts (``tests/vendor_standin/new`` and ``old``) compute: our
kernels (:mod:`kpool.ops`) behind vLLM-Ascend's two operator signatures, so that
``--kernel vllm-ascend:tests/vendor_standin/new`` is bit-exact in merged mode
(kpool-algorithm.md §4.2 (M)) and the adapter (:mod:`parity.implementations.vllm_ascend`) can be
tested without vLLM-Ascend. No vLLM-Ascend code: only the signatures are theirs.

The operator files import ``vllm.triton_utils`` and ``vllm_ascend.ops.triton.triton_utils`` like
the real ones, so loading them exercises the adapter's stubs; the final row copy is a small
Triton kernel of their own, launched on ``get_vectorcore_num()`` programs.
"""
from __future__ import annotations

import torch


def compress_and_write_cache(tail_cache, indexer_cache, k, gate_score, ape, positions, cum_query_lens, seq_lens,
                             tail_slot_mapping, tail_block_table, indexer_slot_mapping, index_kpool):
    """The tail compression and both cache writes (kpool-algorithm.md §5) on
    :func:`kpool.ops.compress.compress_and_write_cache`; ``seq_lens`` are raw token lengths."""
    from kpool.ops.compress import compress_and_write_cache as ours
    ours(k=k, gate=gate_score, ape=ape, compressed_cache=indexer_cache, tail_cache=tail_cache, positions=positions,
         cum_query_lens=cum_query_lens, raw_seq_lens=seq_lens, slot_mapping=indexer_slot_mapping,
         tail_block_table=tail_block_table, tail_slot_mapping=tail_slot_mapping, index_kpool=index_kpool)


def ring_slots(positions, cum_query_lens, tail_block_table, ring_capacity):
    """The older revision's ring addressing: row ``t`` of request ``r`` goes to ring slot
    ``tail_block_table[r, 0] * C + p % C`` (§3.3); padding rows (``t >= cum_query_lens[-1]``) -1.
    int64 ``[T]``."""
    T = positions.shape[0]
    slots = torch.full((T,), -1, dtype=torch.int64, device=positions.device)
    start = 0
    for r, end in enumerate(cum_query_lens.tolist()):
        if end > start:
            p = positions[start:end]
            slots[start:end] = tail_block_table[r, 0].to(torch.int64) * ring_capacity + p % ring_capacity
        start = max(start, end)
    return slots


def higher_id_first(keys):
    """Selection keys re-ranked with exact ties to the HIGHER pool id (a valid, non-canonical
    ``torch.topk`` order; parity-contract.md §3.2): same scores, same sort key layout."""
    from kpool.ops.topk import key_pool_ids
    return ((keys >> 32) << 32) | key_pool_ids(keys).to(torch.int64)


def _canonical_again(keys):
    """Inverse of :func:`higher_id_first` on the selected keys (low word back to ``0xFFFFFFFF - pool``)."""
    return ((keys >> 32) << 32) | (0xFFFFFFFF - (keys & 0xFFFFFFFF))


def lightning_indexer(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens, indexer_block_table,
                      positions, *, index_topk, index_kpool, max_pool_seq_len, output_buffer=None, pack_tail=False,
                      ties="lower-id-first", copy_rows=None):
    """Merged-mode scores, top-k and expansion (kpool-algorithm.md §4) on :mod:`kpool.ops.indexer`.

    Returns int32 ``[T, K_tok + P - 1]`` (``output_buffer[:T]`` when given; its columns beyond are
    -1). ``ties="higher-id-first"`` orders (and at the boundary chooses) exact ties the other way.
    ``copy_rows(src, dst)`` copies the expanded rows into ``output_buffer`` (the operator file's own
    Triton kernel).
    """
    from kpool.ops import indexer as ops
    T, P, R = query.shape[0], index_kpool, cum_query_lens.shape[0]
    W = index_topk + P - 1
    width = output_buffer.shape[1] if output_buffer is not None else W
    rows = torch.empty((T, width), dtype=torch.int32, device=query.device)
    selected = min(index_topk // P, max_pool_seq_len) if T > 0 and R > 0 else 0
    top = torch.empty((T, selected), dtype=torch.int64, device=query.device)
    if selected > 0:
        keys = torch.empty((T, max_pool_seq_len), dtype=torch.int64, device=query.device)
        ops.score_keys(q=query, weights=weights, compressed_cache=indexer_cache, positions=positions,
                       cum_query_lens=cum_query_lens, seq_lens=indexer_seq_lens, block_table=indexer_block_table,
                       max_pool_seq_len=max_pool_seq_len, index_kpool=P, score_mode="merged", row_start=0,
                       num_rows=T, keys=keys)
        if ties == "higher-id-first":
            top.copy_(_canonical_again(ops.select_topk(higher_id_first(keys), selected)))
        else:
            top.copy_(ops.select_topk(keys, selected))
    if T > 0:
        ops.expand_indices(top_keys=top, positions=positions, cum_query_lens=cum_query_lens, index_topk=index_topk,
                           index_kpool=P, pack_tail=pack_tail, out=rows)
    if output_buffer is None:
        return rows
    if T > 0:
        copy_rows(rows, output_buffer[:T])
    return output_buffer[:T]
