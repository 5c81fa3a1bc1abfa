"""``python -m parity selftest``: every planted fault of :data:`parity.verbs.faults.FAULTS` against the
default suites; per fault which suite caught it, with which finding class, and the kill rate
(issue 13: the harness proves it catches what it claims).

Per fault: a mutated copy of ``kpool`` (:func:`parity.implementations.mutants.load_mutant`) is the kernel under
test; the suites run cheap-first (corpus and seed cases together, ordered by token rows, then public,
then generated) and the fault's run stops at the first failure (``run_case(stop_on_failure=True)``,
the first failing public check, the generated driver's first failing example). Device-only faults
(:data:`parity.verbs.faults.kernels.DEVICE_ONLY`) are listed and left out of the CPU kill rate; on a
device, an ``int64-offsets`` fault first runs the large case (:mod:`parity.running.large_case`).
``--jobs N`` runs faults in N worker processes (:class:`concurrent.futures.ProcessPoolExecutor`).

Exit status: 0 every selected fault caught, 1 one survived, 2 usage error.
"""
from __future__ import annotations

import sys
import time
from typing import Dict, List, Optional

SUITE_ORDER = ("corpus", "seed", "public", "generated")
BAD_INPUT_SCENARIOS = ("bad-metadata", "bad-arguments")
"""Seed scenarios with one bad-input step per rejection rule: a rule fault's hunt runs them first."""


def add_selftest_parser(sub) -> None:
    """The ``selftest`` subcommand's parser (no torch import)."""
    p = sub.add_parser("selftest", help="run every planted fault against the default suites; kill rate",
                       description="Plant each fault of the catalog (parity.verbs.faults) in a copy of kpool, run the "
                                   "default suites against it (cheap first, stop at the first failure) and report "
                                   "which suite caught it, with which finding class, and the kill rate; exit 1 "
                                   "below 100%. Device-only faults are listed and skipped on cpu.")
    p.add_argument("--fault", nargs="+", default=None, metavar="NAME", help="only these faults (default: all)")
    p.add_argument("--suite", nargs="+", default=list(SUITE_ORDER), choices=SUITE_ORDER,
                   help="suites to run, in this order of cost (default: all four)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"))
    p.add_argument("--size", default="all", choices=("small", "glm5.3-flash", "all"), help="seed case sizes")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes (default 1)")
    p.add_argument("--list", action="store_true", help="list the catalog and the rules without a fault")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the per-fault results here")
    p.add_argument("--without-family", nargs="+", default=None, metavar="FAMILY",
                   help="turn these families off in every suite (cases.families.SWITCHABLE: values, layouts, "
                        "structure, unvalidated, exactness, size), to "
                        "show that a fault only that family catches survives without it")


def _seed_and_corpus(suites: List[str], size: str) -> List[tuple]:
    """``[(suite, case)]`` of the corpus and seed suites together, cheapest (fewest token rows
    over all steps) first."""
    from cases.scenarios import SIZES, seed_cases

    from ..selection.suites import corpus_cases
    out = []
    if "corpus" in suites:
        out += [("corpus", c) for c in corpus_cases()]
    if "seed" in suites:
        out += [("seed", c) for c in seed_cases(list(SIZES) if size == "all" else [size])]

    def rows(item):
        return sum(r.query_len + r.cached_len for s in item[1].steps for r in s.batch.requests)
    return sorted(out, key=rows)


def hunt(name: str, device: str, suites: List[str], size: str = "all") -> Dict:
    """Run fault ``name`` until a suite catches it.

    Returns:
        ``{"fault", "stage", "caught": bool, "suite", "case", "classes", "detail", "wall_s"}``.
    Raises:
        KeyError: unknown fault. AssertionError: its mutation no longer applies.
    """
    from kpool.platform import resolve_device

    from ..checking.compare import is_failure
    from .faults import FAULTS
    from .faults.structure import STRUCTURE_FAMILY_OF
    from ..implementations.mutants import load_mutant
    from ..running.runner import run_case
    device = str(resolve_device(None if device == "auto" else device))
    fault = FAULTS[name]
    t0 = time.perf_counter()
    out = dict(fault=name, stage=fault.stage, caught=False, suite=None, case=None, classes="", detail="")
    try:
        forward = load_mutant(name, mutation=fault.mutation).forward
    except Exception as exc:          # a mutant that does not import is caught by any suite at once
        return dict(out, caught=True, suite="import", classes="crash", detail=f"{type(exc).__name__}: {exc}"[:200],
                    wall_s=time.perf_counter() - t0)

    def done(suite, case, classes, detail=""):
        return dict(out, caught=True, suite=suite, case=case, classes=",".join(sorted(set(classes))),
                    detail=detail[:200], wall_s=time.perf_counter() - t0)
    if device != "cpu" and fault.stage == "int64-offsets":
        from ..running.large_case import int64_addressing_check
        problems = int64_addressing_check(device, forward)
        if problems:
            return done("device-large-case", "int64-addressing", ["mismatch"], problems[0])
    if device != "cpu" and STRUCTURE_FAMILY_OF.get(name) == "size":      # issue 19 family 6: the device size checks
        from ..running.size_cases import run_size_family
        ok, lines = run_size_family(device, "device", forward)
        if not ok:
            return done("device-size-family", "size", ["failure"], next(x for x in lines if "FAILED" in x))
    cases = _seed_and_corpus(suites, size)
    if fault.stage == "rules":   # speed only: the bad-input scenarios first (the report names the suite)
        cases.sort(key=lambda it: it[1].name not in BAD_INPUT_SCENARIOS)
    for suite, case in cases:
        res = run_case(case, device=device, kernel_forward=forward, check_oracle=False, stop_on_failure=True)
        bad = res.findings[res.findings["verdict"].map(is_failure)] if len(res.findings) else res.findings
        if len(bad):
            return done(suite, case.case_id, bad["verdict"].astype(str), str(bad.iloc[0].get("detail", "")))
    if "public" in suites:
        from cases.public import PUBLIC_CASES

        from ..running.public.runner import run_public
        for cid, pc in PUBLIC_CASES.items():
            _, checks = run_public(pc, device, kernel_forward=forward)
            failed = [c for c in checks if not c.ok]
            if failed:
                return done("public", cid, [getattr(c, "verdict", None) or "check-failed" for c in failed],
                            failed[0].name)
    if "generated" in suites:
        from ..running.generated.driver import run_generated
        for kind in ("batch", "engine"):
            outcome = run_generated(kind, device=device, kernel_forward=forward, check_oracle=False,
                                    collect_coverage=False, shrink_calls=1, shrink_s=5.0, repeat_every=0)
            if not outcome.ok:
                return done("generated", kind, [outcome.failure_kind or "failure"])
    return dict(out, wall_s=time.perf_counter() - t0)


def _print_list(console) -> None:
    from .faults import FAULTS, NOT_PLANTED
    for f in FAULTS.values():
        where = f" [device only: {f.device_only}]" if f.device_only else ""
        console.print(f"{f.name:<36} {f.stage:<16} kpool/{f.mutation[0]:<18} expects {f.expected}{where}",
                      markup=False)
    for what, why in NOT_PLANTED.items():
        console.print(f"not planted: {what}: {why}", markup=False)


def selftest_main(args) -> int:
    """Run the ``selftest`` command (module docstring); returns the exit status."""
    from .faults import FAULTS
    from ..reporting.report import make_console
    console = make_console()
    if args.list:
        _print_list(console)
        return 0
    names = args.fault or list(FAULTS)
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        print(f"python -m parity selftest: error: unknown fault(s) {unknown}; see --list", file=sys.stderr)
        return 2
    if args.without_family:
        import os

        from cases.families import FAMILIES_OFF_ENV, families_off
        os.environ[FAMILIES_OFF_ENV] = ",".join(args.without_family)   # spawned workers inherit it
        try:
            families_off()
        except ValueError as exc:
            print(f"python -m parity selftest: error: {exc}", file=sys.stderr)
            return 2
        console.print(f"selftest: input families turned off: {', '.join(args.without_family)}", markup=False)
    from kpool.platform import resolve_device
    device = str(resolve_device(None if args.device == "auto" else args.device))
    skipped = [n for n in names if FAULTS[n].device_only and device == "cpu"]
    run = [n for n in names if n not in skipped]
    t0 = time.perf_counter()
    results = _run_all(run, device, list(args.suite), args.size, max(1, args.jobs), console)
    caught = [r for r in results if r["caught"]]
    for r in results:
        status = f"caught by {r['suite']} ({r['case']}): {r['classes']}" if r["caught"] else "SURVIVED"
        console.print(f"  {r['fault']:<36} {r['stage']:<16} {status}  [{r['wall_s']:.1f} s]", markup=False)
    for n in skipped:
        console.print(f"  {n:<36} {FAULTS[n].stage:<16} device only, not run on cpu: {FAULTS[n].device_only}",
                      markup=False)
    rate = 100.0 * len(caught) / len(results) if results else 100.0
    if args.json:
        import json
        with open(args.json, "w") as fh:
            json.dump(dict(device=device, suites=list(args.suite), results=results, device_only=skipped), fh, indent=1)
    console.print(f"selftest: {len(caught)}/{len(results)} faults caught ({rate:.1f}%) on {device} in "
                  f"{time.perf_counter() - t0:.0f} s; {len(skipped)} device-only not run; suites {','.join(args.suite)}",
                  markup=False)
    return 0 if len(caught) == len(results) else 1


def _run_all(names: List[str], device: str, suites: List[str], size: str, jobs: int, console) -> List[Dict]:
    """:func:`hunt` for every name, in ``jobs`` spawned processes when ``jobs > 1``, in order."""
    if jobs == 1:
        out = []
        for n in names:
            out.append(hunt(n, device, suites, size))
            console.print(f"  ... {n}: {'caught' if out[-1]['caught'] else 'SURVIVED'}", markup=False)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import as_completed
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(hunt, n, device, suites, size): n for n in names}
        for f in as_completed(futures):
            console.print(f"  ... {futures[f]}: {'caught' if f.result()['caught'] else 'SURVIVED'}", markup=False)
        return [f.result() for f in futures]


def summary_rows(results: List[Dict]) -> Optional[str]:
    """Markdown table of :func:`hunt` results (for docs/validation.md)."""
    lines = ["| fault | stage | caught by | classes | s |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['fault']} | {r['stage']} | {r['suite'] or 'SURVIVED'} {r['case'] or ''} | "
                     f"{r['classes']} | {r['wall_s']:.1f} |")
    return "\n".join(lines)
