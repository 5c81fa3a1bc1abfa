"""One device call for the kernel work of issue 10: correctness on the device, registers and
spills, tile/warp/stage variants and the benchmark table, written to ``$OUT``.

Run from the repository root (``PYTHONPATH=$PWD python3 scripts/device_kernels.py``); every
section is time-boxed (``BUDGET_S``, default 370 s) and its results are flushed to
``$OUT/device_kernels.json`` and ``$OUT/log.txt`` as it goes, so a killed run still reports.
``DEVICE=cpu`` runs the same code on tiny shapes under the interpreter (a dry run).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback

OUT = os.environ.get("OUT", "/tmp/device-out")
os.makedirs(OUT, exist_ok=True)
T0 = time.time()
BUDGET = float(os.environ.get("BUDGET_S", "400"))
DEVICE = os.environ.get("DEVICE", "cuda")
SMALL = DEVICE == "cpu"
RESULTS: dict = {"sections": {}}
_LOG = open(os.path.join(OUT, "log.txt"), "a")


def left() -> float:
    return BUDGET - (time.time() - T0)


def say(*parts) -> None:
    line = f"[{time.time() - T0:6.1f}s] " + " ".join(str(p) for p in parts)
    print(line, flush=True)
    _LOG.write(line + "\n")
    _LOG.flush()


def save() -> None:
    """``$OUT/<RESULTS["script"]>.json`` (default ``device_kernels.json``): the results so far."""
    with open(os.path.join(OUT, f"{RESULTS.get('script', 'device_kernels')}.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def section(name, fn, need_s: float):
    if left() < need_s:
        say(f"SKIP {name}: {left():.0f} s left, needs {need_s:.0f}")
        RESULTS["sections"][name] = "skipped"
        save()
        return None
    say(f"== {name}")
    t = time.time()
    try:
        out = fn()
        RESULTS["sections"][name] = f"ok in {time.time() - t:.1f}s"
        return out
    except Exception:
        say(traceback.format_exc()[-3000:])
        RESULTS["sections"][name] = "error: " + traceback.format_exc().splitlines()[-1]
        return None
    finally:
        save()


def run(cmd, timeout):
    say("$", " ".join(cmd))
    env = dict(os.environ, PYTHONUNBUFFERED="1", KPOOL_DEVICE=DEVICE)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        tail = (p.stdout + p.stderr)[-2500:]
        say(tail)
        return p.returncode, tail
    except subprocess.TimeoutExpired as exc:
        tail = ((exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""))[-1500:]
        say("TIMEOUT", tail)
        return 124, tail


# ------------------------------------------------------------------------------ sections

def correctness():
    tests = ["tests/test_indexer_kernel.py", "-k",
             "(exact_data_scores and (3-wdtype2 or 20-wdtype3 or 2-wdtype1-merged)) or (certified_bound and 16-relu)"
             " or (certified_bound and 2-wdtype0-16-merged) or nan_and_inf or glm or keys_are or padding_rows or"
             " chunking or (decode_or_prefill and (0 or 100)) or select_topk or chain or glm_shape_chunked or"
             " nonfinite_inputs or exp_fp32 or decode_sequence_equals",
             "tests/test_compress_kernel.py::test_glm_shape_chunked_prefill_and_decode",
             "tests/test_compress_kernel.py::test_nonfinite_inputs_bitwise",
             "tests/test_portable_numerics.py::test_exp_fp32_matches_reference_bitwise",
             "tests/test_compress_kernel.py::test_decode_sequence_equals_prefill_c01"]
    rc, tail = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", DEVICE] + tests,
                   timeout=min(150, left() - 220))
    RESULTS["correctness"] = {"rc": rc, "tail": tail[-800:]}


def parity_with_graph():
    rc, tail = run([sys.executable, "-m", "parity", "run", "--device", DEVICE, "--suite", "seed", "--size", "small",
                    "--metamorphic", "captured-replay", "--no-bundles", "--failures-only"], timeout=min(75, left() - 150))
    RESULTS["parity_seed_small_captured_replay"] = {"rc": rc, "tail": tail[-1200:]}


def benchmark():
    import torch

    from kpool.platform import resolve_device, torch_device
    backend = resolve_device(DEVICE)
    device = torch_device(backend)
    from kpool.indexer import forward
    from kpool.ops import plan
    from parity.bench import kernels as bench
    from parity.bench.shapes import standard_cases
    measure = bench.timer(device, 1)
    ceilings = bench.measure_ceilings(device, measure, small=SMALL)
    RESULTS["ceilings"] = ceilings
    say("ceilings", ceilings)
    save()
    makers = dict(zip(("decode", "decode-batch-1", "mtp3-verify", "prefill", "mixed", "compress"),
                      standard_cases(device, small=SMALL)))
    key = "cpu" if SMALL else "cuda"
    variants = {
        "decode": ("score_decode", [dict(BLOCK_N=128, num_warps=4, num_stages=2), dict(BLOCK_N=64, num_warps=4),
                                    dict(BLOCK_N=128, num_warps=8), dict(BLOCK_N=128, num_warps=4, per_core=4)]),
        "prefill": ("score_prefill", [dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
                                      dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
                                      dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
                                      dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3)]),
        "compress": ("compress", [dict(BLOCK_J=64, BLOCK_D=32, window=2048, per_core=8, num_warps=4),
                                  dict(BLOCK_J=64, BLOCK_D=32, window=1024, per_core=8, num_warps=4),
                                  dict(BLOCK_J=64, BLOCK_D=64, window=4096, per_core=4, num_warps=8)]),
    }
    sweep = []
    for shape, (kernel, options) in variants.items():
        if left() < 150:
            break
        case = makers[shape]()
        best = None
        for opt in options if not SMALL else options[:2]:
            saved = dict(plan.TUNING[kernel][key])
            plan.TUNING[kernel][key].update(opt)
            try:
                t = measure(lambda: forward(**case.kwargs, validate=False))
                row = dict(shape=shape, kernel=kernel, **opt, time_ms=1e3 * t,
                           copy_bw_frac=case.bytes / t / ceilings["copy_bytes_per_s"],
                           bf16_frac=case.flops / t / ceilings["bf16_flops_per_s"])
                sweep.append(row)
                say(row)
                if best is None or t < best[0]:
                    best = (t, dict(plan.TUNING[kernel][key]))
            except Exception as exc:
                say(f"variant {opt} failed: {exc!r}"[:500])
            finally:
                plan.TUNING[kernel][key] = saved
        if best is not None:
            plan.TUNING[kernel][key] = best[1]
        RESULTS["sweep"] = sweep
        RESULTS["chosen"] = {k: plan.TUNING[k][key] for k in ("score_decode", "score_prefill", "compress")}
        save()
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
    # selection alone on the decode and prefill key shapes
    sel = []
    for rows, n in ((64, 16384), (2048, 16384)) if not SMALL else ((8, 128),):
        keys = torch.randint(-2 ** 62, 2 ** 62, (rows, n), dtype=torch.int64, device=device)
        scores = torch.randn(rows, n, device=device)
        for label, fn in (("topk int64 keys", lambda: torch.topk(keys, 512 if not SMALL else 16, dim=1)),
                          ("topk fp32 scores", lambda: torch.topk(scores, 512 if not SMALL else 16, dim=1)),
                          ("sort int64 keys", lambda: torch.sort(keys, dim=1, descending=True))):
            sel.append(dict(rows=rows, pools=n, op=label, ms=1e3 * measure(fn)))
            say(sel[-1])
    RESULTS["selection"] = sel
    save()
    # the table with the chosen tiles: eager everywhere, torch.compile for decode and prefill
    table = []
    for shape in ("decode", "prefill", "compress", "decode-batch-1", "mtp3-verify", "mixed"):
        need = 60 if shape in ("decode", "prefill") else 25
        if left() < need:
            say(f"table: no time for {shape}")
            continue
        rows = bench.bench_case(makers[shape], device, measure, ceilings,
                                compile_eager=(shape in ("decode", "prefill") and not SMALL and left() > need + 40))
        table.extend(rows)
        for r in rows:
            say({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "description"})
        RESULTS["table"] = table
        save()
    RESULTS["environment"] = bench.environment(backend, device)
    save()


def registers():
    from kpool.ops import compress, expand, merged, score
    found = []
    for mod in (compress, score, merged, expand):
        for name in dir(mod):
            fn = getattr(mod, name)
            caches = getattr(fn, "device_caches", None)
            if not caches:
                continue
            for dev, entry in caches.items():
                kernels = entry[0] if isinstance(entry, tuple) else entry
                for k in getattr(kernels, "values", lambda: [])():
                    found.append(dict(kernel=name, n_regs=getattr(k, "n_regs", None),
                                      n_spills=getattr(k, "n_spills", None),
                                      num_warps=getattr(getattr(k, "metadata", None), "num_warps", None),
                                      shared=getattr(getattr(k, "metadata", None), "shared", None)))
    RESULTS["registers"] = found
    for f in found:
        say(f)


def main():
    say("python", sys.version.split()[0], "device", DEVICE)
    if not SMALL:
        run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,memory.total", "--format=csv"], timeout=20)
    section("correctness", correctness, need_s=200)
    section("parity seed small + captured-replay", parity_with_graph, need_s=200)
    section("benchmark", benchmark, need_s=120)
    section("registers", registers, need_s=3)
    say("done", RESULTS["sections"])
    save()


if __name__ == "__main__":
    main()
