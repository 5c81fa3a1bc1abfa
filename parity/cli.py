"""Command line of the parity harness: ``python -m parity run ...`` (parity-contract.md).

``run`` resolves the device first (``kpool.platform.resolve_device``: for ``cpu`` it sets
``TRITON_INTERPRET=1``, which must happen before any ``kpool.ops`` kernel is imported), builds the
seed scenarios (``cases.scenarios.seed_cases``), runs every case with
:func:`parity.runner.run_case`, prints the results table and a summary line, and optionally writes
CSV/JSON/markdown (``--report DIR``) and JUnit XML (``--junit FILE``), and writes a repro bundle of
every failing case (:mod:`parity.commands`, :mod:`parity.bundle`). ``record`` takes the same options
and writes a bundle for every case; ``replay BUNDLE`` reruns one in a fresh process on any device.

Exit status: 0 all checks pass, 1 at least one failure finding, 2 usage error (bad option,
unknown case, unavailable device); ``replay``: 0 the recorded findings were reproduced, 1 not.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import List, Optional, Sequence

SIZES = ("small", "glm5.3-flash")
SUITES = ("seed", "all", "corpus", "public", "generated")
"""``seed`` (default) runs here; the others are :mod:`cases.suites` (``all`` = corpus, seed, public
cases with their stated values, a generated budget with coverage; what ``make parity`` runs)."""
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser: ``run``, ``record`` (same options; a repro bundle for every case) and
    ``replay BUNDLE`` (:mod:`parity.commands`)."""
    from . import commands
    parser = argparse.ArgumentParser(prog="python -m parity",
                                     description="Bit-exact parity of the KPool Triton kernels vs the PyTorch reference.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run parity cases and report every check",
                         description="Run the parity cases; exit 1 on any failure finding (a repro bundle "
                                     "is written for every failing case).")
    _add_run_arguments(run)
    record = sub.add_parser("record", help="run cases and write a repro bundle for each, pass or fail",
                            description="Like run, but writes a repro bundle for every corpus and seed case. "
                                        "Public cases are not bundled (their stated-value checks live "
                                        "in cases/public.py: rerun one with --suite public --case Cxx); "
                                        "a failing generated case is kept in cases/corpus.")
    _add_run_arguments(record)
    commands.add_replay_parser(sub)
    return parser


def _add_run_arguments(run) -> None:
    """Options shared by ``run`` and ``record``."""
    from . import commands
    run.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                     help="kernel device; cpu = Triton interpreter (default: auto, npu > cuda > cpu)")
    run.add_argument("--suite", default="seed", choices=SUITES,
                     help="case suite: seed (default), corpus, public, generated, or all of them in that "
                          "order with the corpus first (cases.suites)")
    run.add_argument("--profile", default=None, choices=("ci", "dev", "device", "nightly"),
                     help="hypothesis profile of --suite generated/all (default: $HYPOTHESIS_PROFILE, else ci on "
                          "cpu, device otherwise; cases.profiles)")
    run.add_argument("--size", default="small", choices=SIZES + ("all",), help="case sizes (default: small)")
    run.add_argument("--seed", type=int, default=0, help="offset added to every case and step seed (default: 0)")
    run.add_argument("--case", nargs="+", default=None, metavar="NAME",
                     help="only these cases (by name or name[size])")
    run.add_argument("--report", metavar="DIR", help="write results.csv, results.json, summary.md, timings.csv here")
    run.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    run.add_argument("--no-oracle", action="store_true", help="skip the reference-vs-oracle check")
    run.add_argument("--mode", default="lockstep", choices=("lockstep", "resync"),
                     help="lockstep (default) or resync (reference gets the kernel's caches before each step)")
    run.add_argument("--failures-only", action="store_true", help="print only failing rows (files keep all rows)")
    run.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                     help="worker processes, one device each (round robin; parity.parallel); default 1")
    commands.add_run_options(run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def offset_seeds(case, offset: int):
    """``case`` with ``offset`` added to its seed and every step's seed (``--seed``)."""
    if not offset:
        return case
    steps = [dataclasses.replace(s, seed=s.seed + offset) for s in case.steps]
    return dataclasses.replace(case, seed=case.seed + offset, steps=steps)


def select_cases(cases: Sequence, names: Optional[Sequence[str]]) -> List:
    """Cases whose ``name`` or ``case_id`` is in ``names`` (all when ``names`` is None).

    Raises:
        KeyError: a name matches no case (message lists the available names).
    """
    if not names:
        return list(cases)
    wanted = set(names)
    known = {c.name for c in cases} | {c.case_id for c in cases}
    unknown = sorted(wanted - known)
    if unknown:
        hint = "; public cases C01..C31 need --suite public" if any(u.upper().startswith("C") for u in unknown) else ""
        if any("[" in u for u in unknown):
            hint += "; name[size] needs that size selected (--size all or --size SIZE)"
        raise KeyError(f"unknown case(s) {unknown}; available: {sorted({c.name for c in cases})}{hint}")
    return [c for c in cases if c.name in wanted or c.case_id in wanted]


def _run(args) -> int:
    from rich.markup import escape

    from .report import make_console
    console = make_console()
    # 1. Device first: nothing may import kpool.ops before this.
    from kpool.errors import KPoolUnsupportedError
    from kpool.platform import resolve_device
    try:
        device = resolve_device(None if args.device == "auto" else args.device)
    except KPoolUnsupportedError as exc:
        print(f"python -m parity run: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # 2. Cases. Suites other than seed (corpus, public, generated, all) live in cases.suites.
    if args.suite != "seed":
        from cases.suites import run_suite
        return run_suite(args, device, console, prog=f"python -m parity {args.command}")
    try:
        from cases.scenarios import seed_cases
    except ImportError as exc:
        print(f"python -m parity run: error: cannot load the seed scenarios ({exc})", file=sys.stderr)
        return EXIT_USAGE
    sizes = list(SIZES) if args.size == "all" else [args.size]
    try:
        cases = select_cases(seed_cases(sizes), args.case)
    except KeyError as exc:
        print(f"python -m parity run: error: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    cases = [offset_seeds(c, args.seed) for c in cases]
    # 3. Run, report, bundles (parity.commands; parity.parallel for --jobs > 1).
    from . import commands
    return commands.execute(cases, args, device, console, record=args.command == "record",
                            prog=f"python -m parity {args.command}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the exit status (argparse usage errors and ``--help`` included)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    if args.command in ("run", "record"):
        return _run(args)
    if args.command == "replay":
        from .commands import replay_main
        return replay_main(args)
    parser.error(f"unknown command {args.command!r}")  # unreachable: argparse checks choices
    return EXIT_USAGE
