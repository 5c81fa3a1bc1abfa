"""Issue 19 families 3-6 (cases.structure, cases.unvalidated, cases.size, parity.running.family_cases,
parity.running.size_cases, declared bitwise outputs): the fixed cases pass on the real kernels, each
family's planted faults fail its case, and the exactness faults pass once the claim is switched
off (the rounding certificate accepts them: the evidence that only the claim catches them)."""
import pytest
import torch

from cases.families import FAMILIES_OFF_ENV as OFF_ENV, enabled
from parity.running.family_cases import family_cases


def test_claimed_bitwise_follows_the_declaration_and_the_switch(monkeypatch):
    from parity.implementations import resolve
    from parity.implementations.semantics import KPOOL_BITWISE
    from parity.running.runner import claimed_bitwise
    assert resolve("kpool").bitwise_outputs == KPOOL_BITWISE == ("compressed_cache", "tail_ring")
    assert resolve("mutant:chunk-offset").bitwise_outputs == KPOOL_BITWISE
    assert resolve("parity.running.runner:run_case").bitwise_outputs == ()       # an unknown operator claims nothing
    assert claimed_bitwise(None) == frozenset(KPOOL_BITWISE) and claimed_bitwise(()) == frozenset()
    with pytest.raises(ValueError):
        claimed_bitwise(("cache",))
    monkeypatch.setenv(OFF_ENV, "exactness")
    assert claimed_bitwise(None) == frozenset() and not enabled("exactness") and enabled("structure")
    monkeypatch.setenv(OFF_ENV, "structur")
    with pytest.raises(ValueError):
        enabled("structure")


def test_family_cases_and_the_switch(monkeypatch):
    names = {k: [c.name for c in family_cases(k)] for k in ("batch", "engine")}
    assert names == {"batch": ["structure-chunked-decode", "structure-rearranged", "structure-wide-rows",
                               "exactness-rounding-midpoints", "exactness-merged-iso-scores"],
                     "engine": ["structure-shared-prefix", "unvalidated-stale-metadata"]}
    monkeypatch.setenv(OFF_ENV, "structure,unvalidated,exactness")
    assert family_cases("batch") == [] and family_cases("engine") == []


def test_boundary_windows_sit_on_bf16_midpoints():
    from cases.genvalues import random_ape
    from parity.running.family_cases import boundary_windows
    from reference.numerics import pooled_fp32
    ape = random_ape(4, 16, 19)
    k, gate = boundary_windows(ape, 8, torch.Generator().manual_seed(3))
    low = pooled_fp32(k, gate, ape).view(torch.int32) & 0xFFFF
    near = ((low - 0x8000).abs() <= 2).float().mean()
    assert near >= 0.9, near          # random windows: about 5 / 65536


def test_stale_slots_are_rejected_validated_and_rewritten_only_on_noncompleting_rows():
    from cases.steps import step_metadata
    from cases.structure import unvalidated_case
    from cases.unvalidated import runs_unvalidated
    case = unvalidated_case()
    step = case.steps[1]
    assert runs_unvalidated(step) and not runs_unvalidated(case.steps[0])
    stale = step_metadata(case, step)
    clean = step_metadata(case, type(step)(**{**step.__dict__, "patch_metadata": None}))
    P = case.config.index_kpool
    completing = (stale.positions + 1) % P == 0
    assert torch.equal(stale.slot_mapping[completing], clean.slot_mapping[completing])
    assert (stale.slot_mapping[~completing] >= 0).all() and (clean.slot_mapping[~completing] == -1).all()


def test_family_coverage_counts():
    from parity.findings.coverage import Coverage
    cov = Coverage()
    for kind in ("batch", "engine"):
        for case in family_cases(kind):
            cov.add(case)
    assert {k: cov.classes[k] for k in ("chunk starts at a decode/MTP row", "decode/MTP request across chunks",
                                        "same counts, new arrangement", "row wider than 4096 pools",
                                        "shared prefix pages", "logical pools > physical rows",
                                        "unvalidated stale metadata", "pooled values on rounding midpoints",
                                        "merged pools on iso-score lines")} == {
        "chunk starts at a decode/MTP row": 5, "decode/MTP request across chunks": 3,
        "same counts, new arrangement": 3, "row wider than 4096 pools": 2, "shared prefix pages": 4,
        "logical pools > physical rows": 4, "unvalidated stale metadata": 4, "pooled values on rounding midpoints": 2,
        "merged pools on iso-score lines": 1}
    assert not any("NOT EXERCISED" in line for line in cov.lines() if "families" in line)


def test_size_family_is_skipped_on_the_cpu_with_a_reason():
    from parity.running.size_cases import CPU_SKIP, run_size_family
    assert run_size_family("cpu", "ci") == (True, [CPU_SKIP])


CASE_FAULTS = [
    ("structure-chunked-decode", "decode-chunk-straddle-skipped"),
    ("structure-rearranged", "block-ends-cached-by-counts"),
    ("structure-wide-rows", "key-pool-id-from-lane"),
    ("structure-shared-prefix", "pool-bound-by-physical-pages"),
    ("unvalidated-stale-metadata", "compress-wherever-slot"),
    ("exactness-rounding-midpoints", "compress-multiply-before-divide"),
    ("exactness-rounding-midpoints", "compress-reciprocal-division"),
    ("exactness-merged-iso-scores", "merged-qbar-tf32"),
]


def _case(name):
    import cases.structure as S
    from parity.running.family_cases import boundary_values_case, iso_score_case
    builders = (S.chunked_decode_case, S.rearranged_case, S.wide_rows_case, S.shared_prefix_case,
                S.unvalidated_case, boundary_values_case, iso_score_case)
    return next(c for c in (b() for b in builders) if c.name == name)


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted({c for c, _ in CASE_FAULTS}))
def test_family_case_passes_on_kpool(name, device):
    from parity.running.runner import run_case
    res = run_case(_case(name), device=device)
    assert res.ok, res.failures


@pytest.mark.integration
@pytest.mark.parametrize("name,fault", CASE_FAULTS)
def test_family_fault_fails_its_case(name, fault, device, monkeypatch):
    """The fault fails its family's case (the run stops at its first failing step: failing is the
    claim); on the rounding midpoints every step's failures are cache mismatches (a whole run)."""
    from parity.verbs.faults import FAULTS
    from parity.implementations.mutants import load_mutant
    from parity.running.runner import run_case
    forward = load_mutant(fault, mutation=FAULTS[fault].mutation).forward
    midpoints = name == "exactness-rounding-midpoints"
    res = run_case(_case(name), device=device, kernel_forward=forward, check_oracle=False,
                   stop_on_failure=not midpoints)
    assert not res.ok
    if midpoints:                                     # the claim, not the values, catches it
        assert set(res.failures["verdict"]) == {"cache-mismatch"}
        monkeypatch.setenv(OFF_ENV, "exactness")
        off = run_case(_case(name), device=device, kernel_forward=forward, check_oracle=False)
        assert off.ok and (off.findings["verdict"] == "rounding-boundary").any(), off.failures


def test_a_claimed_cache_gets_no_rounding_certificate():
    """The same 1-ulp move across a bf16 midpoint: certified for an operator that claims nothing,
    a cache-mismatch naming the claim for one that claims its cache bitwise."""
    from tests.certificate_cases import run
    from tests.test_certificates import _flipping_kernel, _midpoint_case
    assert run(_midpoint_case(), _flipping_kernel(1)).ok
    res = run(_midpoint_case(), _flipping_kernel(1), bitwise_outputs=("compressed_cache",))
    bad = res.failures[res.failures["output"] == "compressed_cache"]
    assert set(bad["verdict"]) == {"cache-mismatch"} and "claimed bitwise" in bad.iloc[0]["detail"]
