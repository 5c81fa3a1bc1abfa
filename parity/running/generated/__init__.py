"""Generated parity runs (hypothesis over :mod:`cases.strategies`): the driver
(:mod:`.driver`: :func:`run_generated`, shrinking, determinism re-runs, coverage), the kernel
warm-up and compile clock (:mod:`.warmup`), the ``--suite generated`` command (:mod:`parity.selection.generated_suite`)
and the developer command that grows the corpus with the planted faults' shrunk cases
(``python -m parity.verbs.grow``).
"""
from .driver import (KINDS, GeneratedOutcome, HarnessCrash, Nondeterministic, ParityFailure, error_summary,
                     failure_kind, fingerprint, run_generated, shrink_budget)
from .warmup import JitClock, WarmUp, warm_kernels, warm_up_cases

__all__ = ["KINDS", "GeneratedOutcome", "HarnessCrash", "Nondeterministic", "ParityFailure", "error_summary",
           "failure_kind", "fingerprint", "run_generated", "shrink_budget", "JitClock", "WarmUp", "warm_kernels",
           "warm_up_cases"]
