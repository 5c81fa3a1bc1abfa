"""Running a public case (:mod:`cases.public`): every case of it through
:func:`parity.running.runner.run_case` with recording forwards (:class:`parity.implementations.recording.Recorder`), then
its stated values: the case's own checks on the records (``CASE.expect``), the checks that need
the reference (:data:`parity.running.public.reference_checks.REFERENCE_CHECKS`) and those that call the
kernels directly (:data:`parity.running.public.kernel_checks.KERNEL_CHECKS`).
"""
from __future__ import annotations

import warnings
from typing import Dict, List, Optional

import pandas as pd

from cases.public.model import PUBLIC_SIZE, Check, PublicCase, PublicRun

from ...checking import compare as cmp
from ...checking.checked_reference import checked_reference
from ...findings.vocabulary import UNSUPPORTED
from ...implementations.recording import Recorder
from ...findings.results import CaseResult
from ..runner import run_case
from .kernel_checks import KERNEL_CHECKS
from .reference_checks import REFERENCE_CHECKS


def run_with_recorders(case, device, *, check_oracle: bool = True, kernel_forward=None,
                       tie_policy: str = "canonical", bitwise_outputs=None) -> PublicRun:
    """Run ``case`` through :func:`parity.running.runner.run_case` with recording forwards (the reference
    wrapped in :func:`parity.checking.checked_reference.checked_reference`), the run's tie policy and the
    outputs the implementation claims bitwise (``None``: kpool's claim)."""
    if kernel_forward is None:
        from kpool.indexer import forward as kernel_forward
    kernel = Recorder(kernel_forward)
    reference = Recorder(checked_reference())
    result = run_case(case, device=device, kernel_forward=kernel, reference_forward=reference,
                      check_oracle=check_oracle, tie_policy=tie_policy, bitwise_outputs=bitwise_outputs)
    return PublicRun(case, result, kernel.calls, reference.calls)


def run_public(pc: PublicCase, device, *, kernel_forward=None, semantics=None, package: Optional[str] = "kpool"):
    """Run every case of ``pc`` and evaluate its checks.

    ``semantics`` (:class:`parity.implementations.semantics.RunSemantics`, default: none) sets
    every case's score mode (so the stated values are computed in that mode) and the tie policy;
    the direct-call checks call ``kernel_forward`` (``package``: its kernel package, or ``None``).

    Returns:
        ``(runs, checks)``: ``{case name: PublicRun}`` and the :class:`cases.public.model.Check`
        list (a ``negative control`` check per must-fail case, then the stated values: the case's
        own, the reference's, the direct kernel calls'). An expectation that raises is one failed
        check (verdict ``crash``) with its reason.
    """
    from ...implementations.semantics import RunSemantics
    semantics = semantics or RunSemantics()
    runs: Dict[str, PublicRun] = {}
    checks: List[Check] = []
    with warnings.catch_warnings():
        # NaN / inf inputs make the interpreter's NumPy ops warn; the results are what is checked.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        for case in pc.build():
            case = semantics.case(case)
            run = run_with_recorders(case, device, check_oracle=pc.check_oracle, kernel_forward=kernel_forward,
                                     tie_policy=semantics.tie_policy,
                                     bitwise_outputs=semantics.bitwise_outputs)
            runs[case.name] = run
            bad = run.result.failures
            if case.name in pc.must_fail:
                checks.append(Check(f"{case.name}: harness reports the planted fault", not bad.empty,
                                    detail=", ".join(sorted(set(bad["verdict"]))) if not bad.empty else "no failure"))
        unsupported = _unsupported_detail(runs)
        if unsupported:   # stated values of steps the operator was never asked are not judged
            checks = [Check("stated values", False, unsupported, UNSUPPORTED)]
            return runs, checks
        try:
            checks += stated_checks(pc, runs, device=device, kernel_forward=kernel_forward, package=package)
        except Exception as exc:  # a crashed expectation is a failed one, with its reason
            from ...implementations.semantics import is_unsupported
            # a direct-call check that needs a mode the implementation lacks was not asked
            verdict = UNSUPPORTED if is_unsupported(exc) else "crash"
            checks.append(Check("expectations evaluated", False, f"{type(exc).__name__}: {exc}", verdict))
    return runs, checks


def _unsupported_detail(runs: Dict[str, PublicRun]) -> str:
    """The detail of the first ``unsupported`` step of ``runs`` ("unsupported by IMPL"), or ``""``."""
    for run in runs.values():
        rows = run.result.findings
        hit = rows[rows["verdict"] == UNSUPPORTED] if len(rows) else rows
        if len(hit):
            return f"{run.case.name} step {hit['step'].iloc[0]}: {hit['detail'].iloc[0]}"
    return ""


def stated_checks(pc: PublicCase, runs: Dict[str, PublicRun], *, device=None, kernel_forward=None,
                  package: Optional[str] = "kpool") -> List[Check]:
    """Every stated value of ``pc`` on recorded ``runs``: the case's own checks, then those that
    need the reference, then (when ``device`` is given) those that call the implementation under
    test directly (``kernel_forward``, default the production kernels; ``package`` its kernels).

    Raises:
        whatever an expectation raises (:func:`run_public` reports it as a failed check).
    """
    checks = list(pc.expect(runs))
    if pc.cid in REFERENCE_CHECKS:
        checks += REFERENCE_CHECKS[pc.cid](runs)
    if device is not None and pc.cid in KERNEL_CHECKS:
        checks += KERNEL_CHECKS[pc.cid](device, runs, forward=kernel_forward, package=package)
    return checks


def public_results(pc: PublicCase, device, *, kernel_forward=None, semantics=None,
                   package: Optional[str] = "kpool") -> List[CaseResult]:
    """``[CaseResult]`` of ``pc`` for the parity CLI: each must-pass case's harness findings plus
    one finding per stated-value check (output ``expected:<check>``) on the first result; a
    must-fail case contributes only its negative-control check."""
    runs, checks = run_public(pc, device, kernel_forward=kernel_forward, semantics=semantics, package=package)
    results = []
    rows = [cmp.finding(f"expected:{c.name}"[:120], "exact" if c.ok else c.verdict, 0 if c.ok else 1,
                        detail=c.detail[:300]) for c in checks]
    first = True
    for name, run in runs.items():
        res = run.result
        findings = res.findings if name not in pc.must_fail else cmp.findings_frame([])
        if first:
            extra = cmp.findings_frame(rows, case=f"{pc.cid}:{name}", size=PUBLIC_SIZE, step=-1, step_name="checks")
            findings = pd.concat([findings, extra], ignore_index=True)
            first = False
        findings = findings.assign(case=f"{pc.cid}:{name}")
        results.append(CaseResult(case=f"{pc.cid}:{name}", size=PUBLIC_SIZE, case_id=f"{pc.cid}:{name}[{PUBLIC_SIZE}]",
                                  findings=findings, timings=res.timings, steps_run=res.steps_run, wall_s=res.wall_s))
    return results
