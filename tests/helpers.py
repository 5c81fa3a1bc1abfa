"""Small builders shared by the unit tests (not a public API)."""
from __future__ import annotations

import torch

from kpool.cache import allocate_caches
from kpool.config import KPoolConfig
from kpool.metadata import BatchSpec, RequestSpec, build_metadata


def small_batch(config: KPoolConfig, *, device="cpu", seed=0, page_size=2, num_pages=16,
                requests=((0, 7), (0, 10), (3, 6)), num_tokens=None):
    """A valid multi-request batch with permuted pages: returns ``(caches, kwargs)`` where
    ``kwargs`` is a complete keyword set for ``forward`` (inputs + metadata + config)."""
    g = torch.Generator().manual_seed(seed)
    D, H, P = config.index_head_dim, config.index_n_heads, config.index_kpool
    pages = torch.randperm(num_pages, generator=g).tolist()
    specs = []
    for i, (cached, qlen) in enumerate(requests):
        need = -(-((cached + qlen) // P) // page_size)
        specs.append(RequestSpec(cached, qlen, pages[:need] or [pages[0]], ring_block=len(requests) - 1 - i))
        pages = pages[need:]
    meta = build_metadata(BatchSpec(specs, num_tokens=num_tokens), index_kpool=P,
                          ring_capacity=config.ring_capacity, page_size=page_size, device=device)
    caches = allocate_caches(config, num_pages=num_pages, page_size=page_size,
                             num_tail_blocks=len(requests) + 1, guard=8, device=device)
    T = meta.num_tokens
    kwargs = dict(
        k=torch.randn(T, D, generator=g).to(device), gate=torch.randn(T, D, generator=g).to(device),
        q=torch.randn(T, H, D, generator=g).bfloat16().to(device),
        weights=torch.randn(T, H, generator=g).to(device), ape=torch.randn(P, D, generator=g).to(device),
        compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
        index_topk=config.index_topk, index_kpool=P, **meta.forward_kwargs())
    return caches, kwargs
