"""The planted-fault catalog of ``python -m parity selftest`` (parity.faults; issue 13): every
fault's mutation applies to today's kpool, every fault changes the source, and a small sample is
caught end to end (integration)."""
import pathlib

import pytest

from parity.faults import FAULTS, NOT_PLANTED
from parity.mutants import apply_mutation

KPOOL = pathlib.Path(__file__).resolve().parents[1] / "kpool"


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_every_fault_applies_and_changes_the_source(name):
    rel, old, new, _ = FAULTS[name].mutation
    src = (KPOOL / rel).read_text()
    mutated = apply_mutation(src, old, new, where=f"kpool/{rel}")   # raises when the target moved
    assert mutated != src
    compile(mutated, rel, "exec")


def test_catalog_size_and_rules():
    from cases.violations import VIOLATIONS
    from kpool.rules import RULES
    assert len(FAULTS) >= 30
    from cases.violations import ERRORS
    assert set(VIOLATIONS) <= set(RULES) and set(ERRORS) == set(VIOLATIONS)
    assert {r: RULES[r].error for r in ERRORS} == ERRORS
    assert {f"rule:{r}" for r in VIOLATIONS} <= set(FAULTS)
    cpu = [f for f in FAULTS.values() if not f.device_only]
    assert len(cpu) >= 30 and NOT_PLANTED


@pytest.mark.integration
@pytest.mark.parametrize("name", ["rule:slot-duplicate", "bf16-truncate", "chunk-last-skipped"])
def test_sample_fault_is_caught(name):
    from parity.selftest import hunt
    r = hunt(name, "cpu", ["corpus", "seed"], "small")
    assert r["caught"], r


@pytest.mark.integration
def test_bad_metadata_steps_reject_with_their_rule():
    """The real kernels pass every bad-metadata step (each raises its rule's class and name)."""
    from cases.scenarios import bad_metadata
    from parity.runner import run_case
    res = run_case(bad_metadata("small"), device="cpu")
    assert res.ok, res.failures
    errors = res.findings[res.findings["output"] == "error"]
    assert len(errors) == len([s for s in bad_metadata("small").steps if s.expect_error]) and \
        set(errors["verdict"]) == {"exact"}
