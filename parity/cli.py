"""Command line of the parity harness: ``python -m parity COMMAND`` (parity-contract.md).

* ``run``: resolve the device first (``kpool.platform.resolve_device``: for ``cpu`` it sets
  ``TRITON_INTERPRET=1``, which must happen before any ``kpool.ops`` kernel is imported), then run
  the selected suites (:mod:`parity.selection.suites`; default ``all`` = corpus, seed, public, generated at
  both sizes, exactly what ``make parity`` runs), print a summary and the non-``exact`` rows,
  write reports (``--report DIR``, JUnit ``--junit FILE``) and a repro bundle of every failing
  case (:mod:`parity.sessions.commands`);
* ``record``: the same, with a bundle of every corpus and seed case;
* ``replay BUNDLE``: rerun a bundle in a fresh process on any device (:mod:`parity.verbs.replay`);
* ``corpus add PATH``: promote a run's shrunk failure (``REPORT/corpus-candidates/NAME.json``)
  into ``cases/corpus`` (a run never writes there itself);
* ``merge REPORT_DIR...``: combine the reports of a sharded run (``run --shard i/n`` on each
  host) into the report the unsharded run would have written (:mod:`parity.verbs.merge`);
* ``ab --baseline IMPL --candidate IMPL``: two implementations bit for bit (:mod:`parity.verbs.ab`);
* ``golden record|check DIR``: device goldens of every step's outputs (:mod:`parity.verbs.golden`);
* ``bisect GOOD BAD --case NAME``: the first revision whose kernels change a case (:mod:`parity.verbs.bisect`);
* ``selftest``: plant every fault of the catalog and report which suite catches it (:mod:`parity.verbs.selftest`);
* ``list cases|mutants|relations|implementations``: what ``--case``, ``--kernel mutant:NAME``,
  ``--metamorphic`` and ``--kernel SPEC`` can select.

Building the parser imports no torch, so ``--help`` answers at once.

Exit status: 0 all checks pass, 1 at least one failure finding, 2 usage error (bad option,
unknown case, unavailable device); ``replay``: see :mod:`parity.verbs.replay`.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .selection.shard import parse_shard
from .selection.suites import SIZES, SUITES

DEFAULT_SUITE = "all"
DEFAULT_SIZE = "all"
"""The CLI's defaults, equal to the Makefile's ``SUITE ?= all`` / ``SIZE ?= all`` (a test checks)."""
LIST_TOPICS = ("cases", "mutants", "relations", "implementations")
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of every command (module docstring); imports no torch."""
    from .verbs.ab import add_ab_parser
    from .verbs.bisect import add_bisect_parser
    from .verbs.golden import add_golden_parser
    from .verbs.replay import add_replay_parser
    from .verbs.selftest import add_selftest_parser
    parser = argparse.ArgumentParser(prog="python -m parity",
                                     description="Bit-exact parity of the KPool Triton kernels vs the PyTorch reference.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run parity suites and report every check",
                         description="Run the parity suites (default: all of them at both sizes, as make parity "
                                     "does); exit 1 on any failure finding (a repro bundle is written for every "
                                     "failing case). Writes only under --report DIR (default ./parity-out).")
    _add_run_arguments(run)
    record = sub.add_parser("record", help="run cases and write a repro bundle for each, pass or fail",
                            description="Like run, but writes a repro bundle for every corpus and seed case. "
                                        "Public cases are not bundled (their stated-value checks live "
                                        "in cases/public/: rerun one with --suite public --case Cxx); "
                                        "a failing generated case is kept in REPORT/corpus-candidates.")
    _add_run_arguments(record)
    add_replay_parser(sub)
    add_ab_parser(sub)
    add_golden_parser(sub)
    add_bisect_parser(sub)
    add_selftest_parser(sub)
    merge = sub.add_parser("merge", help="combine the reports of a sharded run (run --shard i/n) into one",
                           description="Combine the --report directories of the shards of one run (python -m "
                                       "parity run --shard i/n --report DIR on each host) into the report the "
                                       "unsharded run would have written: the same rows in the same order. Exit 0 "
                                       "when the merged run passes, 1 on any failure, 2 for missing or "
                                       "inconsistent shards.")
    merge.add_argument("reports", nargs="+", metavar="REPORT_DIR", help="one --report directory per shard")
    merge.add_argument("--out", default=None, metavar="DIR",
                       help="write the merged report here (default: ./parity-out)")
    merge.add_argument("--junit", metavar="FILE", help="also write the merged JUnit XML here")
    corpus = sub.add_parser("corpus", help="promote a run's shrunk failure into cases/corpus",
                            description="The corpus of shrunk failures (cases/corpus) changes only here: a run "
                                        "keeps its new shrunk failures in REPORT/corpus-candidates.")
    csub = corpus.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    add = csub.add_parser("add", help="copy candidate entries (NAME.json + NAME.pt) into the corpus")
    add.add_argument("paths", nargs="+", metavar="PATH", help="a candidate's .json (or a directory of them)")
    add.add_argument("--name", default=None, help="entry name (one PATH only; default: the candidate's)")
    add.add_argument("--dir", default=None, help="corpus directory (default: $KPOOL_CORPUS_DIR or cases/corpus)")
    add.add_argument("--force", action="store_true", help="replace an entry of the same name")
    lst = sub.add_parser("list", help="what --case, --kernel (mutant:NAME, other kinds) and --metamorphic can select")
    lst.add_argument("topic", choices=LIST_TOPICS)
    return parser


def _add_run_arguments(run) -> None:
    """Options shared by ``run`` and ``record``."""
    from .sessions import commands
    run.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                     help="kernel device; cpu = Triton interpreter (default: auto, npu > cuda > cpu)")
    run.add_argument("--suite", default=None, choices=SUITES,
                     help="case suite: all (default: corpus, seed, public, generated, in that order), or one of "
                          "them (parity.selection.suites); with --case, the suite that has those cases")
    run.add_argument("--profile", default=None, choices=("ci", "dev", "device", "nightly"),
                     help="hypothesis profile of the generated suite (default: $HYPOTHESIS_PROFILE, else ci on "
                          "cpu, device otherwise; cases.profiles)")
    run.add_argument("--size", default=DEFAULT_SIZE, choices=SIZES + ("all",),
                     help="seed case sizes (default: all)")
    run.add_argument("--seed", type=int, default=0, help="offset added to every case and step seed (default: 0)")
    run.add_argument("--case", nargs="+", default=None, metavar="NAME",
                     help="only these cases (by name or name[size]; needs one --suite; python -m parity list cases)")
    run.add_argument("--report", metavar="DIR",
                     help="write results.csv, results.json, summary.md, timings.csv, bundles/ and "
                          f"corpus-candidates/ here (default for bundles and candidates: ./{commands.DEFAULT_OUT})")
    run.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    run.add_argument("--no-oracle", action="store_true", help="skip the reference-vs-oracle check")
    run.add_argument("--oracle", default="history", choices=("history", "hf"),
                     help="hf: also compare the kernel with Hugging Face's Glm5NextTextIndexer on the corpus and "
                          "seed cases (needs the [hf] extra; skipped with the reason when it is missing; "
                          "docs/hf-oracle.md); default: history (the whole-history oracle only)")
    run.add_argument("--mode", default="lockstep", choices=("lockstep", "resync"),
                     help="lockstep (default) or resync (reference gets the kernel's caches before each step)")
    run.add_argument("--all-rows", action="store_true",
                     help="print every checked row (default: a summary and the non-exact rows; files keep all rows)")
    run.add_argument("--failures-only", action="store_true", help="print only failing rows (files keep all rows)")
    run.add_argument("--jobs", type=_jobs, default=1, metavar="N|auto",
                     help="worker processes, one device each (round robin; parity.running.parallel); default 1; "
                          "auto (make parity's default): up to 2 on the CPU interpreter for this checkout's kernels, "
                          "else 1")
    run.add_argument("--shard", type=parse_shard, default=None, metavar="I/N",
                     help="run only shard I of N of the run's cases (0 <= I < N; every N-th case, deterministic; "
                          "combine the shards' --report directories with python -m parity merge)")
    commands.add_run_options(run)


def _jobs(text: str) -> int:
    """``--jobs``: a positive int, or ``auto`` (0: :func:`parity.sessions.session.run_cases` decides)."""
    return 0 if text == "auto" else _positive_int(text)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _run(args) -> int:
    from .reporting.report import make_console
    console = make_console()
    # 1. Device first: nothing may import kpool.ops before this.
    from kpool.errors import KPoolUnsupportedError
    from kpool.platform import resolve_device
    try:
        device = resolve_device(None if args.device == "auto" else args.device)
    except KPoolUnsupportedError as exc:
        print(f"python -m parity {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # 2. The suites (parity.selection.suites picks each suite's cases; parity.sessions.commands runs them).
    from .selection.suites import run_suite, suite_of_cases
    if args.suite is None:
        args.suite = suite_of_cases(args.case, args.size) if args.case else DEFAULT_SUITE
    return run_suite(args, device, console, prog=f"python -m parity {args.command}")


def _corpus(args) -> int:
    from pathlib import Path

    from cases.corpus import entries, promote
    paths = []
    for p in map(Path, args.paths):
        paths += entries(p) if p.is_dir() else [p]
    if not paths:
        print(f"python -m parity corpus add: error: no corpus entries in {args.paths}", file=sys.stderr)
        return EXIT_USAGE
    if args.name and len(paths) > 1:
        print("python -m parity corpus add: error: --name needs exactly one entry", file=sys.stderr)
        return EXIT_USAGE
    for p in paths:
        try:
            target = promote(p, args.dir, name=args.name, force=args.force)
        except (FileNotFoundError, FileExistsError, ValueError) as exc:
            print(f"python -m parity corpus add: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"added {target} (and {target.with_suffix('.pt').name}); make test and make parity replay it first")
    return EXIT_OK


def _list(args) -> int:
    if args.topic == "implementations":
        from .implementations import usages
        for usage in usages():
            print(f"--kernel {usage}")
        return EXIT_OK
    if args.topic == "mutants":
        from .implementations.mutants import MUTANTS, PLANTED_FAULTS
        generated = {m: f for f, m in PLANTED_FAULTS.items()}
        for name, (rel, _, _, verdict) in MUTANTS.items():
            extra = f"; found by the generators: {generated[name]}" if name in generated else ""
            print(f"mutant:{name:<32} kpool/{rel:<16} expected verdict {verdict}{extra}")
        return EXIT_OK
    if args.topic == "relations":
        from .checking.metamorphic import RELATIONS
        from .sessions.session import DEVICE_DECODE_RELATIONS
        on_device = set(DEVICE_DECODE_RELATIONS["cuda"])
        for name, fn in RELATIONS.items():
            doc = (fn.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
            default = " [default on cuda/npu: seed decode steps]" if name in on_device else ""
            print(f"{name:<18} {' '.join(doc.split())}{default}")
        return EXIT_OK
    from cases.corpus import default_directory, entries
    from cases.public import PUBLIC_CASES
    from cases.scenarios import SCENARIOS, SIZES as CASE_SIZES
    print(f"seed (--suite seed; sizes {', '.join(CASE_SIZES)}):")
    for name, fn in SCENARIOS.items():
        print(f"  {name:<22} {' '.join((fn.__doc__ or '').split())[:110]}")
    print("public (--suite public):")
    for cid, pc in PUBLIC_CASES.items():
        print(f"  {cid:<22} {pc.title}")
    print(f"corpus (--suite corpus; {default_directory()}):")
    for p in entries(default_directory()):
        print(f"  {p.stem}")
    return EXIT_OK


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
        from .verbs.replay import replay_main
        return replay_main(args)
    if args.command == "ab":
        from .verbs.ab import ab_main
        return ab_main(args)
    if args.command == "golden":
        from .verbs.golden import golden_main
        return golden_main(args)
    if args.command == "bisect":
        from .verbs.bisect import bisect_main
        return bisect_main(args)
    if args.command == "selftest":
        from .verbs.selftest import selftest_main
        return selftest_main(args)
    if args.command == "merge":
        from .verbs.merge import merge_main
        return merge_main(args)
    if args.command == "corpus":
        return _corpus(args)
    if args.command == "list":
        return _list(args)
    parser.error(f"unknown command {args.command!r}")  # unreachable: argparse checks choices
    return EXIT_USAGE
