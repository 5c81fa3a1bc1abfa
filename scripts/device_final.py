"""Last device call of issue 10: the decode kernel's pipelined variants and the compression tiles,
a short correctness check of the rewritten decode kernel, then the benchmark table with the
chosen tiles (graph replay included). ``$OUT/device_final.json`` + log.
Run from the repository root: ``PYTHONPATH=$PWD python3 scripts/device_final.py``."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_kernels as dk  # noqa: E402
import device_profile as dp  # noqa: E402

dk.RESULTS["script"] = "device_final"


def check():
    rc, tail = dk.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", dk.DEVICE,
                       "tests/test_indexer_kernel.py", "-k",
                       "(exact_data_scores and (20-wdtype3 or 2-wdtype1)) or glm or (decode_or_prefill and 100) or "
                       "(certified_bound and 16-relu) or nan_and_inf"], timeout=min(90, dk.left() - 60))
    dk.RESULTS["check"] = {"rc": rc, "tail": tail[-600:]}


def sweep():
    from kpool.indexer import forward
    from kpool.ops import plan
    from kpool.platform import resolve_device, torch_device
    from parity.bench import kernels as bench
    from parity.bench.shapes import standard_cases
    device = torch_device(resolve_device(dk.DEVICE))
    measure = bench.timer(device, 1)
    ceilings = bench.measure_ceilings(device, measure, small=dk.SMALL)
    dk.RESULTS["ceilings"] = ceilings
    key = "cpu" if dk.SMALL else "cuda"
    makers = dict(zip(("decode", "decode-batch-1", "mtp3-verify", "prefill", "mixed", "compress"),
                      standard_cases(device, small=dk.SMALL)))
    grid = {"score_decode": ("decode", [dict(BLOCK_N=64, num_stages=2), dict(BLOCK_N=64, num_stages=3),
                                        dict(BLOCK_N=128, num_stages=3), dict(BLOCK_N=64, num_stages=4),
                                        dict(BLOCK_N=128, num_stages=2)]),
            "compress": ("compress", [dict(BLOCK_J=16, BLOCK_D=32, D_SPLIT=32, window=2048, per_core=8, num_warps=4),
                                      dict(BLOCK_J=64, BLOCK_D=64, D_SPLIT=0, window=4096, per_core=4, num_warps=8),
                                      dict(BLOCK_J=64, BLOCK_D=64, D_SPLIT=64, window=4096, per_core=4, num_warps=8)])}
    rows = []
    for kernel, (shape, variants) in grid.items():
        case = makers[shape]()
        kw = dict(case.kwargs, compute_topk=False) if kernel == "compress" else case.kwargs
        best = None
        for v in variants[: 2 if dk.SMALL else None]:
            saved = dict(plan.TUNING[kernel][key])
            plan.TUNING[kernel][key].update(v)
            try:
                replay = bench.graph_replay(lambda: forward(**kw, validate=False), device) if device.type == "cuda" \
                    else (lambda: forward(**kw, validate=False))
                t = measure(replay)
                rows.append(dict(kernel=kernel, shape=shape, **v, graph_ms=1e3 * t))
                dk.say(rows[-1])
                if best is None or t < best[0]:
                    best = (t, dict(plan.TUNING[kernel][key]))
            except Exception as exc:
                dk.say("variant failed", v, repr(exc)[:400])
            finally:
                plan.TUNING[kernel][key] = saved
        if best is not None:
            plan.TUNING[kernel][key] = best[1]
        del case
    dk.RESULTS["final_sweep"] = rows
    dk.RESULTS["chosen"] = {k: plan.TUNING[k][key] for k in ("score_decode", "score_prefill", "compress")}
    dk.save()


if __name__ == "__main__":
    dk.say("device", dk.DEVICE)
    dk.section("check", check, need_s=100)
    dk.section("sweep", sweep, need_s=50)
    dk.section("table", dp.table, need_s=40)
    dk.say("done", dk.RESULTS["sections"])
    dk.save()
