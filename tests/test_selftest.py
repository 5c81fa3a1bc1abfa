"""The planted-fault catalog of ``python -m parity selftest`` (parity.verbs.faults; issue 13): every
fault's mutation applies to today's kpool, every fault changes the source, and a small sample is
caught end to end (integration)."""
import pathlib

import pytest

from parity.verbs.faults import FAULTS, NOT_PLANTED
from parity.implementations.mutants import apply_mutation

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
    from cases.bad_arguments import CORRUPTIONS
    assert {f"rule:{r}" for r in (*VIOLATIONS, *CORRUPTIONS)} <= set(FAULTS)
    assert {r: RULES[r].error for r in CORRUPTIONS} == {r: e for r, (_, e) in CORRUPTIONS.items()}
    planted = {n[5:] for n in FAULTS if n.startswith("rule:")}
    # every rule validate_forward raises has a fault, except the one NOT_PLANTED names
    forward_rules = {"positions-int32-window", *planted}
    assert forward_rules <= set(RULES) and "positions-int32-window" in NOT_PLANTED
    cpu = [f for f in FAULTS.values() if not f.device_only]
    assert len(cpu) >= 30 and NOT_PLANTED


@pytest.mark.integration
@pytest.mark.parametrize("name", ["rule:slot-duplicate", "rule:dtype", "bf16-truncate", "chunk-last-skipped"])
def test_sample_fault_is_caught(name, device):
    from parity.verbs.selftest import hunt
    r = hunt(name, device, ["corpus", "seed"], "small")
    assert r["caught"], r


@pytest.mark.integration
@pytest.mark.parametrize("scenario", ["bad_metadata", "bad_arguments"])
def test_bad_input_steps_reject_with_their_rule(scenario, device):
    """The real kernels pass every bad-input step (each raises its rule's class and name)."""
    import cases.scenarios as S
    from parity.running.runner import run_case
    case = getattr(S, scenario)("small")
    res = run_case(case, device=device)
    assert res.ok, res.failures
    errors = res.findings[res.findings["output"] == "error"]
    assert len(errors) == len([s for s in case.steps if s.expect_error]) and set(errors["verdict"]) == {"exact"}
