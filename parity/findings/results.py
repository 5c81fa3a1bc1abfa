"""What a parity run of one case returns (parity-contract.md §1, §6): the findings and timings
of :func:`parity.running.runner.run_case`, and the outputs of failing steps that repro bundles keep
(:mod:`parity.sessions.bundle`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pandas as pd
import torch

from .vocabulary import is_failure

TIMING_COLUMNS = ("case", "size", "step", "step_name", "side", "wall_s")


KEEP_OUTPUT_STEPS = 4
"""Failing steps whose outputs (both sides' index rows, caches, output buffers) a
:class:`CaseResult` keeps for repro bundles."""


@dataclass
class StepOutputs:
    """Host copies of both sides' outputs after one step (for repro bundles, :mod:`parity.sessions.bundle`).

    Attributes:
        step: step index.
        kernel_indices / reference_indices: int32 ``[T, 1, W]`` or ``None``.
        kernel_compressed / reference_compressed: int16 bits of the compressed backing (flat).
        kernel_ring / reference_ring: int32 bits of the ring backing (flat).
        kernel_buffer / reference_buffer: int32 output-buffer backing, or ``None``.
    """

    step: int
    kernel_indices: Optional[torch.Tensor]
    reference_indices: Optional[torch.Tensor]
    kernel_compressed: torch.Tensor
    reference_compressed: torch.Tensor
    kernel_ring: torch.Tensor
    reference_ring: torch.Tensor
    kernel_buffer: Optional[torch.Tensor] = None
    reference_buffer: Optional[torch.Tensor] = None

    def tensors(self) -> dict:
        """Every tensor field by name (``None`` fields omitted)."""
        return {k: v for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}


@dataclass
class CaseResult:
    """Outcome of :func:`run_case`.

    Attributes:
        case: case name; size: its size label; case_id: ``name[size]``.
        findings: DataFrame with :data:`parity.findings.vocabulary.FINDING_COLUMNS`, one row per step x
            output x class (``exact`` rows included).
        timings: DataFrame with :data:`TIMING_COLUMNS`: wall seconds of each forward per side
            (``kernel``, ``reference``, ``oracle``; ``kernel-repeat``: the extra kernel runs of
            the determinism check, comparisons included).
        steps_run: steps executed (a crash stops the case).
        wall_s: wall seconds of the whole case.
        mode: ``lockstep`` or ``resync``; repeat: kernel runs per step (determinism check).
        outputs: ``{step: StepOutputs}`` of the first :data:`KEEP_OUTPUT_STEPS` failing steps.
    """

    case: str
    size: str
    case_id: str
    findings: pd.DataFrame
    timings: pd.DataFrame
    steps_run: int
    wall_s: float
    mode: str = "lockstep"
    repeat: int = 1
    outputs: Dict[int, StepOutputs] = field(default_factory=dict)

    @property
    def failures(self) -> pd.DataFrame:
        """The findings whose verdict is a failure (:func:`parity.findings.vocabulary.is_failure`)."""
        return self.findings[self.findings["verdict"].map(is_failure)]

    @property
    def ok(self) -> bool:
        """No failure finding."""
        return self.failures.empty

    @property
    def failing_steps(self) -> List[int]:
        """Sorted step indices with at least one failure."""
        return sorted({int(s) for s in self.failures["step"].dropna()})

    @property
    def first_divergent_step(self) -> Optional[int]:
        """The first step with a failure (``None`` if none). In ``resync`` mode this is the step
        that *produces* the first divergence: every step starts from the kernel's caches, so a
        difference can not be inherited from an earlier step."""
        steps = self.failing_steps
        return steps[0] if steps else None
