"""The cases of a kernel-vs-kernel run (``ab``, ``golden``; parity-contract.md §1), selected with
``run``'s options (``--suite``, ``--size``, ``--case``, ``--seed``, ``--profile``) from the same
suites (:mod:`parity.selection.suites`):

* ``corpus`` / ``seed``: :func:`parity.selection.suites._case_list` and :func:`parity.selection.suites.select_cases`;
* ``public``: every case each public failure case builds (``cases.public``), run as
  :mod:`parity.running.public.runner` runs them (checked reference, the case's oracle setting);
* ``generated``: the profile's guaranteed-coverage cases (``cases.coverage_cases``) plus its
  example budget drawn from the strategies with the profile's seed (0 when it has none): a fixed
  list, so both implementations (or a golden and its check) see the same cases. No shrinking:
  a difference names the drawn case.

Building the parser imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

from .suites import SIZES, SUITES


@dataclass(frozen=True)
class Selected:
    """One case of the run.

    Attributes:
        key: unique name in the run (``case_id``; public cases ``Cxx:name[size]``, generated
            ``generated:KIND#i``). case: :class:`cases.spec.Case`. suite: the suite it came from.
        check_oracle: check the reference against the whole-history oracle.
        reference_forward: the reference side (``None``: ``reference.stateful.forward``).
        must_fail: a public negative control (its reference findings are expected).
    """

    key: str
    case: object
    suite: str
    check_oracle: bool = True
    reference_forward: Optional[Callable] = None
    must_fail: bool = False


def add_selection_arguments(p, *, default_suite: str = "seed", default_size: str = "small") -> None:
    """``--device``, ``--suite``, ``--size``, ``--case``, ``--seed``, ``--profile``, ``--no-oracle``
    (the meanings of ``run``'s options; defaults: a quick selection)."""
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                   help="device both sides run on; cpu = Triton interpreter (default: auto, npu > cuda > cpu)")
    p.add_argument("--suite", default=default_suite, choices=SUITES,
                   help=f"case suite (parity.selection.suites; default: {default_suite}); all = corpus, seed, public, generated")
    p.add_argument("--size", default=default_size, choices=SIZES + ("all",),
                   help=f"seed case sizes (default: {default_size})")
    p.add_argument("--case", nargs="+", default=None, metavar="NAME",
                   help="only these cases (name, name[size], Cxx for --suite public; python -m parity list cases)")
    p.add_argument("--seed", type=int, default=0, help="offset added to every case and step seed (default: 0)")
    p.add_argument("--profile", default=None, choices=("ci", "dev", "device", "nightly"),
                   help="hypothesis profile of the generated suite (default: ci on cpu, device otherwise)")
    p.add_argument("--no-oracle", action="store_true", help="skip the reference-vs-oracle check")


def selected_cases(args, device: str, console) -> List[Selected]:
    """The cases ``args`` selects on ``device``, in suite order.

    Raises:
        KeyError: an unknown case name (message lists the known ones); ValueError: ``--case``
        with ``--suite all``.
    """
    from .suites import _case_list, select_cases, suite_parts
    parts = suite_parts(args.suite)
    if args.case and len(parts) > 1:
        raise ValueError("--case needs one suite (--suite seed, corpus, public or generated), not all")
    cases, part_of = _case_list(args, parts, console)
    if args.case and cases:
        cases = select_cases(cases, args.case)
    out = [Selected(c.case_id, c, part_of[c.case_id], check_oracle=not args.no_oracle) for c in cases]
    if "public" in parts:
        out += _public(args)
    if "generated" in parts:
        out += _generated(args, device)
    return out


def _public(args) -> List[Selected]:
    from cases.public import PUBLIC_CASES

    from ..checking.checked_reference import checked_reference
    wanted = list(args.case or []) if args.suite == "public" else list(PUBLIC_CASES)
    unknown = [c for c in wanted if c not in PUBLIC_CASES]
    if unknown:
        raise KeyError(f"unknown public case(s) {unknown}; known: {', '.join(PUBLIC_CASES)}")
    out = []
    for cid in wanted:
        pc = PUBLIC_CASES[cid]
        for case in pc.build():
            out.append(Selected(f"{cid}:{case.case_id}", case, "public", check_oracle=pc.check_oracle and not args.no_oracle,
                                reference_forward=checked_reference(), must_fail=case.name in pc.must_fail))
    return out


def _generated(args, device: str) -> List[Selected]:
    from cases.coverage_cases import guaranteed_cases
    from cases.profiles import load_profile
    from cases.strategies import batch_cases, engine_cases

    from ..checking.checked_reference import checked_reference
    from ..running.family_cases import family_cases
    prof = load_profile(args.profile or ("ci" if device == "cpu" else "device"))
    if args.case:
        raise KeyError("--case does not select generated cases (they have no stable names); drop --case")
    out = []
    for kind, strategy, n in (("batch", batch_cases(prof.bounds), prof.batch_examples),
                              ("engine", engine_cases(prof.bounds), prof.engine_examples)):
        drawn = guaranteed_cases(kind, prof.bounds) + family_cases(kind) + draw(strategy, n, prof.seed or 0)
        out += [Selected(f"generated:{kind}#{i}", case, "generated", check_oracle=not args.no_oracle,
                         reference_forward=checked_reference()) for i, case in enumerate(drawn)]
    return out


def draw(strategy, n: int, seed: int) -> list:
    """``n`` examples of a hypothesis ``strategy`` in the fixed order of ``seed`` (no shrinking,
    no example database; fewer when hypothesis stops early)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    if n <= 0:
        return []
    out: list = []

    @hypothesis_seed(seed)
    @settings(max_examples=n, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case):
        out.append(case)

    collect()
    return out[:n]
