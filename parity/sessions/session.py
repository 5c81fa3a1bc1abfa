"""Running a list of cases the way the CLI does: options, the kernel under test, the progress
bar, metamorphic checks, repro bundles on failure (parity-contract.md §1, §6).

Kept apart from :mod:`parity.cli` so the CLI stays argument parsing only and the same loop serves
``run``, ``record`` and ``replay``. Nothing here imports Triton at module import; callers resolve
the device (``kpool.platform.resolve_device``) before :func:`run_cases`.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from ..implementations.semantics import KPOOL_BITWISE

DEFAULT_KERNEL = "kpool"
"""Kernel spec of the production kernels (``kpool.indexer.forward``)."""
AUTO_CPU_JOBS = 2
"""Workers of ``--jobs auto`` on the CPU interpreter (at most the machine's cores): two keep the
memory of GLM-size cases modest and halve the seed suite's time on a 2-core CI machine."""
RELATION_NAMES = ("batch-permutation", "padding-rows", "output-width", "score-chunking", "captured-replay")
"""The metamorphic relations of :data:`parity.checking.metamorphic.RELATIONS`, named here so that the CLI's
``--help`` needs no torch import (a test keeps the two equal)."""
DEVICE_DECODE_RELATIONS = {"cuda": ("captured-replay",), "npu": ("captured-replay",), "cpu": ()}
"""Relations a run checks by default on the decode steps of the seed cases, per backend (no
``--metamorphic``): a captured serving graph replays decode steps on a device (FULL mode); the
CPU interpreter captures nothing, so it is off there."""
SEED_TAG = "suite:seed"
"""The tag of the seed scenarios (:mod:`cases.scenarios`): the cases :attr:`RunOptions.decode_relations`
apply to."""


@dataclass
class RunOptions:
    """How cases are run (what a repro bundle records, :mod:`parity.sessions.bundle`).

    Attributes:
        device: resolved backend ``"cpu"`` / ``"cuda"`` / ``"npu"``.
        mode: ``"lockstep"`` or ``"resync"``.
        repeat: kernel forwards per step (determinism check).
        check_oracle: also check the reference against the whole-history oracle.
        kernel: kernel spec, see :func:`resolve_kernel`.
        metamorphic: relation names to check after each case (``[]``: none; see
            :mod:`parity.checking.metamorphic`).
        seed_offset: the ``--seed`` offset the cases were built with (informational).
        decode_relations: relation names checked on the decode steps (:func:`decode_steps`) of
            the seed cases (tag :data:`SEED_TAG`) only: the device default
            (:data:`DEVICE_DECODE_RELATIONS`) when ``--metamorphic`` is not given.
        oracle: ``"history"`` (the whole-history oracle only) or ``"hf"`` (also Hugging Face
            as a third implementation, :mod:`parity.oracles.hf_run`; ``--oracle hf``).
        score_mode, tie_policy, validate_with, interp_rne, supports, bitwise_outputs: the semantics the
            implementation is judged by (:class:`parity.implementations.semantics.RunSemantics`;
            ``--score-mode``, ``--ties``, ``--validate-with``, ``--interp-rne`` or its declared
            defaults; ``supports``: its declared modes, ``None`` = every mode; ``bitwise_outputs``: the outputs it claims bitwise).
        isolate: run the cases in a child worker process (:mod:`parity.running.isolation`): ``"auto"``
            (implementations that are not this checkout's own), ``"on"`` or ``"off"``.
    """

    device: str = "cpu"
    mode: str = "lockstep"
    repeat: int = 1
    check_oracle: bool = True
    kernel: str = DEFAULT_KERNEL
    metamorphic: List[str] = field(default_factory=list)
    seed_offset: int = 0
    decode_relations: List[str] = field(default_factory=list)
    oracle: str = "history"
    score_mode: Optional[str] = None
    tie_policy: str = "canonical"
    validate_with: Optional[str] = None
    interp_rne: bool = False
    supports: Optional[List[str]] = None
    isolate: str = "auto"
    bitwise_outputs: Tuple[str, ...] = KPOOL_BITWISE

    def to_dict(self) -> dict:
        """JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunOptions":
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def resolve_kernel(spec: str) -> Callable:
    """The forward function of a kernel spec (:func:`parity.implementations.resolve`).

    Args:
        spec: ``"kpool"`` (the production kernels), ``"mutant:<name>"`` (a planted fault of
            :data:`parity.implementations.mutants.MUTANTS`), ``"package.module:function"``, or any kind
            registered in :mod:`parity.implementations`.
    Returns:
        A callable with the ``kpool.indexer.forward`` signature.
    Raises:
        ValueError: a malformed spec; KeyError: unknown mutant; ImportError / AttributeError:
        the module or function does not exist.
    """
    from ..implementations import resolve
    return resolve(spec).forward


def decode_steps(case) -> List[int]:
    """Indices of the decode steps of ``case``: scored steps whose every request has at most one
    row, at least one of them live (what a captured FULL-mode decode graph replays)."""
    out = []
    for i, step in enumerate(case.steps):
        lens = [r.query_len for r in step.batch.requests]
        if step.compute_topk and step.expect_error is None and lens and max(lens) == 1:
            out.append(i)
    return out


def case_relations(case, options: "RunOptions") -> List[tuple]:
    """``[(relation names, steps or None)]`` to check on ``case``: ``options.metamorphic`` on every
    step, and ``options.decode_relations`` on the decode steps of a seed case."""
    plan = []
    if options.metamorphic:
        plan.append((list(options.metamorphic), None))
    extra = [r for r in options.decode_relations if r not in options.metamorphic]
    if extra and SEED_TAG in tuple(getattr(case, "tags", ())):
        steps = decode_steps(case)
        if steps:
            plan.append((extra, steps))
    return plan


def _progress(console, total: int):
    """A rich progress bar over ``total`` steps, or ``None`` when stdout is not a terminal."""
    if not console.is_terminal or total <= 0:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("steps"), TimeElapsedColumn(), console=console, transient=True)


def run_cases(cases: Sequence, options: RunOptions, *, console=None, kernel_forward: Optional[Callable] = None,
              on_case: Optional[Callable] = None, jobs: int = 1) -> List:
    """Run ``cases`` with :func:`parity.running.runner.run_case` (plus the selected metamorphic relations).

    A progress bar over cases x steps is shown when the console is a terminal. ``on_case(case,
    result)`` is called after each case (in case order; the CLI prints a status line and writes
    bundles there).

    Args:
        cases: :class:`cases.spec.Case` objects.
        options: :class:`RunOptions`.
        console: a rich console (default :func:`parity.reporting.report.make_console`).
        kernel_forward: overrides ``options.kernel``.
        jobs: worker processes (:mod:`parity.running.parallel`, one device each). Workers import the
            kernel by reference, so ``jobs > 1`` needs the production kernel (``options.kernel ==
            "kpool"``); other kernels run in this process, or isolated. ``0`` (``--jobs auto``,
            ``make parity``): :data:`AUTO_CPU_JOBS` workers on the CPU interpreter where they can
            be used (the interpreter is single-threaded: one worker per core halves the seed
            suite's GLM-size cases), else 1, without the notes an explicit ``--jobs`` gets.

    Isolation (:mod:`parity.running.isolation`, ``options.isolate``): the cases of an implementation that
    is not this checkout's own run, with their relations, in one persistent child process; a
    crash of the child (segfault, abort) ends that case as a ``crash`` finding and a fresh child
    takes the next case.

    Returns:
        The :class:`parity.running.runner.CaseResult` list, in case order; metamorphic findings are
        appended to each case's ``findings``.
    """
    import pandas as pd

    from ..running import parallel as par
    from ..implementations.semantics import RunSemantics, from_options
    from ..reporting.report import make_console
    from ..running.runner import run_case
    console = console or make_console()
    semantics = from_options(options)
    from ..running.isolation import CaseWorker, should_isolate
    isolated = should_isolate(options.kernel, options.isolate, injected=kernel_forward is not None) \
        and options.oracle != "hf"        # the HF observer lives in this process
    # isolated: the child resolves the implementation; this process never calls it
    fn = None if isolated else kernel_forward or semantics.forward(resolve_kernel(options.kernel))
    cases = [semantics.case(c) for c in cases]     # workers get the cases with their score mode
    # workers run kpool's forward with canonical ties, unwrapped: any other semantics stays here
    plain = semantics == RunSemantics(score_mode=semantics.score_mode)
    auto = jobs == 0        # the CPU interpreter's cores; the rules below still apply, silently
    if auto:
        jobs = min(AUTO_CPU_JOBS, os.cpu_count() or 1) if options.device == "cpu" else 1
    if jobs > 1 and (options.kernel != DEFAULT_KERNEL or kernel_forward is not None or not plain):
        if not auto:
            console.print(f"[yellow]--jobs {jobs} needs the production kernel and its semantics; "
                          "running in this process[/]")
        jobs = 1
    kwargs = dict(check_oracle=options.check_oracle, mode=options.mode, repeat=options.repeat)
    observer_for = None
    if options.oracle == "hf":            # a per-case observer lives in this process (parity.oracles.hf_run)
        from ..oracles.hf_run import observer_for
        if jobs > 1:
            if not auto:
                console.print(f"[yellow]--oracle hf runs in this process: --jobs {jobs} ignored[/]")
            jobs = 1
    total = sum(len(c.steps) for c in cases)
    bar = _progress(console, total)
    task = bar.add_task("", total=total) if bar is not None else None
    results: List = []

    def finish(case, res):
        for names, steps in case_relations(case, options):
            from ..checking.metamorphic import run_relations
            t0 = time.perf_counter()
            extra = run_relations(case, names, device=options.device, kernel_forward=fn, steps=steps)
            res.wall_s += time.perf_counter() - t0     # the case line's time includes its relations
            if len(extra):
                for col in ("worker", "worker_device"):
                    if col in res.findings.columns:
                        extra[col] = res.findings[col].iloc[0] if len(res.findings) else None
                res.findings = pd.concat([res.findings, extra], ignore_index=True)
        if on_case is not None:
            on_case(case, res)   # rich prints above a live bar on the same console

    if isolated and jobs > 1:
        if not auto:
            console.print(f"[yellow]--jobs {jobs}: {options.kernel} runs isolated in one worker process[/]")
        jobs = 1
    if bar is not None:
        bar.start()
    try:
        if isolated:
            with CaseWorker(options.kernel, semantics, options.device) as worker:
                label = par.in_process_device_label(options.device)
                for case in cases:
                    if bar is not None:
                        bar.update(task, description=case.case_id)
                    res = par.annotate(worker.run_case(case, kwargs, case_relations(case, options)), 0, label)
                    if bar is not None:
                        bar.advance(task, len(case.steps))
                    results.append(res)
                    if on_case is not None:
                        on_case(case, res)
        elif jobs > 1:
            def advance(res):
                if bar is not None:
                    bar.advance(task, next(len(c.steps) for c in cases if c.case_id == res.case_id))
            results = par.run_cases(cases, device=options.device, jobs=jobs, on_result=advance, **kwargs)
            for case, res in zip(cases, results):
                finish(case, res)
        else:
            label = par.in_process_device_label(options.device)
            for case in cases:
                if bar is not None:
                    bar.update(task, description=case.case_id)
                observer = observer_for(case) if observer_for is not None else None
                res = run_case(case, device=options.device, kernel_forward=fn, tie_policy=semantics.tie_policy,
                               bitwise_outputs=semantics.bitwise_outputs,
                               on_step=(lambda c, i, s: bar.advance(task)) if bar is not None else None,
                               step_observer=observer, **kwargs)
                if observer is not None:
                    res.hf_table = observer.table()
                par.annotate(res, 0, label)
                if bar is not None and res.steps_run < len(case.steps):
                    bar.advance(task, len(case.steps) - res.steps_run)
                results.append(res)
                finish(case, res)
    finally:
        if bar is not None:
            bar.stop()
    return results
