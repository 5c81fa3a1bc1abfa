"""Declared modes (``Implementation.supports``) and the ``unsupported by IMPL`` outcome (issue 18,
item 2), and the harness validation in front of a non-validating implementation (item 3).

A step that needs a mode the implementation declares it does not have (``no-tail``,
``fixed-tail``, ``output-buffer``) is one ``unsupported`` row: the operator is never called, the
step is neither a crash nor a failure, later steps still compare (the kernel side takes the
reference's caches), and the reports count it. Stand-ins: :mod:`tests.standin_impls` (this
checkout's kernels with a reduced ``supports``).

Costs (2-core CPU): unit tests about 6 s together (three small seed cases and two bad-input
cases in process); the CLI test (integration) about 6 s user time (one worker start).
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from parity.findings.vocabulary import UNSUPPORTED, is_failure
from parity.implementations import resolve
from parity.implementations.semantics import (RunSemantics, UnsupportedModeError, gated_by_modes, modes_needed,
                                              resolve_semantics)
from parity.running.runner import run_case
from tests.helpers import parity_cli as _cli



def _seed(name: str):
    from cases.scenarios import seed_cases
    return next(c for c in seed_cases(["small"]) if c.name == name)


def test_modes_needed_reads_the_call():
    assert modes_needed({}) == frozenset()
    assert modes_needed({"always_select_tail": False, "pack_tail": False, "output_buffer": object()}) \
        == {"no-tail", "fixed-tail", "output-buffer"}
    assert modes_needed({"always_select_tail": True, "pack_tail": True, "output_buffer": None}) == frozenset()


def test_the_gate_refuses_before_the_operator_is_called():
    calls = []
    gated = gated_by_modes(lambda **kw: calls.append(kw), frozenset({"fixed-tail"}), "x:y")
    gated(pack_tail=False)
    with pytest.raises(UnsupportedModeError, match="unsupported by x:y.*output-buffer"):
        gated(pack_tail=False, output_buffer=object())
    assert len(calls) == 1
    assert gated_by_modes(len, None) is len                      # None: every mode, no wrapper
    with pytest.raises(ValueError, match="unknown mode"):
        gated_by_modes(len, {"no-such-mode"})


def test_a_module_function_implementation_declares_its_modes():
    impl = resolve("tests.standin_impls:no_output_buffer")
    assert impl.spec == "tests.standin_impls:no_output_buffer" and impl.supports == {"no-tail", "fixed-tail"}
    sem = resolve_semantics(impl)
    assert sem.supports == ("fixed-tail", "no-tail") and "supports=fixed-tail,no-tail" in sem.text()
    assert resolve_semantics(resolve("kpool")).supports is None


def _run(spec: str, case, device):
    impl = resolve(spec)
    sem = resolve_semantics(impl)
    return run_case(sem.case(case), device=device, kernel_forward=sem.forward(impl.forward))


def test_unsupported_output_buffer_steps_are_counted_and_the_rest_still_compares(device):
    """``full-padding``: steps 1-3 hand a caller buffer (unsupported), step 4 (after them) must
    still be exact: it reads caches the unsupported steps wrote on the reference side."""
    res = _run("tests.standin_impls:no_output_buffer", _seed("full-padding"), device)
    f = res.findings
    unsupported = f[f["verdict"] == UNSUPPORTED]
    assert sorted(unsupported["step"].tolist()) == [1, 2, 3]
    assert unsupported["detail"].str.contains("unsupported by tests.standin_impls:no_output_buffer").all()
    assert unsupported["detail"].str.contains("output-buffer").all()
    assert res.ok and res.steps_run == 5 and not f["verdict"].map(is_failure).any()
    last = f[f["step"] == 4]
    assert set(last["output"]) >= {"indices", "compressed_cache", "tail_ring"} and (last["verdict"] == "exact").all()


def test_a_case_whose_every_step_needs_a_missing_mode(device):
    res = _run("tests.standin_impls:no_modes", _seed("prefill-topk-no-tail"), device)
    f = res.findings
    assert (f.loc[f["output"] == "forward[kernel]", "verdict"] == UNSUPPORTED).sum() == len(res.findings["step"].unique())
    assert res.ok and "no-tail" in f.loc[f["verdict"] == UNSUPPORTED, "detail"].iloc[0]


@pytest.mark.parametrize("name", ["bad-arguments", "bad-metadata"])
def test_the_harness_validation_rejects_every_bad_input_step_before_the_operator(name, device):
    """``--validate-with kpool`` in front of a non-validating operator: no bad step reaches it
    (an empty compressed cache read out of bounds by a vendor operator killed the process)."""
    from kpool.indexer import forward
    seen = []

    def operator(**kw):
        seen.append(kw["compressed_cache"].shape[0])
        return forward(**kw)
    case = _seed(name)
    sem = RunSemantics(validate_with="kpool")
    res = run_case(case, device=device, kernel_forward=sem.forward(operator), check_oracle=False)
    good_steps = [s for s in case.steps if s.expect_error is None]
    assert len(seen) == len(good_steps) == 2 and 0 not in seen
    assert res.ok
    bad = res.findings[res.findings["step_name"].str.startswith("bad:") & (res.findings["output"] == "error")]
    assert len(bad) == len(case.steps) - 2 and bad["detail"].str.contains("not validated by the operator").all()



@pytest.mark.integration
def test_cli_reports_unsupported_steps_and_exits_0(tmp_path):
    out = _cli("run", "--kernel", "tests.standin_impls:no_output_buffer", "--suite", "seed", "--size", "small",
               "--case", "full-padding", "--report", str(tmp_path / "r"), "--junit", str(tmp_path / "j.xml"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "3 unsupported by IMPL" in out.stdout and "0 failures" in out.stdout
    summary = json.loads((tmp_path / "r" / "results.json").read_text())["summary"]
    assert summary["unsupported"] == 3 and summary["failures"] == 0 and summary["findings"] == 0
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert root.get("skipped") == "3" and root.get("failures") == "0"
    assert len(root.findall(".//skipped[@message='unsupported by IMPL']")) == 3
    assert "3 unsupported by IMPL" in (tmp_path / "r" / "summary.md").read_text()


def test_the_supports_flag_overrides_the_declared_modes():
    no_modes = resolve("tests.standin_impls:no_modes")
    assert resolve_semantics(no_modes).supports == ()
    assert resolve_semantics(no_modes, supports=["all"]).supports is None
    assert resolve_semantics(resolve("kpool"), supports=["no-tail"]).supports == ("no-tail",)
