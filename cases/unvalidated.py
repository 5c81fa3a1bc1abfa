"""Stale metadata for the unvalidated path (issue 19 family 4; kpool-algorithm.md §3.2, §5.4, §6
FULL mode; parity-contract.md §5).

FULL-graph replays call the forward with ``validate=False``: the metadata buffers are whatever
the last capture or replay left in them, and the kernels must decide pool completion and ring
writes from ``positions`` and ``t < T_live``, never from the mere presence of a slot
(§3.2: a compressed slot is valid only on a live row with ``(p + 1) % P == 0``; §5.4: ring writes
only from each request's last ``min(C, ql)`` rows; padding rows never write). Validation rejects
each rewrite below (``slot-mapping-mismatch``), so only the unvalidated forward sees them.

Each entry of :data:`STALE` rewrites a copy of valid builder metadata; a step carrying one (as a
``cases.patches.MetadataPatch`` of kind ``unvalidated:<name>``) runs the kernel with
``validate=False`` (:func:`runs_unvalidated`), and the reference, the write set and the oracle
follow the positions (they never looked at a stale slot):

* ``slot-on-noncompleting-rows``: every live row that completes no pool carries the in-range
  compressed slot of an already written pool of the batch's first request (the page a stale
  replay buffer would still name);
* ``completing-padding-rows``: FULL-mode padding rows get pool-completing positions and in-range
  compressed and ring slots (:mod:`cases.accepted`), here unvalidated.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch

from .accepted import ACCEPTED

PREFIX = "unvalidated:"


def _slot_on_noncompleting_rows(meta, P, N, B, blocks, C):
    t_live = int(meta.cum_query_lens[-1]) if meta.cum_query_lens.numel() else 0
    if t_live == 0 or int(meta.seq_lens[0]) == 0:
        return meta
    stale = int(meta.block_table[0, 0]) * B              # request 0's pool 0: history to overwrite
    rows = torch.arange(t_live)
    noncompleting = (meta.positions[:t_live] + 1) % P != 0
    meta.slot_mapping[rows[noncompleting]] = stale
    return meta


STALE: Dict[str, Callable] = {
    "slot-on-noncompleting-rows": _slot_on_noncompleting_rows,
    "completing-padding-rows": ACCEPTED["completing-padding-rows"],
}
"""Name -> ``fn(meta, P, N, B, blocks, C) -> meta`` (``meta`` a private copy)."""


def rewrite(name: str, meta, *, index_kpool: int, num_pages: int, page_size: int, num_tail_blocks: int,
            ring_capacity: int):
    """A copy of ``meta`` with :data:`STALE` ``[name]`` applied.

    Raises:
        KeyError: unknown name.
    """
    return STALE[name](meta.clone(), index_kpool, num_pages, page_size, num_tail_blocks, ring_capacity)


def runs_unvalidated(step) -> bool:
    """Whether ``step`` carries stale metadata of this module (its kernel forward then runs with
    ``validate=False``, as a FULL-graph replay does)."""
    kind = getattr(step.patch_metadata, "kind", "")
    return isinstance(kind, str) and kind.startswith(PREFIX)
