"""Metadata ``validate_forward`` accepts but ``kpool.metadata.build_metadata`` never produces
(issue 13 part 2; kpool-algorithm.md §3.1-§3.4, §5.4, §6; kpool/metadata_checks.py): the rest of
the input space the kernels are specified for. Each entry of :data:`ACCEPTED` rewrites a copy of
valid builder metadata into other valid metadata with the same meaning:

* ``completing-padding-rows``: FULL-mode padding rows (``t >= T_live``) get positions that
  complete a pool (``k * P - 1``) and in-range compressed and ring slots of live pages and
  blocks: a padding row is never checked and must never write (§5.4 ``t < T_live`` guard, §6);
* ``tight-block-table``: the block table cut to exactly ``ceil(max(seq_lens) / B)`` columns (at
  least one) and ``max_pool_seq_len = max(seq_lens)``: no spare column, no spare pool (§4.6);
* ``unread-table-garbage``: block-table columns a request never reads (past
  ``ceil(seq_lens / B)``) hold out-of-range page ids (only read pages are checked, §3.1);
* ``idle-ring-blocks``: zero-length requests get a ring block out of range or shared with a
  scheduled request (only scheduled requests' blocks are checked and owned, §3.3).

Each function returns the metadata unchanged where it has nothing to rewrite (no padding row, no
idle request...), so a strategy can draw any of them for any batch.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict

import torch


def _completing_padding_rows(meta, P, N, B, blocks, C):
    t_live, T = int(meta.cum_query_lens[-1]) if meta.cum_query_lens.numel() else 0, int(meta.positions.shape[0])
    for i, t in enumerate(range(t_live, T)):
        meta.positions[t] = (i + 1) * P - 1
        meta.slot_mapping[t] = (i * 7) % (N * B)
        meta.tail_slot_mapping[t] = (i * 5) % (blocks * C)
    return meta


def _tight_block_table(meta, P, N, B, blocks, C):
    if meta.seq_lens.numel() == 0:
        return meta
    pools = int(meta.seq_lens.max())
    cols = max(1, -(-pools // B))
    if cols > meta.block_table.shape[1]:
        return meta
    return dataclasses.replace(meta, block_table=meta.block_table[:, :cols].contiguous(), max_pool_seq_len=pools)


def _unread_table_garbage(meta, P, N, B, blocks, C):
    M = meta.block_table.shape[1]
    read = (meta.seq_lens.to(torch.int64) + B - 1) // B
    unread = torch.arange(M)[None, :] >= read[:, None]
    meta.block_table[unread] = N + 3
    return meta


def _idle_ring_blocks(meta, P, N, B, blocks, C):
    cum = meta.cum_query_lens.to(torch.int64)
    qlen = cum - torch.cat([cum.new_zeros(1), cum[:-1]]) if cum.numel() else cum
    idle = torch.nonzero(qlen == 0).flatten().tolist()
    busy = torch.nonzero(qlen > 0).flatten().tolist()
    for i, r in enumerate(idle):
        meta.tail_block_table[r, 0] = meta.tail_block_table[busy[0], 0] if (busy and i % 2) else blocks + 11
    return meta


ACCEPTED: Dict[str, Callable] = {
    "completing-padding-rows": _completing_padding_rows,
    "tight-block-table": _tight_block_table,
    "unread-table-garbage": _unread_table_garbage,
    "idle-ring-blocks": _idle_ring_blocks,
}
"""Name -> ``fn(meta, P, N, B, blocks, C) -> meta`` (``meta`` a private copy)."""


def rewrite(name: str, meta, *, index_kpool: int, num_pages: int, page_size: int, num_tail_blocks: int,
            ring_capacity: int):
    """A copy of ``meta`` rewritten by :data:`ACCEPTED` ``[name]`` (still valid metadata).

    Raises:
        KeyError: unknown name.
    """
    return ACCEPTED[name](meta.clone(), index_kpool, num_pages, page_size, num_tail_blocks, ring_capacity)
