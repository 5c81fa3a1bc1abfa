"""Grow the corpus with the shrunk cases of the planted faults: ``python -m parity.verbs.grow [--device cpu]``.

For each fault of :data:`parity.implementations.mutants.PLANTED_FAULTS`, the generator that finds it under the
``ci`` budget (:data:`FINDERS`) runs against that mutant; the shrunk failure is written to
``cases/corpus/planted-<mutant>.json`` + ``.pt`` with ``"expect": "fail:<mutant>"``: replayed with
the production kernels it must pass, replayed with the mutant it must still fail
(``tests/test_corpus.py``). This is an explicit developer command; a run never writes the
corpus (``--suite generated`` saves its shrunk failures in the run's ``corpus-candidates``, and
``python -m parity corpus add PATH`` promotes one).
"""
from __future__ import annotations

import argparse
import sys

FINDERS = {"visible-off-by-one": "batch", "ring-stash-gated-on-pool-slot": "engine",
           "ring-capacity-p": "batch", "padding-slot-minus-one": "engine"}
"""Mutant -> the generator (``batch`` / ``engine``) whose ci budget finds it."""


def main(argv=None) -> int:
    """Entry point; returns the exit status (1 when a planted fault was not found)."""
    parser = argparse.ArgumentParser(prog="python -m parity.verbs.grow", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda", "npu"))
    parser.add_argument("--dir", default=None, help="corpus directory (default cases/corpus)")
    args = parser.parse_args(argv)
    from kpool.platform import resolve_device
    device = resolve_device(None if args.device == "auto" else args.device)
    from cases.corpus import default_directory, describe, save_case
    from cases.profiles import load_profile

    from ..implementations.mutants import PLANTED_FAULTS, load_mutant
    from ..running.generated.driver import run_generated
    prof = load_profile("ci")
    status = 0
    for fault, mutant in PLANTED_FAULTS.items():
        out = run_generated(FINDERS[mutant], device=device, profile=prof, kernel_forward=load_mutant(mutant).forward,
                            examples=prof.fault_examples, shrink_calls=400, repeat_every=0,
                            collect_coverage=False, guaranteed=False)
        if out.case is None:
            print(f"{mutant}: NOT FOUND in {out.examples} examples", file=sys.stderr)
            status = 1
            continue
        verdicts = sorted(set(out.result.failures["verdict"]))
        path = save_case(out.case, args.dir or default_directory(), name=f"planted-{mutant}",
                         expect=f"fail:{mutant}", found_by=f"generated-{FINDERS[mutant]} (ci profile)",
                         fault=f"planted: {fault} (parity.implementations.mutants {mutant!r}); verdicts {verdicts}",
                         note="documents what the generators catch; passes on the production kernels")
        print(f"{mutant}: found after {out.passed_examples} passing examples, {out.examples} run; {path}")
        print("\n".join("  " + line for line in describe(out.case)))
    return status


if __name__ == "__main__":
    sys.exit(main())
