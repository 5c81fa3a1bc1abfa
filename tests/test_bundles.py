"""Repro bundles (parity/sessions/bundle.py) and the run / record / replay commands: a bundle holds the case,
its exact inputs and metadata, both sides' outputs, the findings and the environment, and
``python -m parity replay BUNDLE`` reproduces the same findings in a fresh process.

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_bundles.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
import torch

from parity.sessions import bundle
from parity.sessions.session import RunOptions, run_cases
from parity.checking.compare import assert_bitwise_equal, same_bits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT = "tests.test_reports:planted_fault"


def _python(*args, device, cwd=ROOT, timeout=240):
    """``python -m parity ARGS`` in a fresh process on the session's device."""
    env = dict(os.environ, PYTHONPATH=ROOT, KPOOL_DEVICE=device)
    env.pop("TRITON_INTERPRET", None)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "parity", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _case():
    from tests.test_reports import multi_step_case
    return multi_step_case()


def _record(tmp_path, device, kernel=FAULT, mode="resync"):
    options = RunOptions(device=device, mode=mode, repeat=2, kernel=kernel)
    case = _case()
    (res,) = run_cases([case], options)
    path = bundle.write_bundle(res, case, str(tmp_path / bundle.bundle_name(case)), options=options)
    return case, res, path


def test_bundle_holds_case_inputs_outputs_findings_environment(tmp_path, device):
    case, res, path = _record(tmp_path, device)
    assert not res.ok and sorted(os.listdir(path)) == sorted(
        ["README.md", "case.json", "environment.json", "findings.csv", "findings.json", "inputs.pt", "outputs.pt"])
    b = bundle.load_bundle(path)
    assert b.case.case_id == case.case_id and b.options.mode == "resync" and b.options.kernel == FAULT
    assert b.data["first_divergent_step"] == 1 and b.data["command"] == f"{sys.executable} -m parity replay {path}"
    # the exact inputs and metadata of every step
    from cases.values import make_inputs
    from kpool.metadata import build_metadata
    for step, saved in zip(case.steps, b.case.steps):
        meta = build_metadata(step.batch, index_kpool=4, ring_capacity=4, page_size=2)
        replayed = saved.patch_metadata(build_metadata(saved.batch, index_kpool=4, ring_capacity=4, page_size=2))
        for name, t in meta.tensors().items():
            assert_bitwise_equal(getattr(replayed, name), t, name=str(name))
        for name, t in make_inputs(case, step, meta).items():
            assert_bitwise_equal(saved.inputs(b.case, saved, replayed)[name].view(torch.uint8), t.view(torch.uint8))
    # both sides' outputs of the failing steps
    assert set(b.outputs) == {1, 3}
    out = b.outputs[1]
    assert {"kernel_indices", "reference_indices", "kernel_compressed", "reference_compressed",
            "kernel_ring", "reference_ring"} <= set(out)
    assert not same_bits(out["kernel_compressed"], out["reference_compressed"])
    assert_bitwise_equal(out["kernel_indices"], out["reference_indices"])
    # the finding table and the environment
    assert bundle.diff_findings(b.findings, res.findings, with_programs=True).empty
    env = b.environment
    for key in ("device", "device_name", "torch", "torch_npu", "triton", "triton_ascend", "git", "soc_version"):
        assert key in env
    assert env["torch"] == torch.__version__ and env["device"] == device
    if device == "cpu":
        assert env["device_name"] == "Triton interpreter (CPU)"
    assert env["git"]["revision"] is None or len(env["git"]["revision"]) == 40
    readme = open(os.path.join(path, "README.md")).read()
    assert f"-m parity replay {path}" in readme and "cache-mismatch" in readme


@pytest.mark.integration
def test_replay_in_a_fresh_process_gives_identical_findings(tmp_path, device, capsys):
    """The replay in a fresh process (``python -m parity replay``) reproduces every check; then,
    in this process (the same ``parity.cli.main``, no fresh process claimed), how edited findings
    are judged."""
    from kpool.platform import resolve_device
    from parity.cli import main
    case, res, path = _record(tmp_path, device)
    proc = _python("replay", path, device=device)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    failing = int(res.findings["verdict"].map(lambda v: v != "exact").sum())
    assert (f"reproduced: {len(res.findings)} checks identical to the bundle's "
            f"({failing} findings, {len(res.failures)} failures)") in proc.stdout, proc.stdout
    assert "kernel=tests.test_reports:planted_fault" in proc.stdout and "at git " in proc.stdout
    # recorded counts that differ from what the code does now: reported; the verdict (the same
    # failures) still reproduces, so only --expect identical fails
    resolve_device(device)
    records = json.load(open(os.path.join(path, "findings.json")))
    k = next(i for i, r in enumerate(records) if r["verdict"] == "cache-mismatch")
    records[k]["mismatches"] += 1
    json.dump(records, open(os.path.join(path, "findings.json"), "w"))
    capsys.readouterr()
    assert main(["replay", path]) == 0
    out = capsys.readouterr().out
    assert "checks differ from the bundle (2 rows)" in out and "reproduced the verdict" in out, out
    assert main(["replay", path, "--expect", "identical"]) == 1
    # another failure class: the verdict does not reproduce, exit 1
    records[k]["verdict"] = "ring-mismatch"
    json.dump(records, open(os.path.join(path, "findings.json"), "w"))
    capsys.readouterr()
    assert main(["replay", path]) == 1
    assert "not reproduced" in capsys.readouterr().out


@pytest.mark.integration
def test_cli_run_writes_bundle_report_junit_and_replays(tmp_path, device):
    """End to end on the real kernels: a planted kernel fault fails the run, the failure message
    names the replay command, and the replay in another process reproduces the findings."""
    proc = _python("run", "--device", device, "--size", "small", "--case", "prefill-tail",
                   "--kernel", "mutant:visible-off-by-one",
                   "--report", "rep", "--junit", "rep/junit.xml", "--failures-only", "--no-oracle", cwd=tmp_path,
                   device=device)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rel = os.path.join("rep", "bundles", "prefill-tail-small")
    assert f"-m parity replay {tmp_path / rel}" in proc.stdout      # absolute: works from anywhere
    assert os.path.isfile(tmp_path / rel / "case.json")
    junit = ET.parse(tmp_path / "rep" / "junit.xml").getroot()
    df = pd.read_csv(tmp_path / "rep" / "results.csv")
    assert len(list(junit.iter("testcase"))) == len(df[["case", "size", "step", "output"]].drop_duplicates())
    assert any(f.get("message") == "wrong-index" for f in junit.iter("failure"))
    summary = open(tmp_path / "rep" / "summary.md").read()
    assert "## Certified exceptions per output" in summary and "| prefill-tail | small | 0 | prefill |" in summary
    proc = _python("replay", rel, cwd=tmp_path, device=device)
    assert proc.returncode == 0 and "reproduced:" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.integration
def test_record_writes_a_bundle_for_a_passing_case(tmp_path, device):
    from parity.cli import main
    from kpool.platform import resolve_device
    resolve_device(device)
    out = tmp_path / "b"
    assert main(["record", "--device", device, "--case", "prefill-topk", "--size", "small", "--repeat", "1",
                 "--bundle-dir", str(out)]) == 0
    path = out / "prefill-topk-small"
    assert "No failures (recorded on request)" in open(path / "README.md").read()
    assert main(["replay", str(path)]) == 0
    assert main(["replay", str(tmp_path / "nothing")]) == 2


def test_bundle_name_and_unknown_format(tmp_path):
    from tests.test_reports import multi_step_case
    import dataclasses
    case = dataclasses.replace(multi_step_case(), name="a b/c")
    assert bundle.bundle_name(case) == "a_b_c-small"
    (tmp_path / "case.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="format"):
        bundle.load_bundle(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        bundle.load_bundle(str(tmp_path / "missing"))


@pytest.mark.integration
def test_damaged_or_untrusted_bundles_are_usage_errors(tmp_path, capsys, device):
    """A damaged file or a kernel spec outside this checkout: exit 2 with the reason, no traceback,
    nothing run."""
    import shutil
    from parity.sessions.bundle_checks import MAX_REPEAT
    from parity.cli import main
    from kpool.platform import resolve_device
    resolve_device(device)
    out = tmp_path / "b"
    assert main(["record", "--device", device, "--case", "prefill-topk", "--size", "small", "--repeat", "1",
                 "--bundle-dir", str(out)]) == 0
    good = out / "prefill-topk-small"

    def damaged(name, edit):
        path = tmp_path / name
        shutil.copytree(good, path)
        edit(path)
        return str(path)

    def set_kernel(spec):
        def edit(path):
            data = json.load(open(path / "case.json"))
            data["run"]["kernel"] = spec
            json.dump(data, open(path / "case.json", "w"))
        return edit

    def set_field(section, key, value):
        def edit(path):
            data = json.load(open(path / "case.json"))
            target = data
            for part in section:
                target = target[part]
            target[key] = value
            json.dump(data, open(path / "case.json", "w"))
        return edit

    def drop_step(path):
        data = json.load(open(path / "case.json"))
        data["case"]["steps"].pop()
        json.dump(data, open(path / "case.json", "w"))

    cases = {
        "garbage-inputs": (lambda p: (p / "inputs.pt").write_bytes(b"not a tensor file"), "not a readable parity bundle"),
        "null-environment": (lambda p: (p / "environment.json").write_text("null"), "environment.json must hold"),
        "os-system": (set_kernel("os:system"), "replay runs only kpool"),
        "unknown-mutant": (set_kernel("mutant:nope"), "unknown planted fault"),
        "kernel-number": (set_kernel(42), "is not a kernel spec"),
        # code outside the checkout: recorded, but run only when the user names it again
        "vendor-kernel": (set_kernel("vllm-ascend:/somewhere/else"), "replay it with --kernel vllm-ascend:/somewhere/else"),
        "repeat-huge": (set_field(["run"], "repeat", MAX_REPEAT + 1), f"repeat is {MAX_REPEAT + 1}"),
        "repeat-zero": (set_field(["run"], "repeat", 0), "repeat is 0"),
        "repeat-text": (set_field(["run"], "repeat", "2"), "repeat is '2'"),
        "mode": (set_field(["run"], "mode", "sideways"), "mode 'sideways'"),
        "pages-absurd": (set_field(["case", "geometry"], "num_pages", 10 ** 12), "GiB of caches"),
        "page-size-negative": (set_field(["case", "geometry"], "page_size", -2), "geometry.page_size is -2"),
        "config": (set_field(["case", "config"], "index_kpool", 0), "configuration is invalid"),
        "step-count": (drop_step, "has 3 steps but inputs.pt holds 4"),
        "steps-run": (set_field([], "steps_run", 99), "steps_run is 99"),
    }
    capsys.readouterr()
    for name, (edit, reason) in cases.items():
        assert main(["replay", damaged(name, edit)]) == 2, name
        assert reason in capsys.readouterr().err, name
    assert main(["replay", damaged("own-module", set_kernel("tests.test_reports:planted_fault"))]) in (0, 1)


@pytest.mark.integration
def test_replay_checks_a_fix_with_another_kernel(tmp_path, capsys, device):
    """``replay --kernel kpool --expect pass`` checks a fix against a recorded failure; the exit
    code answers the question asked, and the output names the kernel and the recorded one."""
    from kpool.platform import resolve_device
    from parity.cli import main
    resolve_device(device)
    out = tmp_path / "b"
    assert main(["run", "--device", device, "--suite", "seed", "--size", "small", "--case", "prefill-tail",
                 "--kernel", "mutant:visible-off-by-one", "--bundle-dir", str(out), "--no-oracle"]) == 1
    path = str(out / "prefill-tail-small")
    capsys.readouterr()
    assert main(["replay", path]) == 0                                  # the recorded failure reproduces
    assert "kernel=mutant:visible-off-by-one" in capsys.readouterr().out
    assert main(["replay", path, "--expect", "pass"]) == 1              # ... so it does not pass
    assert main(["replay", path, "--kernel", "kpool", "--expect", "pass"]) == 0
    text = capsys.readouterr().out
    assert "kernel=kpool" in text and "replaces the recorded mutant:visible-off-by-one" in text
    assert main(["replay", path, "--kernel", "kpool"]) == 1             # the fix: the failure is gone
    assert main(["replay", path, "--kernel", "mutant:nope"]) == 2
