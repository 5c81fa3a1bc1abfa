"""What the stand-in vendor checkouts compute: our kernels (:mod:`kpool.ops`) behind the
signatures of every public vLLM-Ascend revision shape (docs/vendor-revisions.md), so that
``--kernel vllm-ascend:tests/vendor_standin/X`` is bit-exact in merged mode (kpool-algorithm.md
§4.2 (M)) and the adapter (:mod:`parity.implementations.vllm_ascend`) can be tested without
vLLM-Ascend. No vLLM-Ascend code: only the signatures are theirs.

* ``new``: the tail compression with ``tail_slot_mapping`` (12 arguments) and the indexer with
  ``output_buffer``/``pack_tail``, whose decode rows go through a shared-query kernel that slices
  pairs of rows with ``extract_slice``;
* ``old``: the tail compression addressing the ring itself (11 arguments) and the fixed-layout
  indexer (no ``pack_tail``/``output_buffer``), whose tail columns a kernel writes from positions
  read with ``get_element``;
* ``state``: the older state-cache compression (``[blocks, block_size, 2D]``) and the indexer
  with ``compact_indices`` (the fixed layout, or the packed one with padding rows masked).

Together the operator files import exactly the names of
:data:`parity.implementations.vendor_manifest.STANDINS` (tests/test_vllm_ascend.py checks it), so
loading them exercises the adapter's stand-ins and the interpreter's extension emulation.
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


def fixed_layout_rows(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens, indexer_block_table,
                      positions, *, index_topk, index_kpool, max_pool_seq_len, ties="lower-id-first"):
    """int32 ``[T, K_tok + P - 1]`` rows in the fixed layout (tail at column ``K_tok``,
    kpool-algorithm.md §4.5 with ``pack_tail=False``), as the older indexer revisions write them."""
    return lightning_indexer(query, indexer_cache, weights, cum_query_lens, indexer_seq_lens, indexer_block_table,
                             positions, index_topk=index_topk, index_kpool=index_kpool,
                             max_pool_seq_len=max_pool_seq_len, pack_tail=False, ties=ties)


def state_compress_and_write_cache(state_cache, indexer_cache, k, gate_score, ape, positions, cum_query_lens,
                                   seq_lens, state_slot_mapping, state_block_table, indexer_slot_mapping,
                                   index_kpool):
    """The older state-cache compression (kpool-algorithm.md §3.3 historical layout, §5) on our
    kernel: each request's last ``P - 1`` positions before its query are read from the paged state
    cache fp32 ``[blocks, block_size, 2D]`` (``[k | gate]`` rows, page ``p // block_size`` of
    ``state_block_table``) into a scratch ring, :func:`compress_and_write_cache` pools, then every
    live token's row is stored at its ``state_slot_mapping`` slot (``-1``: none)."""
    import torch
    T, D = k.shape
    R, P, bs = cum_query_lens.shape[0], index_kpool, state_cache.shape[1]
    ring = torch.zeros((max(R, 1), 2, P, D), dtype=torch.float32, device=k.device)
    ring_slots = torch.full((T,), -1, dtype=torch.int64, device=k.device)
    qs = 0
    for r, (end, e) in enumerate(zip(cum_query_lens.tolist(), seq_lens.tolist())):
        s = e - max(end - qs, 0)
        for p in range(max(s - P, 0), s):
            row = state_cache[int(state_block_table[r, p // bs]), p % bs]
            ring[r, 0, p % P], ring[r, 1, p % P] = row[:D], row[D:]
        if end > qs:
            ring_slots[qs:end] = r * P + positions[qs:end].to(torch.int64) % P
        qs = max(qs, end)
    table = torch.arange(max(R, 1), dtype=torch.int32, device=k.device)[:, None]
    compress_and_write_cache(ring, indexer_cache, k, gate_score, ape, positions, cum_query_lens, seq_lens,
                             ring_slots, table, indexer_slot_mapping, index_kpool)
    live = int(cum_query_lens[-1]) if R else 0
    slots = state_slot_mapping[:live].to(torch.int64)
    keep = slots >= 0
    flat = state_cache.view(-1, 2 * D)
    flat[slots[keep], :D] = k[:live][keep]
    flat[slots[keep], D:] = gate_score[:live][keep]
