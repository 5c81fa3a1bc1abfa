"""Fixed cases of the structure and unvalidated-path families (issue 19 families 3 and 4;
kpool-algorithm.md §3.1-§3.4, §4.4, §4.6, §5.4, §6), checked by every generated run before its
budget (:func:`parity.running.family_cases.family_cases`), so a small profile cannot miss them:

* :func:`chunked_decode_case`: decode and MTP-verify rows scored in score chunks that start past
  row 0 (``max_score_rows``), a verify request straddling a chunk boundary;
* :func:`rearranged_case`: several forwards with the same counts ``(R, T)`` in one process, the
  long (prefill-sized) request first, then last, then first again: state cached by shape across
  calls (launch plans, row blocks, anything a graph would freeze) must not leak;
* :func:`wide_rows_case`: rows that see more pools than the interpreter's pool block (4096,
  ``kpool.ops.plan``), so a CPU run crosses the selection's internal switch width;
* :func:`shared_prefix_case`: two requests share the physical pages of a prefix (a prefix-cache
  hit: block-table rows alias read-only pages) while FULL-graph replays carry a static block
  table wider than the page pool (``max_pool_seq_len = M * B`` logical pools > ``N * B``
  physical rows);
* :func:`unvalidated_case`: stale metadata through ``validate=False`` (:mod:`cases.unvalidated`).

Data only: nothing here runs a kernel.
"""
from __future__ import annotations

import dataclasses
from typing import List

from kpool.config import KPoolConfig

from .engine import Action, EngineSim, FullMode
from .genvalues import ValueSpec, random_ape
from .patches import UNVALIDATED_PREFIX, MetadataPatch
from .spec import Case

WIDE_POOLS = 4100
"""Pools of the wide row: past the interpreter's largest pool block (4096)."""


def _middle(n: int) -> int:
    return n // 2


def _sim(cfg: KPoolConfig, *, page_size: int, num_pages: int, num_ring_blocks: int, max_pages: int) -> EngineSim:
    return EngineSim(cfg, page_size=page_size, num_pages=num_pages, num_ring_blocks=num_ring_blocks,
                     max_pages=max_pages, pick=_middle)


def _step(sim: EngineSim, actions, name: str, seed: int, **kw):
    return sim.step(actions, name=name, inputs=ValueSpec(seed=seed), seed=seed, **kw)


def _chunked(sim: EngineSim, rows: int) -> None:
    """The last recorded step scored in chunks of ``rows`` rows."""
    sim.steps[-1] = dataclasses.replace(sim.steps[-1], max_score_rows=rows)


def small_config(P: int = 4, **kw) -> KPoolConfig:
    """H=2, D=4, ``P``, K_pool=2 (the generated suite's shrink target), options ``kw``."""
    return KPoolConfig(**{**dict(index_n_heads=2, index_head_dim=4, index_kpool=P, index_topk=2 * P), **kw})


def chunked_decode_case(config: KPoolConfig = None) -> Case:
    """Four requests prefilled; a decode of all four scored in chunks of 3 rows (the fourth
    decode row starts chunk 2); an MTP-3 verify batch (4 + 1 + 3 rows, one draft accepted)
    scored in chunks of 3 rows, so the first verify request straddles rows 2 | 3 and the last
    5 | 6; the replay, chunked by 2 rows; then a decode of all four in one chunk."""
    cfg = config or small_config(num_speculative_tokens=3)
    sim = _sim(cfg, page_size=2, num_pages=4 * 4 + 2, num_ring_blocks=5, max_pages=4)
    a, b, c, d = (sim.admit() for _ in range(4))
    _step(sim, [Action(a, 9), Action(b, 6), Action(c, 13), Action(d, 5)], "prefill", 1)
    _step(sim, [Action(a, 1), Action(b, 1), Action(c, 1), Action(d, 1)], "decode-chunked", 2)
    _chunked(sim, 3)
    _step(sim, [Action(a, 4, accepted=1), Action(b, 1), Action(c, 3, accepted=2)], "verify-chunked", 3)
    _chunked(sim, 3)
    _step(sim, [Action(c, 1), Action(a, 3, accepted=2), Action(d, 1)], "replay-chunked", 4)
    _chunked(sim, 2)
    _step(sim, [Action(d, 1), Action(c, 1), Action(b, 1), Action(a, 1)], "decode", 5)
    return sim.build("structure-chunked-decode", ape=random_ape(cfg.index_kpool, cfg.index_head_dim, 5), seed=5,
                     description="decode and MTP rows scored in chunks that start past row 0",
                     tags=("family:structure", "structure:chunked-decode"))


def rearranged_case(config: KPoolConfig = None) -> Case:
    """Forwards with the same counts (R = 2, T = 13: a 12-row prefill chunk and a decode) in
    another arrangement each time: long first, long last, long first; then (R = 3, T = 22) twice,
    the long requests swapped."""
    cfg = config or small_config()
    sim = _sim(cfg, page_size=2, num_pages=3 * 8 + 2, num_ring_blocks=4, max_pages=8)
    a, b, c = (sim.admit() for _ in range(3))
    _step(sim, [Action(a, 5), Action(b, 7), Action(c, 3)], "context", 1)
    _step(sim, [Action(a, 12), Action(b, 1)], "long-first", 2)
    _step(sim, [Action(a, 1), Action(b, 12)], "long-last", 3)
    _step(sim, [Action(b, 12), Action(a, 1)], "long-first-again", 4)
    _step(sim, [Action(c, 11), Action(a, 1), Action(b, 10)], "three-long-outer", 5)
    _step(sim, [Action(a, 10), Action(c, 1), Action(b, 11)], "three-long-swapped", 6)
    return sim.build("structure-rearranged", ape=random_ape(cfg.index_kpool, cfg.index_head_dim, 6), seed=6,
                     description="same counts, another arrangement, in one process",
                     tags=("family:structure", "structure:rearranged"))


def wide_rows_case(config: KPoolConfig = None, pools: int = WIDE_POOLS) -> Case:
    """A cache-only prefill of ``pools`` pools at P = 1 (K_pool = 64), then decodes of that
    request beside a short one: the wide rows score ``pools + 1`` pools in two interpreter pool
    blocks and select 64 of them."""
    cfg = config or small_config(P=1, index_topk=64)
    B = 64
    max_pages = -(-(pools + 8) // B)
    sim = _sim(cfg, page_size=B, num_pages=max_pages + 4, num_ring_blocks=3, max_pages=max_pages)
    a, b = sim.admit(), sim.admit()
    _step(sim, [Action(a, pools), Action(b, 3)], "context", 1, compute_topk=False)
    _step(sim, [Action(b, 1), Action(a, 1)], "wide-decode", 2)
    _step(sim, [Action(a, 2), Action(b, 1)], "wide-verify", 3)
    return sim.build("structure-wide-rows", ape=random_ape(cfg.index_kpool, cfg.index_head_dim, 3), seed=3,
                     description=f"rows wider than the interpreter's pool block ({pools} pools)",
                     tags=("family:structure", "structure:wide-rows"))


def shared_prefix_case(config: KPoolConfig = None) -> Case:
    """Request ``a`` prefills 16 tokens (2 full pages of B = 2 pools), ``b`` resumes from that
    prefix (shared pages, a garbage ring); FULL-graph replays with a static block-table width of
    6 pages over a pool of 4 physical pages (``max_pool_seq_len = 12`` > 8 physical rows), then an
    eager decode: the two requests hold 10 logical pools on 8 physical rows."""
    cfg = config or small_config(num_speculative_tokens=1)
    sim = _sim(cfg, page_size=2, num_pages=4, num_ring_blocks=3, max_pages=6)
    a = sim.admit()
    _step(sim, [Action(a, 16)], "prefix", 1)
    b = sim.admit(fork_from=a, shared_pages=2)
    full = FullMode(pad_rows=2, padded_requests=1)
    _step(sim, [Action(b, 2), Action(a, 2)], "replay-shared", 2, full=full)
    _step(sim, [Action(a, 2), Action(b, 2)], "replay-shared-2", 3, full=full)
    _step(sim, [Action(b, 2), Action(a, 2)], "replay-shared-3", 4, full=full)
    _step(sim, [Action(a, 1), Action(b, 1)], "decode", 5)
    return sim.build("structure-shared-prefix", ape=random_ape(cfg.index_kpool, cfg.index_head_dim, 5), seed=5,
                     description="prefix-shared pages, block table wider than the page pool",
                     tags=("family:structure", "structure:shared-prefix"))


def unvalidated_case(config: KPoolConfig = None) -> Case:
    """A prefill, then decode / chunk / FULL-replay steps whose metadata carries stale slots
    (:mod:`cases.unvalidated`) run with ``validate=False``, then a clean decode that reads every
    pool the stale steps must not have touched."""
    cfg = config or small_config(num_speculative_tokens=1)
    sim = _sim(cfg, page_size=2, num_pages=2 * 5 + 2, num_ring_blocks=3, max_pages=5)
    a, b = sim.admit(), sim.admit()
    _step(sim, [Action(a, 9), Action(b, 6)], "prefill", 1)
    geo = sim.geometry()
    args = (cfg.index_kpool, geo.num_pages, geo.page_size, geo.num_tail_blocks, cfg.ring_capacity)

    def stale(name):
        return MetadataPatch(UNVALIDATED_PREFIX + name, args)
    _step(sim, [Action(a, 1), Action(b, 1)], "decode-stale-slots", 2, patch=stale("slot-on-noncompleting-rows"))
    _step(sim, [Action(b, 5), Action(a, 2)], "chunk-stale-slots", 3, patch=stale("slot-on-noncompleting-rows"))
    _step(sim, [Action(a, 1), Action(b, 2)], "replay-stale-padding", 4, full=FullMode(pad_rows=3, stale=True),
          patch=stale("completing-padding-rows"))
    _step(sim, [Action(a, 2), Action(b, 1)], "replay-stale-both", 5, full=FullMode(pad_rows=2, stale=True),
          patch=stale("slot-on-noncompleting-rows"))
    _step(sim, [Action(b, 1), Action(a, 1)], "decode", 6)
    return sim.build("unvalidated-stale-metadata", ape=random_ape(cfg.index_kpool, cfg.index_head_dim, 6), seed=6,
                     description="stale slots and positions through validate=False",
                     tags=("family:unvalidated",))


def structure_cases(kind: str) -> List[Case]:
    """The structure family's fixed cases of a generated run of ``kind`` (``batch``: chunked
    decode, rearranged batches, wide rows; ``engine``: shared prefix)."""
    if kind == "batch":
        return [chunked_decode_case(), rearranged_case(), wide_rows_case()]
    return [shared_prefix_case()] if kind == "engine" else []
