"""The ``run`` / ``record`` commands behind :mod:`parity.cli` (parity-contract.md §1, §6), and
where a run writes.

:mod:`parity.cli` parses arguments; :mod:`parity.selection.suites` picks the cases of each suite; this module
runs a case list (:func:`parity.sessions.session.run_cases`: progress bar, determinism repeats, metamorphic
relations), prints the results, writes the reports (``--report``, ``--junit``) and the repro
bundles (:mod:`parity.sessions.bundle`). ``replay`` is :mod:`parity.verbs.replay`.

A run never edits the checkout. Everything it writes goes under one output root
(:func:`output_root`: ``--report DIR``, else ``./parity-out``, which ``.gitignore`` lists):
bundles in ``ROOT/bundles`` (unless ``--bundle-dir``), shrunk generated failures in
``ROOT/corpus-candidates`` (``python -m parity corpus add PATH`` promotes one into
``cases/corpus``).

Exit status of ``run`` and ``record``: 0 every check passes, 1 at least one failure, 2 usage error.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Dict, List, Optional

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DEFAULT_OUT = "parity-out"
"""Output root of a run without ``--report`` (relative to the working directory; gitignored)."""
DEFAULT_REPEAT = {"cuda": 2, "npu": 2, "cpu": 1}
"""Kernel forwards per step when ``--repeat`` is not given (determinism check; 1 turns it off).
The CPU interpreter runs every program serially in numpy, so a second run there can only repeat
the first: it would double the interpreter time of ``make parity`` for nothing."""


def usage_error(message: str) -> int:
    """Print a usage error on stderr (unwrapped, no markup); returns :data:`EXIT_USAGE`."""
    print(message, file=sys.stderr)
    return EXIT_USAGE


def add_run_options(parser) -> None:
    """The options ``run`` and ``record`` add to the case-selection options of :mod:`parity.cli`
    (no torch import: ``--help`` must answer at once)."""
    from .session import RELATION_NAMES
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="run the kernel N times per step from identical caches; every run must be "
                             "bitwise identical (default: 2 on cuda/npu, 1 on the cpu interpreter; "
                             "1 = no determinism check)")
    from ..implementations.semantics import SCORE_MODES, TIE_POLICIES, VALIDATORS
    parser.add_argument("--kernel", default="kpool", metavar="SPEC",
                        help="implementation under test: kpool (default), mutant:NAME (a planted fault of "
                             "parity.implementations.mutants; python -m parity list mutants), git:REV (this repository's kpool "
                             "at a git revision), vllm-ascend:PATH[@REV] (vLLM-Ascend's operators from a checkout, "
                             "optionally at a git revision of it), or package.module:function (python -m parity "
                             "list implementations)")
    parser.add_argument("--score-mode", default=None, choices=SCORE_MODES,
                        help="score mode of every case, both sides (kpool-algorithm.md 4.2; default: the "
                             "implementation's declared mode, else each case's own)")
    parser.add_argument("--ties", default=None, choices=TIE_POLICIES,
                        help="top-k tie policy: canonical (exact ties lower id first) or any (a row passes when it "
                             "is a valid top-k of its own scores; counted as tie-equivalent); default: the "
                             "implementation's")
    parser.add_argument("--validate-with", default=None, choices=VALIDATORS,
                        help="kpool: run kpool's validation before the operator (bad-input steps then test the "
                             "caller's validation, reported 'not validated by the operator'); none: the operator's "
                             "own; default: kpool for an implementation that does not validate, else none")
    parser.add_argument("--interp-rne", action=argparse.BooleanOptionalAction, default=None,
                        help="under the CPU interpreter, round fp32->bf16 casts and stores to nearest even as the "
                             "hardware does (the interpreter truncates; docs/interpreter-rne.md); default: the "
                             "implementation's declared rounding (on for vllm-ascend:PATH)")
    from ..implementations.semantics import MODES
    parser.add_argument("--supports", nargs="+", default=None, choices=MODES + ("all",), metavar="MODE",
                        help="the optional modes the implementation has (" + ", ".join(MODES) + ", or all); a step "
                             "needing another is reported 'unsupported by IMPL' (counted, not a failure); default: "
                             "the implementation's declared modes")
    from ..running.isolation import ISOLATE_CHOICES
    parser.add_argument("--isolate", default="auto", choices=ISOLATE_CHOICES,
                        help="run the implementation's cases in a child worker process, so that a crash (even a "
                             "segfault or abort) ends only that case as a crash finding: auto (default) for "
                             "implementations that are not this repository's own (vllm-ascend:PATH, module:function; "
                             "not kpool, mutant:NAME or git:REV), on, off")
    parser.add_argument("--metamorphic", nargs="*", default=None, metavar="RELATION",
                        help="also check metamorphic relations on every step, bitwise (no name = all: "
                             f"{', '.join(RELATION_NAMES)})")
    parser.add_argument("--decode-relations", nargs="*", default=None, metavar="RELATION",
                        help="relations checked on the decode steps of the seed cases (default: captured-replay "
                             "on cuda/npu, none on the cpu interpreter; no name = none)")
    parser.add_argument("--bundle-dir", metavar="DIR", default=None,
                        help=f"write repro bundles of failing cases here (default: REPORT/bundles, else "
                             f"./{DEFAULT_OUT}/bundles)")
    parser.add_argument("--no-bundles", action="store_true", help="do not write repro bundles")


def output_root(args) -> str:
    """Where a run writes: ``--report DIR``, else :data:`DEFAULT_OUT`."""
    return getattr(args, "report", None) or DEFAULT_OUT


def bundle_dir(args, *, record: bool = False) -> Optional[str]:
    """The bundle directory of a run (``None``: ``--no-bundles``; ``record`` always writes)."""
    if getattr(args, "no_bundles", False) and not record:
        return None
    return getattr(args, "bundle_dir", None) or os.path.join(output_root(args), "bundles")


def candidates_dir(args) -> str:
    """Where a run keeps its shrunk generated failures: ``ROOT/corpus-candidates``."""
    return os.path.join(output_root(args), "corpus-candidates")


def run_options(args, device: str, prog: str):
    """The :class:`parity.sessions.session.RunOptions` of parsed ``run`` arguments on ``device``, or an
    error message (str) for a usage error."""
    from .session import DEVICE_DECODE_RELATIONS, RELATION_NAMES, RunOptions
    repeat = DEFAULT_REPEAT.get(str(device), 2) if args.repeat is None else args.repeat
    if repeat < 1:
        return f"{prog}: error: --repeat must be >= 1"
    relations = None if args.metamorphic is None else (list(args.metamorphic) or list(RELATION_NAMES))
    decode = list(DEVICE_DECODE_RELATIONS.get(str(device), ())) if getattr(args, "decode_relations", None) is None \
        else list(args.decode_relations)
    unknown = [r for r in (relations or []) + decode if r not in RELATION_NAMES]
    if unknown:
        return f"{prog}: error: unknown metamorphic relation(s) {unknown}; known: {list(RELATION_NAMES)}"
    from ..implementations import device_refusal, resolve
    try:
        implementation = resolve(args.kernel)   # fail early on a bad spec (run_cases resolves it again)
        semantics = run_semantics(args, implementation)
    except Exception as exc:
        return f"{prog}: error: cannot load kernel {args.kernel!r}: {type(exc).__name__}: {exc}"
    refused = device_refusal(implementation, str(device))
    if refused:
        return f"{prog}: error: {refused}"
    return RunOptions(device=device, mode=args.mode, repeat=repeat, check_oracle=not args.no_oracle,
                      oracle=getattr(args, "oracle", "history"),
                      kernel=args.kernel, metamorphic=relations or [], seed_offset=args.seed,
                      decode_relations=decode, isolate=getattr(args, "isolate", None) or "auto",
                      **{k: v for k, v in dataclasses.asdict(semantics).items() if k != "implementation"})


def run_semantics(args, implementation=None):
    """The :class:`parity.implementations.semantics.RunSemantics` of parsed ``run`` arguments:
    ``--score-mode``, ``--ties``, ``--validate-with``, ``--interp-rne`` over the declared defaults
    of ``--kernel``'s implementation (``implementation`` when the caller resolved it already).

    Raises:
        whatever :func:`parity.implementations.resolve` raises for a bad spec.
    """
    from ..implementations import resolve
    from ..implementations.semantics import resolve_semantics
    if implementation is None:
        implementation = resolve(args.kernel)
    return resolve_semantics(implementation, score_mode=getattr(args, "score_mode", None),
                             ties=getattr(args, "ties", None), validate_with=getattr(args, "validate_with", None),
                             interp_rne=getattr(args, "interp_rne", None), supports=getattr(args, "supports", None))


def relations_text(options) -> str:
    """The header's statement of the relations a run checks."""
    parts = []
    if options.metamorphic:
        parts.append(f"metamorphic={','.join(options.metamorphic)} (every step)")
    if options.decode_relations:
        parts.append(f"{','.join(options.decode_relations)} on the seed cases' decode steps"
                     + (" (device default)" if options.device in ("cuda", "npu") else ""))
    elif options.device == "cpu":
        parts.append("captured-replay off (cpu interpreter: nothing is captured)")
    return "; ".join(parts) or "no metamorphic relations"


def write_failure_bundle(result, case, options, out_dir: str, console, env=None) -> str:
    """Write ``case``'s repro bundle under ``out_dir`` and print its replay command; returns the path."""
    from rich.markup import escape

    from . import bundle
    path = bundle.write_bundle(result, case, os.path.join(out_dir, bundle.bundle_name(case)), options=options,
                               env=env)
    console.print(f"    repro: [bold]{escape(bundle.replay_command(path))}[/]")
    return path


def execute(cases: List, args, device: str, console, *, record: bool = False, prog: str = "python -m parity run",
            parts: Optional[Dict[str, str]] = None, counts: Optional[dict] = None) -> int:
    """Run ``cases`` as ``run`` (``record=False``: bundles of failing cases) or ``record``
    (``record=True``: a bundle of every case), print and write the reports.

    Args:
        cases: the selected :class:`cases.spec.Case` objects (seed offset already applied).
        args: parsed arguments (:mod:`parity.cli` ``run`` / ``record`` options).
        device: the resolved backend.
        console: a rich console.
        parts: ``{case_id: suite}`` (``corpus`` / ``seed``) for per-suite counts in ``counts``.
        counts: filled with ``{suite: parity.reporting.report.summarize(...)}`` when given.
    Returns:
        The exit status.
    """
    import pandas as pd
    from rich.markup import escape

    from . import bundle
    from ..reporting import report
    from ..implementations.semantics import from_options
    from ..running.isolation import should_isolate
    from .session import run_cases

    options = run_options(args, device, prog)
    if isinstance(options, str):
        print(options, file=sys.stderr)
        return EXIT_USAGE
    out_dir = bundle_dir(args, record=record)
    env = bundle.environment(device)
    console.print(f"device={device} ({escape(str(env.get('device_name')))}) suite={args.suite} size={args.size} "
                  f"seed={args.seed} mode={args.mode} repeat={options.repeat} kernel={escape(args.kernel)} "
                  f"oracle={'off' if args.no_oracle else 'on'} jobs={getattr(args, 'jobs', 1) or 'auto'} "
                  f"isolated={'yes' if should_isolate(args.kernel, options.isolate) else 'no'} "
                  f"{escape(from_options(options).text())}; "
                  f"{escape(relations_text(options))}: {len(cases)} cases")
    bundles = {}

    def on_case(case, res):
        status = "[green]ok[/]" if res.ok else f"[red]{len(res.failures)} failures[/]"
        skipped = int((res.findings["verdict"] == "unsupported").sum()) if len(res.findings) else 0
        status += f" [yellow]({skipped} unsupported by IMPL)[/]" if skipped else ""
        first = res.first_divergent_step
        where = "" if res.ok else (f", first divergent step {first} ({escape(case.steps[first].name)})"
                                   if first is not None else ", before its first step")
        worker = escape(f" [worker {res.worker}, {res.worker_device}]") if hasattr(res, "worker") else ""
        console.print(f"  {escape(res.case_id)}: {res.steps_run} steps, {res.wall_s:.2f} s, {status}{where}{worker}")
        if out_dir and (record or not res.ok):
            bundles[res.case_id] = write_failure_bundle(res, case, options, out_dir, console, env=env)

    from ..running import compiles
    compiles.install()
    compiled_before = compiles.snapshot()
    t0 = time.perf_counter()
    if options.oracle == "hf":
        from ..oracles.hf_run import hf_header
        console.print(escape(hf_header()))
    results = run_cases(cases, options, console=console, on_case=on_case, jobs=getattr(args, "jobs", 1))
    wall = time.perf_counter() - t0
    if options.oracle == "hf":
        from ..oracles.hf_run import print_hf_summary
        print_hf_summary(results, console, args.report)
    df = report.results_table(results)
    summary = report.print_results(df, wall_s=wall, console=console, failures_only=args.failures_only,
                                   all_rows=getattr(args, "all_rows", False))
    _print_certified(df, console)
    console.print(escape(compiles.line(compiles.total([compiles.since(compiled_before)]
                                                      + [getattr(r, "compiles", None) for r in results]))))
    if counts is not None:
        ids = df["case"].astype(str) + "[" + df["size"].astype(str) + "]" if len(df) else df.get("case")
        for part in sorted(set((parts or {}).values())) or ["cases"]:
            sub = df[ids.map(lambda c: (parts or {}).get(c, "cases") == part)] if len(df) else df
            counts[part] = report.summarize(sub)
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
    from ..reporting.report import certified_counts
    for r in certified_counts(df).to_dict("records"):
        style = "yellow" if r["elements"] else "dim"
        console.print(f"[{style}]certified[/] {r['output']}: {r['elements']} {r['certificate']} elements "
                      f"in {r['steps']} steps (max {r['max_per_step']} in one step)")
