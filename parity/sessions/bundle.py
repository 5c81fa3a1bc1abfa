"""Repro bundles: one directory that reproduces a parity run anywhere (parity-contract.md §6).

A bundle holds everything needed to rerun a case bit for bit in a fresh process on any device,
without the code that generated it:

* ``case.json``: the case as :func:`cases.serialize.case_to_json` writes it (the corpus's format:
  config, cache geometry, every step's batch, flags and seeds), the run options
  (:class:`parity.sessions.session.RunOptions`: mode, repeat, oracle, kernel spec) and the replay command;
* ``inputs.pt``: the APE and, per step, the exact metadata tensors both sides saw (after any
  ``patch_metadata``) and the input tensors ``k, gate, q, weights``;
* ``outputs.pt``: both sides' outputs (index rows, cache and output-buffer bytes) after the failing
  steps the run kept (:data:`parity.running.runner.KEEP_OUTPUT_STEPS`);
* ``findings.csv`` / ``findings.json``: the finding table;
* ``environment.json``: device name, SoC or GPU, torch / torch_npu / triton / triton-ascend
  versions, git revision;
* ``README.md``: what failed and the one-line command ``python -m parity replay BUNDLE``.

:func:`parity.verbs.replay.replay` loads a bundle, reruns the case with the recorded options (the saved
inputs and metadata replace the generators) and compares the new finding table with the recorded
one; :mod:`parity.sessions.bundle_checks` refuses fields a replay must not run.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

import pandas as pd
import torch

from cases.serialize import case_from_json, case_to_json

from ..checking import compare as cmp
from ..reporting.report import replay_command  # noqa: F401 (part of the bundle's API: the command a bundle prints)

BUNDLE_FORMAT = 2
"""2: ``case.json``'s case and ``inputs.pt`` are :mod:`cases.serialize`'s (the corpus's format,
plus every step's metadata tensors); 1 had a bundle-only layout."""
COMPARE_COLUMNS = ("case", "size", "step", "output", "verdict", "mismatches",
                   *[c for c in cmp.LOCATION_COLUMNS if c not in ("kernel", "program_id")])
"""Columns that must agree for a replay to reproduce a bundle. Program ids depend on the
device's grid (SM / vector-core count) and are compared only on the recording backend."""
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------- environment

def _dist_version(name: str) -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_revision(root: str = ROOT) -> dict:
    """``{"revision": sha or None, "dirty": bool or None}`` of the checkout at ``root``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip()) if sha else None
    except (OSError, subprocess.SubprocessError):
        sha, dirty = None, None
    return {"revision": sha, "dirty": dirty}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str) -> dict:
    """What ran: device and hardware, library versions, git revision (JSON-able).

    Args:
        device: resolved backend (``"cpu"``, ``"cuda"``, ``"npu"``).
    Returns:
        dict with ``device``, ``device_name``, ``family`` (Ascend A2/A3/A5, GPU name, or
        ``interpreter``), ``soc_version`` (NPU), ``gpu_capability`` (CUDA), ``cpu``, ``python``,
        ``platform``, ``torch``, ``torch_npu``, ``triton``, ``triton_ascend``, ``cuda``, ``git``,
        ``TRITON_INTERPRET``. Probing failures leave a field ``None``.
    """
    env = {"device": device, "device_name": None, "family": None, "soc_version": None,
           "gpu_capability": None, "cpu": _cpu_name(), "python": platform.python_version(),
           "platform": platform.platform(), "torch": torch.__version__,
           "torch_npu": _dist_version("torch-npu") or _dist_version("torch_npu"),
           "triton": _dist_version("triton"), "triton_ascend": _dist_version("triton-ascend"),
           "cuda": torch.version.cuda, "git": git_revision(),
           "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET")}
    try:
        from kpool.hardware import hardware_profile
        prof = hardware_profile(device)
        env.update(device_name=prof.device_name, family=prof.family, soc_version=prof.soc_version)
    except Exception as exc:  # an unsupported SoC still deserves a bundle
        env["device_name"] = f"unknown ({type(exc).__name__}: {exc})"
    if device == "cuda":
        try:
            env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        except Exception:
            pass
    return env


# --------------------------------------------------------------------------- write / load

def bundle_name(case) -> str:
    """Directory name of a case's bundle: ``<name>-<size>`` with path-safe characters."""
    import re
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{case.name}-{case.size}")


def write_bundle(result, case, directory: str, *, options, env: Optional[dict] = None) -> str:
    """Write the repro bundle of one case run (module docstring).

    Args:
        result: the :class:`parity.running.runner.CaseResult`.
        case: the :class:`cases.spec.Case` that produced it.
        directory: bundle directory (replaced if it exists).
        options: :class:`parity.sessions.session.RunOptions` of the run.
        env: :func:`environment` (computed if omitted).

    Returns:
        ``directory``.
    """
    from ..reporting import report
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    env = env or environment(options.device)
    table = report.results_table(result.findings)
    doc, tensors = case_to_json(case, with_metadata=True)
    data = {"format": BUNDLE_FORMAT, "case": doc, "run": options.to_dict(),
            "command": replay_command(directory), "steps_run": result.steps_run,
            "first_divergent_step": result.first_divergent_step, "ok": result.ok}
    with open(os.path.join(directory, "case.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(directory, "environment.json"), "w") as f:
        json.dump(env, f, indent=1)
    torch.save(tensors, os.path.join(directory, "inputs.pt"))
    torch.save({i: o.tensors() for i, o in result.outputs.items()}, os.path.join(directory, "outputs.pt"))
    table.to_csv(os.path.join(directory, "findings.csv"), index=False)
    with open(os.path.join(directory, "findings.json"), "w") as f:
        f.write(table.to_json(orient="records", indent=1))
    fails = table[table["verdict"].map(cmp.is_failure)]
    lines = [f"# Repro bundle: {case.case_id}", "", case.description or "", "",
             "Replay (any device, fresh process):", "", "```", data["command"], "```", "",
             f"Run: mode={options.mode} repeat={options.repeat} oracle={options.check_oracle} "
             f"kernel={options.kernel} device={options.device} ({env.get('device_name')})",
             f"Git: {env['git']['revision']}{' (dirty)' if env['git']['dirty'] else ''}", "",
             f"First divergent step: {result.first_divergent_step}", "", "## Failures", ""]
    lines.append(report.markdown_table(fails, list(report.REPORT_COLUMNS) + ["detail"]) if len(fails)
                 else "No failures (recorded on request).")
    lines += [""] + report.crash_markdown(table)
    lines += ["Check a fix against this failure: `python -m parity replay BUNDLE --kernel kpool --expect pass`."]
    with open(os.path.join(directory, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return directory


@dataclass
class Bundle:
    """A loaded bundle.

    Attributes:
        path: its directory; case: the rebuilt :class:`cases.spec.Case`; options: the recorded
        :class:`parity.sessions.session.RunOptions`; findings: the recorded finding table; environment:
        ``environment.json``; outputs: ``outputs.pt`` (``{step: {name: tensor}}``); data: ``case.json``.
    """

    path: str
    case: object
    options: object
    findings: pd.DataFrame
    environment: dict
    outputs: dict
    data: dict


def load_bundle(directory: str) -> Bundle:
    """Load a bundle written by :func:`write_bundle`.

    Raises:
        FileNotFoundError: not a bundle directory. ValueError: unknown format version, a damaged
        file, or a field a replay must not run (:mod:`parity.sessions.bundle_checks`: a kernel spec outside
        this checkout, an absurd ``repeat`` or cache geometry, a step count that does not match).
    """
    from . import bundle_checks as checks
    from .session import RunOptions
    path = os.path.join(directory, "case.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory!r} is not a parity bundle (no case.json)")
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("format") != BUNDLE_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"bundle format {got!r} is not {BUNDLE_FORMAT}")
        tensors = torch.load(os.path.join(directory, "inputs.pt"), weights_only=True)
        outputs = torch.load(os.path.join(directory, "outputs.pt"), weights_only=True)
        with open(os.path.join(directory, "environment.json")) as f:
            env = json.load(f)
        with open(os.path.join(directory, "findings.json")) as f:
            records = json.load(f)
        if not isinstance(env, dict) or not isinstance(records, list):
            raise ValueError("environment.json must hold an object and findings.json a list")
        findings = cmp.findings_frame([{k: v for k, v in r.items() if k in cmp.FINDING_COLUMNS} for r in records])
        if not isinstance(tensors, dict) or not isinstance(tensors.get("inputs"), list):
            raise ValueError("inputs.pt holds no step list")
        checks.check_run(data.get("run"))
        checks.check_case(data.get("case"), len(tensors["inputs"]))
        checks.check_counts(data, outputs, findings)
        bundle = Bundle(path=directory, case=case_from_json(data["case"], tensors),
                        options=RunOptions.from_dict(data["run"]), findings=findings, environment=env,
                        outputs=outputs, data=data)
    except ValueError:
        raise
    except Exception as exc:   # a damaged file: say which bundle, not a traceback
        raise ValueError(f"{directory!r} is not a readable parity bundle: {type(exc).__name__}: {exc}") from exc
    return bundle


def finding_key(df: pd.DataFrame, *, with_programs: bool) -> pd.DataFrame:
    """The columns of a finding table that a replay must reproduce, as strings (``""`` for null)."""
    cols = list(COMPARE_COLUMNS) + (["kernel", "program_id"] if with_programs else [])
    out = df[cols].copy().astype(object)
    return out.where(out.notna(), "").astype(str).reset_index(drop=True)


def diff_findings(recorded: pd.DataFrame, replayed: pd.DataFrame, *, with_programs: bool) -> pd.DataFrame:
    """Rows present in one table only (column ``side``: ``recorded`` / ``replayed``); empty when the
    replay reproduced the bundle."""
    a = finding_key(recorded, with_programs=with_programs)
    b = finding_key(replayed, with_programs=with_programs)
    merged = a.merge(b, how="outer", indicator=True)
    diff = merged[merged["_merge"] != "both"].copy()
    diff["side"] = diff["_merge"].map({"left_only": "recorded", "right_only": "replayed"})
    return diff.drop(columns="_merge").reset_index(drop=True)
