"""``python -m parity golden record DIR`` / ``golden check DIR``: device goldens (parity-contract.md
§1, kernel vs kernel, bitwise, across time): record every output of every step of one
implementation once (say on the old revision) and check a later run against it bit for bit.

``record`` runs the selected cases (:mod:`parity.selection.kernel_cases`) on ``--kernel`` (default ``kpool``)
and writes, under ``DIR/<device kind>/`` (:func:`device_kind`: ``cpu-interpreter``,
``cuda:NVIDIA H200``, ``npu:Ascend910B3``; the directory name has ``_`` for other characters...):

* ``golden.json``: the device kind, the environment (:func:`parity.sessions.bundle.environment`: torch /
  triton versions, device name, git revision), the implementation, the selection options and, per
  case, its steps' names and every output's sha256 (:func:`parity.running.step_outputs.step_hashes`);
* ``<case>.pt.zlib``: the tensors themselves (``torch.save`` of ``{step: StepDict}``, zlib), so a
  check can show both values at the first element that moved.

``check`` reruns the recorded selection on ``--kernel`` on this device and compares the hashes,
then the tensors of every output whose hash moved (:func:`parity.running.step_outputs.diff_steps`), and
names the case, step and output with the first differing element and both values. Goldens of
another device kind are refused: a kernel's bits are only reproducible on the kind that made them
(platform-numerics.md).

Exit status: 0 recorded / every output identical, 1 an output moved (or a case is missing), 2
usage error (no goldens, another device kind, a bad kernel spec).
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import zlib

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
MANIFEST = "golden.json"
FORMAT = 1
SELECTION_KEYS = ("suite", "size", "case", "seed", "profile", "no_oracle")


def device_kind(device: str, env: dict) -> str:
    """The device kind goldens are keyed by: ``cpu-interpreter``, ``cuda:<GPU name>`` or
    ``npu:<SoC version or name>`` (``env``: :func:`parity.sessions.bundle.environment` of ``device``)."""
    if device == "cpu":
        return "cpu-interpreter"
    return f"{device}:{env.get('soc_version') or env.get('device_name') or 'unknown'}"


def kind_directory(root: str, kind: str) -> str:
    """``root/<kind with every non-identifier character as _>``."""
    return os.path.join(root, re.sub(r"[^\w.-]", "_", kind))


def add_golden_parser(sub) -> None:
    """The ``golden record|check`` sub-commands (no torch import)."""
    from ..selection.kernel_cases import add_selection_arguments
    g = sub.add_parser("golden", help="record device goldens of every step's outputs; check a later run bit for bit",
                       description="record: store every output of every step (hashes and tensors) per device kind "
                                   "and case with the environment. check: rerun the recorded selection and name the "
                                   "case, step and output that moved. Exit 0 identical, 1 moved, 2 usage error "
                                   "(incl. goldens of another device kind).")
    gsub = g.add_subparsers(dest="golden_command", required=True, metavar="ACTION")
    rec = gsub.add_parser("record", help="record goldens into DIR/<device kind>/")
    rec.add_argument("dir", metavar="DIR")
    rec.add_argument("--kernel", default="kpool", metavar="IMPL",
                     help="implementation to record (default kpool; python -m parity list implementations)")
    rec.add_argument("--force", action="store_true", help="replace goldens of this device kind already in DIR")
    add_selection_arguments(rec)
    _isolate_argument(rec)
    chk = gsub.add_parser("check", help="rerun DIR's recorded selection and compare bit for bit")
    chk.add_argument("dir", metavar="DIR", help="the record's DIR (or its DIR/<device kind>)")
    chk.add_argument("--kernel", default="kpool", metavar="IMPL", help="implementation to check (default kpool)")
    chk.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                     help="device (default: auto); must be the recorded device kind")
    _isolate_argument(chk)


def _isolate_argument(p) -> None:
    from ..running.isolation import ISOLATE_CHOICES
    p.add_argument("--isolate", default="auto", choices=ISOLATE_CHOICES,
                   help="run the implementation in a child worker process, so that a crash (even a segfault) is a "
                        "case whose outputs moved: auto (default) for implementations that are not this "
                        "checkout's own, on, off")


def golden_main(args, console=None) -> int:
    """``python -m parity golden record|check``: as the module docstring says."""
    from kpool.errors import KPoolUnsupportedError
    from kpool.platform import resolve_device

    from .. import api
    from ..sessions.bundle import environment
    from ..reporting.report import make_console
    console = console or make_console()
    prog = f"python -m parity golden {args.golden_command}"
    try:
        device = resolve_device(None if args.device == "auto" else args.device)
    except KPoolUnsupportedError as exc:
        return _usage(f"{prog}: error: {exc}")
    env = environment(device)
    kind = device_kind(device, env)
    if args.golden_command == "check":
        found = _manifest_for(args.dir, kind)
        if isinstance(found, str):
            return _usage(f"{prog}: error: {found}")
    try:
        impl = api.resolve_implementation(args.kernel)
    except Exception as exc:
        return _usage(f"{prog}: error: cannot load implementation {args.kernel!r}: {type(exc).__name__}: {exc}")
    from ..implementations import device_refusal
    refused = device_refusal(impl, device)
    if refused:
        return _usage(f"{prog}: error: {refused}")
    if args.golden_command == "record":
        return _record(args, device, env, kind, impl, console, prog)
    return _check(args, device, kind, impl, found, console, prog)


def _usage(message: str) -> int:
    print(message, file=sys.stderr)
    return EXIT_USAGE


def _manifest_for(root: str, kind: str):
    """``(directory, manifest)`` of ``kind``'s goldens under ``root`` (or ``root`` itself), or
    the refusal message."""
    candidates = [root, kind_directory(root, kind)]
    for d in candidates:
        path = os.path.join(d, MANIFEST)
        if os.path.isfile(path):
            with open(path) as f:
                manifest = json.load(f)
            if manifest.get("device_kind") != kind:
                return (f"goldens in {d} were recorded on device kind {manifest.get('device_kind')!r}; this run is "
                        f"on {kind!r}. A kernel's bits are only reproducible on the kind that made them: record "
                        f"goldens on this device kind (python -m parity golden record DIR)")
            return d, manifest
    others = sorted(n for n in (os.listdir(root) if os.path.isdir(root) else [])
                    if os.path.isfile(os.path.join(root, n, MANIFEST)))
    if others:
        kinds = []
        for n in others:
            with open(os.path.join(root, n, MANIFEST)) as f:
                kinds.append(json.load(f).get("device_kind", n))
        return (f"no goldens for device kind {kind!r} in {root}; it has goldens recorded on {kinds} only, which "
                f"cannot be checked here: record on this device kind first (python -m parity golden record {root})")
    return f"no goldens in {root} (no {MANIFEST}; python -m parity golden record {root} writes them)"


def _case_file(key: str) -> str:
    return re.sub(r"[^\w.-]", "_", key) + ".pt.zlib"


def save_steps(path: str, steps: dict) -> None:
    """Write ``{step: StepDict}`` to ``path`` (``torch.save``, zlib-compressed)."""
    import torch
    buf = io.BytesIO()
    torch.save({int(k): v for k, v in steps.items()}, buf)
    with open(path, "wb") as f:
        f.write(zlib.compress(buf.getvalue(), 6))


def load_steps(path: str) -> dict:
    """Read what :func:`save_steps` wrote (tensors only: ``weights_only``)."""
    import torch
    with open(path, "rb") as f:
        data = zlib.decompress(f.read())
    return torch.load(io.BytesIO(data), weights_only=True)


def _runner(args, impl, device):
    """A context yielding ``(run,)``: ``run(selected) -> (CaseResult, {step: outputs})`` of
    ``impl`` under its declared semantics, isolated in a worker process when ``--isolate`` says so
    (:func:`parity.running.isolated_runners.isolated_runners`: a crash there is a case whose outputs all moved)."""
    from ..implementations.semantics import resolve_semantics
    from ..running.isolated_runners import isolated_runners
    return isolated_runners([impl], [resolve_semantics(impl)], device, getattr(args, "isolate", "auto"))


def _record(args, device, env, kind, impl, console, prog) -> int:
    import shutil

    from rich.markup import escape

    from ..running.step_outputs import step_hashes
    from .cases import select
    out = kind_directory(args.dir, kind)
    if os.path.exists(os.path.join(out, MANIFEST)) and not args.force:
        return _usage(f"{prog}: error: {out} already holds goldens of {kind!r} (--force replaces them)")
    try:
        cases = select(args, device, console)
    except (KeyError, ValueError) as exc:
        return _usage(f"{prog}: error: {exc.args[0]}")
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    manifest = {"format": FORMAT, "device_kind": kind, "environment": env, "implementation": impl.spec,
                "implementation_description": impl.description, "implementation_package": impl.package,
                "selection": {k: getattr(args, k) for k in SELECTION_KEYS}, "cases": {}}
    console.print(escape(f"golden record on {kind}: kernel={impl.spec}, {len(cases)} cases -> {out}"))
    with _runner(args, impl, device) as (run,):
        for sel in cases:
            result, steps = run(sel)
            name = _case_file(sel.key)
            save_steps(os.path.join(tmp, name), steps)
            manifest["cases"][sel.key] = {"file": name, "suite": sel.suite, "reference_failures": len(result.failures),
                                          "step_names": [s.name for s in sel.case.steps],
                                          "steps": {str(i): step_hashes(s) for i, s in steps.items()}}
            console.print(escape(f"  {sel.key}: {len(steps)} steps recorded"
                                 + (f" ({len(result.failures)} failures vs reference)" if len(result.failures) else "")))
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True, default=str)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    console.print(escape(f"recorded {len(cases)} cases in {out}"))
    return EXIT_OK


def _check(args, device, kind, impl, found, console, prog) -> int:
    import argparse

    from rich.markup import escape

    from ..running.step_outputs import diff_steps, step_hashes
    from .cases import select
    directory, manifest = found
    rec_env = manifest.get("environment", {})
    sel_args = argparse.Namespace(device=args.device, **manifest["selection"])
    try:
        cases = select(sel_args, device, console)
    except (KeyError, ValueError) as exc:
        return _usage(f"{prog}: error: the recorded selection no longer selects: {exc.args[0]}")
    console.print(escape(f"golden check on {kind}: kernel={impl.spec} vs goldens of {manifest['implementation']} "
                         f"({manifest.get('implementation_description') or '-'}) recorded by the harness at git "
                         f"{(rec_env.get('git') or {}).get('revision')} (torch {rec_env.get('torch')}, "
                         f"triton {rec_env.get('triton')}) in {directory}: {len(cases)} cases"))
    recorded = manifest["cases"]
    moved, seen = 0, set()
    with _runner(args, impl, device) as (run,):
        for sel in cases:
            entry = recorded.get(sel.key)
            if entry is None:
                console.print(escape(f"  {sel.key}: not in the goldens (new case?); not checked"))
                continue
            seen.add(sel.key)
            _, steps = run(sel)
            hashes = {str(i): step_hashes(s) for i, s in steps.items()}
            if hashes == entry["steps"]:
                console.print(escape(f"  {sel.key}: {len(steps)} steps identical"))
                continue
            diffs = diff_steps(load_steps(os.path.join(directory, entry["file"])), steps, sel.case)
            for step, found_diffs in diffs.items():
                for d in found_diffs:
                    moved += 1
                    name = entry["step_names"][step] if step < len(entry["step_names"]) else ""
                    console.print(f"  [red]MOVED[/] {escape(sel.key)} step {step} ({escape(name)}) "
                                  f"{escape(d.text('golden', 'now'))}")
    missing = sorted(set(recorded) - seen)
    for key in missing:
        console.print(f"  [red]MISSING[/] {escape(key)}: recorded, but the selection no longer has it")
    if moved or missing:
        console.print(f"[red]golden check: {moved} outputs moved, {len(missing)} cases missing[/]")
        return EXIT_FAIL
    console.print(f"[green]golden check: every output of every step of {len(seen)} cases is bitwise identical[/]")
    return EXIT_OK
