"""The six seed scenarios, each at two sizes (kpool-algorithm.md §9, §11 "Harness scenarios").

Every scenario is a function ``(size) -> Case`` with ``size`` in :data:`SIZES`:

* ``"small"``: :data:`kpool.config.SMALL` (H=2, D=16, P=4, K_tok=8 -> K_pool=2, W=11);
* ``"glm5.3-flash"``: :data:`kpool.config.GLM53_FLASH` (H=32, D=128, P=4, K_tok=2048 -> K_pool=512,
  W=2051), with contexts past 2048 tokens so selection really drops pools.

Cost model (the kernels run under the Triton interpreter and the reference scores every live
row): long GLM contexts are mostly built by a ``compute_topk=False`` step (compression and ring
writes only, no scoring), and the scored rows sit on top as short chunks and decodes. Two long
prefills are scored: ``prefill-tail``'s multi-request prefill (2128 rows) and ``prefill-topk``'s
first chunk (2043 rows). :func:`parity.findings.coverage.case_stats` reports the row counts.

Layout rules every case follows (kpool-algorithm.md §9 items 7-8):

* physical pages come from a seeded permutation and are handed out on demand as requests
  grow, so block tables are non-contiguous and interleaved between requests; a few pages stay
  spare (never written: stray writes show up against the sentinel);
* ring blocks come from a seeded permutation of the blocks at or above the number of requests,
  so a ring block never equals a request id or a batch row index (the blocks below stay
  unused);
* request ids are stable across the steps of a case, and batch order changes between steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from kpool.config import GLM53_FLASH, SMALL, KPoolConfig
from kpool.metadata import BatchSpec, RequestSpec

from .spec import Case, CacheGeometry, OutputBufferSpec, Step

SIZES = ("small", "glm5.3-flash")
CONFIGS = {"small": SMALL, "glm5.3-flash": GLM53_FLASH}


def config_for(size: str) -> KPoolConfig:
    """The preset of a size name.

    Raises:
        ValueError: unknown size.
    """
    if size not in CONFIGS:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    return CONFIGS[size]


def _glm(size: str) -> bool:
    return config_for(size) is GLM53_FLASH


# ---- case construction ---------------------------------------------------------------------

@dataclass
class _StepPlan:
    name: str
    requests: List[Tuple[int, int, int]]          # (request id, cached_len, query_len)
    compute_topk: bool
    num_tokens: Optional[int]
    full_mode: bool
    num_padded_requests: int
    stale_tail_slots: bool
    output_buffer: Optional[OutputBufferSpec]
    max_score_rows: Optional[int] = None


@dataclass
class _Plan:
    """Records steps as ``(request id, cached_len, query_len)`` lists, then assigns pages and ring
    blocks once the whole case is known (:meth:`build`)."""

    name: str
    size: str
    seed: int
    page_size: int
    config: Optional[KPoolConfig] = None
    page_padding: int = 0
    ring_block_padding: int = 0
    spare_pages: int = 3
    steps: List[_StepPlan] = field(default_factory=list)

    def __post_init__(self):
        if self.config is None:
            self.config = config_for(self.size)

    def step(self, name: str, requests: Sequence[Tuple[int, int, int]], *, compute_topk: bool = True,
             num_tokens: Optional[int] = None, full_mode: bool = False, num_padded_requests: int = 0,
             stale_tail_slots: bool = False, output_buffer: Optional[OutputBufferSpec] = None,
             max_score_rows: Optional[int] = None) -> None:
        self.steps.append(_StepPlan(name, [tuple(r) for r in requests], compute_topk, num_tokens, full_mode,
                                    num_padded_requests, stale_tail_slots, output_buffer, max_score_rows))

    def _pages_for(self, raw_len: int) -> int:
        # A scheduler allocates pages for every token, incomplete pool included; at least one.
        tokens_per_page = self.config.index_kpool * self.page_size
        return max(1, -(-raw_len // tokens_per_page))

    def build(self, description: str, values: str, tags: Sequence[str] = ()) -> Case:
        g = torch.Generator().manual_seed(self.seed)
        rids = sorted({rid for s in self.steps for rid, _, _ in s.requests})
        # Pass 1: how many pages each request ever needs, in order of first need.
        demand: List[int] = []          # request id per page, in allocation order
        have: Dict[int, int] = {rid: 0 for rid in rids}
        for s in self.steps:
            for rid, cached, qlen in s.requests:
                need = self._pages_for(cached + qlen)
                demand.extend([rid] * max(0, need - have[rid]))
                have[rid] = max(have[rid], need)
        num_pages = len(demand) + self.spare_pages
        perm = torch.randperm(num_pages, generator=g).tolist()
        pages: Dict[int, List[int]] = {rid: [] for rid in rids}
        for rid, page in zip(demand, perm):
            pages[rid].append(page)
        # Ring blocks: never equal to a request id or a batch index (both < n).
        n = max(len(rids), max(rids) + 1)
        num_tail_blocks = 2 * n + 1
        upper = [b for b in torch.randperm(num_tail_blocks, generator=g).tolist() if b >= n]
        ring = {rid: upper[i] for i, rid in enumerate(rids)}
        width_full = max(len(p) for p in pages.values()) + 1   # static FULL-graph table width

        steps = []
        for i, s in enumerate(self.steps):
            reqs = [RequestSpec(cached, qlen, pages[rid][:self._pages_for(cached + qlen)], ring[rid])
                    for rid, cached, qlen in s.requests]
            batch = BatchSpec(reqs, num_tokens=s.num_tokens, full_mode=s.full_mode,
                              num_padded_requests=s.num_padded_requests,
                              block_table_width=width_full if s.full_mode else None,
                              stale_tail_slots=s.stale_tail_slots)
            steps.append(Step(name=s.name, batch=batch, request_ids=[rid for rid, _, _ in s.requests],
                              compute_topk=s.compute_topk, output_buffer=s.output_buffer, seed=i + 1,
                              max_score_rows=s.max_score_rows))
        geometry = CacheGeometry(num_pages=num_pages, page_size=self.page_size, num_tail_blocks=num_tail_blocks,
                                 page_padding=self.page_padding, ring_block_padding=self.ring_block_padding)
        ape = None
        if values == "exact":
            ape = torch.zeros(self.config.index_kpool, self.config.index_head_dim, dtype=torch.float32)
        # "suite:seed" (parity.sessions.session.SEED_TAG): the device-default decode relations apply
        return Case(name=self.name, size=self.size, config=self.config, geometry=geometry, steps=steps,
                    ape=ape, seed=self.seed, values=values, description=description,
                    tags=("suite:seed", *tags))


def _wide_buffer(config: KPoolConfig, capacity: int) -> OutputBufferSpec:
    """An output buffer wider than ``W`` (alignment columns) read every other row."""
    W = config.output_width
    width = 16 if W < 16 else ((W + 32) // 32) * 32   # > W: small 16; GLM 2080 (the public test's width)
    return OutputBufferSpec(capacity=capacity, width=width, row_step=2)


# ---- the six scenarios -----------------------------------------------------------------------

def prefill_tail(size: str) -> Case:
    """``prefill-tail``: a multi-request prefill from position 0 whose lengths leave tails 0..3,
    incl. a request shorter than one pool and a long one (GLM: 2086 tokens, selection drops pools
    inside the prefill); then the long request resumes mid-pool next to a new request, then decodes
    with a zero-length request in the batch. Exact data, padded compressed pages."""
    glm = _glm(size)
    L = 2086 if glm else 38          # long request (tail 2); GLM: > 2048 tokens
    plan = _Plan("prefill-tail", size, seed=101, page_size=16 if glm else 2,
                 page_padding=256 if glm else 8)
    # Raw lengths 3, 8, L, 13, 18 leave tails 3, 0, 2, 1, 2 (request 1 is shorter than a pool).
    plan.step("prefill", [(1, 0, 3), (2, 0, 8), (0, 0, L), (3, 0, 13), (4, 0, 18)])
    # Request 0 resumes mid-pool (its first pool completion reads the ring), ends with tail 1.
    plan.step("chunk+prefill", [(5, 0, 6), (0, L, 7)])
    plan.step("decode", [(4, 18, 1), (0, L + 7, 0), (3, 13, 1), (1, 3, 1), (2, 8, 1), (5, 6, 1)])
    return plan.build("multi-request prefill with tails 0..3 and a sub-pool request, a mid-pool chunk, "
                      "then decodes", "exact")


def decode_tail(size: str) -> Case:
    """``decode-tail``: decodes at every residue mod P after a prefill, one long request with
    more than K_pool visible pools; a ragged last step. Random data, padded ring blocks."""
    glm = _glm(size)
    L = 2090 if glm else 38
    plan = _Plan("decode-tail", size, seed=202, page_size=32 if glm else 3,
                 ring_block_padding=256 if glm else 16)
    plan.step("context", [(0, 0, L)], compute_topk=not glm)
    plan.step("prefill", [(2, 0, 9), (1, 0, 4), (3, 0, 2)])
    # Residues (p+1) % 4 per step: A 3,0,1,2  B 1,2,3  C 2,3,0,1  D 3,0,1.
    plan.step("decode-1", [(0, L, 1), (1, 4, 1), (2, 9, 1), (3, 2, 1)])
    plan.step("decode-2", [(3, 3, 1), (2, 10, 1), (1, 5, 1), (0, L + 1, 1)])
    plan.step("decode-3", [(1, 6, 1), (0, L + 2, 1), (3, 4, 1), (2, 11, 1)])
    plan.step("decode-4", [(2, 12, 1), (0, L + 3, 1)])
    return plan.build("decode steps at non-boundary positions (every tail length) after a prefill", "random")


def pool_boundary_decode(size: str) -> Case:
    """``pool-boundary-decode``: decodes whose token completes a pool ((p+1) % P == 0), so the
    pool written in the same step is visible; visible counts below, at and above K_pool.
    Exact data, padded pages and ring blocks."""
    glm = _glm(size)
    K = config_for(size).topk_pools
    A = 2099 if glm else 43              # boundary decode at p = A sees A//4 + 1 > K_pool pools
    B = 7 if glm else 3                  # below K_pool (small: a sub-pool prefill)
    C = 4 * K - 1                        # decode at p = 4K - 1 sees exactly K_pool pools
    plan = _Plan("pool-boundary-decode", size, seed=303, page_size=16 if glm else 2,
                 page_padding=128 if glm else 4, ring_block_padding=64 if glm else 8)
    plan.step("context", [(0, 0, A), (1, 0, B), (2, 0, C)], compute_topk=not glm)
    plan.step("decode-boundary", [(2, C, 1), (0, A, 1), (1, B, 1)])
    plan.step("decode", [(0, A + 1, 1), (1, B + 1, 1), (2, C + 1, 1)])
    # Multi-token step: the boundary falls inside A's chunk (3rd of 4 rows) and on B's, C's last row.
    plan.step("verify", [(1, B + 2, 3), (0, A + 2, 4), (2, C + 2, 3)])
    plan.step("decode-2", [(0, A + 6, 1), (2, C + 5, 1)])
    return plan.build("decodes completing a pool in the same step (visible below/at/above K_pool)", "exact")


CHUNK_ROWS = {"small": 5, "glm5.3-flash": 8}
"""``max_score_rows`` of ``prefill-topk``'s ``chunk-2`` step (12 / 22 live rows): the kernel scores
it in three chunks, the last one partial, so a chunk written at the wrong rows shows
(kpool-algorithm.md §4.6; the kernel's own 256 MiB scratch bound is never reached by a seed case)."""


def prefill_topk(size: str) -> Case:
    """``prefill-topk``: prefill rows whose visible pool counts are below, exactly at, one above
    and far above K_pool (small: 1, 2, 3, 11; GLM: 511, 512, 513, 562); the two-request chunk is
    scored in chunks of :data:`CHUNK_ROWS` rows. Random data."""
    glm = _glm(size)
    if glm:
        first, second, far = 2043, 18, 2250   # chunk 2 covers p = 2043..2060: visible 511..515
    else:
        first, second, far = 5, 9, 45         # chunk 2 covers p = 5..13: visible 1..3
    plan = _Plan("prefill-topk", size, seed=404, page_size=16 if glm else 2)
    plan.step("context", [(1, 0, far)], compute_topk=not glm)
    plan.step("chunk-1", [(0, 0, first)])
    # Chunk 2 starts mid-pool (reads the ring); request 1's rows are far above K_pool.
    plan.step("chunk-2", [(1, far, 4 if glm else 3), (0, first, second)], max_score_rows=CHUNK_ROWS[size])
    plan.step("decode", [(0, first + second, 1), (1, far + (4 if glm else 3), 1)])
    return plan.build("prefill rows with visible pools below / at / one above / far above K_pool", "random")


def full_padding(size: str) -> Case:
    """``full-padding``: FULL-graph replays (T > T_live, zero-length padded requests, stale positive
    ring slots of padding rows, ``max_pool_seq_len = M * B``) writing through an output buffer
    wider than W read every other row; then an eager decode. Random data, C = P + 1, padded
    pages and ring blocks."""
    glm = _glm(size)
    cfg = config_for(size).with_(num_speculative_tokens=1)
    A = 2301 if glm else 41
    plan = _Plan("full-padding", size, seed=505, config=cfg, page_size=32 if glm else 2,
                 page_padding=256 if glm else 8, ring_block_padding=128 if glm else 4)
    T_cap, R_cap = 8, 4
    buf = _wide_buffer(cfg, capacity=T_cap + 2)
    full = dict(num_tokens=T_cap, full_mode=True, stale_tail_slots=True, output_buffer=buf)
    plan.step("context", [(0, 0, A), (1, 0, 10), (2, 0, 5)], compute_topk=not glm)
    plan.step("replay-1", [(0, A, 1), (1, 10, 1), (2, 5, 1)], num_padded_requests=R_cap - 3, **full)
    plan.step("replay-2", [(1, 11, 2), (0, A + 1, 2)], num_padded_requests=R_cap - 2, **full)
    plan.step("replay-3", [(2, 6, 2), (0, A + 3, 2), (1, 13, 2)], num_padded_requests=R_cap - 3, **full)
    plan.step("eager-decode", [(0, A + 5, 1), (1, 15, 1), (2, 8, 1)])
    return plan.build("FULL-mode replays with padding rows, padded requests, stale ring slots, wide strided output",
                      "random")


def cache_only(size: str) -> Case:
    """``cache-only``: compute_topk=False steps (MTP draft style) between normal steps; later rows
    see pools written by cache-only steps. C = P + 3 (MTP-3 ring). Exact data."""
    glm = _glm(size)
    cfg = config_for(size).with_(num_speculative_tokens=3)
    A = 2090 if glm else 38
    plan = _Plan("cache-only", size, seed=606, config=cfg, page_size=16 if glm else 2,
                 ring_block_padding=32 if glm else 4)
    plan.step("prefill", [(0, 0, A), (1, 0, 11)], compute_topk=not glm)
    plan.step("verify", [(0, A, 3), (1, 11, 3)])
    plan.step("draft", [(1, 14, 1), (0, A + 3, 1)], compute_topk=False)
    plan.step("decode", [(0, A + 4, 1), (1, 15, 1)])
    plan.step("draft-chunk", [(0, A + 5, 5), (1, 16, 2)], compute_topk=False)
    plan.step("decode+prefill", [(2, 0, 6), (0, A + 10, 1), (1, 18, 1)])
    plan.step("draft-prefill", [(2, 6, 7), (1, 19, 1), (0, A + 11, 1)], compute_topk=False)
    plan.step("decode-2", [(1, 20, 1), (2, 13, 1), (0, A + 12, 1)])
    return plan.build("cache-only (compute_topk=False) steps interleaved with scored steps", "exact")


def non_finite(size: str) -> Case:
    """``non-finite``: prefill, chunked prefill and decode steps on the ``nonfinite`` value
    family (:mod:`cases.values`: NaN and +-inf in keys, gates, queries, weights and APE): pooled
    keys and scores that become NaN or infinite, sanitized alike on both sides (§4.3)."""
    glm = _glm(size)
    P = config_for(size).index_kpool
    A = 40 * P + 3 if glm else 9 * P + 2
    plan = _Plan("non-finite", size, seed=808, page_size=4)
    plan.step("prefill", [(0, 0, A), (1, 0, 3 * P + 1)])
    plan.step("chunk", [(1, 3 * P + 1, 2 * P), (0, A, P + 1)])
    plan.step("decode", [(0, A + P + 1, 1), (1, 5 * P + 1, 1)])
    plan.step("decode-2", [(0, A + P + 2, 1), (1, 5 * P + 2, 1)])
    return plan.build("NaN and +-inf in k, gate, q, weights and APE: NaN / inf pooled keys and scores", "nonfinite")


def bad_arguments(size: str) -> Case:
    """``bad-arguments``: after a valid prefill, one step per tensor and scalar rejection rule of
    ``validate_forward`` (:mod:`cases.bad_arguments`; parity-contract.md §5): both sides reject
    with that rule's class (the kernel with its name too) and write nothing; then the batch,
    valid. Random data."""
    import dataclasses

    from .bad_arguments import CORRUPTIONS
    cfg = config_for(size)
    P = cfg.index_kpool
    plan = _Plan("bad-arguments", size, seed=909, page_size=2)
    batch = [(0, 2 * P, 3), (1, P, 2)]
    plan.step("context", [(0, 0, 2 * P), (1, 0, P)])
    for name in CORRUPTIONS:
        plan.step(f"bad:{name}", batch)
    plan.step("after", batch)
    case = plan.build("one bad-argument step per tensor / scalar rejection rule of validate_forward, then the "
                      "valid batch", "random")
    steps = [dataclasses.replace(st, bad_argument=st.name[4:], expect_error=CORRUPTIONS[st.name[4:]][1],
                                 expect_rule=st.name[4:]) if st.name.startswith("bad:") else st for st in case.steps]
    return dataclasses.replace(case, steps=steps)


def bad_metadata(size: str) -> Case:
    """``bad-metadata``: after a valid prefill, one step per metadata rejection rule of
    ``validate_forward`` (:mod:`cases.violations`; parity-contract.md §5): each breaks exactly
    that rule, both sides must reject it (the kernel with that rule's class and name) and write
    nothing; then the same batch, valid, which must see caches untouched by the bad steps.
    Random data."""
    import dataclasses

    from .patches import VIOLATION_PREFIX, MetadataPatch
    from .violations import ERRORS, VIOLATIONS
    cfg = config_for(size)
    P = cfg.index_kpool
    plan = _Plan("bad-metadata", size, seed=707, page_size=2)
    A = 3 * P + 1
    batch = [(0, A, P), (1, 2 * P, 2), (2, P + 1, 2)]
    plan.step("context", [(0, 0, A), (1, 0, 2 * P), (2, 0, P + 1)])
    for rule in VIOLATIONS:
        plan.step(f"bad:{rule}", batch)
    plan.step("after", batch)
    case = plan.build("one bad-metadata step per rejection rule of validate_forward, then the valid batch", "random")
    geo = case.geometry
    args = (P, geo.num_pages, geo.page_size, geo.num_tail_blocks, cfg.ring_capacity)
    steps = [dataclasses.replace(st, patch_metadata=MetadataPatch(VIOLATION_PREFIX + st.name[4:], args),
                                 expect_error=ERRORS[st.name[4:]], expect_rule=st.name[4:])
             if st.name.startswith("bad:") else st for st in case.steps]
    return dataclasses.replace(case, steps=steps)


def prefill_topk_no_tail(size: str) -> Case:
    """``prefill-topk`` in HF's second mode, ``always_select_tail=False`` (kpool-algorithm.md §10):
    rows of width ``K_tok``, no causal tail."""
    return without_tail(prefill_topk(size))


SCENARIOS: Dict[str, Callable[[str], Case]] = {
    "prefill-tail": prefill_tail,
    "decode-tail": decode_tail,
    "pool-boundary-decode": pool_boundary_decode,
    "prefill-topk": prefill_topk,
    "full-padding": full_padding,
    "cache-only": cache_only,
    "prefill-topk-no-tail": prefill_topk_no_tail,
    "non-finite": non_finite,
    "bad-metadata": bad_metadata,
    "bad-arguments": bad_arguments,
}
"""Scenario name -> ``fn(size) -> Case``. ``prefill-topk-no-tail`` is HF's second mode
(``always_select_tail=False``, rows of width ``K_tok``, kpool-algorithm.md §10). Issue 19's
``value-range`` and ``strided-layouts`` come from :mod:`cases.scenarios_range` (added below)."""


def without_tail(case: Case) -> Case:
    """``case`` in HF's second mode, ``always_select_tail=False`` (kpool-algorithm.md §10): the
    same steps and geometry, rows of width ``K_tok`` without the causal tail. Named
    ``NAME-no-tail`` (:data:`SCENARIOS` has ``prefill-topk-no-tail``; an implementation without
    the mode reports its steps "unsupported by IMPL")."""
    import dataclasses
    return dataclasses.replace(case, name=f"{case.name}-no-tail", config=case.config.with_(always_select_tail=False),
                               description=f"{case.description} (always_select_tail=False)")


def seed_cases(sizes: Sequence[str] = SIZES) -> List[Case]:
    """Every seed scenario at every requested size, in :data:`SCENARIOS` order per size (less the
    scenarios of input families the self-test switched off, :mod:`cases.families`).

    Raises:
        ValueError: unknown size.
    """
    from .families import case_enabled
    return [c for c in (fn(size) for size in sizes for fn in SCENARIOS.values()) if case_enabled(c)]


from .scenarios_range import FAMILY_SCENARIOS  # noqa: E402 - it builds on _Plan above

SCENARIOS.update(FAMILY_SCENARIOS)
