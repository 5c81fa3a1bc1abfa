"""Crash isolation: cases of an implementation run in a child worker process, so that a crash of
the implementation under test (an exception, but also a segfault or an abort of the whole
process) ends only that case, as one ``crash`` finding, and the run reports every other case
(parity-contract.md §6).

:class:`CaseWorker` keeps one persistent child (a :class:`concurrent.futures.ProcessPoolExecutor`
of one ``spawn`` worker, as :mod:`parity.running.parallel`), resolves the implementation there once by
its spec (:func:`parity.implementations.resolve`, wrapped with the run's
:class:`parity.implementations.semantics.RunSemantics`) and runs each submitted case there. When
the child dies (:class:`concurrent.futures.process.BrokenProcessPool`) the case gets
:func:`crash_result`: one ``crash`` finding (output :data:`CRASH_OUTPUT`) naming the exit code or
signal (``SIGSEGV``, ``SIGABRT``), the step that was running, the kernel call and the child's
``faulthandler`` trace (the Python stack at the fault); the next case starts a fresh child. The
cost is one process start per run plus one per crash, not one per case.

When (:func:`should_isolate`, ``--isolate auto|on|off``): ``auto`` isolates implementations that
are not this repository's own kernels (anything but ``kpool``, ``mutant:NAME`` and ``git:REV``:
``vllm-ascend:PATH``, ``package.module:function``); ``on`` isolates every one. A forward handed in
as a Python callable (tests) cannot be sent to a child and runs in this process.

Importing this module imports neither torch nor any kernel.
"""
from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import tempfile
import traceback
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Dict, List, Optional, Sequence

from .case_records import record_case, recorded_case
from .device_faults import DEVICE_FAULT_EXIT, call_checked

ISOLATE_CHOICES = ("auto", "on", "off")
"""``--isolate`` values (module docstring)."""
CRASH_OUTPUT = "process"
"""Output name of the finding of a case whose worker process died."""
OWN_PREFIXES = ("mutant:", "git:")
"""Specs of this repository's own kernels besides ``kpool`` (planted-fault copies of ``kpool``,
``kpool`` at a git revision): not isolated by ``auto``."""


def should_isolate(spec: str, isolate: str = "auto", *, injected: bool = False) -> bool:
    """Whether cases of implementation ``spec`` run in a child process.

    Args:
        spec: the ``--kernel`` spec.
        isolate: ``"auto"`` (not this repository's own kernels), ``"on"``, ``"off"``.
        injected: the forward was handed in as a callable (never isolated: it cannot be sent).
    Raises:
        ValueError: ``isolate`` outside :data:`ISOLATE_CHOICES`.
    """
    if isolate not in ISOLATE_CHOICES:
        raise ValueError(f"isolate must be one of {ISOLATE_CHOICES}, got {isolate!r}")
    if injected or isolate == "off":
        return False
    return isolate == "on" or not (spec == "kpool" or spec.startswith(OWN_PREFIXES))


def exit_text(exitcode: Optional[int]) -> str:
    """``"killed by signal SIGSEGV (11)"`` / ``"exit code 3"`` / ``"exit status unknown"``."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by signal {name} ({-exitcode})"
    if exitcode == DEVICE_FAULT_EXIT:
        return f"the device context failed (exit code {exitcode})"
    return f"exit code {exitcode}"


# --------------------------------------------------------------------------- child side

_CHILD: Dict[str, object] = {}
"""The child's progress counters, fault log and resolved forwards (set by :func:`_init_child`)."""


def _init_child(step, calls, fault_log: str) -> None:
    """Pool initializer: keep the shared progress counters and send ``faulthandler``'s trace of a
    fatal signal to ``fault_log`` (read by the parent after a crash)."""
    import faulthandler
    _die_with_parent()
    _CHILD.update(step=step, calls=calls, forwards={})
    _CHILD["fault_file"] = open(fault_log, "w")
    faulthandler.enable(file=_CHILD["fault_file"], all_threads=False)


def _die_with_parent() -> None:
    """On Linux, ask for SIGKILL when the parent dies (a killed run leaves no worker computing on);
    elsewhere nothing (the worker then ends after its current task)."""
    try:
        import ctypes
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _forward(spec: str, semantics, device: str) -> Callable:
    """The child's forward of ``spec`` under ``semantics``, resolved once, counting its calls in
    the shared ``calls`` counter (the crash finding names the call)."""
    key = (spec, semantics)
    if key not in _CHILD["forwards"]:
        from kpool.platform import resolve_device
        resolve_device(device)            # TRITON_INTERPRET before any kernel import (cpu)
        from ..implementations import resolve
        raw = resolve(spec).forward
        calls = _CHILD["calls"]

        def counted(**kwargs):     # a device fault ends the worker (device_faults)
            calls.value += 1
            return call_checked(raw, kwargs, device, calls.value, _CHILD["fault_file"])
        counted.__wrapped__ = raw
        _CHILD["forwards"][key] = semantics.forward(counted)
        _CHILD["forwards"][(spec, None)] = counted          # unwrapped: run_captured wraps it itself
    return _CHILD["forwards"][key]


def _child_task(fn_name: str, spec: str, semantics, device: str, payload: tuple):
    """Pool task: ``(result, None)`` or ``(None, traceback text)`` when the harness raised."""
    _CHILD["step"].value, _CHILD["calls"].value = -1, 0
    _CHILD["spec"] = spec
    try:
        forward = _forward(spec, semantics, device)
        return TASKS[fn_name](forward, semantics, device, *payload), None
    except BaseException:        # a harness error: re-raised in the parent with this trace
        return None, traceback.format_exc()


def _case_task(forward, semantics, device, case, run_kwargs, relations):
    """Run one case (:func:`parity.running.runner.run_case`) and its relations in the child."""
    import pandas as pd

    from .parallel import _to_host
    from .runner import run_case

    def on_step(_case, i, _step):
        _CHILD["step"].value = i + 1      # the step that runs next
    _CHILD["step"].value = 0
    # the outputs the implementation claims bitwise travel with its semantics (none for a vendor's)
    kwargs = {"bitwise_outputs": getattr(semantics, "bitwise_outputs", None), **run_kwargs}
    res = run_case(case, device=device, kernel_forward=forward, tie_policy=semantics.tie_policy, on_step=on_step,
                   **kwargs)
    for names, steps in relations:
        from ..checking.metamorphic import run_relations
        extra = run_relations(case, names, device=device, kernel_forward=forward, steps=steps)
        if len(extra):
            res.findings = pd.concat([res.findings, extra], ignore_index=True)
    return _to_host(res)


def _public_task(forward, semantics, device, pc, package):
    """Run one public case (:func:`parity.running.public.runner.public_results`) in the child."""
    from .parallel import _to_host
    from .public.runner import public_results
    return [_to_host(r) for r in public_results(pc, device, kernel_forward=forward, semantics=semantics,
                                                package=package)]


def _generated_task(forward, semantics, device, kind, kwargs, record_path=None):
    """Run one generated kind (:func:`parity.running.generated.driver.run_generated`) in the child,
    recording each case at ``record_path`` before it runs; an error that cannot be pickled back
    is replaced by a ``RuntimeError`` with its text."""
    import pickle

    from .generated.driver import run_generated
    from ..implementations.semantics import REFUSED
    before = REFUSED[0]
    on_example = functools.partial(record_case, record_path) if record_path else None
    out = run_generated(kind, device=device, kernel_forward=forward, semantics=semantics, on_example=on_example,
                        **kwargs)
    out.unsupported_calls = REFUSED[0] - before
    try:                     # the parent must be able to rebuild it too (a failed load breaks the pool)
        pickle.loads(pickle.dumps(out.error))
    except Exception:
        out.error = RuntimeError(f"{type(out.error).__name__}: {out.error}")
    return out


def _captured_task(forward, semantics, device, selected, checked: bool):
    """:func:`parity.running.step_outputs.run_captured` of one :class:`parity.selection.kernel_cases.Selected` in the
    child (``checked``: its reference side is :func:`parity.checking.checked_reference.checked_reference`,
    rebuilt here: a closure cannot be sent)."""
    import dataclasses
    from types import SimpleNamespace

    from ..checking.checked_reference import checked_reference
    from .parallel import _to_host
    from .step_outputs import run_captured
    raw = _CHILD["forwards"][(_CHILD["spec"], None)]
    if checked:
        selected = dataclasses.replace(selected, reference_forward=checked_reference())
    return _to_host(run_captured(selected, SimpleNamespace(forward=raw), device, semantics))


TASKS = {"case": _case_task, "public": _public_task, "generated": _generated_task, "captured": _captured_task}


# --------------------------------------------------------------------------- parent side

MAX_GENERATED_CRASHES = 3
"""Crashing cases one generated kind may report before it stops (each costs a fresh worker and
a re-run of the kind up to that case)."""


class WorkerDied(RuntimeError):
    """The child process died (signal, abort, exit) while running a generated kind."""

    failure_kind = "crash"
    """:func:`parity.running.generated.driver.failure_kind` of this error."""


class HarnessError(RuntimeError):
    """The harness (not the implementation) raised in the child; the message has its traceback."""


class CaseWorker:
    """A persistent child process that runs cases of one implementation (module docstring).

    Args:
        spec: the implementation's spec (resolved in the child).
        semantics: the run's :class:`parity.implementations.semantics.RunSemantics`.
        device: the resolved backend.

    Use as a context manager (the child is shut down on exit) or call :meth:`close`.
    """

    def __init__(self, spec: str, semantics, device: str):
        self.spec, self.semantics, self.device = spec, semantics, device
        self._ctx = mp.get_context("spawn")
        self._step = self._ctx.Value("i", -1)
        self._calls = self._ctx.Value("i", 0)
        self._dir = tempfile.mkdtemp(prefix="parity_isolation_")
        self._pool: Optional[ProcessPoolExecutor] = None
        self._processes: List = []
        self.starts = 0
        """Child processes started so far (1 + crashes, once a case ran)."""

    def __enter__(self) -> "CaseWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _fault_log(self) -> str:
        return os.path.join(self._dir, f"fault-{self.starts}.txt")

    def _ensure(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self.starts += 1
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=self._ctx, initializer=_init_child,
                                             initargs=(self._step, self._calls, self._fault_log()))
        return self._pool

    def _submit(self, fn_name: str, payload: tuple):
        """``("ok", result)`` or ``("died", detail)``; raises :class:`HarnessError`."""
        pool = self._ensure()
        fut = pool.submit(_child_task, fn_name, self.spec, self.semantics, self.device, payload)
        # the child process exists once a task is submitted: keep it to read its exit code later
        self._processes = list((getattr(pool, "_processes", None) or {}).values()) or self._processes
        try:
            result, trace = fut.result()
        except BrokenProcessPool as exc:
            detail = self._death()
            if exc.__cause__ is not None:   # the pool broke loading a result (its traceback): the child lived
                raise HarnessError(f"the isolated worker of {self.spec} returned a result the harness cannot "
                                   f"load (the worker was then stopped, not a crash):{exc.__cause__}") from exc
            return "died", detail
        if trace is not None:
            raise HarnessError(f"the harness raised in the isolated worker of {self.spec}:\n{trace}")
        return "ok", result

    def _death(self) -> str:
        """Shut the broken pool down and describe how its child died."""
        pool, self._pool = self._pool, None
        pool.shutdown(wait=True, cancel_futures=True)
        codes = [p.exitcode for p in self._processes]
        self._processes = []
        code = next((c for c in codes if c not in (None, 0)), codes[0] if codes else None)
        trace = ""
        log = os.path.join(self._dir, f"fault-{self.starts}.txt")
        if os.path.isfile(log):
            with open(log) as f:
                trace = f.read().split("\nExtension modules:")[0].strip()   # the list of C modules is noise
        log_text = f"\nthe worker's fault log (faulthandler trace or device error):\n{trace}" if trace else ""
        return exit_text(code) + log_text

    def run_case(self, case, run_kwargs: dict, relations: Sequence = ()):
        """Run ``case`` (and its relations, ``[(names, steps)]``) in the child; a
        :class:`parity.findings.results.CaseResult`, or :func:`crash_result` when the child died."""
        status, value = self._submit("case", (case, run_kwargs, list(relations)))
        if status == "ok":
            return value
        step = int(self._step.value)
        return crash_result(case, value, step=step if 0 <= step < len(case.steps) else None,
                            call=int(self._calls.value), spec=self.spec)

    def public_results(self, pc, package: Optional[str]) -> List:
        """:func:`parity.running.public.runner.public_results` of public case ``pc`` in the child; one
        :func:`crash_result` (case ``<cid>:crash``) when the child died."""
        status, value = self._submit("public", (pc, package))
        if status == "ok":
            return value
        from types import SimpleNamespace
        from cases.public.model import PUBLIC_SIZE
        stub = SimpleNamespace(name=f"{pc.cid}:crash", size=PUBLIC_SIZE, case_id=f"{pc.cid}:crash[{PUBLIC_SIZE}]",
                               steps=[])
        return [crash_result(stub, value, step=None, call=int(self._calls.value), spec=self.spec)]

    def run_generated(self, kind: str, kwargs: dict):
        """:func:`parity.running.generated.driver.run_generated` of ``kind`` in the child (``kwargs``: its
        keyword arguments but ``device``, ``kernel_forward`` and ``semantics``).

        When the child dies, the case it was running (recorded before each example) becomes a
        ``crash`` finding (:func:`crash_result`, in the outcome's ``crashes``) and the kind runs
        again in a fresh worker with that case skipped, up to :data:`MAX_GENERATED_CRASHES`
        crashes; the outcome then fails with a :class:`WorkerDied` error naming them (unless the
        rest of the run failed on its own). A death with no recorded case, or one crash too many,
        ends the kind as a failed outcome whose error says how the child died."""
        from .generated.driver import GeneratedOutcome, fingerprint
        profile = getattr(kwargs.get("profile"), "name", "")
        record = os.path.join(self._dir, f"generated-{kind}.pkl")
        crashes, skip = [], set(kwargs.get("skip", ()))
        while True:
            if os.path.exists(record):
                os.remove(record)
            status, value = self._submit("generated", (kind, {**kwargs, "skip": frozenset(skip)}, record))
            if status == "ok":
                out = value
                break
            case = recorded_case(record)
            calls = int(self._calls.value)
            if case is None or len(crashes) >= MAX_GENERATED_CRASHES:
                out = GeneratedOutcome(kind, profile, error=WorkerDied(
                    f"the process running {self.spec} died during the generated {kind} cases, kernel call "
                    f"{calls}: {value}"))
                break
            crashes.append((case, crash_result(case, value, step=None, call=calls, spec=self.spec)))
            skip.update((case.case_id, fingerprint(case)))
        out.crashes = crashes
        if crashes and out.error is None:
            out.case, out.result = crashes[0]
            out.error = WorkerDied(f"the process running {self.spec} died on {len(crashes)} generated {kind} "
                                   f"case(s) ({', '.join(c.case_id for c, _ in crashes)}); the other cases ran "
                                   f"in a fresh worker")
        return out

    def run_captured(self, selected):
        """:func:`parity.running.step_outputs.run_captured` of ``selected`` in the child: ``(CaseResult,
        {step: outputs})``, or ``(crash_result, {})`` when the child died (every step then
        differs from the other side's: ``ab`` and ``golden check`` report it, nothing is lost)."""
        import dataclasses
        checked = selected.reference_forward is not None
        payload = (dataclasses.replace(selected, reference_forward=None), checked)
        status, value = self._submit("captured", payload)
        if status == "ok":
            return value
        step = int(self._step.value)
        return crash_result(selected.case, value, step=None if step < 0 else step, call=int(self._calls.value),
                            spec=self.spec), {}

    def close(self) -> None:
        """Shut the child down and remove the fault logs."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        import shutil
        shutil.rmtree(self._dir, ignore_errors=True)


def crash_result(case, detail: str, *, step: Optional[int], call: int, spec: str):
    """The result of a case whose worker process died: one ``crash`` finding (output
    :data:`CRASH_OUTPUT`) at ``step`` (``None``: not known) naming ``spec``, the kernel call
    (1-based count of the implementation's calls in that case) and ``detail`` (exit code or
    signal, faulthandler trace); ``steps_run`` is the number of steps completed before it."""
    import pandas as pd

    from ..checking import compare as cmp
    from ..findings.results import TIMING_COLUMNS, CaseResult
    step_name = case.steps[step].name if step is not None else None
    where = f"step {step} ({step_name})" if step is not None else "the case"
    first, _, rest = detail.partition("\n")
    text = (f"the process running {spec} died during {where}, kernel call {call}: {first}; every other case "
            f"still runs (a fresh worker takes the next one)" + (f"\n{rest}" if rest else ""))
    findings = cmp.findings_frame([cmp.finding(CRASH_OUTPUT, "crash", 1, detail=text)], case=case.name,
                                  size=case.size, step=step, step_name=step_name)
    return CaseResult(case=case.name, size=case.size, case_id=case.case_id, findings=findings,
                      timings=pd.DataFrame([], columns=list(TIMING_COLUMNS)), steps_run=step or 0, wall_s=0.0)
