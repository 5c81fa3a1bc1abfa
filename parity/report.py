"""Results tables: terminal output (rich), CSV, JSON, markdown and JUnit XML (parity-contract.md §6).

The results table has one row per step x output x class that was checked (``exact`` rows
included), with :data:`REPORT_COLUMNS` shown in the terminal; files keep every column of the
findings frame (:data:`parity.compare.FINDING_COLUMNS`) plus ``first_mismatch``.
"""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from typing import Iterable, Optional, Sequence, Union

import pandas as pd

from .compare import LOCATION_COLUMNS, findings_frame, is_failure

REPORT_COLUMNS = ("case", "size", "step", "output", "verdict", "mismatches", "first_mismatch")
"""Columns of the printed table."""

_SHORT = {"position": "pos", "request": "req", "column": "col", "pool_id": "pool",
          "page_row": "row", "channel": "ch"}


def format_location(row) -> str:
    """``"row=3 pos=7 req=1 col=4 pool=1"``-style text of a finding's non-null location columns
    (cache findings: ``page=.. row=.. ch=..``; ring: ``block=.. plane=.. slot=.. ch=..``)."""
    parts = []
    for col in LOCATION_COLUMNS:
        value = row.get(col) if hasattr(row, "get") else None
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            continue
        parts.append(f"{_SHORT.get(col, col)}={value}")
    return " ".join(parts)


def results_table(results: Union[pd.DataFrame, Iterable]) -> pd.DataFrame:
    """All findings as one DataFrame with a ``first_mismatch`` text column.

    Args:
        results: a findings DataFrame, or an iterable of :class:`parity.runner.CaseResult`.
    Returns:
        DataFrame with :data:`parity.compare.FINDING_COLUMNS` + ``first_mismatch``.
    """
    if isinstance(results, pd.DataFrame):
        df = results.copy()
    else:
        frames = [r.findings for r in results]
        df = pd.concat(frames, ignore_index=True) if frames else findings_frame([])
    df["first_mismatch"] = [format_location(r) for r in df.to_dict("records")] if len(df) else []
    return df


def summarize(df: pd.DataFrame, *, wall_s: Optional[float] = None) -> dict:
    """Counts of a results table: cases, steps, checks (rows), findings (non-exact rows),
    failures (failing rows), failing cases, wall seconds."""
    failing = df["verdict"].map(is_failure) if len(df) else pd.Series([], dtype=bool)
    cases = df[["case", "size"]].drop_duplicates() if len(df) else df
    steps = df[["case", "size", "step"]].drop_duplicates() if len(df) else df
    bad_cases = df[failing][["case", "size"]].drop_duplicates() if len(df) else df
    return {"cases": int(len(cases)), "steps": int(len(steps)), "checks": int(len(df)),
            "findings": int((df["verdict"] != "exact").sum()) if len(df) else 0,
            "failures": int(failing.sum()), "failing_cases": int(len(bad_cases)),
            "wall_s": None if wall_s is None else round(float(wall_s), 3)}


def summary_line(summary: dict) -> str:
    """One line: ``"PASS: 12 cases, 40 steps, 480 checks, 0 findings, 0 failures, 35.2 s"``."""
    status = "FAIL" if summary["failures"] else "PASS"
    wall = "" if summary.get("wall_s") is None else f", {summary['wall_s']:.1f} s"
    return (f"{status}: {summary['cases']} cases, {summary['steps']} steps, {summary['checks']} checks, "
            f"{summary['findings']} findings, {summary['failures']} failures "
            f"({summary['failing_cases']} failing cases){wall}")


def make_console():
    """A rich console; 200 columns wide when stdout is not a terminal (CI logs), so the table's
    columns are not truncated to 80."""
    from rich.console import Console
    console = Console()
    return console if console.is_terminal else Console(width=200)


def print_results(df: pd.DataFrame, *, wall_s: Optional[float] = None, console=None,
                  failures_only: bool = False) -> dict:
    """Print the results table (green ``exact``, red failures, yellow other passes) and the
    summary line with ``rich``. Returns :func:`summarize`'s dict."""
    from rich.markup import escape
    from rich.table import Table

    console = console or make_console()
    df = results_table(df) if "first_mismatch" not in df.columns else df
    table = Table(title="KPool parity", show_lines=False)
    for col in REPORT_COLUMNS:
        table.add_column(col, justify="right" if col in ("step", "mismatches") else "left", overflow="fold")
    for r in df.to_dict("records"):
        fail = is_failure(r["verdict"])
        if failures_only and not fail:
            continue
        style = "red" if fail else ("green" if r["verdict"] == "exact" else "yellow")
        step = f"{r['step']}:{r['step_name']}" if not pd.isna(r["step"]) else ""
        table.add_row(escape(str(r["case"])), escape(str(r["size"])), escape(step), escape(str(r["output"])),
                      f"[{style}]{r['verdict']}[/{style}]", str(r["mismatches"]),
                      escape(str(r["first_mismatch"])))
    console.print(table)
    summary = summarize(df, wall_s=wall_s)
    console.print(f"[{'red' if summary['failures'] else 'green'}]{summary_line(summary)}[/]")
    return summary


def _markdown_table(df: pd.DataFrame, columns: Sequence[str]) -> str:
    def cell(v):
        if v is None or (not isinstance(v, str) and pd.isna(v)):
            return ""
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in df.to_dict("records")]
    return "\n".join(lines)


def write_report(df: pd.DataFrame, directory: Union[str, os.PathLike], *,
                 wall_s: Optional[float] = None, timings: Optional[pd.DataFrame] = None) -> dict:
    """Write ``results.csv``, ``results.json``, ``summary.md`` (and ``timings.csv``) into ``directory``.

    Args:
        df: findings (or a :func:`results_table`).
        directory: created if missing.
        wall_s: total wall time for the summary.
        timings: optional per-step timings (:data:`parity.runner.TIMING_COLUMNS`).
    Returns:
        ``{"csv": path, "json": path, "markdown": path[, "timings": path]}``.
    """
    os.makedirs(directory, exist_ok=True)
    df = results_table(df) if "first_mismatch" not in df.columns else df
    summary = summarize(df, wall_s=wall_s)
    paths = {"csv": os.path.join(directory, "results.csv"),
             "json": os.path.join(directory, "results.json"),
             "markdown": os.path.join(directory, "summary.md")}
    df.to_csv(paths["csv"], index=False)
    records = json.loads(df.to_json(orient="records"))
    with open(paths["json"], "w") as f:
        json.dump({"summary": summary, "results": records}, f, indent=1)
    fails = df[df["verdict"].map(is_failure)] if len(df) else df
    counts = df["verdict"].value_counts().rename_axis("verdict").reset_index(name="rows") if len(df) \
        else pd.DataFrame(columns=["verdict", "rows"])
    md = ["# KPool parity report", "", summary_line(summary), "",
          "## Verdicts", "", _markdown_table(counts, ["verdict", "rows"]), "",
          "## Failures", ""]
    md.append(_markdown_table(fails, list(REPORT_COLUMNS) + ["detail"]) if len(fails) else "No failures.")
    with open(paths["markdown"], "w") as f:
        f.write("\n".join(md) + "\n")
    if timings is not None:
        paths["timings"] = os.path.join(directory, "timings.csv")
        timings.to_csv(paths["timings"], index=False)
    return paths


def write_junit(df: pd.DataFrame, path: Union[str, os.PathLike]) -> str:
    """JUnit XML: one testsuite per case, one testcase per step x output, a ``<failure>`` for
    every failing finding (message = verdict, text = location and detail). Returns ``path``."""
    df = results_table(df) if "first_mismatch" not in df.columns else df
    root = ET.Element("testsuites", name="kpool-parity")
    for (case, size), group in df.groupby(["case", "size"], sort=False):
        suite = ET.SubElement(root, "testsuite", name=f"{case}[{size}]")
        n_fail = 0
        for (step, name, output), rows in group.groupby(["step", "step_name", "output"], sort=False):
            tc = ET.SubElement(suite, "testcase", classname=f"{case}[{size}]", name=f"{step}:{name}:{output}")
            for r in rows.to_dict("records"):
                if is_failure(r["verdict"]):
                    n_fail += 1
                    fail = ET.SubElement(tc, "failure", message=r["verdict"])
                    fail.text = f"{r['mismatches']} mismatches; {r['first_mismatch']}; {r['detail'] or ''}"
        suite.set("tests", str(len(suite)))
        suite.set("failures", str(n_fail))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return str(path)
