"""Metadata that breaks exactly one rejection rule of ``validate_forward`` (parity-contract.md §5;
kpool-algorithm.md §3.1-§3.4, §4.6, §5.4, §6; the rules of :data:`kpool.rules.RULES`).

:data:`VIOLATIONS` maps a metadata rule name to ``fn(meta) -> meta`` that corrupts one copy of a
valid builder metadata so that this rule, and no rule checked before it, is broken. The seed
scenario ``bad-metadata`` (:mod:`cases.scenarios`) runs one step per entry with
``expect_error`` = the rule's class and ``expect_rule`` = the rule name, so a kernel build whose
check of that rule was removed (a planted fault of :mod:`parity.verbs.faults`) is reported
``not-rejected`` (it ran on the bad metadata) or ``crash`` (another rule or exception fired).

Needs a batch with at least two scheduled requests, a live row that completes a pool and a live
row that does not (``bad-metadata``'s batch has them). :data:`ERRORS` restates each rule's class
(``cases`` may import :mod:`kpool.errors`, not :mod:`kpool.rules`; tests/test_selftest.py checks
that it equals :data:`kpool.rules.RULES`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict

import torch

from kpool import errors as E


def _live_rows(meta) -> int:
    return int(meta.cum_query_lens[-1])


def _completing_row(meta, P: int) -> int:
    """A live row whose position completes a pool (``slot_mapping >= 0``)."""
    rows = torch.nonzero(meta.slot_mapping[:_live_rows(meta)] >= 0).flatten()
    if rows.numel() == 0:
        raise ValueError("bad-metadata batch needs a live row that completes a pool")
    return int(rows[0])


def _other_live_row(meta, row: int) -> int:
    return 0 if row != 0 else 1


def _max_pool_seq_len_range(meta, P, N, B, blocks, C):
    return dataclasses.replace(meta, max_pool_seq_len=int(meta.block_table.shape[1]) * B + 1)


def _cum_order(meta, P, N, B, blocks, C):
    meta.cum_query_lens[0] = meta.cum_query_lens[1] + 1        # query length of request 1 < 0
    return meta


def _cum_rows(meta, P, N, B, blocks, C):
    meta.cum_query_lens[-1] = int(meta.positions.shape[0]) + 1
    return meta


def _query_len(meta, P, N, B, blocks, C):
    q1 = int(meta.cum_query_lens[1] - meta.cum_query_lens[0])
    meta.raw_seq_lens[1] = q1 - 1
    return meta


def _seq_lens(meta, P, N, B, blocks, C):
    meta.seq_lens[0] += 1
    return meta


def _max_below_pools(meta, P, N, B, blocks, C):
    return dataclasses.replace(meta, max_pool_seq_len=int(meta.seq_lens.max()) - 1)


def _positions(meta, P, N, B, blocks, C):
    meta.positions[_live_rows(meta) - 1] += 1
    return meta


def _block_table_range(meta, P, N, B, blocks, C):
    meta.block_table[0, 0] = N                                  # request 0 reads page 0 (it has pools)
    return meta


def _ring_block_range(meta, P, N, B, blocks, C):
    meta.tail_block_table[1, 0] = blocks
    return meta


def _slot_range(meta, P, N, B, blocks, C):
    meta.slot_mapping[_completing_row(meta, P)] = N * B
    return meta


def _tail_slot_range(meta, P, N, B, blocks, C):
    meta.tail_slot_mapping[0] = blocks * C
    return meta


def _ring_block_shared(meta, P, N, B, blocks, C):
    meta.tail_block_table[1, 0] = meta.tail_block_table[0, 0]
    return meta


def _slot_duplicate(meta, P, N, B, blocks, C):
    row = _completing_row(meta, P)
    meta.slot_mapping[_other_live_row(meta, row)] = meta.slot_mapping[row]
    return meta


def _slot_mismatch(meta, P, N, B, blocks, C):
    meta.slot_mapping[_completing_row(meta, P)] = -1
    return meta


def _tail_slot_mismatch(meta, P, N, B, blocks, C):
    t = _live_rows(meta) - 1
    meta.tail_slot_mapping[t] = (meta.tail_slot_mapping[t] + 1) % (blocks * C)
    return meta


VIOLATIONS: Dict[str, Callable] = {
    "max-pool-seq-len-range": _max_pool_seq_len_range,
    "cum-query-lens-order": _cum_order,
    "cum-query-lens-rows": _cum_rows,
    "query-len-exceeds-raw": _query_len,
    "seq-lens-pools": _seq_lens,
    "max-pool-seq-len-below-pools": _max_below_pools,
    "positions-contiguous": _positions,
    "block-table-range": _block_table_range,
    "ring-block-range": _ring_block_range,
    "slot-range": _slot_range,
    "tail-slot-range": _tail_slot_range,
    "ring-block-shared": _ring_block_shared,
    "slot-duplicate": _slot_duplicate,
    "slot-mapping-mismatch": _slot_mismatch,
    "tail-slot-mapping-mismatch": _tail_slot_mismatch,
}
"""Rule name -> ``fn(meta, P, N, B, blocks, C) -> meta`` (``meta`` is a private copy; ``N`` pages
of ``B`` pools, ``blocks`` ring blocks of ``C`` rows). Not here: ``positions-int32-window`` (a live
position ``>= INT32_MAX - P`` needs ``max_pool_seq_len >= 2**31 / P`` and a block table that wide:
a device-size case, see ``tests/test_int64_addressing.py``)."""


ERRORS = {
    "max-pool-seq-len-range": E.KPoolMetadataError, "cum-query-lens-order": E.KPoolMetadataError,
    "cum-query-lens-rows": E.KPoolMetadataError, "query-len-exceeds-raw": E.KPoolMetadataError,
    "seq-lens-pools": E.KPoolMetadataError, "max-pool-seq-len-below-pools": E.KPoolMetadataError,
    "positions-contiguous": E.KPoolMetadataError, "block-table-range": E.KPoolBlockIdError,
    "ring-block-range": E.KPoolBlockIdError, "slot-range": E.KPoolBlockIdError, "tail-slot-range": E.KPoolBlockIdError,
    "ring-block-shared": E.KPoolWriteConflictError, "slot-duplicate": E.KPoolWriteConflictError,
    "slot-mapping-mismatch": E.KPoolSlotMappingError, "tail-slot-mapping-mismatch": E.KPoolSlotMappingError,
}
"""Rule name -> the :mod:`kpool.errors` class its rejection raises (parity-contract.md §5)."""


def violate(rule: str, meta, *, index_kpool: int, num_pages: int, page_size: int, num_tail_blocks: int,
            ring_capacity: int):
    """A copy of ``meta`` that breaks ``rule`` (see :data:`VIOLATIONS`).

    Raises:
        KeyError: ``rule`` has no violation here. ValueError: the batch lacks what the rule needs.
    """
    return VIOLATIONS[rule](meta.clone(), index_kpool, num_pages, page_size, num_tail_blocks, ring_capacity)
