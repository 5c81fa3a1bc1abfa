"""The device-only large case: caches of >= 2**31 elements, so the kernels' int64 addressing runs
(issue 13 part 3; kpool-algorithm.md §3.1, §3.3; parity-contract.md §1).

:func:`int64_addressing_check` runs the same two steps (a prefill of two requests with
several pages each, then a decode) twice with the same inputs: once on a compressed cache of
``>= 2**31`` bf16 elements and a ring of ``>= 2**31`` fp32 elements with every page and ring
block the requests use at the top of the address range, once on compact caches with the same
pages renumbered from 0. Page and ring-block ids are not part of the output (token indices),
so the outputs must be bitwise identical, the written pages and ring blocks bitwise identical,
and nothing else of the large caches written (zero-initialised: its non-zero count equals the
compact cache's). The compact side is the kernel of the default suites, which checks it against
the reference; this check proves the large-address side equals it.

Memory: about 4 GiB (compressed, bf16) + 8 GiB (ring, fp32) on the device; a few seconds on an
H200 after the kernels compile. Not run on the CPU interpreter (12 GiB of host memory and
interpreted kernels over a 2**31-element range: hours).
"""
from __future__ import annotations

from typing import Callable, List, Optional

ELEMENTS = 2 ** 31
PAGE_SIZE = 64
PREFILL = (3001, 517)          # tokens of the two requests' prefill (pools: 750, 129)


def _batch(pages, rings, step: int, prefill):
    from kpool.metadata import BatchSpec, RequestSpec
    if step == 0:
        reqs = [RequestSpec(0, prefill[0], pages[0], rings[0]), RequestSpec(0, prefill[1], pages[1], rings[1])]
    else:
        reqs = [RequestSpec(prefill[0], 1, pages[0], rings[0]), RequestSpec(prefill[1], 1, pages[1], rings[1])]
    return BatchSpec(reqs)


def int64_addressing_check(device, forward: Optional[Callable] = None, *, elements: int = ELEMENTS,
                           prefill=PREFILL) -> List[str]:
    """Run the large case (module docstring) on ``device`` (``"cuda"`` / ``"npu"``).

    Args:
        device: a device backend; the CPU interpreter is refused.
        forward: the implementation (default ``kpool.indexer.forward``; the self-test passes a
            planted fault's).
        elements: least elements of each large cache (default 2**31; smaller values only test
            this function's own logic, e.g. on the CPU).
        prefill: prefill tokens of the two requests.
    Returns:
        The problems found (empty: the large-address run equals the compact one).
    Raises:
        ValueError: ``device`` is the CPU with ``elements >= 2**31``.
    """
    import torch

    from kpool.cache import allocate_caches
    from kpool.config import GLM53_FLASH as cfg
    from kpool.metadata import build_metadata
    if str(device).startswith("cpu") and elements >= ELEMENTS:
        raise ValueError("the large case needs a device (the CPU interpreter would take hours)")
    if forward is None:
        from kpool.indexer import forward
    P, D, H, C, B = cfg.index_kpool, cfg.index_head_dim, cfg.index_n_heads, cfg.ring_capacity, PAGE_SIZE
    need = [-(-(n // P) // B) + 1 for n in (prefill[0] + 1, prefill[1] + 1)]
    n_big = -(-elements // (B * D)) + 4
    blocks_big = -(-elements // (2 * C * D)) + 2
    top = iter(range(n_big - 1, -1, -1))
    big_pages = [[next(top) for _ in range(m)] for m in need]
    small_pages = [list(range(0, need[0])), list(range(need[0], need[0] + need[1]))]
    sides = {
        "large": (allocate_caches(cfg, num_pages=n_big, page_size=B, num_tail_blocks=blocks_big, device=device),
                  big_pages, [blocks_big - 1, blocks_big - 2]),
        "compact": (allocate_caches(cfg, num_pages=sum(need) + 2, page_size=B, num_tail_blocks=3, device=device),
                    small_pages, [1, 2]),
    }
    problems = []
    assert sides["large"][0].compressed_cache.numel() >= elements and sides["large"][0].tail_cache.numel() >= elements
    for step in range(2):
        g = torch.Generator().manual_seed(1234 + step)
        outs = {}
        for name, (caches, pages, rings) in sides.items():
            meta = build_metadata(_batch(pages, rings, step, prefill), index_kpool=P, ring_capacity=C, page_size=B,
                                  device=device)
            T = meta.num_tokens
            g.manual_seed(1234 + step)
            inputs = dict(k=torch.randn(T, D, generator=g), gate=torch.randn(T, D, generator=g) * 2,
                          q=torch.randn(T, H, D, generator=g).bfloat16(), weights=torch.randn(T, H, generator=g) / 64,
                          ape=torch.randn(P, D, generator=g))
            inputs = {n: v.to(device) for n, v in inputs.items()}
            try:
                outs[name] = forward(**inputs, compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
                                     index_topk=cfg.index_topk, index_kpool=P, **meta.forward_kwargs())
            except Exception as exc:
                problems.append(f"step {step} {name}: {type(exc).__name__}: {exc}"[:300])
                return problems
        if not torch.equal(outs["large"], outs["compact"]):
            bad = int((outs["large"] != outs["compact"]).sum())
            problems.append(f"step {step}: indices differ in {bad} elements")
    (big, bp, br), (small, sp, sr) = sides["large"], sides["compact"]
    for r in range(2):
        a = big.compressed_cache[torch.tensor(bp[r], device=device)].view(torch.int16)
        b = small.compressed_cache[torch.tensor(sp[r], device=device)].view(torch.int16)
        if not torch.equal(a, b):
            problems.append(f"request {r}: compressed pages differ in {int((a != b).sum())} elements")
        if not torch.equal(big.tail_cache[br[r]].view(torch.int32), small.tail_cache[sr[r]].view(torch.int32)):
            problems.append(f"request {r}: ring block differs")
    for what, x, y in (("compressed", big.compressed_cache, small.compressed_cache),
                       ("ring", big.tail_cache, small.tail_cache)):
        nx, ny = int(torch.count_nonzero(x)), int(torch.count_nonzero(y))
        if nx != ny:
            problems.append(f"{what} cache: {nx} non-zero elements in the large cache, {ny} in the compact one "
                            "(a write landed outside the request's pages)")
    return problems
