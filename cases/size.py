"""Long-context cases of the size family (issue 19 family 6; platform-numerics.md §1.3: a launch
holds at most 65535 programs on Ascend's ``coreDim`` and on CUDA's grid axes 1 and 2). Run on
devices by :mod:`parity.running.size_cases` (the CPU interpreter would take far too long); data only.

* :func:`long_pools_case`: one request of ``LONG_POOLS * P`` tokens (past 262k at P = 4) built by
  a cache-only prefill, then decodes that score all of its ``> 65535`` pools;
* :func:`many_rows_case`: one forward of ``> 65535`` token rows (8-row requests), so every
  row-tiled launch (compression, ring write, expansion) walks more tiles than a grid axis of
  65535 could hold one program each.
"""
from __future__ import annotations

from kpool.config import KPoolConfig

from .engine import Action, EngineSim
from .genvalues import ValueSpec, random_ape
from .spec import Case

LONG_POOLS = 65537
"""Pools of the long request: past 65535 (262148 tokens at P = 4)."""
MANY_ROWS = 65536
"""Token rows of the wide launch: past 65535."""


def long_pools_case(pools: int = LONG_POOLS) -> Case:
    """H=2, D=16, P=4, K_pool=512; a cache-only prefill of ``pools * 4 + 2`` tokens beside a
    short request, then two decodes of the long request (the second completes a pool)."""
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=4, index_topk=2048)
    B = 64
    tokens = pools * 4 + 2
    max_pages = -(-(tokens + 8) // (4 * B))
    sim = EngineSim(cfg, page_size=B, num_pages=max_pages + 3, num_ring_blocks=3, max_pages=max_pages,
                    pick=lambda n: n // 2)
    a, b = sim.admit(), sim.admit()
    sim.step([Action(a, tokens), Action(b, 5)], name="context", compute_topk=False, inputs=ValueSpec(seed=1), seed=1)
    sim.step([Action(b, 1), Action(a, 1)], name="long-decode", inputs=ValueSpec(seed=2), seed=2)
    sim.step([Action(a, 1)], name="long-decode-completing", inputs=ValueSpec(seed=3), seed=3)
    return sim.build("size-long-pools", ape=random_ape(4, 16, 3), seed=3,
                     description=f"a request of {pools} pools ({tokens} tokens)", tags=("family:size",))


def many_rows_case(rows: int = MANY_ROWS) -> Case:
    """H=2, D=16, P=16, K_tok=32: ``rows / 8`` fresh requests of 8 rows each (no pool completes),
    one forward with the top-k path (every row's tail expanded), then a decode of a few."""
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=16, index_topk=32)
    n = -(-rows // 8)
    sim = EngineSim(cfg, page_size=2, num_pages=n + 2, num_ring_blocks=n + 1, max_pages=1, pick=lambda k: k // 2)
    rids = [sim.admit() for _ in range(n)]
    sim.step([Action(r, 8) for r in rids], name="many-rows", inputs=ValueSpec(seed=1), seed=1)
    sim.step([Action(r, 1) for r in rids[:3]], name="decode", inputs=ValueSpec(seed=2), seed=2)
    return sim.build("size-many-rows", ape=random_ape(16, 16, 2), seed=2,
                     description=f"{n * 8} token rows in one forward", tags=("family:size",))
