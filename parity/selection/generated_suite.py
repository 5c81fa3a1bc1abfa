"""``python -m parity run --suite generated``: warm the kernel under test, then a profile's budget
of generated batches and engine sequences on it (:func:`parity.running.generated.run_generated`), with
coverage accounting; a shrunk failure is kept in the run's ``corpus-candidates`` directory
(:func:`parity.sessions.commands.candidates_dir`), never in the checkout."""
from __future__ import annotations

import json
import os

from cases.corpus import describe
from cases.profiles import load_profile

from ..findings.coverage import Coverage
from ..implementations.semantics import REFUSED
from ..running.size_cases import run_size_family
from ..running.generated.driver import error_summary, run_generated
from ..running.generated.warmup import warm_kernels


def _default_profile(device: str) -> str:
    return "ci" if device == "cpu" else "device"


def _expectation(kernel: str) -> dict:
    """Corpus provenance of a generated failure found with ``kernel``: a planted fault's case must
    fail on that mutant and pass on the real kernels."""
    if kernel.startswith("mutant:"):
        return {"expect": f"fail:{kernel.split(':', 1)[1]}"}
    return {"expect": "pass", **({"kernel": kernel} if kernel != "kpool" else {})}


def _isolated_warm_up(worker, kpools, score_modes):
    """:func:`warm_kernels` with every warm-up case run in the isolated worker
    (:class:`parity.running.isolation.CaseWorker`): a crash is that warm-up case's failure."""
    import time

    from ..running.generated.warmup import WarmUp, warm_up_cases
    t0 = time.perf_counter()
    out = WarmUp()
    for case in warm_up_cases(kpools, score_modes):
        res = worker.run_case(case, {"check_oracle": False})
        if not res.ok:
            out.failed.append((case, res))
    out.seconds = time.perf_counter() - t0
    return out


def run_generated_suite(args, device: str, console, *, kinds=("batch", "engine"), kernel_forward=None,
                        counts=None, semantics=None, isolate: bool = False) -> int:
    """Warm the kernel under test, then run a profile's budget of generated batches and engine
    sequences on it; print coverage. Every failure is a finding, never a traceback: a failing
    warm-up case is printed as a results table and bundled, a shrunk generated failure is printed,
    bundled and kept in the run's ``corpus-candidates`` directory (promote it with
    ``python -m parity corpus add PATH``). ``semantics``
    (:class:`parity.implementations.semantics.RunSemantics`): every generated case gets its score
    mode (the warm-up warms only that mode) and the run's tie policy. ``isolate``: the warm-up
    and each kind run in a child worker process (:class:`parity.running.isolation.CaseWorker`, resolving
    ``args.kernel`` there): a crash of the implementation, even a segfault, fails that kind with
    the signal instead of ending the run."""
    worker = None
    if isolate:
        from ..running.isolation import CaseWorker
        worker = CaseWorker(args.kernel, semantics, device)
    try:
        return _run_generated_suite(args, device, console, kinds=kinds, kernel_forward=kernel_forward, counts=counts,
                                    semantics=semantics, worker=worker)
    finally:
        if worker is not None:
            worker.close()


def _run_generated_suite(args, device: str, console, *, kinds, kernel_forward, counts, semantics, worker) -> int:
    """:func:`run_generated_suite` (``worker``: its isolated worker, or ``None``)."""
    from rich.markup import escape

    from ..sessions import commands
    from ..reporting import report

    name = getattr(args, "profile", None) or os.environ.get("HYPOTHESIS_PROFILE") or _default_profile(device)
    try:
        prof = load_profile(name)
    except KeyError as exc:
        return commands.usage_error(f"python -m parity run: error: {exc.args[0]}")
    options = commands.run_options(args, device, "python -m parity run")
    if isinstance(options, str):
        return commands.usage_error(options)
    bundles_dir = commands.bundle_dir(args)
    status, lines = commands.EXIT_OK, []
    from ..implementations.semantics import RunSemantics
    semantics = semantics or RunSemantics()
    modes = (semantics.score_mode,) if semantics.score_mode else ("relu", "merged")
    warm = _isolated_warm_up(worker, prof.bounds.kpools, modes) if worker is not None else \
        warm_kernels(device, kpools=prof.bounds.kpools, score_modes=modes, kernel_forward=kernel_forward)
    console.print(f"[bold]generated[/]: kernel={escape(args.kernel)}, profile {prof.name} ({prof.batch_examples} batches, "
                  f"{prof.engine_examples} engine sequences, plus the guaranteed-coverage cases; "
                  f"{'fixed order, seed ' + str(prof.seed) if prof.seed is not None else 'random order'}; "
                  f"no deadline; kernels warmed in {warm.seconds:.1f} s)")
    if not warm.ok:
        status = commands.EXIT_FAIL
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
        kw = dict(profile=prof, seed=seed, check_oracle=not args.no_oracle, corpus_dir=commands.candidates_dir(args),
                  corpus_info={"note": f"found by python -m parity run --suite generated ({prof.name})",
                               **_expectation(args.kernel)})
        before = REFUSED[0]
        out = worker.run_generated(kind, kw) if worker is not None else \
            run_generated(kind, device=device, kernel_forward=kernel_forward, semantics=semantics, **kw)
        refused = getattr(out, "unsupported_calls", REFUSED[0] - before)   # the worker counts its own
        total.merge(out.coverage)
        line = (f"  generated {kind}: {out.passed_examples} examples passed, {out.examples} run, "
                f"{out.wall_s:.1f} s (compile {out.jit_s:.1f} s)"
                + (f", {refused} steps unsupported by IMPL (not asked, not failures)" if refused else "") + ": ")
        summary[kind] = {"passed_examples": out.passed_examples, "examples": out.examples, "wall_s": out.wall_s,
                         "ok": out.ok, "failure": out.failure_kind, "saved": str(out.saved) if out.saved else None,
                         "slow_examples": out.slow}
        lines.append(f"{kind} {out.passed_examples}/{out.examples} examples passed"
                     + ("" if out.ok else f", FAILED ({out.failure_kind})")
                     + (f", {refused} steps unsupported by IMPL" if refused else ""))
        summary[kind]["unsupported_steps"] = refused
        if out.slow:
            console.print(escape(f"  note: {len(out.slow)} {kind} examples slower than {prof.slow_example_s:g} s "
                                 f"(a warning, not a failure): {out.slow[0]}"))
        if out.ok:
            console.print(line + "[green]ok[/]")
            continue
        status = commands.EXIT_FAIL
        fixed = out.case is not None and any(str(t).startswith(("coverage:", "family:")) for t in out.case.tags)
        how = ", a guaranteed-coverage case" if fixed else (", shrunk" if out.failure_kind == "parity" else "")
        console.print(line + f"[red]FAILED[/] ({escape(str(out.failure_kind))}{how})")
        _print_generated_failure(out, console, error_summary)
        crashes = out.crashes
        if crashes:                     # cases that killed the isolated worker; the rest ran on
            report.print_results(report.results_table([res for _, res in crashes]), console=console,
                                 failures_only=True, title=f"KPool parity: generated {kind}, cases that killed the worker")
        if out.result is not None and out.case is not None and bundles_dir:
            commands.write_failure_bundle(out.result, out.case, options, bundles_dir, console)
        for case, res in crashes if bundles_dir else ():
            if res is not out.result:
                commands.write_failure_bundle(res, case, options, bundles_dir, console)
        if out.saved:
            console.print(escape(f"  kept in {out.saved}; promote it into cases/corpus with: "
                                 f"python -m parity corpus add {out.saved}"))
    size_ok, size_lines = run_size_family(device, prof.name, kernel_forward)     # issue 19 family 6
    for text in size_lines:
        console.print(escape(text))
    if not size_ok:
        status = commands.EXIT_FAIL
        lines.append("size family FAILED")
    for text in total.lines() if total.cases else ["coverage: no generated case passed"]:
        console.print(escape(text))
    if counts is not None:
        counts["generated"] = {"line": ("PASS: " if status == commands.EXIT_OK else "FAIL: ") + "; ".join(lines),
                               "failures": int(status != commands.EXIT_OK)}
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

    from ..reporting import report
    if out.failure_kind == "parity" and out.result is not None:
        console.print(escape("\n".join(describe(out.case))))
        report.print_results(report.results_table([out.result]), console=console, failures_only=True,
                             title=f"KPool parity: generated {out.kind} (shrunk)")
        return
    console.print(escape(error_summary(out.error)), highlight=False)
    inner = getattr(out.error, "exc", None)
    if out.failure_kind == "harness-crash" and inner is not None:
        console.print(escape("".join(traceback.format_exception(type(inner), inner, inner.__traceback__))),
                      highlight=False)
