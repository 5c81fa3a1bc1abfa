"""Benchmark shapes of ``make bench`` and the eager PyTorch implementation they are compared with
(issue 10 point 7; kpool-algorithm.md §4-§5).

A :class:`BenchCase` is one forward of ``kpool.indexer.forward`` on synthetic caches and inputs
(random keys, page tables as a serving engine lays them out), with the minimal bytes it must move
and the FLOPs it must do. :func:`eager_forward` is what a user would write in plain PyTorch
instead: gather each request's pooled keys, bf16 ``einsum`` per head, ReLU, head weights and sum,
causal mask, ``torch.topk``, expansion with the causal tail; and for the cache update a
softmax-pooled window per completed pool (pool-aligned chunks only) and the ring copy, batched
over all requests with index tensors built once (:func:`eager_plan`), so that neither the eager
run nor its ``torch.compile`` pays a Python loop per request. It lives
here, not in ``reference/``: it is a speed baseline, not a numerics oracle (bf16 scores).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch

from kpool.config import GLM53_FLASH, KPoolConfig

PAGE_SIZE = 64
"""Pools per compressed page of the benchmark caches (a serving engine's block of 256 tokens)."""


@dataclass
class BenchCase:
    """One benchmarked forward.

    Attributes:
        name, description: table row label and what it stands for.
        config: the layer's hyper-parameters.
        kwargs: complete keyword arguments of ``kpool.indexer.forward`` (``validate`` excluded).
        caches: ``(compressed_cache, tail_cache)`` to restore between timed runs (not needed: a
            forward rewrites the same slots with the same values).
        bytes: minimal DRAM traffic (each request's pooled keys once, q, weights, k/gate, caches
            written, output): :func:`cost`.
        flops: ``2 * H * D`` per scored (row, visible pool), or the pooling's 6 per element.
        queries: ``(qlen, context)`` per request, for the eager implementation.
    """

    name: str
    description: str
    config: KPoolConfig
    kwargs: dict
    bytes: float
    flops: float
    queries: List[Tuple[int, int]] = field(default_factory=list)


def _pools_per_row(queries, P) -> List[int]:
    out = []
    for qlen, context in queries:
        for i in range(qlen):
            out.append((context - qlen + i + 1) // P)
    return out


def build_case(name: str, description: str, queries: List[Tuple[int, int]], device, *,
               config: KPoolConfig = GLM53_FLASH, compute_topk: bool = True, seed: int = 0) -> BenchCase:
    """A batch of requests ``(query_len, context_len)`` (context includes this step's rows), with
    contiguous page tables in a shuffled page pool, N(0, 1) keys and queries, weights / 64, and
    the longest query as ``max_query_len`` (the launch hint a serving engine passes)."""
    from kpool.cache import allocate_caches
    from kpool.metadata import BatchSpec, RequestSpec, build_metadata
    gen = torch.Generator().manual_seed(seed)
    H, D, P = config.index_n_heads, config.index_head_dim, config.index_kpool
    pages = [-(-(context // P) // PAGE_SIZE) for _, context in queries]
    order = torch.randperm(sum(pages) + 1, generator=gen).tolist()
    specs, k = [], 0
    for i, ((qlen, context), n) in enumerate(zip(queries, pages)):
        specs.append(RequestSpec(context - qlen, qlen, order[k:k + n] or [order[-1]], i))
        k += n
    meta = build_metadata(BatchSpec(specs), index_kpool=P, ring_capacity=config.ring_capacity,
                          page_size=PAGE_SIZE, device=device)
    caches = allocate_caches(config, num_pages=sum(pages) + 1, page_size=PAGE_SIZE, num_tail_blocks=len(queries),
                             device=device)
    on_device = torch.Generator(device=device).manual_seed(seed)       # the big tensors are drawn there
    caches.compressed_cache.copy_(torch.randn(caches.compressed_cache.shape, generator=on_device, device=device))
    caches.tail_cache.copy_(torch.randn(caches.tail_cache.shape, generator=on_device, device=device))
    T = meta.num_tokens
    kwargs = dict(k=torch.randn(T, D, generator=gen).to(device), gate=torch.randn(T, D, generator=gen).to(device),
                  q=torch.randn(T, H, D, generator=gen).bfloat16().to(device),
                  weights=(torch.randn(T, H, generator=gen) / 64).to(device),
                  ape=torch.randn(P, D, generator=gen).to(device),
                  compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
                  index_topk=config.index_topk, index_kpool=P, score_mode=config.score_mode,
                  pack_tail=config.pack_tail, compute_topk=compute_topk, max_query_len=meta.max_query_len,
                  **meta.forward_kwargs())
    nbytes, flops = cost(queries, config, compute_topk)
    return BenchCase(name, description, config, kwargs, nbytes, flops, list(queries))


def cost(queries: List[Tuple[int, int]], config: KPoolConfig, compute_topk: bool = True) -> Tuple[float, float]:
    """``(bytes, flops)`` of one forward: the minimal DRAM traffic (each request's pooled keys read
    once, k/gate read, completed pools and ring rows written, q/weights read and the index rows
    written) and ``2 H D`` FLOPs per scored (row, visible pool) (6 per element for a cache-only
    update)."""
    H, D, P = config.index_n_heads, config.index_head_dim, config.index_kpool
    T = sum(q for q, _ in queries)
    completed = sum(context // P - (context - qlen) // P for qlen, context in queries)
    cache_bytes = D * 2 * sum(context // P for _, context in queries) if compute_topk else 0
    io_bytes = T * D * 4 * 2 + completed * D * 2 + min(T, len(queries) * config.ring_capacity) * D * 8
    topk_bytes = T * (H * D * 2 + H * 4 + config.output_width * 4) if compute_topk else 0
    flops = 2.0 * H * D * sum(_pools_per_row(queries, P)) if compute_topk else 6.0 * T * D
    return float(cache_bytes + io_bytes + topk_bytes), flops


def standard_cases(device, *, small: bool = False) -> List[Callable[[], BenchCase]]:
    """The benchmark shapes (lazily built: each is big on the GLM geometry). ``small``: tiny
    shapes for the CPU interpreter (H=4, D=32, contexts of a few hundred tokens)."""
    if small:
        cfg = KPoolConfig(index_n_heads=4, index_head_dim=32, index_kpool=4, index_topk=64, num_speculative_tokens=3)
        ctx, rows, big = 512, 64, 256
        return [
            lambda: build_case("decode", f"decode, 8 requests x {ctx} context", [(1, ctx)] * 8, device, config=cfg),
            lambda: build_case("decode-batch-1", f"decode, 1 request x {ctx} context", [(1, ctx)], device, config=cfg),
            lambda: build_case("mtp3-verify", f"MTP=3 verify, 8 requests x 4 rows x {ctx}", [(4, ctx)] * 8, device,
                               config=cfg),
            lambda: build_case("prefill", f"prefill, {rows} rows over a {ctx} context", [(rows, ctx)], device, config=cfg),
            lambda: build_case("mixed", f"mixed: {rows}-row chunk + 8 decodes", [(rows, ctx)] + [(1, ctx)] * 8, device,
                               config=cfg),
            lambda: build_case("compress", f"compress + ring, {big}-token prefill", [(big, big)], device, config=cfg,
                               compute_topk=False),
        ]
    cfg = GLM53_FLASH.with_(num_speculative_tokens=3)
    k64 = 65536
    return [
        lambda: build_case("decode", "decode forward, 64 requests x 64k context (16384 pools each)",
                           [(1, k64)] * 64, device, config=cfg),
        lambda: build_case("decode-batch-1", "decode forward, 1 request x 64k context", [(1, k64)], device, config=cfg),
        lambda: build_case("mtp3-verify", "MTP=3 verify, 64 requests x 4 rows x 64k context", [(4, k64)] * 64, device,
                           config=cfg),
        lambda: build_case("prefill", "prefill forward, 16384 rows over a 64k context", [(16384, k64)], device,
                           config=cfg),
        lambda: build_case("mixed", "mixed: a 4096-row prefill chunk over 32k + 63 decodes x 64k",
                           [(4096, 32768)] + [(1, k64)] * 63, device, config=cfg),
        lambda: build_case("compress", "compress + ring write, 64k-token prefill", [(k64, k64)], device, config=cfg,
                           compute_topk=False),
    ]


# ------------------------------------------------------------------------------------ eager

def eager_chunk(q, weights, keys, positions, *, index_kpool: int, index_topk: int, score_mode: str = "relu"):
    """``[G, c, W]`` int32 token ids of ``c`` rows of ``G`` requests of one shape.

    ``q`` bf16 ``[G, c, H, D]``, ``weights`` ``[G, c, H]``, ``keys`` bf16 ``[G, n, D]`` (the
    requests' pooled keys), ``positions`` ``[G, c]``: bf16 einsum per head (fp32 out), ReLU, head
    weights and sum, causal mask, ``torch.topk``, expansion with the packed causal tail."""
    P = index_kpool
    logits = torch.einsum("gthd,gnd->gthn", q, keys).float()
    if score_mode == "relu":
        logits = logits.relu()
    scores = (logits * weights.float()[..., None]).sum(2)                      # [G, c, n]
    n = keys.shape[1]
    visible = (positions + 1) // P
    scores = scores.masked_fill(torch.arange(n, device=q.device) >= visible[..., None], float("-inf"))
    top = torch.topk(scores, min(index_topk // P, n), dim=2)
    lanes = torch.arange(P, device=q.device)
    tokens = torch.where((top.values > float("-inf"))[..., None], top.indices[..., None] * P + lanes, -1)
    tokens = tokens.flatten(2)
    W = index_topk + P - 1
    out = torch.nn.functional.pad(tokens, (0, W - tokens.shape[2]), value=-1)
    tail_start = (positions + 1) // P * P
    lane = torch.arange(W, device=q.device) - torch.clamp(tail_start, max=index_topk)[..., None]
    tail = (lane >= 0) & (lane < P - 1)
    tail_val = torch.where(lane < (positions + 1 - tail_start)[..., None], tail_start[..., None] + lane, -1)
    return torch.where(tail, tail_val, out).to(torch.int32)


def eager_scores(q, weights, cache, pages, positions, *, pools: int, index_kpool: int, index_topk: int,
                 score_mode: str = "relu"):
    """:func:`eager_chunk` of rows whose requests' pooled keys are gathered here: ``cache`` the
    compressed cache ``[N, B, 1, D]``, ``pages`` int64 ``[G, n_pages]`` each request's pages
    (``pools`` pools). One function, so that ``torch.compile`` sees the gather too."""
    G, D = pages.shape[0], cache.shape[-1]
    keys = cache[pages].reshape(G, -1, D)[:, :pools]
    return eager_chunk(q, weights, keys, positions, index_kpool=index_kpool, index_topk=index_topk,
                       score_mode=score_mode)


@dataclass
class EagerPlan:
    """The host-known index tensors the eager baseline uses (what a serving engine's metadata
    builder knows in advance, like the kernels' ``T``): built once per case, on its device.

    Attributes:
        pool_rows: int64 ``[n, P]`` rows of each pool completed inside a pool-aligned chunk.
        pool_slots: int64 ``[n]`` their compressed-cache slots (``slot_mapping``, ``>= 0``).
        ring_rows: int64 ``[m]`` the last ``C`` rows of each request; ``ring_slots`` their
            ``tail_slot_mapping`` entries.
        groups: ``(rows [G, qlen] int64, pages [G, n_pages] int64, pools)`` per request shape.
    """

    pool_rows: torch.Tensor
    pool_slots: torch.Tensor
    ring_rows: torch.Tensor
    ring_slots: torch.Tensor
    groups: List[Tuple[torch.Tensor, torch.Tensor, int]]


def eager_plan(case: BenchCase) -> EagerPlan:
    """:class:`EagerPlan` of ``case`` (cached on it)."""
    cached = getattr(case, "_eager_plan", None)
    if cached is not None:
        return cached
    kw, cfg = case.kwargs, case.config
    P, C = cfg.index_kpool, cfg.ring_capacity
    dev = kw["k"].device
    B = kw["compressed_cache"].shape[1]
    slot_mapping = kw["slot_mapping"].cpu()
    pool_rows, ring_rows, starts, groups = [], [], [], {}
    start = 0
    for r, (qlen, context) in enumerate(case.queries):
        starts.append(start)
        groups.setdefault((qlen, context), []).append(r)
        if (context - qlen) % P == 0 and qlen >= P:
            pool_rows += [list(range(start + j * P, start + (j + 1) * P)) for j in range(qlen // P)
                          if int(slot_mapping[start + (j + 1) * P - 1]) >= 0]
        ring_rows += range(max(start, start + qlen - C), start + qlen)
        start += qlen
    rows = torch.tensor(pool_rows, dtype=torch.int64).reshape(-1, P)
    slots = slot_mapping[rows[:, -1]].to(torch.int64) if rows.numel() else torch.zeros(0, dtype=torch.int64)
    ring = torch.tensor(ring_rows, dtype=torch.int64)
    bt = kw["block_table"].cpu().to(torch.int64)
    plan_groups = []
    for (qlen, context), reqs in groups.items():
        pools = context // P
        grid = torch.tensor([[starts[r] + i for i in range(qlen)] for r in reqs], dtype=torch.int64)
        plan_groups.append((grid.to(dev), bt[reqs, :-(-pools // B)].to(dev), pools))
    plan = EagerPlan(rows.to(dev), slots.to(dev), ring.to(dev),
                     kw["tail_slot_mapping"].cpu()[ring].to(torch.int64).to(dev), plan_groups)
    object.__setattr__(case, "_eager_plan", plan)
    return plan


def eager_update(k, gate, ape, compressed_cache, tail_cache, pool_rows, pool_slots, ring_rows, ring_slots) -> None:
    """Pool compression (softmax over each completed pool's window of this call's rows, fp32,
    one bf16 rounding) and the ring copy of the given rows, in place; no Python loop, so
    ``torch.compile`` can fuse it."""
    D = k.shape[1]
    C = tail_cache.shape[2]
    if pool_rows.numel():
        pooled = (torch.softmax(gate[pool_rows] + ape, dim=1) * k[pool_rows]).sum(1).to(torch.bfloat16)
        compressed_cache.view(-1, D)[pool_slots] = pooled
    ring = tail_cache.view(-1, 2, C, D)
    ring[ring_slots // C, 0, ring_slots % C] = k[ring_rows]
    ring[ring_slots // C, 1, ring_slots % C] = gate[ring_rows]


def eager_forward(case: BenchCase, *, chunk_fn=None, update_fn=None, row_chunk: int = 256) -> Optional[torch.Tensor]:
    """The eager PyTorch forward of ``case``: :func:`eager_update`, then for each group of requests
    of one shape :func:`eager_scores` (or ``chunk_fn``, e.g. its ``torch.compile``) on
    ``row_chunk`` rows at a time. Index tensors come from :func:`eager_plan` (built once).
    Returns ``[T, W]`` int32, or None for a cache-only case."""
    kw, cfg = case.kwargs, case.config
    plan = eager_plan(case)
    (update_fn or eager_update)(kw["k"], kw["gate"], kw["ape"], kw["compressed_cache"], kw["tail_cache"],
                                plan.pool_rows, plan.pool_slots, plan.ring_rows, plan.ring_slots)
    if not kw["compute_topk"]:
        return None
    chunk_fn = chunk_fn or eager_scores
    cache = kw["compressed_cache"]
    out = torch.empty((kw["q"].shape[0], cfg.output_width), dtype=torch.int32, device=cache.device)
    for rows, pages, pools in plan.groups:
        for s in range(0, rows.shape[1], row_chunk):
            idx = rows[:, s:s + row_chunk]
            out[idx] = chunk_fn(kw["q"][idx], kw["weights"][idx], cache, pages, kw["positions"][idx], pools=pools,
                                index_kpool=cfg.index_kpool, index_topk=cfg.index_topk, score_mode=cfg.score_mode)
    return out
