"""``ab`` / ``golden`` runners of several implementations, each isolated in its own
:class:`parity.running.isolation.CaseWorker` when :func:`parity.running.isolation.should_isolate`
says so (a crash there is a case whose outputs all moved, reported, not the end of the run)."""
from __future__ import annotations

import contextlib
import functools
from typing import List, Sequence

from .isolation import CaseWorker, should_isolate


@contextlib.contextmanager
def isolated_runners(implementations: Sequence, semantics: Sequence, device: str, isolate: str = "auto"):
    """For ``ab`` / ``golden``: one ``fn(selected) -> (CaseResult, {step: outputs})`` per
    implementation (:func:`parity.running.step_outputs.run_captured`), in a :class:`CaseWorker` when
    :func:`should_isolate` says so, else in this process; the workers are closed on exit."""
    from .step_outputs import run_captured
    workers: List[CaseWorker] = []
    runners = []
    try:
        for impl, sem in zip(implementations, semantics):
            if should_isolate(impl.spec, isolate):
                workers.append(CaseWorker(impl.spec, sem, device))
                runners.append(workers[-1].run_captured)
            else:
                runners.append(functools.partial(_in_process, impl=impl, device=device, sem=sem,
                                                 run_captured=run_captured))
        yield runners
    finally:
        for w in workers:
            w.close()


def _in_process(selected, *, impl, device, sem, run_captured):
    return run_captured(selected, impl, device, sem)
