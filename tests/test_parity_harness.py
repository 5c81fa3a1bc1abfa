"""Tests of the parity harness itself (parity/): reports, the CLI, the runner with stand-in
forwards, and planted kernel faults (sentinels and comparators: tests/test_comparators.py).

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_parity_harness.py``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
import torch

from cases.spec import Case, CacheGeometry, OutputBufferSpec, Step
from kpool.config import SMALL
from kpool.errors import KPoolBlockIdError
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from parity.checking import compare as cmp
from parity.reporting import report
from tests.helpers import compare_rows, index_rows, padded_batch
from parity.checking.compare import assert_bitwise_equal, same_bits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P, K, W, D = SMALL.index_kpool, SMALL.index_topk, SMALL.output_width, SMALL.index_head_dim  # 4, 8, 11, 16
C = SMALL.ring_capacity  # 4


# --------------------------------------------------------------------------- report, CLI

def _sample_findings():
    meta, ref = index_rows()
    kern = ref.clone()
    kern[5, 0, 1] += 1
    rows = compare_rows(kern, ref, meta) + cmp.compare_ring(torch.zeros(1, 2, C, D), torch.zeros(1, 2, C, D))
    return cmp.findings_frame(rows, case="demo|case", size="small", step=0, step_name="prefill")


def test_write_report_outputs_parse(tmp_path):
    df = _sample_findings()
    paths = report.write_report(df, tmp_path / "rep", wall_s=1.5)
    csv = pd.read_csv(paths["csv"])
    assert len(csv) == 2 and list(csv["verdict"]) == ["wrong-index", "exact"]
    assert csv.loc[0, "first_mismatch"].startswith("row=5 pos=5 req=0 col=1 pool=")
    data = json.load(open(paths["json"]))
    assert data["summary"]["failures"] == 1 and data["summary"]["checks"] == 2
    assert data["results"][0]["row"] == 5 and data["results"][1]["row"] is None
    md = open(paths["markdown"]).read()
    assert md.startswith("# KPool parity report") and "FAIL: 1 cases, 1 steps, 2 checks" in md
    assert "| demo\\|case | small | 0 | indices | wrong-index |" in md
    junit = ET.parse(report.write_junit(df, tmp_path / "j" / "junit.xml")).getroot()
    suite = junit.find("testsuite")
    assert suite.get("failures") == "1" and suite.get("tests") == "2"


def test_print_results_summary_line():
    """The console shows the summary, the non-exact rows and the first failures' expected and
    actual values; ``all_rows`` shows the exact rows too."""
    from rich.console import Console
    console = Console(record=True, width=200)
    summary = report.print_results(_sample_findings(), wall_s=2.0, console=console)
    text = console.export_text()
    assert summary["failures"] == 1 and "FAIL: 1 cases, 1 steps, 2 checks, 1 findings, 1 failures" in text
    assert "wrong-index" in text and "tail_ring" not in text
    assert "expected 6, got 7" in text
    console = Console(record=True, width=200)
    report.print_results(_sample_findings(), console=console, all_rows=True)
    assert "tail_ring" in console.export_text()


@pytest.mark.integration
def test_cli_help_and_usage_errors():
    env = dict(os.environ, PYTHONPATH=ROOT)
    for args in (["--help"], ["run", "--help"]):
        proc = subprocess.run([sys.executable, "-m", "parity", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "usage: python -m parity" in proc.stdout
    from parity.cli import main
    assert main(["run", "--size", "huge"]) == 2
    assert main([]) == 2


def test_cli_import_does_not_load_kernels():
    code = ("import sys, parity.cli, parity.running.runner, parity.reporting.report, parity.checking.compare, parity.implementations.mutants; "
            "bad = [m for m in ('triton', 'kpool.ops.compress', 'kpool.ops.indexer', 'cases.scenarios') "
            "if m in sys.modules]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_seed_offset_and_case_selection():
    from parity.selection.suites import offset_seeds, select_cases
    case = _tiny_case()
    shifted = offset_seeds(case, 10)
    assert shifted.seed == case.seed + 10 and [s.seed for s in shifted.steps] == [s.seed + 10 for s in case.steps]
    assert select_cases([case], ["tiny[small]"]) == [case]
    with pytest.raises(KeyError):
        select_cases([case], ["nope"])


# --------------------------------------------------------------------------- runner

def _tiny_case(**changes):
    """Prefill of two requests (7 and 10 tokens, permuted pages), then a FULL-mode decode with
    stale positive ring slots in the padding rows and a strided, wider output buffer."""
    geo = CacheGeometry(num_pages=8, page_size=2, num_tail_blocks=3, page_padding=3, ring_block_padding=5, guard=16)
    steps = [
        Step("prefill", BatchSpec([RequestSpec(0, 7, [4, 1], 0), RequestSpec(0, 10, [2, 6], 1)]),
             request_ids=[0, 1], seed=1),
        Step("decode-padded", BatchSpec([RequestSpec(7, 1, [4, 1], 0), RequestSpec(10, 1, [2, 6], 1)],
                                        num_tokens=4, full_mode=True, stale_tail_slots=True),
             request_ids=[0, 1], seed=2, output_buffer=OutputBufferSpec(capacity=6, width=13, row_step=2)),
    ]
    return dataclasses.replace(Case("tiny", "small", SMALL, geo, steps, seed=5), **changes)


def _reference_forward():
    from reference.stateful import forward
    return forward


def _outputs(res):
    return set(res.findings["output"])


def test_run_case_reference_against_itself_is_exact():
    res = run_case_cpu(_tiny_case(), kernel_forward=_reference_forward())
    assert res.ok, res.failures
    assert res.steps_run == 2 and set(res.findings["verdict"]) == {"exact"}
    assert {"indices", "compressed_cache", "tail_ring", "reference-vs-oracle",
            "sentinel:compressed_cache[kernel]", "sentinel:tail_ring[reference]",
            "sentinel:output_buffer[kernel]"} <= _outputs(res)
    assert set(res.timings["side"]) == {"kernel", "reference", "oracle"}


def run_case_cpu(case, **kw):
    """Run on the session's device (the CPU interpreter unless pytest ran with --device)."""
    import os
    from parity.running.runner import run_case
    return run_case(case, device=os.environ.get("KPOOL_DEVICE", "cpu"), **kw)


def test_run_case_reports_stray_write_into_guard():
    ref = _reference_forward()

    def leaky(**kw):
        out = ref(**kw)
        cc = kw["compressed_cache"]
        torch.as_strided(cc, (1,), (1,), 3).view(torch.int16).fill_(0)   # guard band before page 0
        return out
    res = run_case_cpu(_tiny_case(), kernel_forward=leaky, check_oracle=False)
    bad = res.failures
    assert set(bad["verdict"]) == {"stray-write"} and set(bad["output"]) == {"sentinel:compressed_cache[kernel]"}
    assert set(bad["region"]) == {"guard-before"}


def test_run_case_reports_missing_write_and_lockstep_vs_resync():
    ref = _reference_forward()
    calls = []

    def forgetful(**kw):   # step 0 computes on a copy and never writes the compressed cache back
        calls.append(1)
        if len(calls) == 1:
            return ref(**{**kw, "compressed_cache": kw["compressed_cache"].clone()})
        return ref(**kw)
    res = run_case_cpu(_tiny_case(), kernel_forward=forgetful, check_oracle=False)
    step0 = res.failures[res.failures["step"] == 0]
    assert {("sentinel:compressed_cache[kernel]", "missing-write"), ("compressed_cache", "nan-introduced")} <= \
        set(zip(step0["output"], step0["verdict"]))
    # lockstep: the kernel's caches stay wrong in step 1; resync hands them to the reference
    assert (res.failures["step"] == 1).any()
    calls.clear()
    res = run_case_cpu(_tiny_case(), kernel_forward=forgetful, check_oracle=False, mode="resync")
    assert not (res.failures["step"] == 1).any() and (res.failures["step"] == 0).any()
    with pytest.raises(ValueError):
        run_case_cpu(_tiny_case(), mode="sideways")


def test_run_case_expected_error_and_crash():
    def bad_blocks(meta):
        meta.block_table[0, 0] = 99
        return meta
    step = Step("bad-block", BatchSpec([RequestSpec(0, 8, [0, 1], 0)]), request_ids=[0],
                patch_metadata=bad_blocks, expect_error=KPoolBlockIdError)
    case = _tiny_case(steps=[step])

    def rejecting(**kw):
        raise KPoolBlockIdError("block 99 out of range")

    def rejecting_ref(**kw):
        raise ValueError("block 99 out of range")

    def writes_then_raises(**kw):
        kw["tail_cache"].fill_(0.0)
        raise KPoolBlockIdError("too late")
    res = run_case_cpu(case, kernel_forward=rejecting, reference_forward=rejecting_ref)
    assert res.ok and res.findings.loc[res.findings["output"] == "error", "verdict"].tolist() == ["exact"]
    res = run_case_cpu(case, kernel_forward=_reference_forward(), reference_forward=rejecting_ref)
    assert "not-rejected" in set(res.failures["verdict"])
    res = run_case_cpu(case, kernel_forward=writes_then_raises, reference_forward=rejecting_ref)
    assert {"stray-write", "ring-mismatch"} <= set(res.failures["verdict"])

    def boom(**kw):
        raise RuntimeError("kernel exploded")
    res = run_case_cpu(_tiny_case(), kernel_forward=boom, check_oracle=False)
    assert res.steps_run == 1 and "crash" in set(res.failures["verdict"])
    assert "forward[kernel]" in set(res.failures["output"])


# --------------------------------------------------------------------------- mutants

def test_mutation_substrings_occur_once():
    from parity.implementations.mutants import MUTANTS, apply_mutation
    import kpool
    base = os.path.dirname(kpool.__file__)
    for name, (rel, old, new, verdict) in MUTANTS.items():
        path = os.path.join(base, rel)
        if not os.path.exists(path):
            pytest.skip(f"{rel} not written yet")
        assert apply_mutation(open(path).read(), old, new) != old
        assert verdict in cmp.VERDICTS and cmp.is_failure(verdict)
    with pytest.raises(AssertionError):
        apply_mutation("a a", "a", "b")
    with pytest.raises(AssertionError):
        apply_mutation("abc", "x", "y")


def test_load_mutant_mechanism_with_metadata_mutation():
    from parity.implementations.mutants import load_mutant
    mutation = ("metadata.py", "tail_slot_mapping[row] = req.ring_block * C + p % C",
                "tail_slot_mapping[row] = req.ring_block * C + (p + 1) % C", None)
    mod = load_mutant("test-ring-slot", mutation=mutation, module="metadata")
    assert mod.__name__ == "kpool_mutant_test_ring_slot.metadata"
    batch = padded_batch()
    good = build_metadata(batch, index_kpool=P, ring_capacity=C, page_size=2)
    bad = mod.build_metadata(batch, index_kpool=P, ring_capacity=C, page_size=2)
    assert_bitwise_equal(good.slot_mapping, bad.slot_mapping)
    assert not same_bits(good.tail_slot_mapping, bad.tail_slot_mapping)
    # the unmutated package is untouched
    assert "(p + 1) % C" not in open(sys.modules["kpool.metadata"].__file__).read()


@pytest.mark.interpreter_ok
def test_kernels_match_reference_on_tiny_case():
    res = run_case_cpu(_tiny_case())
    assert res.ok, report.results_table(res.failures)[["step", "output", "verdict", "first_mismatch", "detail"]]


@pytest.mark.interpreter_ok
@pytest.mark.parametrize("name", ["visible-off-by-one", "ape-reversed", "tail-wrong-column", "padding-row-writes"])
def test_planted_kernel_fault_is_caught(name):
    from parity.implementations.mutants import expected_verdict, load_mutant
    mutant = load_mutant(name)
    # One padded prefill step covers all four faults (keeps the interpreter time down). Ring block
    # 0 belongs to no request, so the padding rows' stale slots (block 0) are outside the write set.
    step = Step("prefill-padded", BatchSpec([RequestSpec(0, 7, [4, 1], 1), RequestSpec(0, 10, [2, 6], 2)],
                                            num_tokens=20, full_mode=True, stale_tail_slots=True),
                request_ids=[0, 1], seed=1, output_buffer=OutputBufferSpec(capacity=21, width=12, row_step=1))
    res = run_case_cpu(_tiny_case(steps=[step]), kernel_forward=mutant.forward, check_oracle=False)
    assert expected_verdict(name) in set(res.failures["verdict"]), res.failures


# ---- blind spots found by an adversarial trial ---------------------------------------------------

def _full_padding_small():
    from cases.scenarios import full_padding
    return full_padding("small")


def test_result_that_is_not_the_output_buffer_is_wrong_index():
    """A forward that returns correct rows but leaves other values in the caller's buffer fails."""
    from parity.running.runner import run_case
    from reference.stateful import forward

    def returns_a_copy(**kw):
        out = forward(**kw)
        if kw.get("output_buffer") is None or out is None:
            return out
        copy = out.clone()
        kw["output_buffer"][0, 0] += 1          # the buffer no longer holds what was returned
        return copy

    case = _full_padding_small()
    assert any(s.output_buffer for s in case.steps)
    res = run_case(case, device=os.environ.get("KPOOL_DEVICE", "cpu"), kernel_forward=returns_a_copy,
                   check_oracle=False)
    bad = res.failures[res.failures["output"] == "indices"]
    assert not bad.empty and set(bad["verdict"]) == {"wrong-index"}
    first = bad.iloc[0]
    assert "output_buffer" in first["detail"] and first["row"] == 0 and first["column"] == 0


def test_forward_that_writes_its_inputs_is_a_stray_write():
    """Inputs (and the metadata every layer shares) are read-only: an in-place write is reported."""
    from parity.running.runner import run_case
    from reference.stateful import forward

    def clobbers_inputs(**kw):
        out = forward(**kw)
        kw["positions"].zero_()
        kw["k"][0, 0] = float("nan")
        return out

    res = run_case(_full_padding_small(), device=os.environ.get("KPOOL_DEVICE", "cpu"),
                   kernel_forward=clobbers_inputs, check_oracle=False)
    bad = res.failures[res.failures["output"] == "inputs[kernel]"]
    assert set(bad["verdict"]) == {"stray-write"} and set(bad["region"]) == {"positions", "k"}
    assert (res.findings["output"] == "inputs[reference]").sum() == 0
