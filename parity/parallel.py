"""Multi-worker parity runs: ``python -m parity run --jobs N`` (``make parity JOBS=N``).

Cases are spread over ``N`` worker processes that pull them from one queue (largest cases
first), each worker pinned to one device; results come back in case order and are merged into
one results table and report, so the findings equal a ``--jobs 1`` run row for row. Every
findings and timings row gets two columns: ``worker`` (0 .. N-1) and ``worker_device``
(``"cuda:1"`` = physical CUDA device 1, ``"npu:0"``, ``"cpu"``).

Device pinning (platform-numerics.md §2.1, §6.2): worker ``i`` sees only physical device
``devices[i % len(devices)]`` through ``CUDA_VISIBLE_DEVICES`` (cuda) or
``ASCEND_RT_VISIBLE_DEVICES`` (npu), where ``devices`` is the parent's own visible list (its
``*_VISIBLE_DEVICES`` if set, else ``0 .. device_count-1``). The variable is put into the
environment the worker process is *spawned* with, so it is in place before the worker's
Python, torch or torch_npu even start; with one device all workers share it; on ``cpu``
(Triton interpreter) nothing is pinned. ``OMP_NUM_THREADS`` defaults to ``cores // N`` per
worker (the reference runs on the host CPU in every worker), unless already set.

Workers use the ``spawn`` start method (a forked CUDA/NPU runtime is unusable) and send each
:class:`parity.runner.CaseResult` back pickled, with every tensor moved to the host. A worker
that raises reports the traceback; one that dies (signal, OOM) is named with the case it was
running; either aborts the run with :class:`ParallelRunError`.

Importing this module imports neither torch nor any kernel.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import queue as queue_mod
import threading
import traceback
from typing import Callable, Dict, List, Optional, Sequence

VISIBLE_DEVICES_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
"""The runtime's device-visibility variable per backend."""

WORKER_COLUMNS = ("worker", "worker_device")
"""Columns added to every findings and timings row."""

_SPAWN_LOCK = threading.Lock()   # os.environ is process-wide while a worker is being spawned
_POLL_S = 0.5


class ParallelRunError(RuntimeError):
    """A worker raised or died; the message names the worker, its device and the case."""


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


def _worker_main(worker: int, device: str, tasks, results) -> None:
    """Worker process body: resolve the device (env already pinned at spawn), then run cases
    from ``tasks`` until ``None``; post ``("start"|"done"|"error", index, worker, payload)``."""
    try:
        from kpool.platform import resolve_device
        resolved = resolve_device(device)
        from .runner import run_case
        # What run_case imports lazily (kernels, reference, value generators): load it now so the
        # start-up cost is not billed to the first case's wall time.
        import cases.values  # noqa: F401
        import kpool.indexer  # noqa: F401
        import reference.stateful  # noqa: F401
    except BaseException:
        results.put(("error", None, worker, traceback.format_exc()))
        return
    while True:
        item = tasks.get()
        if item is None:
            return
        index, case_bytes, run_kwargs = item
        results.put(("start", index, worker, None))
        try:
            res = run_case(pickle.loads(case_bytes), device=resolved, **run_kwargs)
            payload = pickle.dumps(_to_host(res))
        except BaseException:
            results.put(("error", index, worker, traceback.format_exc()))
            return
        results.put(("done", index, worker, payload))


def run_cases(cases: Sequence, *, device: str, jobs: int = 1,
              on_result: Optional[Callable] = None, **run_kwargs) -> List:
    """Run ``cases`` with :func:`parity.runner.run_case` on ``jobs`` workers; merged results.

    Args:
        cases: :class:`cases.spec.Case` objects (picklable).
        device: the resolved backend (``kpool.platform.resolve_device``).
        jobs: worker processes; ``1`` runs in this process (no spawn), ``> 1`` spawns
            ``min(jobs, len(cases))`` workers pinned as in the module docstring.
        on_result: ``fn(result)`` called in this process as each case finishes (progress).
        **run_kwargs: passed to ``run_case`` (``check_oracle``, ``mode``, ...; picklable).
    Returns:
        ``CaseResult`` list in the order of ``cases``, each annotated (:func:`annotate`) with its
        worker and device.
    Raises:
        ValueError: ``jobs < 1``.
        ParallelRunError: a worker raised or died.
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
    return _run_spawned(list(cases), device=device, jobs=min(jobs, len(cases)), on_result=on_result,
                        run_kwargs=run_kwargs)


def _start_workers(ctx, device: str, jobs: int, target, extra_args: tuple):
    """Spawn ``jobs`` processes ``target(worker, device, *extra_args)``, worker ``w`` with
    :func:`worker_environment` in the environment it starts with. Returns ``(procs, labels)``."""
    devices = visible_devices(device)
    procs, labels = [], []
    for w in range(jobs):
        env = worker_environment(w, device, devices, jobs)
        proc = ctx.Process(target=target, args=(w, device) + tuple(extra_args),
                           name=f"parity-worker-{w}", daemon=True)
        with _SPAWN_LOCK:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                proc.start()                 # the child's environment is copied here
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        procs.append(proc)
        labels.append(worker_device_label(device, env))
    return procs, labels


def _probe_main(worker: int, device: str, results) -> None:
    """Probe worker body: report the pin it started with and what the runtime sees through it."""
    info = {"worker": worker, "pid": os.getpid(),
            "torch_imported_at_start": "torch" in __import__("sys").modules}
    for var in ("KPOOL_DEVICE", "OMP_NUM_THREADS") + tuple(VISIBLE_DEVICES_ENV.values()):
        info[var] = os.environ.get(var)
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
    results.put(info)


def probe_workers(device: str, jobs: int, timeout_s: float = 120.0) -> List[dict]:
    """Spawn ``jobs`` workers exactly as ``run --jobs`` does and return what each one saw:
    ``worker``, ``pid``, ``KPOOL_DEVICE``, ``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``,
    ``ASCEND_RT_VISIBLE_DEVICES``, ``torch_imported_at_start`` (must be False: the pin precedes
    torch) and, on cuda/npu, ``device_count`` (1 when pinned) and ``device_name``. A diagnostic
    for multi-device hosts (docs/validation.md) and the tests; sorted by worker."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs, _ = _start_workers(ctx, device, jobs, _probe_main, (results,))
    try:
        out = [results.get(timeout=timeout_s) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        results.cancel_join_thread()
        results.close()
    return sorted(out, key=lambda d: d["worker"])


def _run_spawned(cases: List, *, device: str, jobs: int, on_result, run_kwargs: dict) -> List:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    procs: List = []
    try:
        procs, labels = _start_workers(ctx, device, jobs, _worker_main, (tasks, results))
        for i in case_cost_order(cases):
            tasks.put((i, pickle.dumps(cases[i]), run_kwargs))
        for _ in procs:
            tasks.put(None)
        return _collect(cases, procs, labels, results, on_result)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
        for q in (tasks, results):
            q.cancel_join_thread()       # never block exit on undelivered items of a dead worker
            q.close()


def _collect(cases, procs, labels, results, on_result) -> List:
    """Gather one result per case; fail fast on a worker error or death."""
    out: List = [None] * len(cases)
    running: Dict[int, int] = {}                 # worker -> case index
    pending = len(cases)

    def who(w: int) -> str:
        return f"worker {w} ({labels[w]})"

    def case_name(i) -> str:
        return getattr(cases[i], "case_id", str(i)) if i is not None else "start-up"

    while pending:
        try:
            kind, index, w, payload = results.get(timeout=_POLL_S)
        except queue_mod.Empty:
            for w, proc in enumerate(procs):
                if not proc.is_alive() and proc.exitcode not in (0, None):
                    raise ParallelRunError(f"{who(w)} died (exit code {proc.exitcode}) while running "
                                           f"{case_name(running.get(w))}")
            if all(not p.is_alive() for p in procs):
                missing = [case_name(i) for i, r in enumerate(out) if r is None]
                raise ParallelRunError(f"all workers exited with cases left: {missing}")
            continue
        if kind == "start":
            running[w] = index
        elif kind == "error":
            raise ParallelRunError(f"{who(w)} failed on {case_name(index)}:\n{payload}")
        else:
            running.pop(w, None)
            out[index] = annotate(pickle.loads(payload), w, labels[w])
            pending -= 1
            if on_result is not None:
                on_result(out[index])
    return out



def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m parity.parallel [--device D] [--jobs N]``: print :func:`probe_workers` as JSON
    lines (which device each worker of ``run --jobs N`` would be pinned to, and what it sees)."""
    import argparse
    import json
    parser = argparse.ArgumentParser(prog="python -m parity.parallel",
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
