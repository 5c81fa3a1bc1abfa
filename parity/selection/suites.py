"""The case suites behind ``python -m parity run --suite ...`` (parity-contract.md §1).

* ``corpus``: every kept shrunk failure (:mod:`cases.corpus`), replayed first;
* ``seed``: the named seed scenarios (:mod:`cases.scenarios`);
* ``public``: the public failure cases C01..C31 with their stated values (:mod:`cases.public`,
  run by :mod:`parity.running.public`);
* ``generated``: a profile's budget of hypothesis-generated batches and engine sequences
  (:mod:`parity.running.generated`), with coverage accounting; a shrunk failure is kept in the run's
  ``corpus-candidates`` directory (:func:`parity.sessions.commands.candidates_dir`), never in the checkout;
* ``all`` (the default of the CLI and of ``make parity``): the four, in that order.

``corpus`` and ``seed`` are plain case lists and go through :func:`parity.sessions.commands.execute`
(reports, bundles, ``--repeat``, relations); ``public`` and ``generated`` print their own tables.
``--shard i/n`` keeps every ``n``-th unit of the run (:mod:`parity.selection.shard`). The exit status is
the worst of the parts (0 ok, 1 failure, 2 usage error); the run ends with one summary line per
suite.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

from ..sessions.commands import EXIT_OK, EXIT_USAGE, usage_error

SUITES = ("all", "corpus", "seed", "public", "generated")
PARTS = ("corpus", "seed", "public", "generated")
SIZES = ("small", "glm5.3-flash")
"""The seed case sizes ``--size`` selects from (``all``: both)."""
GENERATED_KINDS = ("batch", "engine")


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
    from cases.corpus import default_directory, entries
    from cases.public import PUBLIC_CASES
    from cases.scenarios import SCENARIOS
    seed = set(SCENARIOS) | {f"{n}[{s}]" for n in SCENARIOS for s in SIZES}
    if all(n in seed for n in names):
        return "seed"
    if all(n in PUBLIC_CASES for n in names):
        return "public"
    corpus = {p.stem for p in entries(default_directory())}
    if all(n in corpus or n.split("[", 1)[0] in corpus for n in names):
        return "corpus"
    return "seed"


def corpus_cases(directory=None) -> List:
    """The corpus entries to replay with the production kernels, as cases (every entry: a
    ``fail:<mutant>`` entry documents a planted fault and must pass on the real kernels)."""
    from cases.corpus import default_directory, load_all
    return [case for case, _ in load_all(directory or default_directory())]


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


def _case_list(args, parts, console):
    """The corpus and seed cases of the run and ``{case_id: suite}`` (``--case`` applied by the caller)."""
    cases, part_of = [], {}
    if "corpus" in parts:
        corpus = corpus_cases()
        console.print(f"[bold]corpus[/]: {len(corpus)} kept shrunk failures (cases/corpus), replayed first")
        cases += corpus
        part_of.update({c.case_id: "corpus" for c in corpus})
    if "seed" in parts:
        from cases.scenarios import seed_cases
        sizes = list(SIZES) if args.size == "all" else [args.size]
        seeds = [offset_seeds(c, args.seed) for c in seed_cases(sizes)]
        cases += seeds
        part_of.update({c.case_id: "seed" for c in seeds})
    return cases, part_of


def run_suite(args, device: str, console, *, prog: str = "python -m parity run") -> int:
    """Run ``args.suite`` (only ``args.shard``'s units when set) and print the results.
    Returns the exit status."""
    from rich.markup import escape

    from cases.public import PUBLIC_CASES

    from ..sessions import commands
    from .generated_suite import run_generated_suite
    from .public_suite import run_public_suite
    from .shard import shard_units, write_manifest

    parts = suite_parts(args.suite)
    if args.case and len(parts) > 1:
        return usage_error(f"{prog}: error: --case needs one suite (--suite seed, corpus or public), not all")
    try:
        from ..implementations import resolve
        implementation = resolve(args.kernel)
        semantics = commands.run_semantics(args)
        kernel_forward = semantics.forward(implementation.forward)
    except Exception as exc:
        return usage_error(f"{prog}: error: cannot load kernel {args.kernel!r}: {type(exc).__name__}: {exc}")
    if {"public", "generated"} & set(parts):
        ignored = [flag for flag, used in (("--mode resync", args.mode != "lockstep"),
                                           ("--repeat", args.repeat is not None),
                                           ("--metamorphic", args.metamorphic is not None),
                                           ("--jobs", getattr(args, "jobs", 1) not in (0, 1))) if used]
        if ignored:
            console.print(f"note: {', '.join(ignored)} apply to corpus and seed cases only; public and "
                          "generated cases run lockstep, once, in this process", markup=False)
    # The units of the whole run, in order: corpus and seed cases, public cases, generated kinds.
    case_list, part_of = _case_list(args, parts, console)
    if case_list:
        try:
            case_list = select_cases(case_list, args.case) if args.case else case_list
        except KeyError as exc:
            return usage_error(f"{prog}: error: {exc.args[0]}")
    public_ids = []
    if "public" in parts:
        wanted = list(args.case or []) if args.suite == "public" else []
        unknown = [c for c in wanted if c not in PUBLIC_CASES]
        if unknown:   # a typo must not silently run (and pass) every public case
            return usage_error(f"{prog}: error: unknown public case(s) {unknown}; known: {', '.join(PUBLIC_CASES)}")
        public_ids = wanted or list(PUBLIC_CASES)
    kinds = list(GENERATED_KINDS) if "generated" in parts else []
    units = [c.case_id for c in case_list] + public_ids + [f"generated:{k}" for k in kinds]
    unit_parts = {**part_of, **{c: "public" for c in public_ids}, **{f"generated:{k}": "generated" for k in kinds}}
    shard = getattr(args, "shard", None)
    mine = set(shard_units(units, shard))
    if shard is not None:
        console.print(f"[bold]shard {shard[0]}/{shard[1]}[/]: {len(mine)} of the run's {len(units)} units")
        case_list = [c for c in case_list if c.case_id in mine]
        public_ids = [c for c in public_ids if c in mine]
        kinds = [k for k in kinds if f"generated:{k}" in mine]
    if args.report:
        write_manifest(args.report, shard=shard, units=units, ran=[u for u in units if u in mine], suite=args.suite,
                       parts=unit_parts)

    status = EXIT_OK
    counts: dict = {}
    if case_list:
        status = max(status, commands.execute(case_list, args, device, console, record=args.command == "record",
                                              prog=prog, parts=part_of, counts=counts))
    if args.command == "record" and ({"public", "generated"} & set(parts)):
        console.print("note: record writes bundles for corpus and seed cases only; public cases are rerun by "
                      "name (--suite public --case Cxx), a failing generated case is kept in "
                      "REPORT/corpus-candidates", markup=False)
    if public_ids:
        from ..running.isolation import should_isolate
        isolate = should_isolate(args.kernel, getattr(args, "isolate", "auto"))
        status = max(status, run_public_suite(args, device, console, cids=public_ids, kernel_forward=kernel_forward,
                                              counts=counts, semantics=semantics, package=implementation.package,
                                              isolate=isolate))
    if kinds:
        from ..running.isolation import should_isolate
        status = max(status, run_generated_suite(args, device, console, kinds=kinds, kernel_forward=kernel_forward,
                                                 counts=counts, semantics=semantics,
                                                 isolate=should_isolate(args.kernel, getattr(args, "isolate", "auto"))))
    if len(parts) > 1 and status != EXIT_USAGE:
        from ..reporting.report import summary_line
        console.print("[bold]suites:[/]")
        for part in parts:
            if part in counts:
                c = counts[part]
                line = summary_line(c) if "checks" in c else c["line"]
                console.print(escape(f"  {part:<10} {line}"))
    return status
