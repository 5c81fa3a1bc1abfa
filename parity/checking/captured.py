"""The ``captured-replay`` metamorphic relation: a FULL-mode decode step captured in a device graph
and replayed with the next step's metadata and inputs rewritten in place (kpool-algorithm.md
§4.6, §6 FULL mode; issue 10 point 4).

On cuda (``torch.cuda.CUDAGraph``) and npu (``torch.npu.NPUGraph``) step ``i`` is really captured:
one set of device buffers (metadata, inputs, output buffer, caches) is allocated for the padded
FULL-mode shapes of steps ``i`` and ``i + 1`` (``T``, ``R``, ``M`` of the larger step,
``max_pool_seq_len = M * B``), the kernel forward runs once eagerly on a copy (compiles the
kernels), is captured with ``validate=False``, replayed for step ``i``, then the buffers are
rewritten in place with step ``i + 1``'s values (``KPoolMetadata.copy_``) and the graph is
replayed again. A forward that read a device value on the host, or sized a launch from one,
fails here (capture raises, or the replay reuses step ``i``'s sizes). A forward that takes
``max_query_len`` (the production one) is captured with the longer of the two steps' (a
graph serves its bucket's longest query), so the launches a decode hint skips are skipped in
the graph, and the eager run, without the hint, checks that skipping them changes nothing.

The CPU interpreter has no graph: it imitates the capture by calling the forward twice on the
same buffers, rewritten in place between the calls (the detail of every finding says which).

Both replays are compared bitwise with the same steps run eagerly on fresh tensors, and with the
reference (``reference.stateful.forward`` on the same FULL-mode metadata and inputs, from the
same caches), index rows through the tie certificate of parity-contract.md §3.2 for random-data
cases and bitwise for exact-data cases, both caches bitwise.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

import torch

from . import compare as cmp
from ..implementations.forwards import accepts_keyword
from .relation_base import OUTPUT_PREFIX, KernelRun, build_meta, compare_runs, is_plain, is_unsupported, relation_kwargs

NAME = "captured-replay"


def _graph_api(dev: torch.device):
    """``(graph class, capture context, stream class, stream context, current stream)`` of the
    device, or None on the interpreter."""
    if dev.type == "cuda":
        return torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.Stream, torch.cuda.stream, torch.cuda.current_stream
    if dev.type == "npu":  # pragma: no cover - needs torch_npu
        return torch.npu.NPUGraph, torch.npu.graph, torch.npu.Stream, torch.npu.stream, torch.npu.current_stream
    return None


def _names_validate(fn) -> bool:
    """The forward has a ``validate`` parameter of its own (the production forward: the graph is
    captured without the host-side validation, as a serving engine runs it)."""
    import inspect
    try:
        return "validate" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "npu":  # pragma: no cover
        torch.npu.synchronize(dev)


def _host(out, caches):
    return KernelRun(out.detach().cpu().clone() if isinstance(out, torch.Tensor) else None, caches.to("cpu"))


def _replays(case, steps, ape, caches, metas, inputs, kernel_forward, dev, T: int, W: int):
    """The two steps through one set of buffers: captured in a graph (device) or called twice
    (interpreter). Returns ``[run of step i, run of step i + 1]`` (host copies)."""
    work = caches.to(dev)
    meta_buf = metas[0].to(dev).clone()       # (clone: on the CPU ``.to`` aliases the originals)
    in_buf = {k: v.to(dev).clone() for k, v in inputs[0].items()}
    out_buf = torch.full((T, W), -777, dtype=torch.int32, device=dev)
    extra = {"validate": False} if _names_validate(kernel_forward) else {}
    if accepts_keyword(kernel_forward, "max_query_len", explicit=True):
        extra["max_query_len"] = meta_buf.max_query_len
    kw = relation_kwargs(case, steps[0].compute_topk, meta_buf, in_buf, ape, work, out_buf, dev, **extra)
    api = _graph_api(dev)
    runs = []
    if api is None:
        for i in range(2):
            if i:
                meta_buf.copy_(metas[1].to(dev))
                for k, v in inputs[1].items():
                    in_buf[k].copy_(v.to(dev))
            runs.append(_host(kernel_forward(**kw), work))
        return runs
    graph_cls, capture, stream_cls, stream_ctx, current = api
    warm = caches.to(dev)
    side = stream_cls()
    side.wait_stream(current())
    with stream_ctx(side):        # compile and warm the allocator off the capture
        kernel_forward(**dict(kw, compressed_cache=warm.compressed_cache, tail_cache=warm.tail_cache,
                              output_buffer=out_buf.clone()))
    current().wait_stream(side)
    _sync(dev)
    graph = graph_cls()
    with capture(graph):
        out = kernel_forward(**kw)
    for i in range(2):
        if i:
            meta_buf.copy_(metas[1].to(dev))
            for k, v in inputs[1].items():
                in_buf[k].copy_(v.to(dev))
        graph.replay()
        _sync(dev)
        runs.append(_host(out, work))
    return runs


def _fresh(case, steps, ape, caches, metas, inputs, kernel_forward, dev, T: int, W: int):
    """The same two steps with freshly built device tensors for every call (the eager run)."""
    work = caches.to(dev)
    runs = []
    for step, meta, inp in zip(steps, metas, inputs):
        out = kernel_forward(**relation_kwargs(case, step.compute_topk, meta.clone().to(dev), inp, ape, work,
                                       torch.full((T, W), -777, dtype=torch.int32, device=dev), dev))
        runs.append(_host(out, work))
    return runs


def _against_reference(case, state, steps, metas, inputs, runs, what: str) -> List[dict]:
    """Both replayed steps against the reference forward run on the same FULL-mode metadata and
    inputs from the same caches: rows (tie-certified on random data), both caches bitwise."""
    from reference.stateful import forward as reference_forward

    from . import certificates as certs
    cfg = case.config
    ref_caches = state.caches.clone()
    output = OUTPUT_PREFIX + NAME
    rows = []
    for step, meta, inp, run in zip(steps, metas, inputs, runs):
        T, W = meta.num_tokens, cfg.output_width
        ref_out = reference_forward(**relation_kwargs(case, step.compute_topk, meta, inp, state.ape, ref_caches,
                                              torch.full((T, W), -777, dtype=torch.int32), "cpu"))
        ctx = None
        if case.values != "exact" and step.compute_topk:
            ctx = certs.TieContext(q=inp["q"], weights=inp["weights"], kernel_cache=run.caches.compressed_cache,
                                   reference_cache=ref_caches.compressed_cache, positions=meta.positions,
                                   cum_query_lens=meta.cum_query_lens, seq_lens=meta.seq_lens,
                                   block_table=meta.block_table, index_topk=cfg.index_topk,
                                   index_kpool=cfg.index_kpool, score_mode=cfg.score_mode, pack_tail=cfg.pack_tail)
        found = cmp.compare_indices(run.out, ref_out, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
                                    index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, pack_tail=cfg.pack_tail,
                                    compute_topk=step.compute_topk, output=output, context=ctx)
        found += cmp.compare_compressed(run.caches.compressed_cache, ref_caches.compressed_cache, output=output)
        found += cmp.compare_ring(run.caches.tail_cache, ref_caches.tail_cache, output=output)
        for r in found:
            r["detail"] = f"{what}; step {step.name} vs reference" + (f": {r['detail']}" if r.get("detail") else "")
        rows += found
    return rows


def captured_replay(state, next_state, *, device, kernel_forward: Callable) -> List[dict]:
    """Steps ``i`` and ``i + 1`` as FULL-mode graph replays (see the module docstring): every
    output of both replays against the eager run, and of the second against the reference.
    Applies to consecutive plain steps with the same ``compute_topk``; else no finding."""
    from cases.values import make_inputs

    if next_state is None or not (is_plain(state) and is_plain(next_state)) \
            or state.step.compute_topk != next_state.step.compute_topk:
        return []
    a, b = state.step.batch, next_state.step.batch
    T = max(state.meta.num_tokens, next_state.meta.num_tokens)
    R = max(len(a.requests) + a.num_padded_requests, len(b.requests) + b.num_padded_requests)
    M = max(state.meta.block_table.shape[1], next_state.meta.block_table.shape[1])

    def full(batch):
        return dataclasses.replace(batch, num_tokens=T, full_mode=True, block_table_width=M,
                                   num_padded_requests=R - len(batch.requests))
    fa, fb = full(a), full(b)
    case = state.case
    W = case.config.output_width
    metas = [build_meta(case, fa), build_meta(case, fb)]
    bucket = max(m.max_query_len or 0 for m in metas)      # the graph serves both steps
    for m in metas:
        m.max_query_len = bucket
    steps = [dataclasses.replace(state.step, batch=fa), dataclasses.replace(next_state.step, batch=fb)]
    inputs = [make_inputs(case, steps[0], metas[0]), make_inputs(case, steps[1], metas[1])]
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    ape = state.ape.to(dev)
    what = (f"{dev.type} graph captured at step {state.index}, replayed with step {next_state.index}'s metadata and "
            "inputs rewritten in place" if _graph_api(dev) is not None else
            f"CPU interpreter (no graph): step {state.index}'s buffers rewritten in place for step {next_state.index}")
    try:
        captured = _replays(case, steps, ape, state.caches, metas, inputs, kernel_forward, dev, T, W)
        fresh = _fresh(case, steps, ape, state.caches, metas, inputs, kernel_forward, dev, T, W)
    except Exception as exc:
        if is_unsupported(exc):   # a serving graph writes a caller output buffer: a mode it may lack
            return [cmp.finding(OUTPUT_PREFIX + NAME, "unsupported", 0, detail=f"{what}: {exc}")]
        return [cmp.crash_finding("kernel", exc, output=OUTPUT_PREFIX + NAME)]
    rows = []
    for i, (st, meta, step) in enumerate(((state, metas[0], steps[0]), (next_state, metas[1], steps[1]))):
        view = dataclasses.replace(st, meta=meta, step=step)
        rows += [r for r in compare_runs(NAME, view, fresh[i], captured[i], what=what) if r["verdict"] != "exact"]
    try:
        rows += [r for r in _against_reference(case, state, steps, metas, inputs, captured, what)
                 if r["verdict"] != "exact"]
    except Exception as exc:
        rows.append(cmp.crash_finding("reference", exc, output=OUTPUT_PREFIX + NAME))
    return rows or [cmp.finding(OUTPUT_PREFIX + NAME, "exact", detail=what)]
