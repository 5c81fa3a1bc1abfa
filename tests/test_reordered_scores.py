"""Certified parity for scores accumulated in another order (issue 10 point 5; docs/certificates.md §5).

Stand-in forwards (tests/certificate_cases.py) are the reference with its scores computed the way
a fast kernel does -- fp32 ``torch.matmul``, reversed ``d``/``h`` order, pairwise sums -- on the
same caches. On the random-data seed cases they must pass, their differing rows certified
``tie-equivalent`` (GLM-5.3-Flash size: the only seed case with near-ties at the K_pool boundary
is ``prefill-topk``); a planted fault that only moves scores slightly (head 0's weight times
``1 + 2^-10``) must not be certified; exact-data cases stay bitwise; and the planted kernel faults
of :mod:`parity.implementations.mutants` keep their failure classes with no certified finding.
"""
from __future__ import annotations

import dataclasses

import pytest

from cases.scenarios import seed_cases
from parity.reporting.report import certified_counts
from tests.certificate_cases import SCORERS, run, standin_forward

# the stand-ins do not validate: seed cases with bad-input steps (bad-metadata, bad-arguments)
# test validation, which the production kernels do (tests/test_validation.py)
VALID_SMALL = [c for c in seed_cases(("small",)) if not any(s.expect_error for s in c.steps)]
RANDOM_SMALL = [c for c in VALID_SMALL if c.values == "random"]
EXACT_SMALL = [c for c in VALID_SMALL if c.values == "exact"]
FAULT = 1 + 2.0 ** -10


def _glm(name):
    (case,) = [c for c in seed_cases(("glm5.3-flash",)) if c.name == name]
    return case


def _merged(case):
    return dataclasses.replace(case, config=case.config.with_(score_mode="merged"))


def _certified_rows(res) -> int:
    ties = res.findings[(res.findings["output"] == "indices") & (res.findings["verdict"] == "tie-equivalent")]
    return sum(int(d.split()[0]) for d in ties["detail"])


@pytest.mark.parametrize("scorer", sorted(SCORERS))
@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_reordered_scoring_passes_the_small_seed_cases(scorer, mode):
    """Small size (H=2, D=16): other orders change no selection on the seed cases (bitwise), on
    random and exact data alike."""
    for case in RANDOM_SMALL + EXACT_SMALL:
        case = _merged(case) if mode == "merged" else case
        res = run(case, standin_forward(SCORERS[scorer]), check_oracle=False)
        assert res.ok, (case.name, res.failures[["step", "verdict", "detail"]].to_string())
        assert set(res.findings["verdict"]) == {"exact"}


@pytest.mark.slow
def test_exact_data_stays_bitwise_at_glm_size():
    """GLM-5.3-Flash pool-boundary-decode (exact data): pairwise sums give bit-identical scores,
    every check is exact, no certificate is involved."""
    res = run(_glm("pool-boundary-decode"), standin_forward(SCORERS["pairwise"]), check_oracle=False)
    assert res.ok and set(res.findings["verdict"]) == {"exact"}


@pytest.mark.slow
@pytest.mark.parametrize("scorer, mode", [("reversed", "relu"), ("matmul", "merged")])
def test_reordered_scoring_is_certified_at_glm_size(scorer, mode):
    """GLM-5.3-Flash prefill-topk (H=32, D=128, K_pool=512): the reordered rows differ from the
    reference's at near-ties and are certified; the report counts them per output."""
    case = _glm("prefill-topk")
    case = _merged(case) if mode == "merged" else case
    res = run(case, standin_forward(SCORERS[scorer]), check_oracle=False)
    assert res.ok, res.failures[["step", "verdict", "detail"]].to_string()
    assert _certified_rows(res) >= 3
    counts = certified_counts(res.findings).set_index("output")
    assert counts.loc["indices", "elements"] > 0 and counts.loc["compressed_cache", "elements"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["decode-tail", "full-padding"])
def test_a_slight_head_weight_fault_is_not_certified(name):
    """Head 0's weight times 1 + 2^-10 moves scores by about 2^-15 of their size, below the
    any-order bound for many rows (those are certified), but not for all: the case fails with
    wrong-index rows that say why they are no tie."""
    res = run(_glm(name), standin_forward(head0_weight_scale=FAULT), check_oracle=False)
    assert not res.ok
    bad = res.failures
    assert set(bad["verdict"]) == {"wrong-index"} and set(bad["output"]) == {"indices"}
    assert bad["detail"].str.contains("not a tie").all() and bad["detail"].str.contains("bounds").any()


def test_a_head_weight_fault_fails_small_and_exact_cases():
    """Small size: the fault changes no selection of the random seed cases (nothing to certify,
    nothing differs); on exact data a larger weight fault (x 1.5) changes rows and nothing is
    certified."""
    for case in RANDOM_SMALL:
        res = run(case, standin_forward(head0_weight_scale=FAULT), check_oracle=False)
        assert "tie-equivalent" not in set(res.findings["verdict"])
    failed = [run(c, standin_forward(head0_weight_scale=1.5), check_oracle=False) for c in EXACT_SMALL]
    assert any(not r.ok for r in failed)
    for res in failed:
        assert not {"tie-equivalent", "rounding-boundary"} & set(res.findings["verdict"])


MUTANT_CASES = {"prefill-topk": ("visible-off-by-one", "ape-reversed", "tail-wrong-column",
                                 "ring-stash-gated-on-pool-slot", "chunk-offset")}
ONLY_CHUNKED = {"chunk-offset"}   # reachable only through prefill-topk's chunked step


@pytest.mark.integration
def test_planted_mutants_stay_uncertified(device):
    """Every planted fault of parity.implementations.mutants on the small random full-padding seed case (which
    catches all of them), on prefill-topk for the faults that change index rows, and on its
    corpus entry: the expected failure class, and no certified finding at all."""
    from cases import corpus
    from kpool.platform import resolve_device
    from parity.implementations.mutants import MUTANTS, expected_verdict, load_mutant
    resolve_device(device)
    by_name = {c.name: c for c in RANDOM_SMALL}
    saved = {corpus.mutant_of(info): case for case, info in map(corpus.load_case, corpus.entries())}
    for name in MUTANTS:
        mutant = load_mutant(name)
        cases = [] if name in ONLY_CHUNKED else [by_name["full-padding"]]
        cases += [by_name[c] for c, names in MUTANT_CASES.items() if name in names]
        cases += [saved[name]] if name in saved else []
        for case in cases:
            res = run(case, mutant.forward, check_oracle=False)
            assert expected_verdict(name) in set(res.failures["verdict"]), (name, case.name)
            assert not {"tie-equivalent", "rounding-boundary"} & set(res.findings["verdict"]), (name, case.name)


def test_console_states_certified_counts_per_output_zeros_included():
    """``python -m parity run`` prints one certified line per certifiable output, zeros too."""
    import io

    from rich.console import Console

    from parity.sessions.commands import _print_certified
    from tests.certificate_cases import swapping_kernel, tie_case
    out = io.StringIO()
    _print_certified(run(tie_case(), swapping_kernel(2)).findings, Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    assert lines == ["certified indices: 24 tie-equivalent elements in 1 steps (max 24 in one step)",
                     "certified compressed_cache: 0 rounding-boundary elements in 0 steps (max 0 in one step)"]
