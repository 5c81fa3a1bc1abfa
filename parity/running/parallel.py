"""Multi-worker parity runs: ``python -m parity run --jobs N`` (``make parity JOBS=N``).

Cases go to ``N`` worker processes of a :class:`concurrent.futures.ProcessPoolExecutor` (largest
cases submitted first), each worker pinned to one device; results come back in case order and are
merged into one results table and report, so the findings equal a ``--jobs 1`` run row for row.
Every findings and timings row gets two columns: ``worker`` (0 .. N-1) and ``worker_device``
(``"cuda:1"`` = physical CUDA device 1, ``"npu:0"``, ``"cpu"``).

Device pinning (platform-numerics.md §2.1, §6.2): worker ``i`` sees only physical device
``devices[i % len(devices)]`` through ``CUDA_VISIBLE_DEVICES`` (cuda) or
``ASCEND_RT_VISIBLE_DEVICES`` (npu), where ``devices`` is the parent's own visible list (its
``*_VISIBLE_DEVICES`` if set, else ``0 .. device_count-1``). The pool's initializer
(:func:`_init_worker`) sets the variable first thing in the worker, before its torch or
torch_npu are imported (the worker starts with the ``spawn`` method: a fresh interpreter that has
imported only this module, which imports no torch); with one device all workers share it; on
``cpu`` (Triton interpreter) nothing is pinned. ``OMP_NUM_THREADS`` defaults to ``cores // N``
per worker (the reference runs on the host CPU in every worker), unless already set.

Each worker sends its :class:`parity.findings.results.CaseResult` back with every tensor moved to the
host. A worker whose ``run_case`` raises (a harness bug) aborts the run with
:class:`ParallelRunError` naming the worker, its device and the case. A worker that dies (signal,
OOM: the pool is then broken, :class:`concurrent.futures.process.BrokenProcessPool`) is a
finding: the cases that did not finish are rerun one per fresh single-worker pool, and a case
whose worker dies again gets one ``crash`` finding (output ``worker``) instead of results.

Importing this module imports neither torch nor any kernel.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Dict, List, Optional, Sequence

VISIBLE_DEVICES_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
"""The runtime's device-visibility variable per backend."""

WORKER_COLUMNS = ("worker", "worker_device")
"""Columns added to every findings and timings row."""

WORKER_OUTPUT = "worker"
"""Output name of the finding of a case whose worker process died."""


class ParallelRunError(RuntimeError):
    """A worker's ``run_case`` raised; the message names the worker, its device and the case."""


def visible_devices(device: str) -> List[str]:
    """Physical device ids this process may hand out to workers.

    Args:
        device: resolved backend, ``"cuda"``, ``"npu"`` or ``"cpu"``.
    Returns:
        ``[]`` for cpu; else the entries of the backend's ``*_VISIBLE_DEVICES`` when set (so a
        parent limited to ``"2,3"`` gives workers ``"2"`` and ``"3"``), otherwise
        ``["0", .., str(device_count - 1)]`` (at least ``["0"]``).
    """
    var = VISIBLE_DEVICES_ENV.get(device)
    if var is None:
        return []
    listed = os.environ.get(var)
    if listed is not None and listed.strip():
        return [d.strip() for d in listed.split(",") if d.strip()]
    import torch
    count = int(torch.cuda.device_count()) if device == "cuda" else int(torch.npu.device_count())
    return [str(i) for i in range(max(1, count))]


def worker_environment(worker: int, device: str, devices: Sequence[str], jobs: int,
                       base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment variables to set (on top of ``base``, default ``os.environ``) for a worker.

    Args:
        worker: worker index ``0 .. jobs-1``.
        device: resolved backend.
        devices: :func:`visible_devices` of the parent.
        jobs: number of workers.
    Returns:
        ``{"KPOOL_DEVICE": device, VAR: devices[worker % len(devices)]}`` (``VAR`` only on
        cuda/npu) plus ``OMP_NUM_THREADS`` = ``max(1, cores // jobs)`` when ``base`` has none.
    """
    base = os.environ if base is None else base
    env = {"KPOOL_DEVICE": device}
    var = VISIBLE_DEVICES_ENV.get(device)
    if var is not None and devices:
        env[var] = str(devices[worker % len(devices)])
    if "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    return env


def worker_device_label(device: str, env: Dict[str, str]) -> str:
    """``"cuda:<physical id>"``/``"npu:<physical id>"`` from a worker's pin, ``"cpu"`` otherwise."""
    var = VISIBLE_DEVICES_ENV.get(device)
    if var is None or var not in env:
        return device
    return f"{device}:{env[var]}"


def in_process_device_label(device: str) -> str:
    """Label of the device this process runs on (the ``--jobs 1`` path): physical id of the
    current device through this process's own visible list."""
    if device not in VISIBLE_DEVICES_ENV:
        return device
    import torch
    current = int(torch.cuda.current_device()) if device == "cuda" else int(torch.npu.current_device())
    devices = visible_devices(device)
    return f"{device}:{devices[current] if current < len(devices) else current}"


def annotate(result, worker: int, worker_device: str):
    """Add :data:`WORKER_COLUMNS` to ``result.findings`` and ``result.timings`` (in place) and
    set ``result.worker`` / ``result.worker_device``; returns ``result``."""
    for frame in (result.findings, result.timings):
        if frame is not None:
            frame["worker"] = worker
            frame["worker_device"] = worker_device
    result.worker, result.worker_device = worker, worker_device
    return result


def _to_host(obj):
    """``obj`` with every tensor inside (dataclasses, dicts, lists, tuples) moved to the CPU."""
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: _to_host(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_host(v) for v in obj)
    return obj


def case_cost_order(cases: Sequence) -> List[int]:
    """Indices of ``cases`` in the order workers should take them: non-``small`` sizes (the
    GLM-shaped ones, far slower) first, then the given order (longest-first keeps the last
    worker from finishing alone)."""
    return sorted(range(len(cases)), key=lambda i: (getattr(cases[i], "size", "") == "small", i))


# --------------------------------------------------------------------------- worker side

_WORKER: Dict[str, object] = {}
"""This worker's index, device label and start-up facts (set by :func:`_init_worker`)."""


def _init_worker(device: str, slots) -> None:
    """Pool initializer: take this worker's ``(index, environment)`` from ``slots`` and put the
    environment in place before anything imports torch (module docstring)."""
    worker, env = slots.get()
    torch_first = "torch" in __import__("sys").modules
    os.environ.update(env)
    _WORKER.update(index=worker, label=worker_device_label(device, env), device=device,
                   torch_imported_at_start=torch_first)


def _warm_imports(device: str) -> str:
    """Resolve the device and import what ``run_case`` imports lazily (kernels, reference, value
    generators), so the start-up cost is not billed to the worker's first case. Returns the
    resolved backend."""
    if "resolved" not in _WORKER:
        from kpool.platform import resolve_device
        _WORKER["resolved"] = resolve_device(device)
        import cases.values  # noqa: F401
        import kpool.indexer  # noqa: F401
        import reference.stateful  # noqa: F401
    return _WORKER["resolved"]


def _run_one(case, run_kwargs: dict):
    """Pool task: run one case on this worker. Returns ``(worker, label, result, None)`` or, when
    ``run_case`` raises, ``(worker, label, None, traceback text)``."""
    worker, label = _WORKER["index"], _WORKER["label"]
    try:
        from . import compiles
        from .runner import run_case
        resolved = _warm_imports(str(_WORKER["device"]))
        compiles.install()
        before = compiles.snapshot()
        result = _to_host(run_case(case, device=resolved, **run_kwargs))
        result.compiles = compiles.since(before)        # this case's share of the worker's compilations
        return worker, label, result, None
    except BaseException:   # returned, not raised: the parent names the worker and the case
        return worker, label, None, traceback.format_exc()


def _probe(barrier) -> dict:
    """Pool task of :func:`probe_workers`: what this worker started with and sees."""
    barrier.wait(timeout=120)      # every worker takes exactly one probe
    info = {"worker": _WORKER["index"], "pid": os.getpid(),
            "torch_imported_at_start": _WORKER["torch_imported_at_start"]}
    for var in ("KPOOL_DEVICE", "OMP_NUM_THREADS") + tuple(VISIBLE_DEVICES_ENV.values()):
        info[var] = os.environ.get(var)
    device = str(_WORKER["device"])
    try:
        import torch
        if device == "cuda":
            info["device_count"] = int(torch.cuda.device_count())
            if info["device_count"]:
                info["device_name"] = torch.cuda.get_device_name(0)
        elif device == "npu":
            import torch_npu  # noqa: F401
            info["device_count"] = int(torch.npu.device_count())
    except Exception as exc:  # report, do not hide: the probe is a diagnostic
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


# --------------------------------------------------------------------------- parent side

def _pool(device: str, workers: Sequence[int], initializer=None, extra_initargs: tuple = ()):
    """A spawn-context pool of ``len(workers)`` processes whose initializer pins the worker that
    takes slot ``w`` of ``workers`` as :func:`worker_environment` says."""
    ctx = mp.get_context("spawn")
    devices = visible_devices(device)
    slots = ctx.Queue()
    for w in workers:
        slots.put((w, worker_environment(w, device, devices, len(workers))))
    return ProcessPoolExecutor(max_workers=len(workers), mp_context=ctx, initializer=initializer or _init_worker,
                               initargs=(device, slots) + tuple(extra_initargs))


def probe_workers(device: str, jobs: int) -> List[dict]:
    """Start ``jobs`` workers exactly as ``run --jobs`` does and return what each one saw:
    ``worker``, ``pid``, ``KPOOL_DEVICE``, ``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``,
    ``ASCEND_RT_VISIBLE_DEVICES``, ``torch_imported_at_start`` (must be False: the pin precedes
    torch) and, on cuda/npu, ``device_count`` (1 when pinned) and ``device_name``. A diagnostic
    for multi-device hosts (docs/validation.md) and the tests; sorted by worker."""
    barrier = mp.get_context("spawn").Barrier(jobs)
    with _pool(device, range(jobs), _probe_init, (barrier,)) as pool:
        out = list(pool.map(_probe_task, range(jobs)))
    return sorted(out, key=lambda d: d["worker"])


def _probe_init(device: str, slots, barrier) -> None:
    _init_worker(device, slots)
    _WORKER["barrier"] = barrier


def _probe_task(_: int) -> dict:
    return _probe(_WORKER["barrier"])


def dead_worker_result(case, detail: str):
    """The result of a case whose worker process died: one ``crash`` finding (output
    :data:`WORKER_OUTPUT`), no steps run."""
    import pandas as pd

    from ..checking import compare as cmp
    from ..findings.results import TIMING_COLUMNS, CaseResult
    findings = cmp.findings_frame([cmp.finding(WORKER_OUTPUT, "crash", 1, detail=detail)], case=case.name,
                                  size=case.size)
    return CaseResult(case=case.name, size=case.size, case_id=case.case_id, findings=findings,
                      timings=pd.DataFrame([], columns=list(TIMING_COLUMNS)), steps_run=0, wall_s=0.0)


def _collect(cases, futures: Dict[int, object], out: list, on_result) -> List[int]:
    """Fill ``out[i]`` from each finished future (``{case index: future}``); returns the indices
    whose worker died. Raises :class:`ParallelRunError` when a worker's ``run_case`` raised."""
    died = []
    for i, fut in futures.items():
        try:
            worker, label, res, trace = fut.result()
        except BrokenProcessPool:
            died.append(i)
            continue
        if trace is not None:
            raise ParallelRunError(f"worker {worker} ({label}) failed on {cases[i].case_id}:\n{trace}")
        out[i] = annotate(res, worker, label)
        if on_result is not None:
            on_result(out[i])
    return died


def run_cases(cases: Sequence, *, device: str, jobs: int = 1,
              on_result: Optional[Callable] = None, task: Callable = _run_one, **run_kwargs) -> List:
    """Run ``cases`` with :func:`parity.running.runner.run_case` on ``jobs`` workers; merged results.

    Args:
        cases: :class:`cases.spec.Case` objects (picklable).
        device: the resolved backend (``kpool.platform.resolve_device``).
        jobs: worker processes; ``1`` runs in this process (no pool), ``> 1`` starts
            ``min(jobs, len(cases))`` workers pinned as in the module docstring.
        on_result: ``fn(result)`` called in this process as each case's result is collected.
        task: the pool task (tests plant a worker death with it).
        **run_kwargs: passed to ``run_case`` (``check_oracle``, ``mode``, ...; picklable).
    Returns:
        ``CaseResult`` list in the order of ``cases``, each annotated (:func:`annotate`) with its
        worker and device; a case whose worker died twice holds :func:`dead_worker_result`.
    Raises:
        ValueError: ``jobs < 1``.
        ParallelRunError: a worker's ``run_case`` raised.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(cases) <= 1:
        from .runner import run_case
        label = in_process_device_label(device)
        out = []
        for case in cases:
            res = annotate(run_case(case, device=device, **run_kwargs), 0, label)
            out.append(res)
            if on_result is not None:
                on_result(res)
        return out
    cases = list(cases)
    out: List = [None] * len(cases)
    with _pool(device, range(min(jobs, len(cases)))) as pool:
        futures = {i: pool.submit(task, cases[i], run_kwargs) for i in case_cost_order(cases)}
        try:
            died = _collect(cases, futures, out, on_result)
        except ParallelRunError:
            pool.shutdown(wait=False, cancel_futures=True)   # fail fast: queued cases never start
            raise
    for n, i in enumerate(died):     # isolate the culprit: one fresh worker per unfinished case
        w = n % jobs
        with _pool(device, [w]) as pool:
            again = _collect(cases, {i: pool.submit(task, cases[i], run_kwargs)}, out, on_result)
        if again:
            label = worker_device_label(device, worker_environment(w, device, visible_devices(device), 1))
            out[i] = annotate(dead_worker_result(cases[i], "the worker process running this case died twice "
                                                           "(BrokenProcessPool: killed by a signal or out of memory); "
                                                           "rerun it with --jobs 1 to see how"), w, label)
            if on_result is not None:
                on_result(out[i])
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m parity.running.parallel [--device D] [--jobs N]``: print :func:`probe_workers` as JSON
    lines (which device each worker of ``run --jobs N`` would be pinned to, and what it sees)."""
    import argparse
    import json
    parser = argparse.ArgumentParser(prog="python -m parity.running.parallel",
                                     description="Show the device pin of each parity worker.")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    from kpool.platform import detect_device
    device = detect_device(None if args.device == "auto" else args.device)
    print(json.dumps({"device": device, "visible": visible_devices(device), "jobs": args.jobs}))
    for info in probe_workers(device, args.jobs):
        print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
