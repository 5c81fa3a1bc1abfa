"""The findings vocabulary of the parity harness (parity-contract.md §6): verdicts, location
columns, one finding row, the findings DataFrame.

Every comparator (:mod:`parity.checking.compare`, :mod:`parity.checking.metamorphic`, the runner's determinism and
oracle checks) returns a list of *findings* (plain dicts, one per (output, class)); the runner adds
the case/step columns and :func:`findings_frame` turns them into a pandas DataFrame with
:data:`FINDING_COLUMNS`. An output that matches produces one ``exact`` finding, so the results
table shows everything that was checked.
"""
from __future__ import annotations

from typing import Iterable, Optional

import pandas as pd

VERDICTS = ("exact", "rounding-boundary", "tie-equivalent", "wrong-index", "wrong-tail",
            "padding-leak", "stray-write", "missing-write", "ring-mismatch", "cache-mismatch",
            "nan-introduced", "nondeterministic", "not-rejected", "crash", "unsupported")
"""Triage labels of parity-contract.md §6, and ``unsupported`` (:data:`UNSUPPORTED`)."""
PASS_VERDICTS = frozenset({"exact", "rounding-boundary", "tie-equivalent"})
"""Verdicts that are not failures (the two certified ones count as passes)."""
UNSUPPORTED = "unsupported"
"""The outcome "unsupported by IMPL": a step needs a mode the implementation under test declares
it does not have (:attr:`parity.implementations.Implementation.supports`), so it was not asked.
Counted on its own in every report; neither a finding nor a failure, and no exit status sees it."""

LOCATION_COLUMNS = ("row", "position", "request", "column", "pool_id", "page", "page_row",
                    "block", "plane", "slot", "channel", "region", "kernel", "program_id")
"""Localisation of a finding's first mismatch: token row / position / request / column / pool id
(indices), page / page_row / channel (compressed cache), block / plane / slot / channel (ring),
region (sentinel checks: ``view``, ``guard-before``, ``page-padding``, ``between-rows``...), and
the kernel and program id that wrote the element where the launch tiling makes it derivable
(:mod:`parity.checking.programs`; cache and ring findings also name the writing token row, its position,
request and pool id)."""
TEXT_LOCATION_COLUMNS = ("region", "kernel")
"""Location columns holding text; the others are nullable integers."""
FINDING_COLUMNS = ("case", "size", "step", "step_name", "output", "verdict", "mismatches",
                   *LOCATION_COLUMNS, "detail")
"""Columns of a findings DataFrame."""


def is_failure(verdict: str) -> bool:
    """True for every verdict outside :data:`PASS_VERDICTS` and :data:`UNSUPPORTED`."""
    return verdict not in PASS_VERDICTS and verdict != UNSUPPORTED


def finding(output: str, verdict: str, mismatches: int = 0, detail: str = "", **location) -> dict:
    """One finding row (case/step columns are added by the runner).

    Raises:
        ValueError: unknown verdict or location key.
    """
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}")
    bad = set(location) - set(LOCATION_COLUMNS)
    if bad:
        raise ValueError(f"unknown location keys {sorted(bad)}")
    return {"output": output, "verdict": verdict, "mismatches": int(mismatches), "detail": detail,
            **{k: v for k, v in location.items() if v is not None}}


def findings_frame(rows: Iterable[dict], **context) -> pd.DataFrame:
    """DataFrame with :data:`FINDING_COLUMNS` from finding dicts; ``context`` (case, size, step,
    step_name) fills columns the rows do not set. Integer location columns are nullable Int64."""
    rows = [{**context, **r} for r in rows]
    df = pd.DataFrame(rows, columns=list(FINDING_COLUMNS))
    for col in ("step", "mismatches", *LOCATION_COLUMNS):
        if col not in TEXT_LOCATION_COLUMNS:
            df[col] = df[col].astype("Int64")
    for col in ("case", "size", "step_name", "output", "verdict", *TEXT_LOCATION_COLUMNS, "detail"):
        df[col] = df[col].astype("object")
    return df


def crash_finding(side: str, exc: BaseException, output: Optional[str] = None) -> dict:
    """A ``crash`` finding for an unexpected exception on ``side`` (output ``forward[<side>]``):
    ``detail`` is ``"<Type>: <message>"`` then the full traceback, with the file and line that
    raised (printed by :func:`parity.reporting.report.print_results`, kept in reports and bundles)."""
    import traceback
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return finding(output or f"forward[{side}]", "crash", 1, detail=f"{type(exc).__name__}: {exc}\n{trace}")
