"""Stage 9 of ``parity/`` (docs/design.md "Layout"): the harness's public API, what code outside
this repository may import (parity-contract.md §1, §6); everything else in :mod:`parity` is
internal and may move. It may import the folders of stages 1-8; the verbs (stage 10: ``ab``,
``golden``, ``bisect``, ``replay``), the CLI and the pytest plugin are built on it: they resolve
implementations and select cases through it (``tests/test_layout.py`` checks that they do not go
around it).

Four verbs::

    from parity import api
    cases = api.list_cases(suite="seed", size="small")          # [api.CaseRef]
    impl = api.resolve_implementation("vllm-ascend:/src/vllm-ascend")
    outcome = api.run_case(cases[0], impl)                       # api.Outcome: checks, findings
    api.assert_parity(cases[0], impl)                            # raises api.ParityFailure

An implementation spec is what ``--kernel`` takes (``python -m parity list implementations``):
``kpool``, ``mutant:NAME``, ``git:REV``, ``vllm-ascend:PATH``, ``package.module:function``. A case
is run exactly as ``python -m parity run`` runs it: the implementation and the PyTorch reference
from byte-identical sentinel caches, every output of every step compared bit for bit, the two
certified exceptions (``rounding-boundary``, ``tie-equivalent``) counted as passes, the
implementation judged by its declared semantics (score mode, tie policy, caller validation;
:mod:`parity.implementations.semantics`).

The pytest plugin (:mod:`parity.pytest_plugin`) is built on these four functions only;
``tests/test_api.py`` fails when one of :data:`__all__` disappears.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

__all__ = ["CaseRef", "Outcome", "ParityFailure", "list_cases", "resolve_implementation", "run_case",
           "assert_parity", "SUITES", "SIZES"]

SUITES = ("corpus", "seed", "public", "generated")
"""Suites a case can come from (``all`` in :func:`list_cases` means every one)."""
SIZES = ("small", "glm5.3-flash")
"""Seed case sizes (``all``: both)."""
FIRST_ROWS = 5
"""Failure rows quoted in a :class:`ParityFailure` message."""


@dataclass(frozen=True)
class CaseRef:
    """One selectable case.

    Attributes:
        suite: ``corpus`` / ``seed`` / ``public`` / ``generated``.
        key: its unique name in a run (``decode-tail[small]``, ``C09:own-pool[small]``,
            ``generated:batch#3``); :attr:`test_id` is ``suite/name/size``.
        case: the :class:`cases.spec.Case` (steps, config, seed).
        selected: the harness's :class:`parity.selection.kernel_cases.Selected` (reference side, oracle check,
            negative-control flag).
    """

    suite: str
    key: str
    case: object
    selected: object

    @property
    def test_id(self) -> str:
        """``suite/name/size`` (a pytest id: ``kpool[seed/decode-tail/small]``)."""
        name = self.key.split("[")[0]
        return f"{self.suite}/{name}/{self.case.size}"

    def __str__(self) -> str:
        return self.test_id


@dataclass
class Outcome:
    """The result of :func:`run_case`.

    Attributes:
        case: the :class:`CaseRef`; implementation: the spec it ran.
        checks: pandas DataFrame, one row per check (:data:`parity.findings.vocabulary.FINDING_COLUMNS`:
            case, size, step, output, verdict, mismatches, location columns, detail).
        device: the backend it ran on (``cpu`` = Triton interpreter, ``cuda``, ``npu``).
        result: the harness's :class:`parity.findings.results.CaseResult`.
    """

    case: CaseRef
    implementation: str
    checks: object
    device: str
    result: object

    @property
    def findings(self):
        """Checks that are not ``exact`` (certified ones included)."""
        return self.checks[self.checks["verdict"] != "exact"]

    @property
    def failures(self):
        """Findings that are not certified exceptions (a negative-control public case expects
        its own and has none)."""
        if getattr(self.case.selected, "must_fail", False):
            return self.checks.iloc[0:0]
        return self.result.failures

    @property
    def ok(self) -> bool:
        """No failure."""
        return self.failures.empty


class ParityFailure(AssertionError):
    """Raised by :func:`assert_parity`: the implementation disagrees with the reference.

    Attributes:
        outcome: the :class:`Outcome`; bundle: the repro bundle directory (``None`` when it could
        not be written); replay: the one-line command that replays it.
    """

    def __init__(self, message: str, outcome: Outcome, bundle: Optional[str], replay: Optional[str]):
        super().__init__(message)
        self.outcome, self.bundle, self.replay = outcome, bundle, replay

    def __reduce__(self):            # pytest-xdist and process pools pickle it
        return type(self), (self.args[0], self.outcome, self.bundle, self.replay)


def _device(device: Optional[str]) -> str:
    from kpool.platform import resolve_device
    return resolve_device(None if device in (None, "auto") else device)


def list_cases(suite: str = "seed", size: str = "small", names: Optional[Sequence[str]] = None, *,
               device: Optional[str] = None, profile: Optional[str] = None, seed: int = 0,
               oracle: bool = True, console=None) -> List[CaseRef]:
    """The cases ``python -m parity run --suite SUITE --size SIZE [--case NAMES]`` runs, in order.

    Args:
        suite: one of :data:`SUITES` or ``"all"``.
        size: ``"small"``, ``"glm5.3-flash"`` or ``"all"`` (seed cases).
        names: only these cases (``decode-tail``, ``decode-tail[small]``, ``C09``); one suite only.
        device: ``"cpu"`` / ``"cuda"`` / ``"npu"`` / ``None`` (best available): the generated
            suite's default hypothesis profile depends on it (``ci`` on the CPU, ``device``
            otherwise).
        profile: hypothesis profile of the generated suite (``ci``, ``dev``, ``device``, ``nightly``).
        seed: offset added to every case and step seed.
        oracle: check the reference against the whole-history oracle (``run --no-oracle`` is
            ``False``).
        console: a rich console for the selection's notes (default: discarded).
    Raises:
        ValueError: unknown suite or size, or ``names`` with ``suite="all"``; KeyError: an
        unknown case name (the message lists the known ones).
    """
    from rich.console import Console

    from ..selection.kernel_cases import selected_cases
    if suite not in SUITES + ("all",):
        raise ValueError(f"suite must be one of {SUITES + ('all',)}, got {suite!r}")
    if size not in SIZES + ("all",):
        raise ValueError(f"size must be one of {SIZES + ('all',)}, got {size!r}")
    args = argparse.Namespace(suite=suite, size=size, case=list(names) if names else None, seed=seed,
                              profile=profile, no_oracle=not oracle)
    dev = _device(device)
    if console is not None:
        selected = selected_cases(args, dev, console)
    else:
        with open(os.devnull, "w") as sink:
            selected = selected_cases(args, dev, Console(file=sink))
    return [CaseRef(sel.suite, sel.key, sel.case, sel) for sel in selected]


def resolve_implementation(spec: Union[str, object] = "kpool"):
    """The :class:`parity.implementations.Implementation` named by ``spec`` (``--kernel``'s
    syntax); an Implementation is returned as it is.

    Raises:
        ValueError: a spec of no known kind; KeyError: unknown mutant; ImportError /
        AttributeError / FileNotFoundError: the code it names does not load.
    """
    from ..implementations import Implementation, resolve
    if isinstance(spec, Implementation):
        return spec
    return resolve(spec)


def run_case(case: CaseRef, implementation: Union[str, object] = "kpool", *, device: Optional[str] = None):
    """Run ``case`` on ``implementation`` and on the reference, compare every output bit for bit.

    Args:
        case: a :class:`CaseRef` of :func:`list_cases`.
        implementation: a spec or an Implementation (:func:`resolve_implementation`), judged by
            its declared semantics.
        device: as :func:`list_cases`.
    Returns:
        :class:`Outcome`. A crash of the implementation is a ``crash`` check, not an exception.
    Raises:
        as :func:`resolve_implementation`; KPoolUnsupportedError: the device does not exist here,
        or the implementation cannot run on it (``Implementation.devices``).
    """
    from kpool.errors import KPoolUnsupportedError

    from ..implementations import device_refusal
    from ..running.step_outputs import run_captured
    impl = resolve_implementation(implementation)
    dev = _device(device)
    refused = device_refusal(impl, dev)
    if refused:
        raise KPoolUnsupportedError(refused)
    result, _ = run_captured(case.selected, impl, dev)
    return Outcome(case=case, implementation=impl.spec, checks=result.findings, device=dev, result=result)


def _message(outcome: Outcome, replay: Optional[str]) -> str:
    from ..reporting.report import values_text
    bad = outcome.failures
    lines = [f"{outcome.implementation} disagrees with the reference on {outcome.case.key} ({outcome.device}): "
             f"{len(bad)} failing checks in steps {sorted({int(s) for s in bad['step'].dropna()})}"]
    for _, row in bad.head(FIRST_ROWS).iterrows():
        where = ", ".join(f"{c}={row[c]}" for c in ("row", "column", "pool_id", "page", "page_row", "block",
                                                    "slot", "channel", "region") if c in row and _given(row[c]))
        lines.append(f"  step {row['step']} ({row['step_name']}) {row['output']}: {row['verdict']}, "
                     f"{row['mismatches']} mismatches" + (f" at {where}" if where else ""))
        if row.get("detail"):
            lines.append(f"    {values_text(row['detail'])}")
    if len(bad) > FIRST_ROWS:
        lines.append(f"  ... and {len(bad) - FIRST_ROWS} more")
    if replay:
        lines.append(f"replay: {replay}")
    return "\n".join(lines)


def _given(value) -> bool:
    import pandas as pd
    return value is not None and not (isinstance(value, float) and value != value) and value is not pd.NA


def assert_parity(case: CaseRef, implementation: Union[str, object] = "kpool", *, device: Optional[str] = None,
                  bundle_dir: Optional[str] = None) -> Outcome:
    """:func:`run_case`, then raise when anything fails.

    Args:
        bundle_dir: where the repro bundle of a failure goes (default: a new temporary directory).
    Returns:
        the :class:`Outcome` when every check passes (certified exceptions counted as passes).
    Raises:
        ParityFailure: with the failing checks' verdicts and first mismatch locations (the detail
        column says expected vs actual) and the ``python -m parity replay`` command of the
        bundle written for the failure.
    """
    outcome = run_case(case, implementation, device=device)
    if outcome.ok:
        return outcome
    from ..sessions import bundle
    from ..sessions.session import RunOptions
    path = replay = None
    if case.suite != "public":                 # public cases are rerun by name, not bundled
        root = bundle_dir or tempfile.mkdtemp(prefix="kpool-parity-")
        options = RunOptions(device=outcome.device, kernel=outcome.implementation)
        path = bundle.write_bundle(outcome.result, case.case, os.path.join(root, bundle.bundle_name(case.case)),
                                   options=options)
        replay = bundle.replay_command(path)
    else:
        replay = (f"python -m parity run --suite public --case {case.key.split(':')[0]} "
                  f"--kernel {outcome.implementation} --device {outcome.device}")
    raise ParityFailure(_message(outcome, replay), outcome, path, replay)
