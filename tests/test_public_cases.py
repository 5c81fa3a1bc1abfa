"""The public failure cases C01..C31 (cases.public, run by parity.running.public; ../shared/cases/public-cases.md).

* every public case passes kernel vs stateful reference vs whole-history oracle, bitwise, with
  its stated values asserted on what the kernel and the reference returned;
* the stated-value checks are real: corrupting the recorded outputs makes them fail, and the
  planted fault of each case's kind (parity.implementations.mutants) makes the case fail;
* ``python -m parity run --suite public`` runs them on any device.

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_public_cases.py``.
"""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from cases.public import PUBLIC_CASES, Check, PublicRun
from parity.checking.compare import bits
from parity.running.public.runner import run_public, stated_checks

_RUNS: dict = {}


def _run(cid: str, device):
    if cid not in _RUNS:
        _RUNS[cid] = run_public(PUBLIC_CASES[cid], device)
    return _RUNS[cid]


@pytest.mark.parametrize("cid", list(PUBLIC_CASES))
def test_public_case_passes_with_its_stated_values(cid, device):
    pc = PUBLIC_CASES[cid]
    runs, checks = _run(cid, device)
    for name, run in runs.items():
        if name in pc.must_fail:
            continue
        assert run.result.ok, (name, run.result.failures[["step", "output", "verdict", "detail"]].to_string())
    bad = [c for c in checks if not c.ok]
    assert not bad, "\n".join(f"{c.name}: {c.detail}" for c in bad)
    assert len(checks) >= 3, [c.name for c in checks]


def _corrupt(run: PublicRun) -> PublicRun:
    """A copy whose recorded outputs are wrong the way a broken implementation's would be (on
    both sides: the stated values must fail even where kernel and reference agree): every index
    row shifted by one token, every cache and ring element's lowest bit flipped."""
    bad = copy.copy(run)
    for side in ("kernel_calls", "reference_calls"):
        calls = []
        for call in getattr(run, side):
            c = copy.copy(call)
            if c.out is not None:
                c.out = torch.where(c.out >= 0, c.out + 1, c.out)
            c.compressed = (bits(c.compressed) ^ 1).view(torch.bfloat16)
            c.tail = (bits(c.tail) ^ 1).view(torch.float32)
            calls.append(c)
        setattr(bad, side, calls)
    return bad


@pytest.mark.parametrize("cid", [c for c in PUBLIC_CASES if c not in ("C17", "C19")])
def test_stated_values_fail_on_corrupted_outputs(cid, device):
    """Break on purpose: the same expectations on corrupted recordings must fail (C17 and C19
    compare runs with each other and check metadata, which an equal corruption of both does not
    change; the planted-fault test below covers them)."""
    pc = PUBLIC_CASES[cid]
    runs, _ = _run(cid, device)
    checks = stated_checks(pc, {name: _corrupt(run) for name, run in runs.items()})
    assert any(not c.ok for c in checks), [c.name for c in checks]


PLANTED = [("visible-off-by-one", "C09"), ("ring-stash-gated-on-pool-slot", "C03"),
           ("ring-capacity-p", "C21"), ("padding-slot-minus-one", "C17"), ("tail-wrong-column", "C07"),
           ("ape-reversed", "C31")]


@pytest.mark.parametrize("mutant,cid", PLANTED)
def test_public_case_catches_its_fault_kind(mutant, cid, device):
    from parity.implementations.mutants import load_mutant
    runs, checks = run_public(PUBLIC_CASES[cid], device, kernel_forward=load_mutant(mutant).forward)
    harness_ok = all(r.result.ok for n, r in runs.items() if n not in PUBLIC_CASES[cid].must_fail)
    assert not harness_ok or any(not c.ok for c in checks)


def test_check_and_registry_shape():
    assert [c for c in PUBLIC_CASES] == ["C01", "C03", "C05", "C07", "C09", "C11", "C13", "C15", "C17", "C19",
                                         "C21", "C23", "C25", "C27", "C29", "C31"]
    for pc in PUBLIC_CASES.values():
        assert pc.title and callable(pc.build) and callable(pc.expect)
    assert Check("x", False).verdict == "wrong-index"


@pytest.mark.integration
def test_cli_runs_the_public_suite(device):
    proc = subprocess.run([sys.executable, "-m", "parity", "run", "--device", device, "--suite", "public",
                           "--case", "C09", "C13", "--no-bundles"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "C09" in proc.stdout and "C13" in proc.stdout and "PASS" in proc.stdout
