"""Results tables: terminal output (rich), CSV, JSON, markdown and JUnit XML (parity-contract.md §6).

The results table has one row per step x output x class that was checked (``exact`` rows
included), with :data:`REPORT_COLUMNS` shown in the terminal; files keep every column of the
findings frame (:data:`parity.checking.compare.FINDING_COLUMNS`) plus ``first_mismatch``.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import xml.etree.ElementTree as ET
from typing import Iterable, Optional, Sequence, Union

import pandas as pd

from ..checking.compare import LOCATION_COLUMNS, findings_frame, is_failure
from ..findings.vocabulary import UNSUPPORTED

REPORT_COLUMNS = ("case", "size", "step", "output", "verdict", "mismatches", "first_mismatch")
"""Columns of the printed table."""

_SHORT = {"position": "pos", "request": "req", "column": "col", "pool_id": "pool",
          "page_row": "prow", "channel": "ch"}


def replay_command(directory: str) -> str:
    """The one-line command that replays a repro bundle (:mod:`parity.sessions.bundle`), with this
    interpreter (a bare ``python`` may not be the one that has torch and the harness)."""
    target = os.path.abspath(directory)     # works from any directory
    return f"{shlex.quote(sys.executable)} -m parity replay {shlex.quote(target)}"


def part_path(path: str, part: str) -> str:
    """``out/junit.xml`` -> ``out/junit-public.xml``: one JUnit file per suite part."""
    root, ext = os.path.splitext(path)
    return f"{root}-{part}{ext or '.xml'}"


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
        results: a findings DataFrame, or an iterable of :class:`parity.running.runner.CaseResult`.
    Returns:
        DataFrame with :data:`parity.checking.compare.FINDING_COLUMNS` + ``first_mismatch``.
    """
    if isinstance(results, pd.DataFrame):
        df = results.copy()
    else:
        frames = [r.findings for r in results]
        df = pd.concat(frames, ignore_index=True) if frames else findings_frame([])
    df["first_mismatch"] = [format_location(r) for r in df.to_dict("records")] if len(df) else []
    return df


def summarize(df: pd.DataFrame, *, wall_s: Optional[float] = None) -> dict:
    """Counts of a results table: cases, steps, checks (rows), findings (non-exact rows, the
    ``unsupported`` ones aside), failures (failing rows), failing cases, ``unsupported`` (rows of
    steps the implementation declares no support for, :data:`parity.findings.vocabulary.UNSUPPORTED`),
    wall seconds."""
    failing = df["verdict"].map(is_failure) if len(df) else pd.Series([], dtype=bool)
    cases = df[["case", "size"]].drop_duplicates() if len(df) else df
    steps = df[["case", "size", "step"]].drop_duplicates() if len(df) else df
    bad_cases = df[failing][["case", "size"]].drop_duplicates() if len(df) else df
    certified = {v: int(df.loc[df["verdict"] == v, "mismatches"].sum()) if len(df) else 0
                 for v in ("rounding-boundary", "tie-equivalent")}
    return {"cases": int(len(cases)), "steps": int(len(steps)), "checks": int(len(df)),
            "findings": int((~df["verdict"].isin(("exact", UNSUPPORTED))).sum()) if len(df) else 0,
            "failures": int(failing.sum()), "failing_cases": int(len(bad_cases)),
            "unsupported": int((df["verdict"] == UNSUPPORTED).sum()) if len(df) else 0,
            "certified": certified,
            "wall_s": None if wall_s is None else round(float(wall_s), 3)}


def summary_line(summary: dict) -> str:
    """One line: ``"PASS: 12 cases, 40 steps, 480 checks, 0 findings, 0 failures, 35.2 s"``
    (``", 3 unsupported by IMPL"`` after the failures when steps were not asked,
    :data:`parity.findings.vocabulary.UNSUPPORTED`)."""
    status = "FAIL" if summary["failures"] else "PASS"
    wall = "" if summary.get("wall_s") is None else f", {summary['wall_s']:.1f} s"
    cert = summary.get("certified") or {}
    certified = ", ".join(f"{n} {v}" for v, n in cert.items() if n)
    return (f"{status}: {summary['cases']} cases, {summary['steps']} steps, {summary['checks']} checks, "
            f"{summary['findings']} findings, {summary['failures']} failures "
            f"({summary['failing_cases']} failing cases)"
            + (f", {summary['unsupported']} unsupported by IMPL" if summary.get("unsupported") else "") + wall
            + (f"; certified elements: {certified}" if certified else ""))


def make_console():
    """A rich console; 200 columns wide when stdout is not a terminal (CI logs), so the table's
    columns are not truncated to 80."""
    from rich.console import Console
    console = Console()
    return console if console.is_terminal else Console(width=200)


def values_text(detail) -> str:
    """A finding's ``detail`` with ``kernel=A reference=B`` spelled as ``expected B, got A`` (the
    reference side of a comparison is what was expected; for ``reference-vs-oracle`` rows the
    oracle is, for metamorphic rows the unchanged run is)."""
    import re
    text = "" if detail is None or (not isinstance(detail, str) and pd.isna(detail)) else str(detail)
    return re.sub(r"kernel=(\S+) reference=(\S+?)(;|$)", r"expected \2, got \1\3", text.splitlines()[0] if text else "")


def crash_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ``crash`` rows of a results table (their ``detail`` holds the full traceback)."""
    return df[df["verdict"] == "crash"] if len(df) else df


def _where(r) -> str:
    step = "" if pd.isna(r["step"]) else f" step {r['step']}:{r['step_name']}"
    return f"{r['case']}[{r['size']}]{step} {r['output']}"


def print_results(df: pd.DataFrame, *, wall_s: Optional[float] = None, console=None,
                  failures_only: bool = False, all_rows: bool = False, first: int = 10,
                  title: str = "KPool parity") -> dict:
    """Print the results with ``rich``: a table of the non-``exact`` rows (every row with
    ``all_rows``, failures only with ``failures_only``; green ``exact``, red failures, yellow
    certified passes), the first ``first`` failures with their expected and actual values, the
    full traceback of every ``crash``, and the summary line. Files keep every row
    (:func:`write_report`). Returns :func:`summarize`'s dict."""
    from rich.markup import escape
    from rich.table import Table

    console = console or make_console()
    df = results_table(df) if "first_mismatch" not in df.columns else df
    shown = df
    if len(df) and not all_rows:
        shown = df[df["verdict"].map(is_failure)] if failures_only else df[df["verdict"] != "exact"]
    if len(shown):
        table = Table(title=title, show_lines=False)
        for col in REPORT_COLUMNS:
            table.add_column(col, justify="right" if col in ("step", "mismatches") else "left", overflow="fold")
        for r in shown.to_dict("records"):
            fail = is_failure(r["verdict"])
            style = "red" if fail else ("green" if r["verdict"] == "exact" else "yellow")
            step = f"{r['step']}:{r['step_name']}" if not pd.isna(r["step"]) else ""
            table.add_row(escape(str(r["case"])), escape(str(r["size"])), escape(step), escape(str(r["output"])),
                          f"[{style}]{r['verdict']}[/{style}]", str(r["mismatches"]),
                          escape(str(r["first_mismatch"])))
        console.print(table)
    elif len(df):
        console.print(f"{title}: every one of the {len(df)} checks is exact (--all-rows lists them)")
    fails = df[df["verdict"].map(is_failure)] if len(df) else df
    firsts = fails[fails["verdict"] != "crash"].head(first)
    if len(firsts):
        console.print(f"[bold]first {len(firsts)} of {len(fails)} failures, expected vs actual:[/]")
        for r in firsts.to_dict("records"):
            where = f" at {r['first_mismatch']}" if r["first_mismatch"] else ""
            console.print(escape(f"  {_where(r)}: {r['verdict']} x{r['mismatches']}{where}: {values_text(r['detail'])}"))
    for r in crash_rows(df).to_dict("records"):
        console.print(f"[red bold]crash[/] {escape(_where(r))}:")
        console.print(escape(str(r["detail"])), highlight=False)
    summary = summarize(df, wall_s=wall_s)
    console.print(f"[{'red' if summary['failures'] else 'green'}]{summary_line(summary)}[/]")
    return summary


def crash_markdown(df: pd.DataFrame) -> list:
    """Markdown lines: a ``## Crashes`` section with each crash's full traceback (empty if none)."""
    crashes = crash_rows(df)
    if not len(crashes):
        return []
    md = ["## Crashes", ""]
    for r in crashes.to_dict("records"):
        md += [f"{_where(r)}:", "", "```", str(r["detail"]).rstrip(), "```", ""]
    return md


CERTIFIED_OUTPUTS = (("indices", "tie-equivalent"), ("compressed_cache", "rounding-boundary"))
"""The outputs that admit a certified exception and its class (parity-contract.md §3)."""


def certified_counts(df: pd.DataFrame, *, by_case: bool = False) -> pd.DataFrame:
    """Certified-exception counts per output (parity-contract.md §3: "report the count of
    certified elements; a rising count is a signal").

    Args:
        df: findings / results table.
        by_case: one row per case x output instead of per output.
    Returns:
        DataFrame with ``[case, size,] output, certificate, steps, elements, max_per_step``:
        ``steps`` = steps with a certified finding, ``elements`` = certified elements summed over
        steps (index elements of tie-equivalent rows; bf16 elements on a rounding boundary,
        counted again in every step they persist), ``max_per_step`` its largest single-step value.
        Every certifiable output appears (zeros included), so the table is comparable run to run.
    """
    keys = ["case", "size"] if by_case else []
    groups = df[keys].drop_duplicates().to_dict("records") if by_case and len(df) else ([{}] if not by_case else [])
    rows = []
    for g in groups:
        sub = df
        for k, v in g.items():
            sub = sub[sub[k] == v]
        for output, verdict in CERTIFIED_OUTPUTS:
            hit = sub[(sub["output"] == output) & (sub["verdict"] == verdict)]
            per_step = hit.groupby(["case", "size", "step"])["mismatches"].sum() if len(hit) else pd.Series([], dtype="int64")
            rows.append({**g, "output": output, "certificate": verdict, "steps": int(len(per_step)),
                         "elements": int(per_step.sum()) if len(per_step) else 0,
                         "max_per_step": int(per_step.max()) if len(per_step) else 0})
    return pd.DataFrame(rows, columns=keys + ["output", "certificate", "steps", "elements", "max_per_step"])


def first_divergence(df: pd.DataFrame) -> pd.DataFrame:
    """The first failing step of every failing case: ``case, size, step, step_name, outputs``
    (the failing outputs of that step) and ``failing_steps`` (all of them). In ``--mode resync``
    the first failing step is the one that produces the divergence (parity-contract.md §1)."""
    cols = ["case", "size", "step", "step_name", "outputs", "failing_steps"]
    if not len(df):
        return pd.DataFrame(columns=cols)
    fails = df[df["verdict"].map(is_failure)]
    rows = []
    for (case, size), g in fails.groupby(["case", "size"], sort=False):
        steps = sorted({int(s) for s in g["step"].dropna()})
        if not steps:
            continue
        first = g[g["step"] == steps[0]]
        rows.append({"case": case, "size": size, "step": steps[0], "step_name": first["step_name"].iloc[0],
                     "outputs": ", ".join(dict.fromkeys(first["output"])),
                     "failing_steps": " ".join(map(str, steps))})
    return pd.DataFrame(rows, columns=cols)


def markdown_table(df: pd.DataFrame, columns: Sequence[str]) -> str:
    """A GitHub-markdown table of ``df[columns]`` (``|`` escaped, nulls empty)."""
    return _markdown_table(df, columns)


def _markdown_table(df: pd.DataFrame, columns: Sequence[str]) -> str:
    def cell(v):
        if v is None or (not isinstance(v, str) and pd.isna(v)):
            return ""
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in df.to_dict("records")]
    return "\n".join(lines)


def write_report(df: pd.DataFrame, directory: Union[str, os.PathLike], *,
                 wall_s: Optional[float] = None, timings: Optional[pd.DataFrame] = None,
                 environment: Optional[dict] = None, bundles: Optional[dict] = None,
                 run: Optional[dict] = None) -> dict:
    """Write ``results.csv``, ``results.json``, ``summary.md`` (and ``timings.csv``) into ``directory``.

    ``summary.md`` holds the summary line, the run and environment, the verdict counts, the
    certified-exception counts per output (:func:`certified_counts`, overall and per case), the
    first divergent step of each failing case (:func:`first_divergence`), the repro bundles and
    the failing rows.

    Args:
        df: findings (or a :func:`results_table`).
        directory: created if missing.
        wall_s: total wall time for the summary.
        timings: optional per-step timings (:data:`parity.running.runner.TIMING_COLUMNS`).
        environment: optional :func:`parity.sessions.bundle.environment` dict.
        bundles: optional ``{case_id: bundle directory}``.
        run: optional run options (:meth:`parity.sessions.session.RunOptions.to_dict`).
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
    cert = certified_counts(df)
    cert_cases = certified_counts(df, by_case=True)
    diverge = first_divergence(df)
    with open(paths["json"], "w") as f:
        json.dump({"summary": summary, "run": run, "environment": environment,
                   "certified": json.loads(cert.to_json(orient="records")),
                   "certified_by_case": json.loads(cert_cases.to_json(orient="records")),
                   "first_divergence": json.loads(diverge.to_json(orient="records")),
                   "bundles": bundles or {}, "results": records}, f, indent=1)
    fails = df[df["verdict"].map(is_failure)] if len(df) else df
    counts = df["verdict"].value_counts().rename_axis("verdict").reset_index(name="rows") if len(df) \
        else pd.DataFrame(columns=["verdict", "rows"])
    md = ["# KPool parity report", "", summary_line(summary), ""]
    if run or environment:
        md += ["## Run", ""]
        if run:
            md.append("- options: " + ", ".join(f"{k}={v}" for k, v in run.items()))
        if environment:
            git = environment.get("git") or {}
            md += [f"- device: {environment.get('device')} ({environment.get('device_name')}, "
                   f"family {environment.get('family')}, SoC {environment.get('soc_version')}, "
                   f"capability {environment.get('gpu_capability')})",
                   f"- versions: torch {environment.get('torch')}, torch_npu {environment.get('torch_npu')}, "
                   f"triton {environment.get('triton')}, triton-ascend {environment.get('triton_ascend')}, "
                   f"CUDA {environment.get('cuda')}, python {environment.get('python')}",
                   f"- git: {git.get('revision')}{' (dirty)' if git.get('dirty') else ''}"]
        md.append("")
    md += ["## Verdicts", "", _markdown_table(counts, ["verdict", "rows"]), "",
           "## Certified exceptions per output", "",
           "Only parity-contract.md §3 certificates pass without bitwise equality; `elements` sums the "
           "certified elements over steps (a certified cache element is counted in every step it persists).", "",
           _markdown_table(cert, list(cert.columns)), ""]
    nonzero = cert_cases[cert_cases["elements"] > 0] if len(cert_cases) else cert_cases
    if len(nonzero):
        md += ["Per case:", "", _markdown_table(nonzero, list(nonzero.columns)), ""]
    md += ["## First divergent step", ""]
    md.append(_markdown_table(diverge, list(diverge.columns)) if len(diverge) else "No divergence.")
    md.append("")
    if bundles:
        md += ["## Repro bundles", ""]
        md += [f"- {cid}: `{replay_command(path)}`" for cid, path in bundles.items()]
        md.append("")
    md += ["## Failures", ""]
    md.append(_markdown_table(fails, list(REPORT_COLUMNS) + ["detail"]) if len(fails) else "No failures.")
    md += [""] + crash_markdown(df)
    with open(paths["markdown"], "w") as f:
        f.write("\n".join(md) + "\n")
    if timings is not None:
        paths["timings"] = os.path.join(directory, "timings.csv")
        timings.to_csv(paths["timings"], index=False)
    return paths


def write_junit(df: pd.DataFrame, path: Union[str, os.PathLike], *,
                bundles: Optional[dict] = None) -> str:
    """JUnit XML for CI systems: one ``<testsuite>`` per case, one ``<testcase>`` per case x step x
    output (``classname`` = case id, ``name`` = ``<step>:<step_name>:<output>``), one ``<failure>``
    per failing finding (``message`` = verdict, ``type`` = the output, text = mismatches, location,
    detail, and the replay command when ``bundles`` has the case); certified findings are noted
    in ``<system-out>``; an ``unsupported`` finding (a step the implementation declares no support
    for, "unsupported by IMPL") is a ``<skipped>`` testcase. Suite attributes
    ``tests``/``failures``/``skipped`` count testcases. Returns ``path``."""
    df = results_table(df) if "first_mismatch" not in df.columns else df
    root = ET.Element("testsuites", name="kpool-parity")
    total = total_fail = total_skip = 0
    for (case, size), group in df.groupby(["case", "size"], sort=False):
        cid = f"{case}[{size}]"
        suite = ET.SubElement(root, "testsuite", name=cid)
        n_fail = n_skip = 0
        for (step, name, output), rows in group.groupby(["step", "step_name", "output"], sort=False, dropna=False):
            step_label = "" if pd.isna(step) else int(step)
            tc = ET.SubElement(suite, "testcase", classname=cid, name=f"{step_label}:{name}:{output}")
            failed, skipped, notes = False, False, []
            for r in rows.to_dict("records"):
                if r["verdict"] == UNSUPPORTED:
                    skipped = True
                    ET.SubElement(tc, "skipped", message="unsupported by IMPL").text = str(r["detail"] or "")
                elif is_failure(r["verdict"]):
                    failed = True
                    fail = ET.SubElement(tc, "failure", message=r["verdict"], type=str(output))
                    text = f"{r['mismatches']} mismatches; {r['first_mismatch']}; {r['detail'] or ''}"
                    if bundles and cid in bundles:
                        text += f"\nrepro: {replay_command(bundles[cid])}"
                    fail.text = text
                elif r["verdict"] != "exact":
                    notes.append(f"{r['verdict']}: {r['mismatches']} elements; {r['first_mismatch']}; {r['detail'] or ''}")
            if notes:
                ET.SubElement(tc, "system-out").text = "\n".join(notes)
            n_fail += failed
            n_skip += skipped and not failed
        suite.set("tests", str(len(suite.findall("testcase"))))
        suite.set("failures", str(n_fail))
        suite.set("skipped", str(n_skip))
        suite.set("errors", "0")
        total += len(suite.findall("testcase"))
        total_fail += n_fail
        total_skip += n_skip
    root.set("tests", str(total))
    root.set("failures", str(total_fail))
    root.set("skipped", str(total_skip))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return str(path)
