"""Serialisable metadata patches (``Step.patch_metadata`` callables) for generated and corpus
cases (public-cases.md C05, C17; kpool-algorithm.md §3.3, §6 "FULL-mode padding").

A :class:`MetadataPatch` is a frozen dataclass ``(kind, args)``, so a shrunk generated case that
uses one can be written to the corpus as JSON and read back. Kinds:

* ``"ring-block-out-of-range"`` ``(request, block, C)``: request ``request``'s ring block becomes
  ``block`` (past the ring) and its rows' ring slots ``block * C + p % C`` (C05 (b): a main-KV
  sized block id in the tail slot mapping). Invalid metadata: both sides must reject it with
  :class:`kpool.errors.KPoolBlockIdError` (or a builtin base) and write nothing.
* ``"stale-padded-lengths"`` ``(first_padded, raw_len, P)``: the zero-length padded requests
  ``>= first_padded`` carry a stale ``raw_seq_lens = raw_len`` (``seq_lens = raw_len // P``) from
  an earlier replay (C17 (c)). Valid metadata (the padded requests own no rows): outputs must
  not change.
* ``"violate:<rule>"`` ``(P, N, B, blocks, C)``: breaks exactly the rejection rule ``<rule>``
  (:mod:`cases.violations`; the seed scenario ``bad-metadata``). Invalid metadata.
* ``"accepted:<name>"`` ``(P, N, B, blocks, C)``: valid metadata the builder never produces
  (:mod:`cases.accepted`: completing padding rows, a tight block table, garbage in unread
  table columns, idle requests' ring blocks). Outputs must not change.
* ``"unvalidated:<name>"`` ``(P, N, B, blocks, C)``: stale metadata only the ``validate=False``
  forward sees (:mod:`cases.unvalidated`); the kernel must follow the positions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

PATCH_KINDS = ("ring-block-out-of-range", "stale-padded-lengths")
VIOLATION_PREFIX = "violate:"
ACCEPTED_PREFIX = "accepted:"
UNVALIDATED_PREFIX = "unvalidated:"


@dataclass(frozen=True)
class MetadataPatch:
    """A named, serialisable ``fn(metadata) -> metadata`` (see the module docstring).

    Raises:
        ValueError: unknown kind (at construction).
    """

    kind: str
    args: Tuple[int, ...]

    def __post_init__(self):
        if self.kind not in PATCH_KINDS and not self.kind.startswith((VIOLATION_PREFIX, ACCEPTED_PREFIX,
                                                                      UNVALIDATED_PREFIX)):
            raise ValueError(f"patch kind must be one of {PATCH_KINDS}, got {self.kind!r}")

    def __call__(self, meta):
        if self.kind.startswith(UNVALIDATED_PREFIX):
            from .unvalidated import rewrite as stale
            P, N, B, blocks, C = self.args
            return stale(self.kind[len(UNVALIDATED_PREFIX):], meta, index_kpool=P, num_pages=N, page_size=B,
                         num_tail_blocks=blocks, ring_capacity=C)
        if self.kind.startswith(ACCEPTED_PREFIX):
            from .accepted import rewrite
            P, N, B, blocks, C = self.args
            return rewrite(self.kind[len(ACCEPTED_PREFIX):], meta, index_kpool=P, num_pages=N, page_size=B,
                           num_tail_blocks=blocks, ring_capacity=C)
        if self.kind.startswith(VIOLATION_PREFIX):
            from .violations import violate
            P, N, B, blocks, C = self.args
            return violate(self.kind[len(VIOLATION_PREFIX):], meta, index_kpool=P, num_pages=N, page_size=B,
                           num_tail_blocks=blocks, ring_capacity=C)
        meta = meta.clone()
        if self.kind == "ring-block-out-of-range":
            r, block, C = self.args
            meta.tail_block_table[r, 0] = block
            cum = meta.cum_query_lens.to(torch.int64)
            start = int(cum[r - 1]) if r > 0 else 0
            rows = torch.arange(start, int(cum[r]))
            meta.tail_slot_mapping[rows] = block * C + meta.positions[rows] % C
        else:
            first, raw_len, P = self.args
            meta.raw_seq_lens[first:] = raw_len
            meta.seq_lens[first:] = raw_len // P
        return meta

    def to_json(self) -> dict:
        """``{"kind": ..., "args": [...]}``."""
        return {"kind": self.kind, "args": list(self.args)}

    @staticmethod
    def from_json(d: dict) -> "MetadataPatch":
        """Inverse of :meth:`to_json`."""
        return MetadataPatch(d["kind"], tuple(int(a) for a in d["args"]))
