"""What a public failure case is (public-cases.md; parity-contract.md §1): its cases, its stated
values as checks on recorded runs, and the records those checks read.

A :class:`PublicCase` builds one or more :class:`cases.spec.Case` objects and states, as
:class:`Check` results, what the kernel (and the reference) must have returned and left in the
caches. The harness (:mod:`parity.running.public`) runs every case with recording forwards, hands the
records to :attr:`PublicCase.expect` as :class:`PublicRun` objects, and adds the checks that
need the reference or the kernels themselves. Data only: nothing here runs anything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..spec import Case

PUBLIC_SIZE = "public"
"""The size label of every public case (reports: ``C09:own-incomplete-pool[public]``)."""


@dataclass
class Check:
    """One stated-value assertion: ``name``, whether it held, a detail, and the triage verdict
    (parity-contract.md §6) a failure is reported under."""

    name: str
    ok: bool
    detail: str = ""
    verdict: str = "wrong-index"


@dataclass
class Call:
    """One recorded forward call (CPU copies; :class:`parity.implementations.recording.Recorder` makes them).

    Attributes:
        out: int32 ``[T, 1, W]`` returned rows (``None`` for cache-only steps or on error).
        compressed: bf16 ``[N, B, 1, D]`` cache after the call. tail: fp32 ``[blocks, 2, C, D]`` ring
            after the call. error: the exception raised, if any. meta: the metadata tensors passed.
        inputs: ``k``, ``gate``, ``q``, ``weights`` passed.
    """

    out: Optional[torch.Tensor]
    compressed: torch.Tensor
    tail: torch.Tensor
    error: Optional[BaseException]
    meta: dict
    inputs: dict


@dataclass
class PublicRun:
    """One case of a public case after a harness run with recording forwards.

    Attributes:
        case: the :class:`cases.spec.Case`. result: its :class:`parity.findings.results.CaseResult`
        (``findings``, ``failures``). kernel_calls / reference_calls: the recorded calls, one per
        step, in step order.
    """

    case: Case
    result: object
    kernel_calls: List[Call]
    reference_calls: List[Call]

    def call(self, step: int, side: str = "kernel") -> Call:
        """The recorded call of ``step`` on ``side`` (``"kernel"`` / ``"reference"``)."""
        return (self.kernel_calls if side == "kernel" else self.reference_calls)[step]


@dataclass
class PublicCase:
    """A public failure case.

    Attributes:
        cid: ``"C01"``..``"C31"``. title: one line.
        build: ``fn() -> [Case, ...]`` (run in order, each from fresh caches).
        expect: ``fn({case name: PublicRun}) -> [Check]``: the stated values that read only the
            recorded runs (the checks that need the reference or direct kernel calls live in
            :mod:`parity.running.public`, keyed by ``cid``).
        must_fail: names of cases that are negative controls (their failures are expected;
            a check asserts the harness reported one).
        check_oracle: cases whose physical state is deliberately not a function of per-request
            history (C19 re-points requests at other blocks) run without the oracle.
    """

    cid: str
    title: str
    build: Callable[[], List[Case]]
    expect: Callable[[Dict[str, PublicRun]], List[Check]]
    must_fail: Sequence[str] = ()
    check_oracle: bool = True
