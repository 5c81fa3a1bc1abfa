"""Crash isolation (issue 18, item 3): a crash of the implementation under test, even a segfault
or an abort of its whole process, ends that case as one ``crash`` finding (signal, step, kernel
call, faulthandler trace) with its bundle, and the run reports every other case
(:mod:`parity.running.isolation`). Stand-in: :func:`tests.standin_impls.segfault_on_page_size_4`
(this checkout's kernels; a read of address 0 through ctypes on the one small seed case with
4-row pages, ``non-finite``).

Costs (2-core CPU, user time; wall time doubles under load): unit tests < 0.1 s; integration:
the CLI run about 5 s (two small cases, two worker starts), the abort test about 5 s, ab with a
segfaulting side about 5 s, the public + generated test about 5 s (two worker starts).
"""
from __future__ import annotations

import json

import pytest

from parity.running.isolation import CaseWorker, exit_text, should_isolate
from tests.helpers import parity_cli as _cli

SPEC = "tests.standin_impls:segfault_on_page_size_4"


def test_which_implementations_are_isolated():
    assert not should_isolate("kpool") and not should_isolate("mutant:ape-reversed") and not should_isolate("git:HEAD")
    for spec in ("vllm-ascend:../vllm-ascend", SPEC):
        assert should_isolate(spec) and not should_isolate(spec, "off")
        assert not should_isolate(spec, injected=True)          # a callable cannot be sent to a child
    assert should_isolate("kpool", "on")
    with pytest.raises(ValueError):
        should_isolate("kpool", "sometimes")


def test_exit_text_names_the_signal():
    assert exit_text(-11) == "killed by signal SIGSEGV (11)" and exit_text(-6) == "killed by signal SIGABRT (6)"
    assert exit_text(3) == "exit code 3" and exit_text(None) == "exit status unknown"



@pytest.mark.integration
def test_a_segfaulting_implementation_is_one_crash_finding_and_the_other_case_passes(tmp_path):
    out = _cli("run", "--kernel", SPEC, "--suite", "seed", "--size", "small", "--case", "non-finite", "prefill-tail",
               "--report", str(tmp_path / "r"))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    assert "isolated=yes" in out.stdout and "prefill-tail[small]: 3 steps" in out.stdout
    rows = json.loads((tmp_path / "r" / "results.json").read_text())["results"]
    bad = [r for r in rows if r["verdict"] != "exact"]
    assert len(bad) == 1, bad
    crash = bad[0]
    assert (crash["case"], crash["verdict"], crash["output"], crash["step"]) == ("non-finite", "crash", "process", 0)
    assert "SIGSEGV" in crash["detail"] and "kernel call 1" in crash["detail"] and "string_at" in crash["detail"]
    assert {r["case"] for r in rows if r["verdict"] == "exact"} == {"prefill-tail"}
    bundle = tmp_path / "r" / "bundles" / "non-finite-small"
    assert (bundle / "case.json").is_file() and "crash" in (bundle / "findings.csv").read_text()


@pytest.mark.integration
def test_an_abort_is_a_crash_and_a_fresh_worker_takes_the_next_case(monkeypatch):
    from cases.scenarios import seed_cases
    from parity.implementations.semantics import RunSemantics
    monkeypatch.setenv("PARITY_TEST_CRASH", "abort")         # inherited by the spawned worker
    cases = {c.name: c for c in seed_cases(["small"])}
    with CaseWorker(SPEC, RunSemantics(), "cpu") as worker:
        first = worker.run_case(cases["prefill-tail"], {"check_oracle": False})
        crashed = worker.run_case(cases["non-finite"], {"check_oracle": False})
        after = worker.run_case(cases["prefill-tail"], {"check_oracle": False})
        assert worker.starts == 2                               # one start, one replacement: not one per case
    assert first.ok and after.ok and after.steps_run == 3
    assert not crashed.ok and list(crashed.findings["verdict"]) == ["crash"]
    assert "SIGABRT" in crashed.findings["detail"].iloc[0] and crashed.first_divergent_step == 0


@pytest.mark.integration
def test_ab_against_a_segfaulting_side_reports_the_crash():
    out = _cli("ab", "--baseline", "kpool", "--candidate", SPEC, "--suite", "seed", "--size", "small",
               "--case", "non-finite", "--device", "cpu")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    assert "differ" in out.stdout and "candidate 1 failures" in out.stdout


@pytest.mark.integration
def test_public_and_generated_runs_survive_a_segfault():
    """A public case and a generated kind whose implementation segfaults at its first call: one
    crash each, reported (not a dead run)."""
    from cases.public import PUBLIC_CASES
    from parity.implementations.semantics import RunSemantics
    with CaseWorker("tests.standin_impls:segfault_always", RunSemantics(), "cpu") as worker:
        (crashed,) = worker.public_results(PUBLIC_CASES["C07"], None)
        gen = worker.run_generated("batch", {"examples": 1, "check_oracle": False})
    assert crashed.case_id.startswith("C07:") and list(crashed.findings["verdict"]) == ["crash"]
    assert "SIGSEGV" in crashed.findings["detail"].iloc[0]
    assert gen.failure_kind == "crash" and "SIGSEGV" in str(gen.error)


@pytest.mark.integration
def test_an_isolated_generated_failure_comes_back_as_its_finding():
    """A wrong answer found by the generated suite in a worker comes back as that parity failure
    (its case and findings), not as a dead worker: the failure must survive the trip back
    (before, its exception could not be rebuilt, the pool broke and the run said SIGTERM)."""
    from parity.implementations.semantics import RunSemantics
    with CaseWorker("tests.standin_impls:tail_column_off", RunSemantics(), "cpu") as worker:
        gen = worker.run_generated("batch", {"examples": 2, "check_oracle": False})
        assert worker.starts == 1                               # the worker lived
    assert not gen.ok and gen.failure_kind == "parity", (gen.failure_kind, gen.error)
    assert "generated case failed" in str(gen.error) and "SIGTERM" not in str(gen.error)


@pytest.mark.integration
def test_a_generated_case_that_kills_the_worker_is_one_crash_and_the_rest_still_runs():
    """The generated engine cases on an implementation that segfaults on token rows with no
    request (the empty-steps guaranteed case, as 3ebb4fc4 does): that case comes back as one
    ``crash`` finding naming it, and every other case runs in a fresh worker and passes (before,
    the dead worker ended the whole kind: "0 examples run, FAILED (crash)")."""
    from parity.implementations.semantics import RunSemantics
    with CaseWorker("tests.standin_impls:segfault_on_requestless_rows", RunSemantics(), "cpu") as worker:
        gen = worker.run_generated("engine", {"examples": 3, "check_oracle": False})
        assert worker.starts == 2                              # one crash, one fresh worker
    assert not gen.ok and gen.failure_kind == "crash", (gen.failure_kind, gen.error)
    assert len(gen.crashes) == 1
    case, res = gen.crashes[0]
    assert (gen.case, gen.result) == (case, res)
    assert any(not s.batch.requests and (s.batch.num_tokens or 0) > 0 for s in case.steps), case.case_id
    crash = res.failures
    assert list(crash["verdict"]) == ["crash"] and "SIGSEGV" in crash["detail"].iloc[0]
    assert case.case_id in str(gen.error) and "fresh worker" in str(gen.error)
    # the rest ran: the guaranteed cases after it and the drawn examples, all passing
    assert gen.passed_examples >= 3 and gen.examples > gen.passed_examples


def _raise_on_requestless_rows(**kwargs):
    from parity.implementations.semantics import requestless_rows
    from tests.standin_impls import kpool_forward
    if requestless_rows(kwargs):
        raise RuntimeError("planted: token rows with no request")
    return kpool_forward(**kwargs)


def test_a_skipped_case_is_matched_by_its_id(device):
    """A case that killed a worker is skipped in the fresh one by its id even when it is not drawn
    bit for bit again (its fingerprint then differs): the skip lists ids and fingerprints. (On the
    session's device: a compiled session's kernels cannot run under the interpreter in-process.)"""
    from parity.running.generated.driver import run_generated
    out = run_generated("engine", device=device, examples=1, check_oracle=False, kernel_forward=_raise_on_requestless_rows)
    assert not out.ok and out.case.case_id == "coverage-empty-steps[generated]", out.error
    out = run_generated("engine", device=device, examples=1, check_oracle=False, kernel_forward=_raise_on_requestless_rows,
                        skip=frozenset({"coverage-empty-steps[generated]"}))
    assert out.ok, out.error


def test_generated_failures_survive_pickling():
    import pickle

    from parity.api import ParityFailure as ApiFailure
    from parity.running.generated.driver import HarnessCrash, Nondeterministic, ParityFailure
    from types import SimpleNamespace
    case = SimpleNamespace(case_id="x[generated]")
    for exc in (ParityFailure("case", "result", "message"), HarnessCrash(case, ValueError("v")),
                Nondeterministic(case, ["d"]), ApiFailure("m", "outcome", None, None)):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)


def test_an_isolated_case_keeps_the_implementations_bitwise_claim(monkeypatch):
    """A vendor operator claims no output bitwise (its cache gets the rounding certificate): the
    child worker must run the case with that claim, not kpool's default."""
    import multiprocessing

    from parity.implementations.semantics import RunSemantics
    from parity.running import isolation, runner
    seen = {}

    def fake_run_case(case, **kwargs):
        seen.update(kwargs)
        raise LookupError("stop after the call")
    monkeypatch.setattr(runner, "run_case", fake_run_case)
    monkeypatch.setitem(isolation._CHILD, "step", multiprocessing.Value("i", 0))
    with pytest.raises(LookupError):
        isolation._case_task(None, RunSemantics("merged", "any", "kpool", False, bitwise_outputs=()), "cpu",
                             object(), {}, ())
    assert seen["bitwise_outputs"] == ()


# ---- a kernel fault on a device (CUDA's sticky illegal-memory-access error) is a crash ----------

def _broken_context(device):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_failed_device_context_ends_the_worker_with_the_devices_message():
    """On the H200 a vendor kernel's out-of-bounds read left the CUDA context broken, and every
    later case of the worker became a harness crash. After each implementation call the worker
    synchronizes; a broken context writes the device's message to the fault log and exits with
    DEVICE_FAULT_EXIT, which the parent reports like a killed worker (one crash finding)."""
    import io

    from parity.running.device_faults import DEVICE_FAULT_EXIT, call_checked, device_fault, exit_on_device_fault
    from parity.running.isolation import exit_text
    assert device_fault("cpu", _broken_context) is None             # the interpreter has no context
    assert device_fault("cuda", lambda d: None) is None
    assert "illegal memory access" in device_fault("cuda", _broken_context)
    log, codes = io.StringIO(), []
    exit_on_device_fault("cuda", 7, log, ZeroDivisionError("x"), sync=_broken_context, exit_fn=codes.append)
    assert codes == [DEVICE_FAULT_EXIT]
    assert "kernel call 7" in log.getvalue() and "illegal memory access" in log.getvalue()
    assert "ZeroDivisionError" in log.getvalue()
    exit_on_device_fault("cuda", 8, log, sync=lambda d: None, exit_fn=codes.append)   # a working context
    assert codes == [DEVICE_FAULT_EXIT]
    assert exit_text(DEVICE_FAULT_EXIT) == f"the device context failed (exit code {DEVICE_FAULT_EXIT})"
    # on the interpreter an exception of the call propagates untouched (no exit)
    with pytest.raises(ZeroDivisionError):
        call_checked(lambda: 1 // 0, {}, "cpu", 1, log)
    assert call_checked(lambda x: x + 1, {"x": 1}, "cpu", 2, log) == 2
