"""Device call of issue 20: the exact top-k kernels against ``torch.topk`` (bit for bit on random
and adversarial rows at serving widths, and their times), then per-kernel device times of one
forward of each benchmark shape (profiler trace) and its graph replay.
``$OUT/device_speed.json`` + log. Run from the repository root:
``PYTHONPATH=$PWD python3 scripts/device_speed.py`` (``DEVICE=cpu``: tiny dry run)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_kernels as dk  # noqa: E402  (logging, time budget, sections)

dk.RESULTS["script"] = "device_speed"
SHAPES = ("decode", "decode-batch-1", "mtp3-verify", "prefill", "mixed", "compress")


def adversarial_keys(rows: int, width: int, device):
    """Canonical keys of rows that stress the select: random, all equal, -0.0/+0.0, dense
    near-ties, fewer valid pools than K, strictly increasing."""
    import torch

    from kpool.ops import topk
    gen = torch.Generator().manual_seed(rows + width)
    s = torch.randn(rows, width, generator=gen)
    lowest = torch.finfo(torch.float32).min
    kinds = rows if rows < 6 else 6
    for r in range(kinds):
        if r % 6 == 1:
            s[r] = 1.5
        elif r % 6 == 2:
            s[r] = torch.where(torch.arange(width) % 2 == 0, 0.0, -0.0)
        elif r % 6 == 3:
            one = torch.tensor(1.0).view(torch.int32)
            s[r] = (one + torch.arange(width, dtype=torch.int32) % 5).view(torch.float32)
        elif r % 6 == 4:
            s[r] = lowest
            s[r, torch.randperm(width, generator=gen)[:7]] = 0.5
        elif r % 6 == 5:
            s[r] = torch.arange(width, dtype=torch.float32)
    return topk.canonical_keys(s).to(device)


def topk_section():
    import torch

    from kpool.platform import resolve_device, torch_device
    device = torch_device(resolve_device(dk.DEVICE))     # before any kernel module is imported
    from kpool.ops import topk
    from parity.bench import kernels as bench
    measure = bench.timer(device, 1)
    rows_out = []
    shapes = [(1, 16384, 512), (64, 16384, 512), (256, 16384, 512), (2048, 16384, 512), (64, 2048, 64),
              (64, 4096, 2048), (16, 16384, 16384)] if not dk.SMALL else [(4, 300, 17), (3, 64, 64)]
    for rows, width, k in shapes:
        keys = adversarial_keys(rows, width, device)
        out = torch.empty(rows, k, dtype=torch.int64, device=device)
        work = torch.empty(rows, k, dtype=torch.int64, device=device)
        got = topk.select_topk(keys, k, out=out, work=work)
        want = torch.topk(keys, k, dim=1).values
        equal = bool(torch.equal(got, want))
        t_kernel = measure(lambda: topk.select_topk(keys, k, out=out, work=work))
        t_torch = measure(lambda: torch.topk(keys, k, dim=1))
        t_f32 = measure(lambda: torch.topk(keys.view(torch.float64), k, dim=1))   # 8-byte values, no order
        read = measure(lambda: keys.sum())
        rows_out.append(dict(rows=rows, width=width, k=k, equal=equal, kernel_us=1e6 * t_kernel,
                             torch_topk_int64_us=1e6 * t_torch, one_read_us=1e6 * read,
                             torch_topk_8byte_float_us=1e6 * t_f32))
        dk.say(rows_out[-1])
        dk.RESULTS["topk"] = rows_out
        dk.save()
        del keys, out, work


def profile_section():
    import torch
    from torch.profiler import ProfilerActivity, profile as prof

    from kpool.indexer import forward
    from kpool.platform import resolve_device, torch_device
    from parity.bench import kernels as bench
    from parity.bench.shapes import standard_cases
    device = torch_device(resolve_device(dk.DEVICE))
    measure = bench.timer(device, 1)
    makers = dict(zip(SHAPES, standard_cases(device, small=dk.SMALL)))
    per_kernel = {}
    for shape in SHAPES:
        if dk.left() < 30:
            break
        case = makers[shape]()
        fn = lambda: forward(**case.kwargs, validate=False)  # noqa: E731
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
            with prof(activities=[ProfilerActivity.CUDA]) as p:
                fn()
                torch.cuda.synchronize()
            table = {}
            for e in p.key_averages():
                t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                if t:
                    table[e.key[:60]] = (e.count, round(t, 1))
            per_kernel[shape] = dict(sorted(table.items(), key=lambda kv: -kv[1][1])[:10])
            per_kernel[shape + " graph_ms"] = 1e3 * measure(bench.graph_replay(fn, device))
            per_kernel[shape + " host_ms"] = 1e3 * bench.host_time(fn, device)
            dk.say(shape, per_kernel[shape], "graph ms", per_kernel[shape + " graph_ms"], "host ms",
                   per_kernel[shape + " host_ms"])
        del case
        dk.RESULTS["per_kernel"] = per_kernel
        dk.save()


if __name__ == "__main__":
    dk.say("device", dk.DEVICE)
    dk.section("topk", topk_section, need_s=20)
    if "--profile" in sys.argv:
        dk.section("profile", profile_section, need_s=30)
