"""Kernel benchmarks: ``make bench`` = ``python -m parity.bench`` (issue 10 point 7).

For each shape of :func:`parity.bench.shapes.standard_cases` (decode 64 x 64k, decode batch 1,
MTP=3 verify, prefill 16384 rows over 64k, a mixed prefill + decode batch, compress + ring write
of a 64k prefill) it times ``kpool.indexer.forward`` with ``validate=False`` (and, for the
decode and mixed shapes, a second row with ``validate=True``: validation is a host sync and
stays off the serving path), the same forward captured in a CUDA graph and replayed (the FULL-
mode serving path, no host launch overhead; ``graph_ms``), the eager PyTorch version of the same
op and its ``torch.compile``, and prints per op: time, bytes and FLOPs, the fraction of the
measured copy bandwidth and bf16 matmul rate (both measured in the same run), the ratio to eager
and to compiled, the launches per forward and the host time of one eager forward (``host_ms``).

Timing: CUDA/NPU with ``triton.testing.do_bench`` (median; L2 flushed between runs, warm-up
excluded, so JIT compilation is not timed); the CPU interpreter with wall-clock medians of a
few runs on tiny shapes (no ``torch.compile`` there by default). Speed targets live here, as
ratios in the printed table, never in timed tests.

Run: ``python -m parity.bench [--device auto|cpu|cuda|npu] [--case NAME ...] [--compile
all|none|NAME,...] [--repeat N] [--json FILE] [--compare FILE] [--csv FILE]``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

VALIDATED = ("decode", "mixed")
"""Shapes also timed with ``validate=True`` (a separate row)."""


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":  # pragma: no cover - needs torch_npu
        torch.npu.synchronize(device)


def timer(device, repeat: int) -> Callable[[Callable[[], object]], float]:
    """``time(fn) -> seconds``: ``triton.testing.do_bench`` on cuda/npu (median, L2 flushed,
    ``repeat`` scales its time budget), else the median wall time of ``repeat`` runs after one
    warm-up run."""
    if device.type in ("cuda", "npu"):
        import triton

        def measure(fn):
            return triton.testing.do_bench(fn, warmup=25 * repeat, rep=100 * repeat, return_mode="median") / 1e3
        return measure

    def measure(fn):
        fn()
        times = []
        for _ in range(max(1, repeat)):
            start = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    return measure


def count_launches(fn, device) -> int:
    """Kernel launches of one call of ``fn``: device kernels in a profiler trace on cuda/npu; on
    the interpreter the Triton launches plus the torch ops of the top-k path (``torch.topk``)."""
    import torch
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile
        fn()
        _sync(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            _sync(device)
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    from triton.runtime import jit
    calls = {"n": 0}
    original = jit.KernelInterface.__getitem__
    real_topk = torch.topk

    def counting(self, grid):
        calls["n"] += 1
        return original(self, grid)

    def topk(*a, **k):
        calls["n"] += 1
        return real_topk(*a, **k)
    jit.KernelInterface.__getitem__ = counting
    torch.topk = topk
    try:
        fn()
    finally:
        jit.KernelInterface.__getitem__ = original
        torch.topk = real_topk
    return calls["n"]


def host_time(fn, device, calls: int = 20) -> float:
    """Median host seconds of one eager call of ``fn`` (Python, allocation, launch plans and the
    launches themselves), each call started on an idle device (synchronized before, not after),
    so a full launch queue never stalls it. What a piecewise-launched serving step pays on the
    host; the device work overlaps the next step's host time."""
    fn()
    times = []
    for _ in range(max(1, calls)):
        _sync(device)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    _sync(device)
    return statistics.median(times)


def graph_replay(fn, device):
    """``fn`` captured in a CUDA graph (after a warm-up call on a side stream), as a FULL-mode
    serving engine replays it: returns ``graph.replay`` (raises where capture fails, e.g. on a
    host sync). CUDA only."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def measure_ceilings(device, measure, *, small: bool) -> Dict[str, float]:
    """``copy_bytes_per_s`` (``dst.copy_(src)``, read + write) and ``bf16_flops_per_s`` (square
    bf16 matmul) of this device, measured now."""
    import torch
    n = (1 << 20) if small else (1 << 29)            # elements of fp32: 4 MiB / 2 GiB
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    copy = measure(lambda: dst.copy_(src))
    m = 256 if small else 8192
    a = torch.randn(m, m, device=device).bfloat16()
    b = torch.randn(m, m, device=device).bfloat16()
    mm = measure(lambda: a @ b)
    del src, dst, a, b
    return {"copy_bytes_per_s": 2 * n * 4 / copy, "bf16_flops_per_s": 2 * m ** 3 / mm}


def bench_case(make_case, device, measure, ceilings: dict, *, compile_eager: bool) -> List[dict]:
    """Rows of one shape: the kernel forward (validate=False), optionally validate=True, with the
    eager / compiled baselines and the ceilings' fractions."""
    import torch

    from kpool.indexer import forward

    from .shapes import eager_forward, eager_plan, eager_scores, eager_update
    case = make_case()
    kernel = lambda: forward(**case.kwargs, validate=False)  # noqa: E731
    t = measure(kernel)
    launches = count_launches(kernel, device)
    host = host_time(kernel, device)
    graph = None
    if device.type == "cuda":       # the serving path: one decode step replayed from a graph
        graph = measure(graph_replay(kernel, device))
    eager_plan(case)                # host-known index tensors, built once (not timed)
    eager = measure(lambda: eager_forward(case))
    compiled = None
    if compile_eager:               # the cache-only shape compiles its update alone
        scores, update = torch.compile(eager_scores, dynamic=False), torch.compile(eager_update, dynamic=False)
        compiled = measure(lambda: eager_forward(case, chunk_fn=scores, update_fn=update))
    row = dict(op=case.name, description=case.description, time_ms=1e3 * t, bytes_MB=case.bytes / 1e6,
               GFLOP=case.flops / 1e9, copy_bw_frac=case.bytes / t / ceilings["copy_bytes_per_s"],
               bf16_frac=case.flops / t / ceilings["bf16_flops_per_s"],
               floor_ms=1e3 * max(case.bytes / ceilings["copy_bytes_per_s"], case.flops / ceilings["bf16_flops_per_s"]),
               eager_ms=1e3 * eager, compiled_ms=None if compiled is None else 1e3 * compiled,
               vs_eager=eager / t, vs_compiled=None if compiled is None else compiled / t, launches=launches,
               host_ms=1e3 * host, graph_ms=None if graph is None else 1e3 * graph, validate=False)
    rows = [row]
    if case.name in VALIDATED:
        tv = measure(lambda: forward(**case.kwargs, validate=True))
        rows.append(dict(row, op=f"{case.name} [validate=True]", time_ms=1e3 * tv, graph_ms=None,
                         copy_bw_frac=case.bytes / tv / ceilings["copy_bytes_per_s"],
                         bf16_frac=case.flops / tv / ceilings["bf16_flops_per_s"], vs_eager=eager / tv,
                         vs_compiled=None if compiled is None else compiled / tv,
                         launches=count_launches(lambda: forward(**case.kwargs, validate=True), device),
                         host_ms=1e3 * host_time(lambda: forward(**case.kwargs, validate=True), device),
                         validate=True))
    del case
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def environment(backend: str, device) -> dict:
    import platform

    import torch
    import triton
    env = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), backend=backend,
               torch=torch.__version__, triton=triton.__version__, python=platform.python_version())
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    return env


def _serving(r) -> Optional[float]:
    """The serving time of a row: the graph replay where there is one, else the eager-launched time."""
    return r["graph_ms"] if r.get("graph_ms") is not None else r["time_ms"]


TARGETS = (
    ("decode", "serving <= 2.0x memory floor", lambda r: _serving(r) <= 2.0 * r["floor_ms"]),
    ("decode-batch-1", "serving <= 0.040 ms", lambda r: _serving(r) <= 0.040),
    ("mtp3-verify", "serving <= 2.5x memory floor", lambda r: _serving(r) <= 2.5 * r["floor_ms"]),
    ("prefill", "serving <= 2.5x FLOP floor", lambda r: _serving(r) <= 2.5 * r["floor_ms"]),
    ("mixed", "serving <= 3x floor", lambda r: _serving(r) <= 3.0 * r["floor_ms"]),
    ("compress", "serving >= 40% of copy bandwidth", lambda r: r["floor_ms"] >= 0.4 * _serving(r)),
    ("compress", "serving >= 2x faster than torch.compile", lambda r: r["compiled_ms"] is not None
     and r["compiled_ms"] >= 2 * _serving(r)),
    ("decode", "host time of an eager forward <= 0.2 ms", lambda r: r.get("host_ms") is not None
     and r["host_ms"] <= 0.2),
)
"""Issue 20's targets as ``(op, what, test(row))``: "serving" is the CUDA-graph replay (FULL
mode) where the device has graphs, else the eager-launched time; floors and baselines are this
run's."""


def check_targets(rows: List[dict]) -> List[dict]:
    """One ``{op, target, met}`` row per target whose op was benchmarked."""
    by_op = {r["op"]: r for r in rows}
    return [dict(op=op, target=what, met=bool(test(by_op[op]))) for op, what, test in TARGETS if op in by_op]


def compare(rows: List[dict], before: dict) -> List[dict]:
    """Per op of ``rows`` also in the stored run ``before`` (a ``--json`` file's content): times
    now and then and ``speedup = before / now``."""
    old = {r["op"]: r for r in before.get("rows", [])}
    out = []
    for r in rows:
        if r["op"] not in old:
            continue
        was = old[r["op"]]
        row = dict(op=r["op"], time_ms=r["time_ms"], before_ms=was["time_ms"], speedup=was["time_ms"] / r["time_ms"])
        if r.get("graph_ms") is not None and was.get("graph_ms") is not None:
            row.update(graph_ms=r["graph_ms"], graph_before_ms=was["graph_ms"],
                       graph_speedup=was["graph_ms"] / r["graph_ms"])
        out.append(row)
    return out


def main(argv=None) -> int:
    """CLI entry; returns the exit code (0, or 2 on a usage error)."""
    parser = argparse.ArgumentParser(prog="python -m parity.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--case", action="append", default=None, help="shape name (repeatable)")
    parser.add_argument("--compile", default=None, help="all | none | comma-separated shape names "
                        "(default: all on cuda/npu, none on the interpreter)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the table, ceilings and environment")
    parser.add_argument("--compare", default=None, help="print the speedup against a stored --json run")
    parser.add_argument("--csv", default=None)
    args = parser.parse_args(argv)
    from kpool.platform import resolve_device, torch_device  # before anything imports kpool.ops
    backend = resolve_device(args.device)
    device = torch_device(backend)
    import pandas as pd

    from .shapes import standard_cases
    small = backend == "cpu"
    factories = standard_cases(device, small=small)      # built lazily: each is big on the GLM geometry
    known = ("decode", "decode-batch-1", "mtp3-verify", "prefill", "mixed", "compress")
    wanted = args.case or list(known)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {list(known)}", file=sys.stderr)
        return 2
    before = None
    if args.compare:
        try:
            with open(args.compare) as f:
                before = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"cannot read --compare {args.compare}: {exc}", file=sys.stderr)
            return 2
    spec = args.compile or ("none" if small else "all")
    compiled = set(known) if spec == "all" else set() if spec == "none" else set(spec.split(","))
    measure = timer(device, max(1, args.repeat))
    ceilings = measure_ceilings(device, measure, small=small)
    rows = []
    for name, make in zip(known, factories):
        if name in wanted:
            rows.extend(bench_case(make, device, measure, ceilings, compile_eager=name in compiled))
    table = pd.DataFrame(rows).drop(columns=["description"])
    env = environment(backend, device)
    with pd.option_context("display.width", 250, "display.max_rows", 100, "display.max_columns", 30):
        print(f"device: {env.get('device_name', backend)}; torch {env['torch']}, triton {env['triton']}; "
              f"copy {ceilings['copy_bytes_per_s'] / 1e12:.3f} TB/s, bf16 matmul "
              f"{ceilings['bf16_flops_per_s'] / 1e12:.1f} TFLOP/s (measured now)")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        targets = check_targets(rows)
        if targets:
            print("\ntargets (issue 20; ratios of this run):")
            print(pd.DataFrame(targets).to_string(index=False))
        if before is not None:
            print(f"\nagainst {args.compare} ({before.get('environment', {}).get('date', '?')}):")
            print(pd.DataFrame(compare(rows, before)).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "ceilings": ceilings, "rows": rows, "targets": check_targets(rows)},
                      f, indent=1)
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
