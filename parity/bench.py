"""Kernel benchmarks: ``make bench`` = ``python -m parity.bench`` (architecture.md ``bench``).

Times the production forward (``kpool.indexer.forward``: compression + ring write + scoring +
top-k + expansion) on every step of the seed scenarios, from a fresh byte-identical copy of the
step's input caches each repetition, after one warm-up run (JIT compilation excluded). Reports the
median and minimum wall time per step (device-synchronised) and the caches' bytes, as a pandas
table, optionally written to CSV. Speed targets belong here, never in timed unit tests.

Run: ``python -m parity.bench [--device auto|cpu|cuda|npu] [--size small|glm5.3-flash|all]
[--repeat N] [--case NAME ...] [--csv FILE]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":  # pragma: no cover - needs torch_npu
        torch.npu.synchronize(device)


def bench_case(case, device, repeat: int) -> list:
    """Time every step of ``case`` on ``device``.

    Returns:
        one dict per step: case, size, step, step_name, rows ``T``, median_ms, min_ms, cache_mib.
    """
    import torch

    from cases.values import case_ape, make_inputs
    from kpool.indexer import forward
    from kpool.metadata import build_metadata

    cfg, geo = case.config, case.geometry
    caches = geo.allocate(cfg, device=device)
    ape = case_ape(case).to(device)
    cache_mib = (caches.compressed_backing.numel() * 2 + caches.tail_backing.numel() * 4) / 2 ** 20
    rows = []
    for index, step in enumerate(case.steps):
        meta = build_metadata(step.batch, index_kpool=cfg.index_kpool, ring_capacity=cfg.ring_capacity,
                              page_size=geo.page_size)
        if step.patch_metadata is not None:
            meta = step.patch_metadata(meta)
        inputs = {k: v.to(device) for k, v in make_inputs(case, step, meta).items()}
        meta = meta.to(device)
        kwargs = dict(inputs, ape=ape, index_topk=cfg.index_topk, index_kpool=cfg.index_kpool,
                      score_mode=cfg.score_mode, pack_tail=cfg.pack_tail, compute_topk=step.compute_topk,
                      **meta.forward_kwargs())
        pristine = caches.clone()
        times = []
        for rep in range(repeat + 1):  # repetition 0 warms up (compiles) and is not timed
            caches.copy_(pristine)
            _sync(device)
            start = time.perf_counter()
            forward(compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache, **kwargs)
            _sync(device)
            if rep:
                times.append(time.perf_counter() - start)
        rows.append(dict(case=case.name, size=case.size, step=index, step_name=step.name,
                         rows=meta.num_tokens, median_ms=1e3 * statistics.median(times),
                         min_ms=1e3 * min(times), cache_mib=round(cache_mib, 2)))
    return rows


def main(argv=None) -> int:
    """CLI entry; returns the exit code (0, or 2 on a usage error)."""
    parser = argparse.ArgumentParser(prog="python -m parity.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--size", default="small", choices=("small", "glm5.3-flash", "all"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--case", action="append", default=None)
    parser.add_argument("--csv", default=None)
    args = parser.parse_args(argv)
    from kpool.platform import resolve_device, torch_device  # before anything imports kpool.ops
    backend = resolve_device(args.device)
    device = torch_device(backend)
    import pandas as pd

    from cases.scenarios import SIZES, seed_cases
    sizes = SIZES if args.size == "all" else (args.size,)
    cases = [c for c in seed_cases(sizes) if not args.case or c.name in args.case]
    if not cases:
        print(f"no case matches {args.case}", file=sys.stderr)
        return 2
    table = pd.DataFrame([row for case in cases for row in bench_case(case, device, max(1, args.repeat))])
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(f"device: {backend}; repeat: {args.repeat}; time per forward (kernel side only)")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
