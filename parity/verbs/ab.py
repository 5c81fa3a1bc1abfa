"""``python -m parity ab --baseline IMPL --candidate IMPL``: two implementations on one device,
every output of every step compared bit for bit (parity-contract.md §1, kernel vs kernel column).

Both sides run each selected case (:mod:`parity.selection.kernel_cases`: ``run``'s suite, size, case, seed and
profile options) through the normal run (:func:`parity.running.step_outputs.run_captured`), from byte-
identical sentinel caches (:func:`parity.checking.sentinel.sentinel_caches`) on the same device, so each
side also gets its usual findings against the reference. Then every step's indices, output buffer
(guards included), compressed cache and tail ring (whole backings) are compared bitwise
(:func:`parity.running.step_outputs.diff_steps`): on the same device, kernel vs kernel is the comparison
that can and must be bitwise, even where a fast kernel is only certified against the CPU reference.

IMPL is any spec :func:`parity.implementations.resolve` knows (``kpool``, ``mutant:NAME``,
``git:REV``, ``package.module:function``, ...). Output: one line per case (identical, or each
differing step with, per output, the count and both sides' values at the first differing
element); ``--report DIR`` writes ``DIR/ab.csv`` with a row per case, step and output.

Exit status: 0 every step of every case identical, 1 at least one difference, 2 usage error.
"""
from __future__ import annotations

import os
import sys
from typing import List

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def add_ab_parser(sub) -> None:
    """The ``ab`` sub-command (no torch import)."""
    from ..selection.kernel_cases import add_selection_arguments
    p = sub.add_parser("ab", help="compare two implementations bit for bit on one device (kernel vs kernel)",
                       description="Run a baseline and a candidate implementation on the same device from byte-"
                                   "identical caches through the selected cases and compare every output of every "
                                   "step bit for bit (each also against the reference). Exit 0 identical, 1 "
                                   "differs, 2 usage error.")
    p.add_argument("--baseline", required=True, metavar="IMPL",
                   help="implementation spec: kpool, mutant:NAME, git:REV, package.module:function "
                        "(python -m parity list implementations)")
    p.add_argument("--candidate", required=True, metavar="IMPL", help="implementation spec (as --baseline)")
    add_selection_arguments(p)
    p.add_argument("--all-steps", action="store_true", help="print a line for every step (default: differing ones)")
    p.add_argument("--report", metavar="DIR", help="write DIR/ab.csv: one row per case, step and output")
    from .golden import _isolate_argument
    _isolate_argument(p)


def _resolve(spec: str, prog: str):
    from .. import api
    try:
        return api.resolve_implementation(spec)
    except Exception as exc:
        return f"{prog}: error: cannot load implementation {spec!r}: {type(exc).__name__}: {exc}"


def ab_main(args, console=None) -> int:
    """``python -m parity ab``: run, print, exit as the module docstring says."""
    from rich.markup import escape

    from kpool.errors import KPoolUnsupportedError
    from kpool.platform import resolve_device

    from ..reporting.report import make_console
    from .cases import select
    console = console or make_console()
    prog = "python -m parity ab"
    try:
        device = resolve_device(None if args.device == "auto" else args.device)
    except KPoolUnsupportedError as exc:
        return _usage(f"{prog}: error: {exc}")
    sides = [_resolve(s, prog) for s in (args.baseline, args.candidate)]
    for side in sides:
        if isinstance(side, str):
            return _usage(side)
    from ..implementations import device_refusal
    for refused in filter(None, (device_refusal(side, device) for side in sides)):
        return _usage(f"{prog}: error: {refused}")
    sems = _shared_semantics(sides)
    if isinstance(sems, str):
        return _usage(f"{prog}: error: {sems}")
    try:
        cases = select(args, device, console)
    except (KeyError, ValueError) as exc:
        return _usage(f"{prog}: error: {exc.args[0]}")
    if not cases:
        return _usage(f"{prog}: error: the selection has no cases")
    from ..sessions.bundle import environment
    name = environment(device).get("device_name")
    console.print(escape(f"ab on {device} ({name}): baseline={_label(sides[0])} candidate={_label(sides[1])}; "
                         f"suite={args.suite} size={args.size} seed={args.seed}: {len(cases)} cases; "
                         f"baseline {sems[0].text()}; candidate {sems[1].text()}"))
    rows: List[dict] = []
    failures = {"baseline": 0, "candidate": 0}
    from ..running.isolated_runners import isolated_runners
    with isolated_runners(sides, sems, device, getattr(args, "isolate", "auto")) as runners:
        for sel in cases:
            (ra, sa), (rb, sb) = (run(sel) for run in runners)
            _ab_case(sel, ra, sa, rb, sb, rows, failures, console, args)
    steps = {(r["case"], r["step"]) for r in rows}
    bad_steps = {(r["case"], r["step"]) for r in rows if r["status"] == "differs"}
    bad_cases = {c for c, _ in bad_steps}
    console.print(escape(f"ab: {len(cases)} cases, {len(steps)} steps: {len(steps) - len(bad_steps)} identical, "
                         f"{len(bad_steps)} differ (in {len(bad_cases)} cases)"))
    console.print(escape(f"vs reference: baseline {failures['baseline']} failures, candidate "
                         f"{failures['candidate']} failures (python -m parity run --kernel IMPL for the findings)"))
    if args.report:
        import pandas as pd
        os.makedirs(args.report, exist_ok=True)
        path = os.path.join(args.report, "ab.csv")
        pd.DataFrame(rows).to_csv(path, index=False)
        console.print(escape(f"report: {path}"))
    if bad_steps:
        console.print("[red]DIFFERS[/]: the candidate's outputs are not bitwise equal to the baseline's")
        return EXIT_FAIL
    console.print("[green]IDENTICAL[/]: every output of every step is bitwise equal")
    return EXIT_OK


def _ab_case(sel, ra, sa, rb, sb, rows: List[dict], failures: dict, console, args) -> None:
    """Count, diff and print one case of both sides (results ``ra``/``rb``, step outputs ``sa``/``sb``)."""
    from ..running.step_outputs import diff_steps
    if not sel.must_fail:
        failures["baseline"] += len(ra.failures)
        failures["candidate"] += len(rb.failures)
    diffs = diff_steps(sa, sb, sel.case)
    rows += _case_rows(sel, diffs)
    _print_case(console, sel, diffs, ra, rb, args.all_steps)


def _shared_semantics(sides):
    """Each side's declared semantics (parity.implementations.semantics) with one score mode for
    both: both sides must run the same cases. A message (str) when they declare different modes."""
    import dataclasses

    from ..implementations.semantics import resolve_semantics
    sems = [resolve_semantics(impl) for impl in sides]
    modes = {s.score_mode for s in sems} - {None}
    if len(modes) > 1:
        return (f"{sides[0].spec} and {sides[1].spec} compute different score modes {sorted(modes)}: "
                "their outputs cannot be compared bit for bit")
    mode = modes.pop() if modes else None
    return [dataclasses.replace(s, score_mode=mode) for s in sems]


def _usage(message: str) -> int:
    print(message, file=sys.stderr)
    return EXIT_USAGE


def _label(impl) -> str:
    return impl.spec + (f" ({impl.package})" if impl.package and impl.package != impl.spec else "")


def _case_rows(sel, diffs) -> List[dict]:
    """One row per step and output (identical steps: one row with output ``*``)."""
    rows = []
    for step, found in diffs.items():
        name = sel.case.steps[step].name if step < len(sel.case.steps) else ""
        base = dict(suite=sel.suite, case=sel.key, step=step, step_name=name)
        if not found:
            rows.append({**base, "output": "*", "status": "identical", "count": 0, "where": "", "baseline": "",
                         "candidate": "", "detail": "", "rows": ""})
        for d in found:
            rows.append({**base, "output": d.output, "status": "differs", "count": d.count,
                         "where": " ".join(f"{k}={v}" for k, v in (d.where or {}).items()), "baseline": d.a,
                         "candidate": d.b, "detail": d.detail,
                         "rows": "" if d.rows is None else " ".join(map(str, d.rows))})
    return rows


def _print_case(console, sel, diffs, ra, rb, all_steps: bool) -> None:
    from rich.markup import escape

    from ..findings.vocabulary import UNSUPPORTED
    ref = f"vs reference: baseline {len(ra.failures)}, candidate {len(rb.failures)} failures" + \
        (" (negative control)" if sel.must_fail else "")
    skipped = [int((r.findings["verdict"] == UNSUPPORTED).sum()) if len(r.findings) else 0 for r in (ra, rb)]
    if any(skipped):     # steps neither side's operator was asked (not compared)
        ref += f"; unsupported by IMPL: baseline {skipped[0]}, candidate {skipped[1]} steps (not compared)"
    bad = {s: d for s, d in diffs.items() if d}
    status = "[green]identical[/]" if not bad else f"[red]{len(bad)} of {len(diffs)} steps differ[/]"
    console.print(f"  {escape(sel.suite)} {escape(sel.key)}: {len(diffs)} steps, {status}; {escape(ref)}")
    for step, found in diffs.items():
        if not found and not all_steps:
            continue
        name = sel.case.steps[step].name if step < len(sel.case.steps) else ""
        console.print(f"    step {step} ({escape(name)}): " + ("identical" if not found else "[red]differs[/]"))
        for d in found:
            console.print(f"      {escape(d.text())}")
