"""The public cases' checks that call the kernels directly (public-cases.md C05, C17, C19, C25,
C27): ``validate=False`` launches (a captured graph skips validation), in-place graph-replay
emulation, repeated launches.

:data:`KERNEL_CHECKS` maps a case id to ``fn(device, {case name: PublicRun}, *, forward=None,
package="kpool") -> [Check]``. They call ``forward``, the implementation under test (default
``kpool.indexer.forward``), on launch behaviour the recorded harness runs cannot reach. C27's
logits check needs the implementation's internal score kernel (``PACKAGE.ops.indexer.score_pools``):
for an implementation without one (``package=None``, e.g. ``vllm-ascend:PATH``) it is skipped with
that reason (an ``unsupported`` check, counted "unsupported by IMPL" and a JUnit ``<skipped>``, never
``exact``), its rows check still runs.
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, List, Optional

import torch

from cases.bits import same_bits
from cases.public.common import rows
from cases.public.model import Call, Check
from cases.steps import build_step

from ...checking import sentinel as sen
from ...findings.vocabulary import UNSUPPORTED
from ...implementations.forwards import torch_device


def _is_cpu(device) -> bool:
    return str(device).startswith("cpu")


def _production() -> Callable:
    from kpool.indexer import forward
    return forward


def direct_run(case, device, *, validate_last: bool = True, repeats: int = 1, step: int = -1,
               start_from: Optional[Call] = None, forward: Optional[Callable] = None):
    """Run ``case`` directly on ``forward`` (default ``kpool.indexer.forward``; no harness) up to step ``step``
    (default the last), that one with ``validate=validate_last``; returns CPU copies ``out``,
    ``compressed``, ``tail`` after it. With ``repeats > 1`` that step runs that many times, each
    from a byte copy of the caches before it, and a list of such dicts is returned.

    Args:
        start_from: the recorded kernel call of the step before ``step``; its cache contents are
            loaded instead of re-running the earlier steps (long contexts are slow under the
            interpreter).
    """
    forward = forward or _production()
    dev = torch_device(device)
    caches = sen.sentinel_caches(case).to(dev)

    def launch(s, caches, validate):
        kw = build_step(case, s).forward_kwargs(case, s, caches, device=dev, validate=validate)
        out = forward(**kw)
        return dict(out=None if out is None else out.detach().cpu(), compressed=caches.compressed_cache.detach().cpu(),
                    tail=caches.tail_cache.detach().cpu())
    last = step % len(case.steps)
    if start_from is not None:
        caches.compressed_cache.copy_(start_from.compressed.to(dev))
        caches.tail_cache.copy_(start_from.tail.to(dev))
    else:
        for s in case.steps[:last]:
            launch(s, caches, True)
    results = [launch(case.steps[last], caches.clone() if repeats > 1 else caches, validate_last)
               for _ in range(repeats)]
    return results if repeats > 1 else results[0]


def _c05(device, runs, *, forward=None, package="kpool") -> List[Check]:
    """(b) once more with ``validate=False``: the kernels' own guards must store nothing into the
    ring, fault nothing, and leave its guard bands untouched."""
    forward = forward or _production()
    case = runs["tail-seed-b-bad-block"].case
    dev = torch_device(device)
    caches = sen.sentinel_caches(case).to(dev)
    # Replay the context step, then the bad step without validation.
    ring_after_context = None
    for i, step in enumerate(case.steps):
        if i == 1:
            ring_after_context = caches.tail_backing.detach().cpu().clone()
        forward(**build_step(case, step).forward_kwargs(case, step, caches, device=dev, validate=(i == 0)))
    same = same_bits(caches.tail_backing.detach().cpu(), ring_after_context)
    return [Check("(b) validate=False: ring and its guard bands bitwise unchanged, no fault", same,
                  verdict="stray-write")]


def _c17(device, runs, *, forward=None, package="kpool") -> List[Check]:
    """(b) with ``validate=False``: no crash, padding rows -1, real rows and caches as eager."""
    eager = runs["eager-no-padding"]
    got = direct_run(runs["full-pad-seq-minus4"].case, device, validate_last=False, forward=forward)
    r = got["out"][:, 0, :].tolist()
    ok_rows = r[:6] == rows(eager.call(1)) and all(v == -1 for row in r[6:] for v in row)
    ok_caches = same_bits(got["compressed"], eager.call(1).compressed) and same_bits(got["tail"], eager.call(1).tail)
    return [Check("(b) validate=False with seq_len -4: no crash, padding -1, real rows as eager", ok_rows),
            Check("(b) validate=False with seq_len -4: caches as eager", ok_caches, verdict="cache-mismatch")]


def _c19(device, runs, *, forward=None, package="kpool") -> List[Check]:
    """Emulated graph replay: one captured :class:`kpool.metadata.KPoolMetadata` and fixed input
    and output buffers on the device, refreshed in place (``copy_``) before each
    ``validate=False`` launch; after each replay the caches and rows equal an eager run."""
    forward = forward or _production()

    case = runs["graph-replay-metadata"].case
    cfg = case.config
    dev = torch_device(device)
    graph_caches, eager_caches = sen.sentinel_caches(case).to(dev), sen.sentinel_caches(case).to(dev)
    captured = buffers = None
    out_buf = torch.full((2, cfg.output_width), -777, dtype=torch.int32, device=dev)
    checks = []
    for step in case.steps:
        built = build_step(case, step)
        meta, inputs = built.meta, built.inputs
        if captured is None:
            captured = meta.to(dev)
            captured.max_query_len = None      # captured without the decode hint: any later step fits
            buffers = {n: v.to(dev) for n, v in inputs.items()}
        else:
            captured.copy_(meta.to(dev))
            for n, v in inputs.items():
                buffers[n].copy_(v.to(dev))
        common = dict(ape=case.ape.to(dev), index_topk=cfg.index_topk, index_kpool=cfg.index_kpool,
                      score_mode=cfg.score_mode, pack_tail=cfg.pack_tail)
        g = forward(**buffers, **common, compressed_cache=graph_caches.compressed_cache,
                    tail_cache=graph_caches.tail_cache, **captured.forward_kwargs(), output_buffer=out_buf,
                    validate=False)
        e = forward(**{n: v.to(dev) for n, v in inputs.items()}, **common,
                    compressed_cache=eager_caches.compressed_cache, tail_cache=eager_caches.tail_cache,
                    **meta.to(dev).forward_kwargs())
        checks.append(Check(f"{step.name}: in-place replay rows = eager rows", same_bits(g.cpu(), e.cpu())))
        checks.append(Check(f"{step.name}: in-place replay caches = eager caches",
                            same_bits(graph_caches.compressed_backing.cpu(), eager_caches.compressed_backing.cpu())
                            and same_bits(graph_caches.tail_backing.cpu(), eager_caches.tail_backing.cpu()),
                            verdict="cache-mismatch"))
    return checks


def _c25(device, runs, *, forward=None, package="kpool") -> List[Check]:
    """Kernel choice stable over repeated launches; the reference fed the kernel's bf16 cache
    rows reproduces the kernel's rows exactly."""
    from reference.stateful import forward as reference_forward
    checks = []
    for name in ("near-tie-1ulp", "margin-64ulp"):
        run = runs[name]
        repeats = [r["out"] for r in direct_run(run.case, device, repeats=3 if _is_cpu(device) else 20,
                                                start_from=run.call(0), forward=forward)]
        checks.append(Check(f"{name}: kernel rows identical over {len(repeats)} runs",
                            all(same_bits(r, repeats[0]) for r in repeats), verdict="nondeterministic"))
        call = run.call(1)
        kw = dict(call.inputs, **call.meta, ape=run.case.ape, compressed_cache=call.compressed.clone(),
                  tail_cache=call.tail.clone(), max_pool_seq_len=int(call.meta["seq_lens"].max()),
                  index_topk=run.case.config.index_topk, index_kpool=run.case.config.index_kpool,
                  score_mode=run.case.config.score_mode, pack_tail=run.case.config.pack_tail)
        ref = reference_forward(**kw)
        checks.append(Check(f"{name}: reference on the kernel's bf16 rows = kernel rows", same_bits(ref, call.out)))
    return checks


def _c27(device, runs, *, forward=None, package="kpool") -> List[Check]:
    """Logits (the score kernel's fp32 output, ``PACKAGE.ops.indexer.score_pools``; skipped with
    the reason when the implementation has no such package) and rows (``forward``) bitwise
    identical across repeated eager and FULL-mode launches (20 + 20 on a device, 2 + 2 under the
    interpreter)."""
    score_pools = importlib.import_module(f"{package}.ops.indexer").score_pools if package else None
    n = 2 if _is_cpu(device) else 20
    dev = torch_device(device)
    run = runs["determinism"]
    cfg = run.case.config
    checks = []
    for i, label in ((1, "eager"), (2, "FULL-mode")):
        call = run.call(i)
        batch = run.case.steps[i].batch
        meta = {k: v.to(dev) for k, v in call.meta.items()}
        T_live = int(call.meta["cum_query_lens"][-1])
        mpsl = batch.block_table_width * run.case.geometry.page_size if batch.full_mode else int(call.meta["seq_lens"].max())
        cache = call.compressed.to(dev)
        logits = []
        if score_pools is None:
            checks.append(Check(f"{label}: logits bitwise identical (skipped)", False,
                                detail="skipped: the implementation exposes no score kernel (package=None); "
                                       "its rows are checked below", verdict=UNSUPPORTED))
        for _ in range(n if score_pools is not None else 0):
            out = torch.empty((T_live, mpsl), dtype=torch.float32, device=dev)
            score_pools(q=call.inputs["q"].to(dev), weights=call.inputs["weights"].to(dev), compressed_cache=cache,
                        positions=meta["positions"], cum_query_lens=meta["cum_query_lens"], seq_lens=meta["seq_lens"],
                        block_table=meta["block_table"], max_pool_seq_len=mpsl, index_kpool=cfg.index_kpool,
                        score_mode=cfg.score_mode, row_start=0, num_rows=T_live, out=out)
            logits.append(out.cpu())
        if score_pools is not None:
            checks.append(Check(f"{label}: logits bitwise identical over {n} launches",
                                all(same_bits(x, logits[0]) for x in logits), verdict="nondeterministic"))
        outs = [r["out"] for r in direct_run(run.case, device, repeats=n, step=i, validate_last=not batch.full_mode,
                                             start_from=run.call(i - 1), forward=forward)]
        checks.append(Check(f"{label}: rows bitwise identical over {n} runs and equal to the harness run",
                            all(same_bits(o, call.out) for o in outs), verdict="nondeterministic"))
    return checks


KERNEL_CHECKS: Dict[str, Callable] = {"C05": _c05, "C17": _c17, "C19": _c19, "C25": _c25, "C27": _c27}
"""Case id -> the checks of that case that call the kernels directly."""
