"""The case suites behind ``python -m parity run --suite ...`` (parity-contract.md §1).

* ``corpus``: every kept shrunk failure (:mod:`cases.corpus`), replayed first;
* ``seed``: the named seed scenarios (:mod:`cases.scenarios`);
* ``public``: the public failure cases C01..C31 with their stated values (:mod:`cases.public`);
* ``generated``: a profile's budget of hypothesis-generated batches and engine sequences
  (:mod:`cases.generated`), with coverage accounting; a shrunk failure is kept in the run's
  ``corpus-candidates`` directory (:func:`parity.commands.candidates_dir`), never in the checkout;
* ``all`` (the default of the CLI and of ``make parity``): the four, in that order.

``corpus`` and ``seed`` are plain case lists and go through :func:`parity.commands.execute`
(reports, bundles, ``--repeat``, relations); ``public`` and ``generated`` run here and print their
own tables. The exit status is the worst of the parts (0 ok, 1 failure, 2 usage error); the run
ends with one summary line per suite.
"""
from __future__ import annotations

import json
import os
import time
from typing import List

SUITES = ("all", "corpus", "seed", "public", "generated")
PARTS = ("corpus", "seed", "public", "generated")
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def suite_parts(suite: str) -> List[str]:
    """The suites a ``--suite`` value runs, in order (``all`` -> :data:`PARTS`).

    Raises:
        ValueError: unknown suite.
    """
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {SUITES}, got {suite!r}")
    return list(PARTS) if suite == "all" else [suite]


def suite_of_cases(names, size: str = "all") -> str:
    """The one suite that has every case in ``names`` (``--case`` without ``--suite``): ``seed``
    (a scenario name, or ``name[size]``), ``public`` (``C01``..``C31``) or ``corpus`` (an entry
    name); ``seed`` when none has them all (its error message then lists the names)."""
    from .public import PUBLIC_CASES
    from .scenarios import SCENARIOS
    seed = set(SCENARIOS) | {f"{n}[{s}]" for n in SCENARIOS for s in ("small", "glm5.3-flash")}
    if all(n in seed for n in names):
        return "seed"
    if all(n in PUBLIC_CASES for n in names):
        return "public"
    from .corpus import default_directory, entries
    corpus = {p.stem for p in entries(default_directory())}
    if all(n in corpus or n.split("[", 1)[0] in corpus for n in names):
        return "corpus"
    return "seed"


def corpus_cases(directory=None) -> List:
    """The corpus entries to replay with the production kernels, as cases (every entry: a
    ``fail:<mutant>`` entry documents a planted fault and must pass on the real kernels)."""
    from .corpus import default_directory, load_all
    return [case for case, _ in load_all(directory or default_directory())]


def _usage(message: str) -> int:
    """Print a usage error on stderr (unwrapped, no markup); returns :data:`EXIT_USAGE`."""
    import sys
    print(message, file=sys.stderr)
    return EXIT_USAGE


def _default_profile(device: str) -> str:
    return "ci" if device == "cpu" else "device"


def run_suite(args, device: str, console, *, prog: str = "python -m parity run") -> int:
    """Run ``args.suite`` and print the results. Returns the exit status."""
    from rich.markup import escape

    from parity import commands
    from parity.cli import SIZES, offset_seeds, select_cases

    parts = suite_parts(args.suite)
    if args.case and len(parts) > 1:
        return _usage(f"{prog}: error: --case needs one suite (--suite seed, corpus or public), not all")
    try:
        from parity.session import resolve_kernel
        kernel_forward = resolve_kernel(args.kernel)
    except Exception as exc:
        return _usage(f"{prog}: error: cannot load kernel {args.kernel!r}: {type(exc).__name__}: {exc}")
    if {"public", "generated"} & set(parts):
        ignored = [flag for flag, used in (("--mode resync", args.mode != "lockstep"),
                                           ("--repeat", args.repeat is not None),
                                           ("--metamorphic", args.metamorphic is not None),
                                           ("--jobs", getattr(args, "jobs", 1) != 1)) if used]
        if ignored:
            console.print(f"note: {', '.join(ignored)} apply to corpus and seed cases only; public and "
                          "generated cases run lockstep, once, in this process", markup=False)
    status = EXIT_OK
    counts: dict = {}
    case_lists, part_of = [], {}
    if "corpus" in parts:
        corpus = corpus_cases()
        console.print(f"[bold]corpus[/]: {len(corpus)} kept shrunk failures (cases/corpus), replayed first")
        case_lists += corpus
        part_of.update({c.case_id: "corpus" for c in corpus})
    if "seed" in parts:
        from .scenarios import seed_cases
        sizes = list(SIZES) if args.size == "all" else [args.size]
        seeds = [offset_seeds(c, args.seed) for c in seed_cases(sizes)]
        case_lists += seeds
        part_of.update({c.case_id: "seed" for c in seeds})
    if case_lists:
        try:
            case_lists = select_cases(case_lists, args.case) if args.case else case_lists
        except KeyError as exc:
            return _usage(f"{prog}: error: {exc.args[0]}")
        status = max(status, commands.execute(case_lists, args, device, console, record=args.command == "record",
                                              prog=prog, parts=part_of, counts=counts))
    if args.command == "record" and ({"public", "generated"} & set(parts)):
        console.print("note: record writes bundles for corpus and seed cases only; public cases are rerun by "
                      "name (--suite public --case Cxx), a failing generated case is kept in "
                      "REPORT/corpus-candidates", markup=False)
    if "public" in parts:
        status = max(status, run_public_suite(args, device, console, kernel_forward=kernel_forward, counts=counts))
    if "generated" in parts:
        status = max(status, run_generated_suite(args, device, console, kernel_forward=kernel_forward,
                                                 counts=counts))
    if len(parts) > 1 and status != EXIT_USAGE:
        from parity.report import summary_line
        console.print("[bold]suites:[/]")
        for part in parts:
            if part in counts:
                c = counts[part]
                line = summary_line(c) if "checks" in c else c["line"]
                console.print(escape(f"  {part:<10} {line}"))
    return status


def _part_path(path: str, part: str) -> str:
    """``out/junit.xml`` -> ``out/junit-public.xml``: one file per suite part."""
    root, ext = os.path.splitext(path)
    return f"{root}-{part}{ext or '.xml'}"


def run_public_suite(args, device: str, console, *, kernel_forward=None, counts=None) -> int:
    """Run every public case (or ``--case C09 ...``) on ``kernel_forward`` (default: the
    production kernels): harness findings plus stated-value checks. ``--report DIR`` writes
    ``DIR/public/``; ``--junit F`` writes ``F`` with ``-public`` before its extension."""
    from rich.markup import escape

    from parity import report

    from .public import PUBLIC_CASES
    wanted = list(args.case or []) if args.suite == "public" else []
    unknown = [c for c in wanted if c not in PUBLIC_CASES]
    if unknown:   # a typo must not silently run (and pass) every public case
        return _usage(f"python -m parity run: error: unknown public case(s) {unknown}; "
                      f"known: {', '.join(PUBLIC_CASES)}")
    selected = [PUBLIC_CASES[c] for c in wanted] or list(PUBLIC_CASES.values())
    console.print(f"[bold]public[/]: {len(selected)} public failure cases on {device}, kernel={escape(args.kernel)}")
    from .public import public_results
    t0 = time.perf_counter()
    results = []
    for pc in selected:
        t = time.perf_counter()
        res = public_results(pc, device, kernel_forward=kernel_forward)
        results += res
        bad = sum(len(r.failures) for r in res)
        status = "[green]ok[/]" if not bad else f"[red]{bad} failures[/]"
        checks = sum(int(r.findings["output"].astype(str).str.startswith("expected:").sum()) for r in res)
        console.print(f"  {pc.cid} {escape(pc.title)}: {len(res)} cases, {checks} stated-value checks, "
                      f"{time.perf_counter() - t:.1f} s, {status}")
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
        console.print(escape(f"public junit: {report.write_junit(df, _part_path(args.junit, 'public'))}"))
    return EXIT_FAIL if summary["failures"] else EXIT_OK


def _expectation(kernel: str) -> dict:
    """Corpus provenance of a generated failure found with ``kernel``: a planted fault's case must
    fail on that mutant and pass on the real kernels."""
    if kernel.startswith("mutant:"):
        return {"expect": f"fail:{kernel.split(':', 1)[1]}"}
    return {"expect": "pass", **({"kernel": kernel} if kernel != "kpool" else {})}


def run_generated_suite(args, device: str, console, *, kinds=("batch", "engine"), kernel_forward=None,
                        counts=None) -> int:
    """Warm the kernel under test, then run a profile's budget of generated batches and engine
    sequences on it; print coverage. Every failure is a finding, never a traceback: a failing
    warm-up case is printed as a results table and bundled, a shrunk generated failure is printed,
    bundled and kept in the run's ``corpus-candidates`` directory (promote it with
    ``python -m parity corpus add PATH``)."""
    from rich.markup import escape

    from parity import commands, report

    from .coverage import Coverage
    from .generated import error_summary, run_generated
    from .profiles import load_profile, warm_kernels

    name = getattr(args, "profile", None) or os.environ.get("HYPOTHESIS_PROFILE") or _default_profile(device)
    try:
        prof = load_profile(name)
    except KeyError as exc:
        return _usage(f"python -m parity run: error: {exc.args[0]}")
    options = commands.run_options(args, device, "python -m parity run")
    if isinstance(options, str):
        return _usage(options)
    bundles_dir = commands.bundle_dir(args)
    status, lines = EXIT_OK, []
    warm = warm_kernels(device, kpools=prof.bounds.kpools, score_modes=("relu", "merged"),
                        kernel_forward=kernel_forward)
    console.print(f"[bold]generated[/]: kernel={escape(args.kernel)}, profile {prof.name} ({prof.batch_examples} batches, "
                  f"{prof.engine_examples} engine sequences, plus the guaranteed-coverage cases; "
                  f"{'fixed order, seed ' + str(prof.seed) if prof.seed is not None else 'random order'}; "
                  f"no deadline; kernels warmed in {warm.seconds:.1f} s)")
    if not warm.ok:
        status = EXIT_FAIL
        console.print(f"[red]warm-up FAILED[/]: {len(warm.failed)} warm-up cases disagree with the reference")
        report.print_results(report.results_table([res for _, res in warm.failed]), console=console,
                             title="KPool parity: generated-suite warm-up")
        for case, res in warm.failed:
            if bundles_dir:
                commands.write_failure_bundle(res, case, options, bundles_dir, console)
        lines.append(f"warm-up FAILED ({len(warm.failed)} cases)")
    total = Coverage()
    summary = {}
    seed = args.seed if getattr(args, "seed", 0) else None
    for kind in kinds:
        out = run_generated(kind, device=device, profile=prof, seed=seed, kernel_forward=kernel_forward,
                            check_oracle=not args.no_oracle, corpus_dir=commands.candidates_dir(args),
                            corpus_info={"note": f"found by python -m parity run --suite generated ({prof.name})",
                                         **_expectation(args.kernel)})
        total.merge(out.coverage)
        line = (f"  generated {kind}: {out.passed_examples} examples passed, {out.examples} run, "
                f"{out.wall_s:.1f} s (compile {out.jit_s:.1f} s): ")
        summary[kind] = {"passed_examples": out.passed_examples, "examples": out.examples, "wall_s": out.wall_s,
                         "ok": out.ok, "failure": out.failure_kind, "saved": str(out.saved) if out.saved else None,
                         "slow_examples": out.slow}
        lines.append(f"{kind} {out.passed_examples}/{out.examples} examples passed"
                     + ("" if out.ok else f", FAILED ({out.failure_kind})"))
        if out.slow:
            console.print(escape(f"  note: {len(out.slow)} {kind} examples slower than {prof.slow_example_s:g} s "
                                 f"(a warning, not a failure): {out.slow[0]}"))
        if out.ok:
            console.print(line + "[green]ok[/]")
            continue
        status = EXIT_FAIL
        fixed = out.case is not None and any(str(t).startswith("coverage:") for t in out.case.tags)
        how = ", a guaranteed-coverage case" if fixed else (", shrunk" if out.failure_kind == "parity" else "")
        console.print(line + f"[red]FAILED[/] ({escape(str(out.failure_kind))}{how})")
        _print_generated_failure(out, console, error_summary)
        if out.result is not None and out.case is not None and bundles_dir:
            commands.write_failure_bundle(out.result, out.case, options, bundles_dir, console)
        if out.saved:
            console.print(escape(f"  kept in {out.saved}; promote it into cases/corpus with: "
                                 f"python -m parity corpus add {out.saved}"))
    for text in total.lines() if total.cases else ["coverage: no generated case passed"]:
        console.print(escape(text))
    if counts is not None:
        counts["generated"] = {"line": ("PASS: " if status == EXIT_OK else "FAIL: ") + "; ".join(lines),
                               "failures": int(status != EXIT_OK)}
    if args.report:
        path = os.path.join(args.report, "generated")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "coverage.json"), "w") as f:
            json.dump({"profile": prof.name, "warm_up_ok": warm.ok, "runs": summary, "coverage": total.to_dict()},
                      f, indent=1)
        console.print(escape(f"generated report: {os.path.join(path, 'coverage.json')}"))
    return status


def _print_generated_failure(out, console, error_summary) -> None:
    """The failure of a generated run, as findings: the case and its failing rows (parity), the
    harness traceback (harness-crash), or the error's summary (flaky, nondeterministic, other)."""
    import traceback

    from rich.markup import escape

    from parity import report
    if out.failure_kind == "parity" and out.result is not None:
        from .corpus import describe
        console.print(escape("\n".join(describe(out.case))))
        report.print_results(report.results_table([out.result]), console=console, failures_only=True,
                             title=f"KPool parity: generated {out.kind} (shrunk)")
        return
    console.print(escape(error_summary(out.error)), highlight=False)
    inner = getattr(out.error, "exc", None)
    if out.failure_kind == "harness-crash" and inner is not None:
        console.print(escape("".join(traceback.format_exception(type(inner), inner, inner.__traceback__))),
                      highlight=False)
