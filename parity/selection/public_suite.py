"""``python -m parity run --suite public``: every public case (or ``--case C09 ...``) on the
kernel under test, harness findings plus stated-value checks, printed and written like the other
suites (:mod:`parity.selection.suites`)."""
from __future__ import annotations

import os
import time
from typing import Optional, Sequence

from cases.public import PUBLIC_CASES

from ..sessions.commands import EXIT_FAIL, EXIT_OK


def run_public_suite(args, device: str, console, *, cids: Sequence[str], kernel_forward=None, counts=None,
                     semantics=None, package: Optional[str] = "kpool", isolate: bool = False) -> int:
    """Run the public cases ``cids`` (:data:`cases.public.PUBLIC_CASES` ids) on ``kernel_forward``
    (default: the production kernels): harness findings plus stated-value checks. ``--report
    DIR`` writes ``DIR/public/``; ``--junit F`` writes ``F`` with ``-public`` before its extension.
    ``semantics`` (:class:`parity.implementations.semantics.RunSemantics`): score mode and tie
    policy of the run; ``package``: the implementation's kernel package, for the checks that need
    its internal kernels (:mod:`parity.running.public.kernel_checks`). ``isolate``: run each public case in
    a child worker process (:class:`parity.running.isolation.CaseWorker`, resolving ``args.kernel`` there):
    a crash of the implementation ends that public case as one ``crash`` finding.

    Returns:
        The exit status (:data:`parity.sessions.commands.EXIT_OK` or ``EXIT_FAIL``).
    """
    from rich.markup import escape

    from ..reporting import report
    from ..running.public.runner import public_results

    selected = [PUBLIC_CASES[c] for c in cids]
    console.print(f"[bold]public[/]: {len(selected)} public failure cases on {device}, kernel={escape(args.kernel)}")
    t0 = time.perf_counter()
    results = []
    worker = None
    if isolate:
        from ..running.isolation import CaseWorker
        worker = CaseWorker(args.kernel, semantics, device)
    try:
        for pc in selected:
            t = time.perf_counter()
            res = worker.public_results(pc, package) if worker is not None else \
                public_results(pc, device, kernel_forward=kernel_forward, semantics=semantics, package=package)
            results += res
            bad = sum(len(r.failures) for r in res)
            status = "[green]ok[/]" if not bad else f"[red]{bad} failures[/]"
            checks = sum(int(r.findings["output"].astype(str).str.startswith("expected:").sum()) for r in res)
            console.print(f"  {pc.cid} {escape(pc.title)}: {len(res)} cases, {checks} stated-value checks, "
                          f"{time.perf_counter() - t:.1f} s, {status}")
    finally:
        if worker is not None:
            worker.close()
    wall = time.perf_counter() - t0
    df = report.results_table(results)
    summary = report.print_results(df, wall_s=wall, console=console, failures_only=args.failures_only,
                                   all_rows=args.all_rows, title="KPool parity: public cases")
    if counts is not None:
        counts["public"] = summary
    if args.report:
        paths = report.write_report(df, os.path.join(args.report, "public"), wall_s=wall)
        console.print(escape(f"public report: {', '.join(paths.values())}"))
    if getattr(args, "junit", None):
        console.print(escape(f"public junit: {report.write_junit(df, report.part_path(args.junit, 'public'))}"))
    return EXIT_FAIL if summary["failures"] else EXIT_OK
