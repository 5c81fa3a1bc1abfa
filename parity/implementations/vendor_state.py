"""The older vLLM-Ascend compression (``glm5_next_kpool_state_compress_and_write_cache_triton``)
on our tail ring: the ring is converted bit-exactly into the paged state cache that operator
reads and writes, and back (kpool-algorithm.md §3.3 "historical layout", §5).

The state cache is ``[blocks, block_size, 2D]`` fp32, one row ``[k | gate]`` per token position,
paged by position through a state block table (page ``p // block_size``, row ``p % block_size``),
with a state slot per token to write. Our ring keeps only the last ``C`` positions of a request
(row ``p % C`` of its block ``tail_block_table[r, 0]``). The conversion, per call:

1. a scratch state cache with block size ``C``; per request, the pages from the one holding
   position ``s - C`` (``s`` = the request's first query position) to the one holding its last
   position get fresh blocks (block 0 stays zero and backs every other page);
2. the ring's rows of positions ``[s - C, s)`` are copied into their page rows (fp32, bit copies);
3. each live token with a ring slot and ``p >= 0`` gets the scratch slot of its position (else
   ``-1``), so the operator's state write never overwrites a row another program still reads (the
   ring would alias them: position ``p`` and ``p + C`` share a row);
4. after the operator, the rows it wrote for the ring's rows are copied back: per request its last
   ``min(C, ql)`` tokens, to their ``tail_slot_mapping`` slots (the ring write of §5.4).

So the operator's own state write and history read are what is tested; the conversion only moves
fp32 values. Host-side metadata reads (``.tolist()``): not graph-capturable.
"""
from __future__ import annotations

from typing import Callable, List, Tuple

import torch


def _plan(ends: List[int], raw: List[int], C: int) -> Tuple[List[Tuple[int, int, int, int, int]], int, int]:
    """Per request ``(qs, end, s, first_page, base_block)`` (page ``j`` of the request is scratch
    block ``base_block + j``), the number of scratch blocks and the table width."""
    plans, next_block, width = [], 1, 1
    qs = 0
    for end, e in zip(ends, raw):
        ql = max(end - qs, 0)
        s = e - ql
        lo, hi = max(s - C, 0) // C, max(e - 1, 0) // C
        plans.append((qs, end, s, lo, next_block - lo))
        next_block += hi - lo + 1
        width = max(width, hi + 1)
        qs = max(qs, end)
    return plans, next_block, width


def compress_through_state(compress: Callable, *, k, gate, ape, compressed_cache, tail_cache, positions,
                           cum_query_lens, raw_seq_lens, tail_block_table, tail_slot_mapping, slot_mapping,
                           index_kpool: int) -> None:
    """Run the state compression ``compress`` (its 12-argument signature: ``state_cache,
    indexer_cache, k, gate_score, ape, positions, cum_query_lens, seq_lens, state_slot_mapping,
    state_block_table, indexer_slot_mapping, index_kpool``) as our compression and ring write.

    Shapes as :func:`kpool.indexer.forward`: ``tail_cache`` fp32 ``[blocks, 2, C, D]`` (updated in
    place, module docstring step 4), ``compressed_cache`` bf16 ``[N, B, 1, D]`` (written by the
    operator), ``k``/``gate`` fp32 ``[T, D]``, metadata int ``[T]`` / ``[R]`` / ``[R, M]``.

    Raises: whatever the operator raises (nothing is validated here: the harness validates first).
    """
    T = int(k.shape[0])
    if T == 0 or cum_query_lens.numel() == 0:
        empty = torch.zeros((1, tail_cache.shape[2], 2 * tail_cache.shape[3]), dtype=tail_cache.dtype,
                            device=tail_cache.device)
        table = torch.zeros((max(int(cum_query_lens.numel()), 1), 1), dtype=torch.int32, device=k.device)
        compress(empty, compressed_cache, k, gate, ape, positions, cum_query_lens, raw_seq_lens,
                 torch.full((T,), -1, dtype=torch.int64, device=k.device), table, slot_mapping, index_kpool)
        return
    num_ring, C, D = int(tail_cache.shape[0]), int(tail_cache.shape[2]), int(tail_cache.shape[3])
    dev = k.device
    ends, raw = cum_query_lens.tolist(), raw_seq_lens.tolist()
    ring_blocks = tail_block_table[:, 0].tolist()
    plans, num_blocks, width = _plan(ends, raw, C)
    state = torch.zeros((num_blocks, C, 2 * D), dtype=tail_cache.dtype, device=dev)
    table = torch.zeros((len(ends), width), dtype=torch.int32, device=dev)
    slots = torch.full((T,), -1, dtype=torch.int64, device=dev)
    flat = state.view(-1, 2 * D)
    for r, (qs, end, s, lo, base) in enumerate(plans):
        e = raw[r]
        hi = max(e - 1, 0) // C
        table[r, lo:hi + 1] = torch.arange(base + lo, base + hi + 1, dtype=torch.int32, device=dev)
        block = ring_blocks[r]
        if 0 <= block < num_ring and s > 0:
            hist = torch.arange(max(s - C, 0), s, device=dev)
            rows = (base + hist // C) * C + hist % C
            flat[rows, :D] = tail_cache[block, 0, hist % C]
            flat[rows, D:] = tail_cache[block, 1, hist % C]
        end = min(end, T)
        if end > qs:
            p = positions[qs:end].to(torch.int64)
            ring = tail_slot_mapping[qs:end].to(torch.int64)
            page = p.clamp(min=0) // C
            ok = (p >= 0) & (ring >= 0) & (ring < num_ring * C) & (page >= lo) & (page <= hi)
            slots[qs:end] = torch.where(ok, (base + page) * C + p.clamp(min=0) % C, -1)
    compress(state, compressed_cache, k, gate, ape, positions, cum_query_lens, raw_seq_lens, slots, table,
             slot_mapping, index_kpool)
    for qs, end, _s, _lo, _base in plans:
        end = min(end, T)
        rows = torch.arange(max(qs, end - C), end, device=dev) if end > qs else torch.empty(0, dtype=torch.long)
        if rows.numel() == 0:
            continue
        src = slots[rows]
        keep = src >= 0
        src, ring = src[keep], tail_slot_mapping[rows][keep].to(torch.int64)
        tail_cache[ring // C, 0, ring % C] = flat[src, :D]
        tail_cache[ring // C, 1, ring % C] = flat[src, D:]
