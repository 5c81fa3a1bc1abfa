"""Second device call of issue 10: where the time of each benchmark shape goes (per-kernel CUDA
times from a profiler trace), the forward replayed from a CUDA graph, the score kernels alone,
compression tile variants, then the benchmark table. ``$OUT/device_profile.json`` + log.
Run from the repository root: ``PYTHONPATH=$PWD python3 scripts/device_profile.py``."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_kernels as dk  # noqa: E402  (logging, time budget, sections)

dk.RESULTS["script"] = "device_profile"


def profile():
    import torch
    from torch.profiler import ProfilerActivity, profile as prof

    from kpool.indexer import forward
    from kpool.ops import plan
    from kpool.platform import resolve_device, torch_device
    from parity.bench import kernels as bench
    from parity.bench.shapes import standard_cases
    device = torch_device(resolve_device(dk.DEVICE))
    measure = bench.timer(device, 1)
    ceilings = bench.measure_ceilings(device, measure, small=dk.SMALL)
    dk.RESULTS["ceilings"] = ceilings
    makers = dict(zip(("decode", "decode-batch-1", "mtp3-verify", "prefill", "mixed", "compress"),
                      standard_cases(device, small=dk.SMALL)))
    key = "cpu" if dk.SMALL else "cuda"
    # 1. compression tile variants (prefill 64k and the decode batch's cache update)
    variants = [dict(BLOCK_J=16, BLOCK_D=32, D_SPLIT=32, num_warps=4), dict(BLOCK_J=8, BLOCK_D=32, D_SPLIT=32, num_warps=4),
                dict(BLOCK_J=32, BLOCK_D=32, D_SPLIT=32, num_warps=4), dict(BLOCK_J=16, BLOCK_D=32, D_SPLIT=64, num_warps=4),
                dict(BLOCK_J=4, BLOCK_D=32, D_SPLIT=32, num_warps=4), dict(BLOCK_J=16, BLOCK_D=64, D_SPLIT=64, num_warps=8,
                                                                          window=4096)]
    rows = []
    for shape in ("compress", "decode"):
        case = makers[shape]()
        kw = dict(case.kwargs, compute_topk=False)
        best = None
        for v in variants[: 2 if dk.SMALL else None]:
            saved = dict(plan.TUNING["compress"][key])
            plan.TUNING["compress"][key].update(v)
            try:
                t = measure(lambda: forward(**kw, validate=False))
                rows.append(dict(shape=shape, **v, cache_update_ms=1e3 * t,
                                 copy_bw_frac=case.bytes / t / ceilings["copy_bytes_per_s"] if shape == "compress" else None))
                dk.say(rows[-1])
                if shape == "compress" and (best is None or t < best[0]):
                    best = (t, dict(plan.TUNING["compress"][key]))
            finally:
                plan.TUNING["compress"][key] = saved
        if best is not None:
            plan.TUNING["compress"][key] = best[1]
        del case
    dk.RESULTS["compress_variants"] = rows
    dk.RESULTS["compress_chosen"] = plan.TUNING["compress"][key]
    dk.save()
    # 2. per-kernel device time of one forward, the graph replay, the score kernels alone
    per_kernel = {}
    for shape in ("decode", "mtp3-verify", "decode-batch-1", "prefill", "mixed", "compress"):
        if dk.left() < 60:
            break
        case = makers[shape]()
        fn = lambda: forward(**case.kwargs, validate=False)  # noqa: E731
        fn()
        torch.cuda.synchronize() if device.type == "cuda" else None
        if device.type == "cuda":
            with prof(activities=[ProfilerActivity.CUDA]) as p:
                fn()
                torch.cuda.synchronize()
            table = {}
            for e in p.key_averages():
                if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "self_device_time_total", 0):
                    t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                    if t:
                        table[e.key[:70]] = (e.count, round(t, 1))
            per_kernel[shape] = dict(sorted(table.items(), key=lambda kv: -kv[1][1])[:12])
            dk.say(shape, "per-kernel us:", per_kernel[shape])
            g = measure(bench.graph_replay(fn, device))
            per_kernel[shape + " graph_ms"] = 1e3 * g
            dk.say(shape, "graph replay ms", 1e3 * g)
        del case
        dk.RESULTS["per_kernel"] = per_kernel
        dk.save()


def table():
    import torch

    from kpool.platform import resolve_device, torch_device
    from parity.bench import kernels as bench
    from parity.bench.shapes import standard_cases
    device = torch_device(resolve_device(dk.DEVICE))
    measure = bench.timer(device, 1)
    ceilings = dk.RESULTS.get("ceilings") or bench.measure_ceilings(device, measure, small=dk.SMALL)
    makers = dict(zip(("decode", "decode-batch-1", "mtp3-verify", "prefill", "mixed", "compress"),
                      standard_cases(device, small=dk.SMALL)))
    rows = []
    for shape in ("decode", "prefill", "compress", "decode-batch-1", "mtp3-verify", "mixed"):
        if dk.left() < (50 if shape in ("decode", "prefill") else 15):
            dk.say("table: no time for", shape)
            continue
        got = bench.bench_case(makers[shape], device, measure, ceilings,
                               compile_eager=shape in ("decode", "prefill") and not dk.SMALL and dk.left() > 80)
        rows.extend(got)
        for r in got:
            dk.say({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "description"})
        dk.RESULTS["table"] = rows
        dk.save()
    dk.RESULTS["environment"] = bench.environment(dk.DEVICE, device)
    dk.save()


if __name__ == "__main__":
    dk.say("device", dk.DEVICE)
    dk.section("profile", profile, need_s=60)
    dk.section("table", table, need_s=40)
    dk.say("done", dk.RESULTS["sections"])
    dk.save()
