"""The planted-fault catalog of the self-test (``python -m parity selftest``; issue 13).

One catalog: :data:`FAULTS` = the named mutants of :data:`parity.implementations.mutants.MUTANTS` (which
``--kernel mutant:NAME`` runs), the kernel and orchestration faults of
:mod:`parity.verbs.faults.kernels`, the faults only one input family catches
(:mod:`parity.verbs.faults.families`), and one fault per metadata rejection rule of
``kpool.validation.validate_forward`` (:func:`rule_fault`: that rule's ``reject`` made a no-op in
a copy of ``kpool``, so the check is gone and the forward goes on; caught by the seed scenarios
``bad-metadata`` and ``bad-arguments``). Every fault is a textual
mutation applied by :func:`parity.implementations.mutants.load_mutant` (it raises when the old text is
missing), so a refactor that moves a target fails ``tests/test_selftest.py`` instead of
silently testing nothing.

Rules outside this catalog, with the reason, are in :data:`NOT_PLANTED`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from .families import FAMILY_FAULTS, FAMILY_STAGES
from .structure import STRUCTURE_DEVICE_ONLY, STRUCTURE_FAULTS, STRUCTURE_STAGES
from .kernels import DEVICE_ONLY, KERNEL_FAULTS

REJECT_LINE = "    raise RULES[rule].error(message, rule=rule)"
"""The one line of ``kpool/rules.py`` ``reject`` that raises: a rule fault guards it."""


@dataclass(frozen=True)
class Fault:
    """One planted fault.

    Attributes:
        name: catalog name (``rule:<rule>`` for a removed rejection rule).
        stage: what it breaks (``window``, ``softmax``, ``rules``...).
        mutation: ``(file relative to kpool/, old, new, expected finding class)`` as in
            :data:`parity.implementations.mutants.MUTANTS`.
        device_only: why no CPU-interpreter case can catch it, or ``None``.
    """

    name: str
    stage: str
    mutation: Tuple
    device_only: Optional[str] = None

    @property
    def expected(self) -> str:
        """The finding class the mutation is expected to produce (informational)."""
        return self.mutation[3]


def rule_fault(rule: str) -> Tuple:
    """The mutation that removes rejection rule ``rule``: ``reject(rule, ...)`` returns instead of
    raising, so every check of that rule is skipped (parity-contract.md §5)."""
    new = f"    if rule != {rule!r}:\n    " + REJECT_LINE
    return ("rules.py", REJECT_LINE, new, "not-rejected")


_STAGES = {
    "visible-off-by-one": "visibility", "ape-reversed": "softmax", "tail-wrong-column": "tail",
    "padding-row-writes": "padding", "ring-stash-gated-on-pool-slot": "ring-write",
    "ring-capacity-p": "ring-write", "padding-slot-minus-one": "padding", "chunk-offset": "chunked-scoring",
    "window-first-row-from-ring": "window", "window-shifted": "window", "ring-read-k-from-gate-plane": "window",
    "softmax-normalizer-skips-slot": "softmax", "bf16-truncate": "bf16-rounding",
    "ring-write-gate-into-k-plane": "ring-write", "ring-write-span-short": "ring-write",
    "request-boundary": "window", "completing-row-offset": "completing-row",
    "prefill-relu-dropped": "head-reduction", "decode-last-head-dropped": "head-reduction",
    "nan-not-sanitized": "sanitization", "negative-key-image": "sanitization",
    "key-low-word-pool": "topk-order", "expand-invalid-kept": "expansion",
    "tail-misses-current-token": "tail", "fixed-tail-packed": "tail",
    "padding-rows-not-cleared": "padding", "alignment-columns-unwritten": "alignment",
    "paging-page-index": "paging", "selected-one-short": "expansion", "chunk-last-skipped": "chunked-scoring",
    "ring-write-one-pass": "launch-geometry", "expand-one-pass": "launch-geometry",
    "compress-store-int32": "int64-offsets",
}


def _catalog() -> Dict[str, Fault]:
    from cases.bad_arguments import CORRUPTIONS
    from cases.violations import VIOLATIONS

    from ...implementations.mutants import MUTANTS
    out = {}
    for name, mutation in {**MUTANTS, **KERNEL_FAULTS, **FAMILY_FAULTS}.items():
        stage = _STAGES.get(name) or FAMILY_STAGES.get(name, "other")
        out[name] = Fault(name, stage, tuple(mutation), DEVICE_ONLY.get(name))
    for name, mutation in STRUCTURE_FAULTS.items():      # issue 19 families 3-6 (parity.verbs.faults.structure)
        out[name] = Fault(name, STRUCTURE_STAGES[name], tuple(mutation), STRUCTURE_DEVICE_ONLY.get(name))
    for rule in (*VIOLATIONS, *CORRUPTIONS):
        out[f"rule:{rule}"] = Fault(f"rule:{rule}", "rules", rule_fault(rule))
    return out


FAULTS: Dict[str, Fault] = _catalog()
"""Catalog name -> :class:`Fault`."""

NOT_PLANTED = {
    "positions-int32-window": "a live position >= INT32_MAX - P needs max_pool_seq_len >= 2**31 / P and a "
                              "block table that wide (2**29 pools at P = 4): no interpreter-size bad-input step; follow-up",
    "builder and backend rules": "argument-type, context-parallel-*, config-*, builder-*, allocation-size: not "
                                 "checked by validate_forward (the harness builds metadata and caches with the "
                                 "production builders, so a removed check changes no forward)",
}
"""Rejection rules with no planted fault in :data:`FAULTS`, and why."""
