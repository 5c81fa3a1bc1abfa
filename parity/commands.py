"""The ``run`` / ``record`` / ``replay`` commands behind :mod:`parity.cli` (parity-contract.md §1, §6).

:mod:`parity.cli` parses arguments and selects cases; this module runs them
(:func:`parity.session.run_cases`: progress bar, determinism repeats, metamorphic relations),
prints the results, writes the reports (``--report``, ``--junit``) and the repro bundles
(:mod:`parity.bundle`), and replays bundles.

Exit status of ``run`` and ``record``: 0 every check passes, 1 at least one failure, 2 usage error.
``replay``: 0 the replay reproduced the recorded findings, 1 it did not, 2 usage error.
"""
from __future__ import annotations

import os
import sys
import time
from typing import List, Optional

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DEFAULT_BUNDLE_DIR = "bundles"
"""Bundles go here unless ``--bundle-dir`` (or ``--report DIR``: ``DIR/bundles``) says otherwise."""
DEFAULT_REPEAT = {"cuda": 2, "npu": 2, "cpu": 1}
"""Kernel forwards per step when ``--repeat`` is not given (determinism check; 1 turns it off).
The CPU interpreter runs every program serially in numpy, so a second run there can only repeat
the first: it would double the interpreter time of ``make parity`` for nothing."""


def add_run_options(parser) -> None:
    """The options ``run`` and ``record`` add to the case-selection options of :mod:`parity.cli`."""
    from .metamorphic import RELATIONS
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="run the kernel N times per step from identical caches; every run must be "
                             "bitwise identical (default: 2 on cuda/npu, 1 on the cpu interpreter; "
                             "1 = no determinism check)")
    parser.add_argument("--kernel", default="kpool", metavar="SPEC",
                        help="implementation under test: kpool (default), mutant:NAME (a planted fault of "
                             "parity.mutants), or package.module:function")
    parser.add_argument("--metamorphic", nargs="*", default=None, metavar="RELATION",
                        help="also check metamorphic relations, bitwise (no name = all: "
                             f"{', '.join(RELATIONS)})")
    parser.add_argument("--bundle-dir", metavar="DIR", default=None,
                        help=f"write repro bundles of failing cases here (default: REPORT/bundles with "
                             f"--report, else ./{DEFAULT_BUNDLE_DIR})")
    parser.add_argument("--no-bundles", action="store_true", help="do not write repro bundles")


def add_replay_parser(sub) -> None:
    """The ``replay`` sub-command."""
    p = sub.add_parser("replay", help="rerun a repro bundle and compare its findings",
                       description="Rerun a repro bundle (fresh process, any device) with its recorded options "
                                   "and compare the findings with the recorded ones. Exit 0 when reproduced.")
    p.add_argument("bundle", metavar="BUNDLE", help="bundle directory (written by run / record)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                   help="kernel device (default: auto, npu > cuda > cpu)")
    p.add_argument("--report", metavar="DIR", help="write the replay's results.csv, results.json, summary.md here")
    p.add_argument("--junit", metavar="FILE", help="write the replay's JUnit XML here")
    p.add_argument("--failures-only", action="store_true", help="print only failing rows")


def _bundle_dir(args) -> Optional[str]:
    if getattr(args, "no_bundles", False):
        return None
    if args.bundle_dir:
        return args.bundle_dir
    if args.report:
        return os.path.join(args.report, "bundles")
    return DEFAULT_BUNDLE_DIR


def execute(cases: List, args, device: str, console, *, record: bool = False, prog: str = "python -m parity run") -> int:
    """Run ``cases`` as ``run`` (``record=False``: bundles of failing cases) or ``record``
    (``record=True``: a bundle of every case), print and write the reports.

    Args:
        cases: the selected :class:`cases.spec.Case` objects (seed offset already applied).
        args: parsed arguments (:mod:`parity.cli` ``run`` / ``record`` options).
        device: the resolved backend.
        console: a rich console.
    Returns:
        The exit status.
    """
    import pandas as pd
    from rich.markup import escape

    from . import bundle, report
    from .metamorphic import RELATIONS
    from .session import RunOptions, resolve_kernel, run_cases

    if args.repeat is None:
        args.repeat = DEFAULT_REPEAT.get(str(device), 2)
    if args.repeat < 1:
        print(f"{prog}: error: --repeat must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    relations = None if args.metamorphic is None else (list(args.metamorphic) or list(RELATIONS))
    unknown = [r for r in relations or [] if r not in RELATIONS]
    if unknown:
        print(f"{prog}: error: unknown metamorphic relation(s) {unknown}; known: {list(RELATIONS)}", file=sys.stderr)
        return EXIT_USAGE
    options = RunOptions(device=device, mode=args.mode, repeat=args.repeat, check_oracle=not args.no_oracle,
                         kernel=args.kernel, metamorphic=relations or [], seed_offset=args.seed)
    try:
        resolve_kernel(args.kernel)      # fail early on a bad spec (run_cases resolves it again, cached)
    except Exception as exc:
        print(f"{prog}: error: cannot load kernel {args.kernel!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if record:   # record always writes (--no-bundles does not apply)
        out_dir = args.bundle_dir or (os.path.join(args.report, "bundles") if args.report else DEFAULT_BUNDLE_DIR)
    else:
        out_dir = _bundle_dir(args)
    env = bundle.environment(device)
    console.print(f"device={device} ({escape(str(env.get('device_name')))}) suite={args.suite} size={args.size} "
                  f"seed={args.seed} mode={args.mode} repeat={args.repeat} kernel={escape(args.kernel)} "
                  f"oracle={'off' if args.no_oracle else 'on'} jobs={getattr(args, 'jobs', 1)}"
                  f"{' metamorphic=' + ','.join(relations) if relations else ''}: {len(cases)} cases")
    bundles = {}

    def on_case(case, res):
        status = "[green]ok[/]" if res.ok else f"[red]{len(res.failures)} failures[/]"
        where = "" if res.ok else f", first divergent step {res.first_divergent_step} " \
                                  f"({escape(case.steps[res.first_divergent_step].name)})"
        worker = escape(f" [worker {res.worker}, {res.worker_device}]") if hasattr(res, "worker") else ""
        console.print(f"  {escape(res.case_id)}: {res.steps_run} steps, {res.wall_s:.2f} s, {status}{where}{worker}")
        if out_dir and (record or not res.ok):
            path = bundle.write_bundle(res, case, os.path.join(out_dir, bundle.bundle_name(case)),
                                       options=options, env=env)
            bundles[res.case_id] = path
            console.print(f"    repro: [bold]{escape(bundle.replay_command(path))}[/]")

    t0 = time.perf_counter()
    results = run_cases(cases, options, console=console, on_case=on_case,
                        jobs=getattr(args, "jobs", 1))
    wall = time.perf_counter() - t0
    df = report.results_table(results)
    summary = report.print_results(df, wall_s=wall, console=console, failures_only=args.failures_only)
    _print_certified(df, console)
    timings = pd.concat([r.timings for r in results], ignore_index=True) if results else None
    if args.report:
        paths = report.write_report(df, args.report, wall_s=wall, timings=timings, environment=env,
                                    bundles=bundles, run=options.to_dict())
        console.print(escape(f"report: {', '.join(paths.values())}"))
    if args.junit:
        console.print(escape(f"junit: {report.write_junit(df, args.junit, bundles=bundles)}"))
    for cid, path in bundles.items():
        if not record:
            console.print(f"[red]FAILED[/] {escape(cid)}: reproduce with [bold]{escape(bundle.replay_command(path))}[/]")
    return EXIT_FAIL if summary["failures"] else EXIT_OK


def _print_certified(df, console) -> None:
    """One line per certifiable output, zeros included (parity-contract.md §3: report the counts)."""
    from .report import certified_counts
    for r in certified_counts(df).to_dict("records"):
        style = "yellow" if r["elements"] else "dim"
        console.print(f"[{style}]certified[/] {r['output']}: {r['elements']} {r['certificate']} elements "
                      f"in {r['steps']} steps (max {r['max_per_step']} in one step)")


def replay_main(args, console=None) -> int:
    """``python -m parity replay BUNDLE``: rerun, print, compare with the recorded findings."""
    from rich.markup import escape

    from kpool.errors import KPoolUnsupportedError

    from . import bundle, report
    from .report import make_console
    console = console or make_console()
    prog = "python -m parity replay"
    try:
        b, result, diff = bundle.replay(args.bundle, device=None if args.device == "auto" else args.device,
                                        console=console)
    except (FileNotFoundError, ValueError, KPoolUnsupportedError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    console.print(f"replayed {escape(b.case.case_id)} from {escape(args.bundle)} "
                  f"(recorded on {escape(str(b.environment.get('device_name')))}, "
                  f"git {escape(str((b.environment.get('git') or {}).get('revision')))})")
    df = report.results_table([result])
    report.print_results(df, wall_s=result.wall_s, console=console, failures_only=args.failures_only)
    if args.report:
        report.write_report(df, args.report, wall_s=result.wall_s, run=b.options.to_dict())
    if args.junit:
        report.write_junit(df, args.junit)
    if len(diff):
        console.print(f"[red]checks differ from the bundle ({len(diff)} rows):[/]")
        console.print(escape(diff.to_string(index=False)))
        return EXIT_FAIL
    summary = report.summarize(df)
    console.print(f"[green]reproduced: {len(result.findings)} checks identical to the bundle's "
                  f"({summary['findings']} findings, {summary['failures']} failures)[/]")
    return EXIT_OK
