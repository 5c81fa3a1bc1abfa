"""The public failure cases C01..C31 of ``../shared/cases/public-cases.md`` as named regression
cases with their stated correct values (parity-contract.md §1; kpool-algorithm.md §4-§7), one
module per case, each exporting ``CASE`` (a :class:`cases.public.model.PublicCase`).

``python -m parity run --suite public`` (and ``tests/test_public_cases.py``) runs each case
through the harness with recording forwards (:mod:`parity.running.public`) and evaluates ``CASE.expect``
on what the kernel and the reference returned and left in the caches; the checks that need the
reference's numerics, the harness's sentinels or direct kernel calls live in
:mod:`parity.running.public` keyed by case id. A case marked ``must_fail`` is a negative control: the
harness must report it.

Where a public case states a value for an implementation style we do not have, the case
module's docstring says how it is adapted: our ring stores each request's last ``C`` rows (§5.4,
so C05's "slots 2 and 3 unchanged" becomes "slots 2, 3 hold tokens 206, 207") and has
``C = P + spec`` slots (C21's ring slots are ``p % C``); our top-k is a stable sort with no
workspace or radix switch (C23, C29 check what those cases *mean* for us: the canonical
``torch.topk`` set, independence from earlier launches and from row order, no truncation above
k = 256); there are no CUDA graphs under the interpreter, so FULL-graph replay is emulated by
FULL-mode metadata copied in place (:meth:`kpool.metadata.KPoolMetadata.copy_`) into fixed
buffers and ``validate=False`` launches.

To add a case: a module ``cNN_<what_it_checks>.py`` with ``build()``, ``expect(runs)`` and
``CASE``, listed in :data:`MODULES`.
"""
from __future__ import annotations

from typing import Dict

from . import (c01_decode_vs_prefill_writer, c03_padded_stride_ring, c05_tail_seed_bounds,
               c07_short_row_in_mixed_batch, c09_own_incomplete_pool, c11_request_boundary_pooling,
               c13_partial_pool_tie, c15_ragged_mtp_decode, c17_full_graph_padding, c19_graph_replay_metadata,
               c21_rejected_drafts, c23_topk_state_across_rows, c25_near_ties, c27_determinism, c29_k512,
               c31_softmax_per_dim)
from .model import PUBLIC_SIZE, Call, Check, PublicCase, PublicRun

__all__ = ["MODULES", "PUBLIC_CASES", "PUBLIC_SIZE", "Call", "Check", "PublicCase", "PublicRun"]

MODULES = (c01_decode_vs_prefill_writer, c03_padded_stride_ring, c05_tail_seed_bounds, c07_short_row_in_mixed_batch,
           c09_own_incomplete_pool, c11_request_boundary_pooling, c13_partial_pool_tie, c15_ragged_mtp_decode,
           c17_full_graph_padding, c19_graph_replay_metadata, c21_rejected_drafts, c23_topk_state_across_rows,
           c25_near_ties, c27_determinism, c29_k512, c31_softmax_per_dim)
"""Every public case module, in case-id order."""

PUBLIC_CASES: Dict[str, PublicCase] = {m.CASE.cid: m.CASE for m in MODULES}
"""Every public case by id."""
