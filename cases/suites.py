"""The case suites behind ``python -m parity run --suite ...`` (parity-contract.md §1).

* ``corpus``: every kept shrunk failure (:mod:`cases.corpus`), replayed first;
* ``seed``: the named seed scenarios (:mod:`cases.scenarios`);
* ``public``: the public failure cases C01..C31 with their stated values (:mod:`cases.public`);
* ``generated``: a profile's budget of hypothesis-generated batches and engine sequences
  (:mod:`cases.generated`), with coverage accounting; a shrunk failure is saved to the corpus;
* ``all``: the four, in that order (what ``make parity`` runs).

``corpus`` and ``seed`` are plain case lists and go through :func:`parity.commands.execute`
(reports, bundles, ``--repeat``); ``public`` and ``generated`` run here and print their own
tables. The exit status is the worst of the parts (0 ok, 1 failure, 2 usage error).
"""
from __future__ import annotations

import json
import os
import time
from typing import List

SUITES = ("all", "corpus", "seed", "public", "generated")
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def corpus_cases(directory=None) -> List:
    """The corpus entries to replay with the production kernels, as cases (every entry: a
    ``fail:<mutant>`` entry documents a planted fault and must pass on the real kernels)."""
    from .corpus import default_directory, load_all
    return [case for case, _ in load_all(directory or default_directory())]


def _default_profile(device: str) -> str:
    return "ci" if device == "cpu" else "device"


def run_suite(args, device: str, console, *, prog: str = "python -m parity run") -> int:
    """Run ``args.suite`` (``all`` / ``corpus`` / ``public`` / ``generated``; ``seed`` stays in
    :mod:`parity.cli`) and print the results. Returns the exit status."""
    from rich.markup import escape

    from parity import commands
    from parity.cli import SIZES, offset_seeds, select_cases

    parts = ["corpus", "seed", "public", "generated"] if args.suite == "all" else [args.suite]
    if args.case and args.suite == "all":
        console.print(f"{prog}: error: --case needs one suite (--suite seed, corpus or public), not all",
                      markup=False)
        return EXIT_USAGE
    try:
        from parity.session import resolve_kernel
        kernel_forward = resolve_kernel(args.kernel)
    except Exception as exc:
        console.print(f"{prog}: error: cannot load kernel {args.kernel!r}: {type(exc).__name__}: {exc}",
                      markup=False)
        return EXIT_USAGE
    if {"public", "generated"} & set(parts):
        ignored = [flag for flag, used in (("--mode resync", args.mode != "lockstep"),
                                           ("--repeat", args.repeat is not None),
                                           ("--metamorphic", args.metamorphic is not None),
                                           ("--jobs", getattr(args, "jobs", 1) != 1)) if used]
        if ignored:
            console.print(f"note: {', '.join(ignored)} apply to corpus and seed cases only; public and "
                          "generated cases run lockstep, once, in this process", markup=False)
    status = EXIT_OK
    case_lists = []
    if "corpus" in parts:
        corpus = corpus_cases()
        console.print(f"[bold]corpus[/]: {len(corpus)} kept shrunk failures (cases/corpus), replayed first")
        case_lists += corpus
    if "seed" in parts:
        from .scenarios import seed_cases
        sizes = list(SIZES) if args.size == "all" else [args.size]
        case_lists += [offset_seeds(c, args.seed) for c in seed_cases(sizes)]
    if case_lists:
        try:
            case_lists = select_cases(case_lists, args.case) if args.case and args.suite != "all" else case_lists
        except KeyError as exc:
            console.print(escape(f"{prog}: error: {exc.args[0]}"))
            return EXIT_USAGE
        status = max(status, commands.execute(case_lists, args, device, console, record=args.command == "record",
                                              prog=prog))
    if args.command == "record" and ({"public", "generated"} & set(parts)):
        console.print("note: record writes bundles for corpus and seed cases only; public cases are rerun by "
                      "name (--suite public --case Cxx), a failing generated case is kept in cases/corpus",
                      markup=False)
    if "public" in parts:
        status = max(status, run_public_suite(args, device, console, kernel_forward=kernel_forward))
    if "generated" in parts:
        status = max(status, run_generated_suite(args, device, console, kernel_forward=kernel_forward))
    return status


def _part_path(path: str, part: str) -> str:
    """``out/junit.xml`` -> ``out/junit-public.xml``: one file per suite part."""
    root, ext = os.path.splitext(path)
    return f"{root}-{part}{ext or '.xml'}"


def run_public_suite(args, device: str, console, *, kernel_forward=None) -> int:
    """Run every public case (or ``--case C09 ...``) on ``kernel_forward`` (default: the
    production kernels): harness findings plus stated-value checks. ``--report DIR`` writes
    ``DIR/public/``; ``--junit F`` writes ``F`` with ``-public`` before its extension."""
    from rich.markup import escape

    from parity import report

    from .public import PUBLIC_CASES
    wanted = list(args.case or []) if args.suite == "public" else []
    unknown = [c for c in wanted if c not in PUBLIC_CASES]
    if unknown:   # a typo must not silently run (and pass) every public case
        console.print(f"python -m parity run: error: unknown public case(s) {unknown}; "
                      f"known: {', '.join(PUBLIC_CASES)}", markup=False)
        return EXIT_USAGE
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
    summary = report.print_results(df, wall_s=wall, console=console, failures_only=True)
    if args.report:
        paths = report.write_report(df, os.path.join(args.report, "public"), wall_s=wall)
        console.print(escape(f"public report: {', '.join(paths.values())}"))
    if getattr(args, "junit", None):
        console.print(escape(f"public junit: {report.write_junit(df, _part_path(args.junit, 'public'))}"))
    return EXIT_FAIL if summary["failures"] else EXIT_OK


def run_generated_suite(args, device: str, console, *, kinds=("batch", "engine"), kernel_forward=None) -> int:
    """Run a profile's budget of generated batches and engine sequences on ``kernel_forward``
    (default: the production kernels); print coverage; save a shrunk failure to the corpus (only
    when the production kernels are under test: a planted fault's case is not a regression)."""
    from rich.markup import escape

    from .corpus import default_directory
    from .coverage import Coverage
    from .generated import run_generated
    from .profiles import load_profile, warm_kernels

    name = getattr(args, "profile", None) or os.environ.get("HYPOTHESIS_PROFILE") or _default_profile(device)
    try:
        prof = load_profile(name)
    except KeyError as exc:
        console.print(escape(str(exc)))
        return EXIT_USAGE
    warm = warm_kernels(device, kpools=prof.bounds.kpools, score_modes=("relu", "merged"))
    console.print(f"[bold]generated[/]: kernel={escape(args.kernel)}, profile {prof.name} ({prof.batch_examples} batches, {prof.engine_examples} "
                  f"engine sequences; net deadline {prof.deadline_s:g} s excluding Triton compilation; kernels "
                  f"warmed in {warm:.1f} s)")
    status, total = EXIT_OK, Coverage()
    summary = {}
    seed = args.seed if getattr(args, "seed", 0) else None
    for kind in kinds:
        out = run_generated(kind, device=device, profile=prof, seed=seed, kernel_forward=kernel_forward,
                            check_oracle=not args.no_oracle,
                            corpus_dir=default_directory() if args.kernel == "kpool" else None,
                            corpus_info={"note": f"found by python -m parity run --suite generated ({prof.name})"})
        total.merge(out.coverage)
        line = (f"  generated {kind}: {out.passed_examples} examples passed, {out.examples} run, "
                f"{out.wall_s:.1f} s (compile {out.jit_s:.1f} s): ")
        summary[kind] = {"passed_examples": out.passed_examples, "examples": out.examples, "wall_s": out.wall_s,
                         "ok": out.ok, "saved": str(out.saved) if out.saved else None}
        if out.ok:
            console.print(line + "[green]ok[/]")
        else:
            status = EXIT_FAIL
            console.print(line + "[red]FAILED[/] (shrunk)")
            console.print(escape(str(out.error)))
            if out.saved:
                console.print(escape(f"  kept in the corpus: {out.saved}"))
    for text in total.lines():
        console.print(escape(text))
    if args.report:
        path = os.path.join(args.report, "generated")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "coverage.json"), "w") as f:
            json.dump({"profile": prof.name, "runs": summary, "coverage": total.to_dict()}, f, indent=1)
        console.print(escape(f"generated report: {os.path.join(path, 'coverage.json')}"))
    return status
