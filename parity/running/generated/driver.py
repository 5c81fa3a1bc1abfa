"""Generated parity runs: hypothesis drives :func:`cases.strategies.batch_cases` or
:func:`cases.strategies.engine_cases` through :func:`parity.running.runner.run_case` (kernel vs stateful
reference vs whole-history oracle, lockstep, after every step), shrinks any failure to a minimal
case and keeps it in a corpus directory the caller names (:mod:`cases.corpus` format).

Used by ``tests/test_strategies.py`` / ``tests/test_engine.py`` (the ``ci`` profile) and by
``python -m parity run --suite generated`` (profile by device). Each example:

1. runs the case, the reference side wrapped in :func:`parity.checking.checked_reference.checked_reference` so bad
   metadata is rejected on both sides (parity-contract.md §5);
2. on every ``repeat_every``-th example, runs it again and requires every kernel output and cache
   state to be bitwise identical to the first run (determinism, public case C27);
3. measures its wall time net of Triton compilation (:class:`parity.running.generated.warmup.JitClock`) and notes
   the examples slower than the profile's ``slow_example_s`` (a warning: nothing here depends on
   wall-clock time);
4. adds the case to the :class:`parity.findings.coverage.Coverage` of the run (until the first failure).

The guaranteed-coverage cases of :mod:`cases.coverage_cases` run first (explicit examples).
Whatever goes wrong (a parity failure, a harness exception, a nondeterministic kernel, a
hypothesis ``FlakyFailure`` / ``ExceptionGroup``) ends in :attr:`GeneratedOutcome.error`, never
as an exception out of :func:`run_generated`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, List, Optional

from cases.bits import same_bits
from cases.corpus import describe, save_case
from cases.coverage_cases import guaranteed_cases
from cases.profiles import Profile, current_profile
from cases.strategies import batch_cases, engine_cases

from ...checking.checked_reference import checked_reference
from ...findings.coverage import Coverage
from ..family_cases import family_cases
from ...implementations.recording import Recorder
from ..runner import run_case
from .warmup import JitClock

KINDS = ("batch", "engine")


@contextlib.contextmanager
def shrink_budget(seconds: float) -> Iterator[None]:
    """Bound hypothesis's shrinking phase to ``seconds`` (``MAX_SHRINKING_SECONDS`` is
    documented as monkeypatchable) and restore it afterwards."""
    from hypothesis.internal.conjecture import engine
    old = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = old


class ParityFailure(AssertionError):
    """A generated case failed; carries the case and its :class:`parity.running.runner.CaseResult`."""

    def __init__(self, case, result, message: str):
        super().__init__(message)
        self.case, self.result = case, result

    def __reduce__(self):            # an isolated worker sends it back to the parent
        return type(self), (self.case, self.result, self.args[0])


class HarnessCrash(AssertionError):
    """The harness itself raised (not a finding): a bug in a comparator or generator."""

    def __init__(self, case, exc: BaseException):
        super().__init__(f"harness raised {type(exc).__name__}: {exc} on {case.case_id}")
        self.case, self.exc = case, exc

    def __reduce__(self):
        return type(self), (self.case, self.exc)


class Nondeterministic(AssertionError):
    """Two runs of one generated case gave different kernel bits (public case C27)."""

    def __init__(self, case, diffs: List[str]):
        super().__init__(f"nondeterministic kernel results for {case.case_id}: {diffs[:4]}")
        self.case, self.diffs = case, diffs

    def __reduce__(self):
        return type(self), (self.case, self.diffs)


@dataclass
class GeneratedOutcome:
    """What a generated run did.

    Attributes:
        kind: ``"batch"`` or ``"engine"``. profile: profile name. examples: examples executed
        (shrink attempts included). passed_examples: examples that passed before any failure.
        case / result / error: the shrunk failing case, its result and the exception (``None`` when
        every example passed). coverage: input classes of the passing examples. wall_s / jit_s:
        wall and compile seconds. saved: JSON path of the shrunk failure, written to the
        ``corpus_dir`` the caller gave (a run's candidates directory, never the checkout).
        notes: hypothesis's own report lines (falsifying example, reproduce blob, shrink notes).
        slow: one line per example slower than the profile's ``slow_example_s`` (warnings).
        crashes: ``(case, CaseResult)`` of each case that killed an isolated worker process (a
            ``crash`` finding each; the run went on without it in a fresh worker).
    """

    kind: str
    profile: str
    examples: int = 0
    passed_examples: int = 0
    case: object = None
    result: object = None
    error: Optional[BaseException] = None
    coverage: Coverage = field(default_factory=Coverage)
    wall_s: float = 0.0
    jit_s: float = 0.0
    saved: Optional[Path] = None
    notes: List[str] = field(default_factory=list)
    slow: List[str] = field(default_factory=list)
    crashes: List[tuple] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No failure."""
        return self.error is None

    @property
    def failure_kind(self) -> Optional[str]:
        """``None`` (passed), ``parity`` (a finding), ``harness-crash``, ``nondeterministic``,
        ``flaky`` (hypothesis saw an example fail, then pass on replay) or ``error``."""
        return failure_kind(self.error)


def failure_kind(error: Optional[BaseException]) -> Optional[str]:
    """The class of a generated run's error (:attr:`GeneratedOutcome.failure_kind`)."""
    if error is None:
        return None
    if getattr(error, "failure_kind", None):      # an error that names its class (parity.running.isolation.WorkerDied)
        return error.failure_kind
    from hypothesis.errors import Flaky
    for cls, kind in ((ParityFailure, "parity"), (HarnessCrash, "harness-crash"),
                      (Nondeterministic, "nondeterministic"), (Flaky, "flaky")):
        if isinstance(error, cls):
            return kind
    return "error"


def _case_of(error: BaseException):
    """The generated case an error carries, looking inside exception groups (FlakyFailure)."""
    case = getattr(error, "case", None)
    for inner in getattr(error, "exceptions", ()) if case is None else ():
        case = _case_of(inner)
        if case is not None:
            break
    return case


def error_summary(error: BaseException, limit: int = 4) -> str:
    """One paragraph for the console: the error's class and message, plus the first ``limit``
    inner exceptions of a group (a ``FlakyFailure`` lists the failures that did not repeat)."""
    lines = [f"{type(error).__name__}: {error}"]
    for inner in list(getattr(error, "exceptions", ()))[:limit]:
        lines.append(f"  inner {type(inner).__name__}: " + str(inner).splitlines()[0][:300])
    return "\n".join(lines)


def failure_message(case, result, limit: int = 12) -> str:
    """Human-readable failure: the case (one line per step) and its first failing findings."""
    lines = ["generated case failed:"] + describe(case)
    bad = result.failures
    cols = [c for c in ("step", "step_name", "output", "verdict", "mismatches", "row", "position", "column",
                        "pool_id", "page", "page_row", "block", "slot", "region", "detail") if c in bad.columns]
    lines.append(bad[cols].head(limit).to_string(index=False))
    return "\n".join(lines)


def _determinism_findings(first: Recorder, second: Recorder) -> List[str]:
    """Differences between two recorded kernel runs of one case (C27)."""
    out = []
    for i, (a, b) in enumerate(zip(first.calls, second.calls)):
        for what in ("out", "compressed", "tail"):
            if not same_bits(getattr(a, what), getattr(b, what)):
                out.append(f"step {i}: {what} differs between two identical runs")
    if len(first.calls) != len(second.calls):
        out.append(f"{len(first.calls)} vs {len(second.calls)} calls")
    return out


def fingerprint(case) -> str:
    """A string that identifies a generated case (configuration, layout, steps, APE bits)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((case.config, case.geometry, case.values, case.seed)).encode())
    for s in case.steps:
        h.update(repr((s.name, s.batch, list(s.request_ids), s.compute_topk, s.output_buffer, s.seed, s.inputs,
                       s.patch_metadata, s.expect_error, tuple(s.forks), s.max_score_rows,
                       getattr(s, "layout", None))).encode())
    if case.ape is not None:
        h.update(case.ape.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _trim(outcome: GeneratedOutcome, device, kernel_forward, reference, check_oracle,
          tie_policy: str = "canonical") -> None:
    """Cut the shrunk case after its first failing step (lockstep: later steps cannot change it)
    when hypothesis's time-bounded shrinking left trailing steps; keeps it only if it still fails."""
    case, res = outcome.case, outcome.result
    failing = sorted({int(s) for s in res.failures["step"].dropna()})
    if not failing or failing[0] + 1 >= len(case.steps):
        return
    trimmed = dataclasses.replace(case, steps=list(case.steps[:failing[0] + 1]))
    if kernel_forward is None:
        from kpool.indexer import forward as kernel_forward
    again = run_case(trimmed, device=device, kernel_forward=kernel_forward, reference_forward=reference,
                     check_oracle=check_oracle, tie_policy=tie_policy)
    if not again.ok:
        outcome.case, outcome.result = trimmed, again
        outcome.error = ParityFailure(trimmed, again, failure_message(trimmed, again))


def run_generated(kind: str, *, device, profile: Optional[Profile] = None, examples: Optional[int] = None,
                  kernel_forward: Optional[Callable] = None, reference_forward: Optional[Callable] = None,
                  check_oracle: bool = True, seed: Optional[int] = None, corpus_dir=None,
                  corpus_info: Optional[dict] = None, repeat_every: int = 5, shrink_s: Optional[float] = None,
                  bounds=None, collect_coverage: bool = True,
                  shrink_calls: Optional[int] = None, guaranteed: bool = True,
                  semantics=None, skip=frozenset(), on_example: Optional[Callable] = None) -> GeneratedOutcome:
    """Run the guaranteed-coverage cases and ``examples`` generated cases of ``kind``, and shrink
    the first failure.

    Args:
        kind: ``"batch"`` (:func:`cases.strategies.batch_cases`) or ``"engine"``
            (:func:`cases.strategies.engine_cases`).
        device: kernel device (``"cpu"`` = Triton interpreter, ``"cuda"``, ``"npu"``, torch device).
        profile: budget (default :func:`cases.profiles.current_profile`).
        examples: override of the profile's example count.
        kernel_forward / reference_forward: sides under test (defaults: production kernels,
            ``reference.stateful.forward``); the reference is always wrapped in
            :func:`parity.checking.checked_reference.checked_reference`.
        check_oracle: also check reference vs whole-history oracle.
        seed: hypothesis seed; ``None`` keeps the profile's (:attr:`cases.profiles.Profile.seed`).
        corpus_dir: save the shrunk failure there (``None``: do not save). Callers pass a run's
            output directory: a run never writes into the checkout's corpus.
        corpus_info: provenance fields for the saved entry.
        repeat_every: run every n-th passing example twice and require bitwise-identical kernel
            results (0 = never).
        shrink_s: shrinking time budget override (default: the profile's), a safety net.
        shrink_calls: shrink attempts after the first failure that really run (default: the
            profile's); later attempts of cases not already seen failing pass at once, so the
            shrunk result depends on a count, not on the machine's speed.
        bounds: :class:`cases.strategies.Bounds` override.
        collect_coverage: classify passing examples (:mod:`parity.findings.coverage`).
        guaranteed: first check :func:`cases.coverage_cases.guaranteed_cases` (explicit
            examples; planted-fault searches turn them off to test the generator and shrinker).
        semantics: :class:`parity.implementations.semantics.RunSemantics` (score mode forced on
            every case, tie policy); default: each case's own mode, canonical ties.
        skip: ``case_id`` s or :func:`fingerprint` s of cases that pass without running: cases
            that killed an earlier worker process, already reported as crashes
            (:mod:`parity.running.isolation`). The id matters: a re-run in a fresh process draws
            the case again under its id, but not always bit for bit (its fingerprint can differ).
        on_example: called with each case before it runs (the isolated worker records it, so a
            case that kills the process is known to the parent).

    Returns:
        :class:`GeneratedOutcome` (failures of every kind are in its ``error``).
    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.reporting import with_reporter

    from ...implementations.semantics import RunSemantics
    semantics = semantics or RunSemantics()
    prof = profile or current_profile()
    bounds = bounds or prof.bounds
    n = examples if examples is not None else (prof.batch_examples if kind == "batch" else prof.engine_examples)
    strategy = batch_cases(bounds) if kind == "batch" else engine_cases(bounds)
    reference = checked_reference(reference_forward)
    outcome = GeneratedOutcome(kind=kind, profile=prof.name)
    state = {"failed": False, "after_failure": 0}
    budget_calls = prof.shrink_calls if shrink_calls is None else shrink_calls
    failing: set = set()           # fingerprints of cases seen failing (the final replay is one)
    # A shrink attempt only needs its first failing step.
    early_stop = {"stop_on_failure": True}

    def check(case):
        outcome.examples += 1
        if skip and (case.case_id in skip or fingerprint(case) in skip):
            return          # it killed an earlier worker: reported as a crash, the run goes on
        if on_example is not None:
            on_example(case)
        if state["failed"]:
            state["after_failure"] += 1
            if state["after_failure"] > budget_calls and fingerprint(case) not in failing:
                return      # shrink budget spent: treat unseen candidates as passing, cheaply
        try:
            run_one(case)
        except AssertionError:
            state["failed"] = True
            failing.add(fingerprint(case))
            raise

    def run_one(case):
        case = semantics.case(case)
        t0 = time.perf_counter()
        recorder = Recorder(kernel_forward) if kernel_forward is not None else None
        with JitClock() as clock:
            if recorder is None:
                from kpool.indexer import forward as production
                recorder = Recorder(production)
            try:
                res = run_case(case, device=device, kernel_forward=recorder, reference_forward=reference,
                               check_oracle=check_oracle, tie_policy=semantics.tie_policy,
                               bitwise_outputs=semantics.bitwise_outputs, **early_stop)
            except Exception as exc:      # a harness bug: keep the case, shrink it like any failure
                raise HarnessCrash(case, exc) from exc
            if not res.ok:
                raise ParityFailure(case, res, failure_message(case, res))
            if repeat_every and not state["failed"] and outcome.passed_examples % repeat_every == 0:
                again = Recorder(recorder.forward)
                run_case(case, device=device, kernel_forward=again, reference_forward=reference,
                         check_oracle=False, tie_policy=semantics.tie_policy)
                diffs = _determinism_findings(recorder, again)
                if diffs:
                    raise Nondeterministic(case, diffs)
        outcome.jit_s += clock.seconds
        net = time.perf_counter() - t0 - clock.seconds
        if net > prof.slow_example_s:    # a warning only: no result depends on wall-clock time
            outcome.slow.append(f"{case.case_id}: {net:.1f} s net of Triton compilation "
                                f"(> {prof.slow_example_s:g} s)")
        if not state["failed"]:
            outcome.passed_examples += 1
            if collect_coverage:
                outcome.coverage.add(case)

    test = given(strategy)(check)
    fixed = guaranteed_cases(kind, bounds) + family_cases(kind) if guaranteed else []   # issue 19 families 3-5
    for case in reversed(fixed):
        test = example(case)(test)      # explicit examples run first, in list order
    test = settings(max_examples=n, database=None, deadline=None, report_multiple_bugs=False,
                    derandomize=False, phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])(test)
    seed = prof.seed if seed is None else seed
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    t0 = time.perf_counter()
    with shrink_budget(prof.shrink_s if shrink_s is None else shrink_s), warnings.catch_warnings(), \
            with_reporter(outcome.notes.append):
        # NaN / inf inputs make the interpreter's NumPy ops warn; the results are what is checked.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        try:
            test()
        except Exception as exc:     # FlakyFailure / ExceptionGroup included: a finding, not a traceback
            outcome.error = exc
            outcome.case = _case_of(exc)
            outcome.result = getattr(exc, "result", None)
    if isinstance(outcome.error, ParityFailure):
        _trim(outcome, device, kernel_forward, reference, check_oracle, semantics.tie_policy)
    outcome.wall_s = time.perf_counter() - t0
    if outcome.case is not None and corpus_dir is not None:
        info = {"found_by": f"generated-{kind} ({prof.name} profile)",
                "fault": str(outcome.error).splitlines()[0][:200], **(corpus_info or {})}
        outcome.saved = save_case(outcome.case, corpus_dir, **info)
    return outcome
