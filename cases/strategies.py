"""Hypothesis strategies for generated parity cases (kpool-algorithm.md §9, §11 "Harness
scenarios"; public-cases.md: every fault kind C01..C31 must be reachable from here).

Composable pieces, each bounded by a :class:`Bounds` (the profiles in :mod:`cases.profiles` pick
one):

* :func:`configs`: ``P`` in {1, 2, 4, 8, 16}, ``index_topk`` a multiple of it, heads, head dims,
  MTP depth with ring capacity ``C >= P + spec``, score mode, tail layout.
* :func:`value_specs` / :func:`specials`: bit-exact value families (random, exact dyadic, forced
  ties, near-ties) and NaN / +-inf injected into q, weights, K and gate (:mod:`cases.genvalues`).
* :func:`batch_cases`: one batch under test after a cache-only context step: mixed prefill /
  decode / MTP rows, zero-length requests, chunk starts at every residue mod P, pool-aligned
  prefix resumes, FULL-mode padding with stale slots and stale padded-request lengths, permuted
  non-contiguous block tables, padded page and ring strides, caller output buffers wider than W,
  page sizes 1..64, metadata only validation produces (batches only; :mod:`cases.accepted`:
  completing padding rows, tight block tables, garbage in unread table columns, idle requests'
  ring blocks), and
  (rarely) an out-of-range ring block both sides must reject (C05).
* :func:`engine_cases`: whole engine sequences over one cache pair (:mod:`cases.engine`): admit,
  prefill chunks, decode, MTP verify with partial acceptance and replay, FULL-mode replays with
  padding, cache-only steps, finish and reuse of pages and ring blocks, prefix resumes.

Every strategy returns :class:`cases.spec.Case` objects that :func:`parity.running.runner.run_case` runs
as is. Choices are ordered so that shrinking goes to the simple end (P=4, one request, decode,
no padding, random values).

Where each public fault kind is reachable (``cases.public`` holds the named cases):

====  ==========================================================================================
C01   decodes and chunks completing pools from ring rows (engine steps; ring stash vs pool slot)
C03   ``ring_block_padding`` / ``page_padding`` drawn per case: strided, non-contiguous views
C05   ``ring-block-out-of-range`` patch steps (``bad_metadata_chance``): both sides reject
C07   rows with 0 < visible < K_pool next to long rows; caller buffers prefilled with sentinels
C09   multi-row prefill chunks at every residue (own incomplete pool never visible)
C11   several requests per batch with non-aligned boundaries, permuted row order
C13   ``ties`` / ``near-ties`` value families: bitwise ties at and inside the top-k boundary
C15   ragged MTP verify lengths per request in one step, eager and FULL
C17   FULL replays: padding rows with -1 or stale positive ring slots, padded requests with
      stale lengths (``stale-padded-lengths``)
C19   consecutive FULL replays whose block tables and ring blocks change (reuse after finish)
C21   MTP verify with partial acceptance then replay (``C = P + spec``; ``undersized_ring``
      plants the configuration fault the oracle must catch)
C23   permuted request order every step; determinism re-runs (``parity.running.generated``)
C25   ``near-ties`` family; random gate/APE pooling
C27   every few examples the kernel runs twice and must repeat every bit
C29   visible counts below, at and above K_pool; K_pool up to 8 in the nightly profile
C31   random per-channel gate and APE in every family but ``exact``; ring vs input windows
====  ==========================================================================================

Issue 19 families on top (:mod:`cases.wide_inputs`, choices derived from the drawn seeds): a
share of the cases gets values from the whole finite range (:mod:`cases.ranges`) and strided
input layouts (:mod:`cases.layouts`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

from hypothesis import strategies as st

from kpool.config import KPoolConfig
from kpool.errors import KPoolBlockIdError

from .engine import Action, EngineSim, FullMode
from .genvalues import FAMILIES, SPECIAL_KINDS, SPECIAL_TENSORS, Special, ValueSpec, random_ape
from .accepted import ACCEPTED
from .patches import ACCEPTED_PREFIX, MetadataPatch
from .spec import Case, OutputBufferSpec
from .wide_inputs import widen_case

KPOOLS = (4, 1, 2, 8, 16)
"""Pool sizes, the shrink target first."""
PAGE_SIZES = (2, 1, 3, 4, 16, 64)
"""Pools per compressed page ``B`` (shrink target first; 64 = one page holds whole requests)."""


@dataclass(frozen=True)
class Bounds:
    """Size limits of generated cases (the profiles of :mod:`cases.profiles` choose them).

    Attributes:
        kpools: allowed ``P``. max_topk_pools: ``K_pool = index_topk / P`` in ``[1, max]``.
        max_heads: ``H`` in ``[1, max]``. head_dims: allowed ``D`` (powers of two).
        max_spec: MTP depth in ``[0, max]``. max_live: requests alive at once.
        max_steps: steps of an engine sequence (context steps of a batch case not counted).
        max_step_tokens: live rows of one step. max_chunk: rows of one prefill chunk.
        extra_len: request lengths reach ``K_tok + 2P + extra_len`` (visible > K_pool possible).
        page_sizes: allowed ``B``. special_chance: percent of steps with NaN/inf injections.
        bad_metadata_chance: percent of steps replaced by an invalid-ring-block step.
        accepted_chance: percent of the other steps whose metadata is rewritten into valid
            metadata the builder never produces (:mod:`cases.accepted`).
        verify_weight / chunk_weight: how many times "MTP verify" / "prefill chunk" appear in the
            action menu (decode, zero-length and skip appear once): MTP rejection needs a verify
            *and* a later step; most prefill faults need a multi-row chunk.
        step_kinds: the menu of step kinds (repeat one to weight it; the first is the shrink target).
        undersized_ring: plant the configuration fault of public case C21: MTP depth >= 1 with
            ring capacity ``C = P`` (< ``P + spec``). Kernels and reference agree on it; only the
            whole-history oracle can tell, once a rejected draft clobbered a committed ring row.
        empty_steps: keep a drawn step with no live row and no padding (``T == 0`` or ``R == 0``,
            kpool-algorithm.md §9 item 3) instead of turning it into a decode (on in every
            profile; ``False`` only for tests that want a step with rows).
        value_range_chance / layout_chance: percent of cases given a range class of the whole
            finite range / strided input layouts (:mod:`cases.wide_inputs`, issue 19 families 1-2).
    """

    kpools: Tuple[int, ...] = KPOOLS
    max_topk_pools: int = 2
    max_heads: int = 2
    head_dims: Tuple[int, ...] = (4, 1, 2, 8, 16)
    max_spec: int = 3
    max_live: int = 3
    max_steps: int = 5
    max_step_tokens: int = 40
    max_chunk: int = 24
    extra_len: int = 4
    page_sizes: Tuple[int, ...] = PAGE_SIZES
    special_chance: int = 15
    bad_metadata_chance: int = 4
    accepted_chance: int = 20
    undersized_ring: bool = False
    verify_weight: int = 2
    chunk_weight: int = 2
    step_kinds: Tuple[str, ...] = ("eager", "full", "cache-only")
    empty_steps: bool = True
    value_range_chance: int = 60
    layout_chance: int = 50


TINY = Bounds()
"""The interpreter-sized default (H <= 2, D <= 16, <= 40 rows a step)."""


def _chance(draw, percent: int) -> bool:
    """True with about ``percent`` % probability; shrinks to False."""
    return percent > 0 and draw(st.integers(0, 99)) >= 100 - percent


# ---- configs and values ------------------------------------------------------------------------

@st.composite
def configs(draw, bounds: Bounds = TINY) -> KPoolConfig:
    """A valid :class:`kpool.config.KPoolConfig` within ``bounds`` (ring capacity ``C`` is
    ``P + spec`` or a little more, never less: kpool-algorithm.md §3.3)."""
    P = draw(st.sampled_from(bounds.kpools))
    K_pool = draw(st.integers(1, bounds.max_topk_pools))
    H = draw(st.integers(1, bounds.max_heads))
    D = draw(st.sampled_from(bounds.head_dims))
    # An undersized ring can only lose a committed row with >= 2 drafts (one rejected draft
    # lands on a slot no committed token of the open pool uses).
    # MTP depth: the first choice (the shrink target) is 2, so MTP verify / rejection / replay
    # are common; 0 (no MTP) is one choice of four.
    depths = (2, 0, 1, 3) if not bounds.undersized_ring else (2, 3)
    spec = draw(st.sampled_from([d for d in depths if d <= max(bounds.max_spec, 2 if bounds.undersized_ring else 0)]))
    extra = draw(st.sampled_from((None, 1, 3)))
    capacity = None if extra is None else P + spec + extra
    if bounds.undersized_ring:
        capacity = P
    return KPoolConfig(index_n_heads=H, index_head_dim=D, index_kpool=P, index_topk=K_pool * P,
                       num_speculative_tokens=spec, tail_ring_capacity=capacity,
                       score_mode=draw(st.sampled_from(("relu", "merged"))),
                       pack_tail=draw(st.sampled_from((True, False))))


def specials(max_size: int = 2):
    """Lists of :class:`cases.genvalues.Special` NaN / +-inf injections."""
    one = st.builds(Special, tensor=st.sampled_from(SPECIAL_TENSORS), row=st.integers(0, 63),
                    col=st.integers(0, 255), kind=st.sampled_from(SPECIAL_KINDS))
    return st.lists(one, min_size=1, max_size=max_size).map(tuple)


@st.composite
def value_specs(draw, seed: int, pool_seed: int, family: Optional[str] = None,
                weights_bf16: bool = False, special_chance: int = 15) -> ValueSpec:
    """A :class:`cases.genvalues.ValueSpec` for one step (family drawn unless given)."""
    family = family or draw(st.sampled_from(FAMILIES))
    inject = draw(specials()) if _chance(draw, special_chance) else ()
    return ValueSpec(family=family, seed=seed, pool_seed=pool_seed, weights_bf16=weights_bf16, specials=inject)


# ---- one step of an engine --------------------------------------------------------------------

@dataclass
class _Ctx:
    """Per-case drawing context."""

    sim: EngineSim
    bounds: Bounds
    family: str
    weights_bf16: bool
    case_seed: int


def _draw_actions(draw, ctx: _Ctx, kind: str):
    """Actions of the live requests, in a drawn row order (kinds: eager, full, cache-only)."""
    sim, spec = ctx.sim, ctx.sim.config.num_speculative_tokens
    rids = draw(st.permutations(sorted(sim.requests)))
    actions, budget = [], ctx.bounds.max_step_tokens
    for rid in rids:
        room = min(sim.max_len() - sim.requests[rid].committed, budget)
        menu = ["decode"]
        if kind != "full":
            menu += ["chunk"] * ctx.bounds.chunk_weight
        if kind != "cache-only" and spec > 0:
            menu += ["verify"] * ctx.bounds.verify_weight
        menu += ["zero", "skip"]
        if room < 1:
            menu = ["zero", "skip"]
        what = draw(st.sampled_from(menu))
        if what == "skip":
            continue
        if what == "zero":
            actions.append(Action(rid, 0))
        elif what == "decode":
            actions.append(Action(rid, 1))
        elif what == "chunk":
            actions.append(Action(rid, draw(st.integers(1, max(1, min(room, ctx.bounds.max_chunk))))))
        else:
            s = draw(st.integers(1, max(1, min(spec, room - 1)))) if room > 1 else 0
            actions.append(Action(rid, 1 + s, accepted=draw(st.integers(0, s))))
        budget -= actions[-1].query_len
    return actions


def _draw_step(draw, ctx: _Ctx, index: int, kind: Optional[str] = None, accepted: bool = True) -> None:
    """Draw and record one step of ``ctx.sim`` (module docstring of :mod:`cases.engine`)."""
    sim, cfg = ctx.sim, ctx.sim.config
    kind = kind or draw(st.sampled_from(ctx.bounds.step_kinds))
    actions = _draw_actions(draw, ctx, kind)
    full, patch, expect = None, None, None
    if kind == "full":
        full = FullMode(pad_rows=draw(st.integers(0, 3)), padded_requests=draw(st.integers(0, 2)),
                        stale=draw(st.booleans()))
    T = sum(a.query_len for a in actions) + (full.pad_rows if full else 0)
    R = len(actions) + (full.padded_requests if full else 0)
    if (T == 0 or R == 0) and not ctx.bounds.empty_steps:
        # Bounds.empty_steps off: turn the empty step into a decode.
        rid = next((r for r in sorted(sim.requests) if sim.requests[r].committed < sim.max_len()), None)
        if rid is None:
            return
        actions = [a for a in actions if a.rid != rid] + [Action(rid, 1)]
    if full is not None:
        if full.padded_requests and _chance(draw, 50):
            stale_len = draw(st.integers(1, sim.max_len()))
            patch = MetadataPatch("stale-padded-lengths", (len(actions), stale_len, cfg.index_kpool))
    compute_topk = kind != "cache-only"
    buf = None
    if compute_topk and _chance(draw, 30):
        T = sum(a.query_len for a in actions) + (full.pad_rows if full else 0)
        buf = OutputBufferSpec(capacity=T + draw(st.integers(0, 2)),
                               width=cfg.output_width + draw(st.integers(0, 5)),
                               row_step=draw(st.integers(1, 2)))
    live = [i for i, a in enumerate(actions) if a.query_len > 0]
    if live and patch is None and _chance(draw, ctx.bounds.bad_metadata_chance):
        r = draw(st.sampled_from(live))
        patch = MetadataPatch("ring-block-out-of-range",
                              (r, sim.num_ring_blocks + draw(st.integers(0, 4096)), sim.C))
        expect = KPoolBlockIdError
    if accepted and patch is None and _chance(draw, ctx.bounds.accepted_chance):
        # the rest of what validate_forward accepts (issue 13 part 2)
        patch = MetadataPatch(ACCEPTED_PREFIX + draw(st.sampled_from(sorted(ACCEPTED))),
                              (cfg.index_kpool, sim.num_pages, sim.B, sim.num_ring_blocks, sim.C))
    seed = ctx.case_seed * 1000 + index + 1
    values = draw(value_specs(seed, ctx.case_seed, ctx.family, ctx.weights_bf16, ctx.bounds.special_chance))
    names = {"eager": "step", "full": "full-replay", "cache-only": "cache-only"}
    sim.step(actions, name=f"{names[kind]}-{index}" + ("-bad-ring" if expect else ""),
             compute_topk=compute_topk, full=full, output_buffer=buf, inputs=values, seed=seed,
             patch=patch, expect_error=expect)


def _admit(draw, ctx: _Ctx) -> int:
    """Admit one request: fresh, or (when a live request holds complete pages) maybe a prefix resume."""
    sim = ctx.sim
    donors = [rid for rid in sorted(sim.requests) if sim.complete_pages(rid) > 0]
    if donors and _chance(draw, 60):
        src = draw(st.sampled_from(donors))
        return sim.admit(fork_from=src, shared_pages=draw(st.integers(1, sim.complete_pages(src))))
    return sim.admit()


def _new_ctx(draw, bounds: Bounds):
    cfg = draw(configs(bounds))
    P, B = cfg.index_kpool, draw(st.sampled_from(bounds.page_sizes))
    target = cfg.index_topk + 2 * P + bounds.extra_len
    max_pages = max(1, -(-target // (P * B)))
    pick = lambda n: draw(st.integers(0, n - 1))   # noqa: E731 - free-list choices, shrink to 0
    sim = EngineSim(cfg, page_size=B, num_pages=bounds.max_live * max_pages + 2,
                    num_ring_blocks=bounds.max_live + 1, max_pages=max_pages, pick=pick)
    family = draw(st.sampled_from(FAMILIES))
    ctx = _Ctx(sim, bounds, family, weights_bf16=draw(st.booleans()), case_seed=draw(st.integers(0, 2 ** 16)))
    return ctx


def _finish_case(draw, ctx: _Ctx, name: str, description: str) -> Case:
    cfg, sim = ctx.sim.config, ctx.sim
    D = cfg.index_head_dim
    page_padding = draw(st.sampled_from((0, D + 3, 1)))
    ring_padding = draw(st.sampled_from((0, 2 * D + 5, 1)))
    ape = random_ape(cfg.index_kpool, D, ctx.case_seed, "exact" if ctx.family == "exact" else "random")
    tags = tuple(f"engine:{k}={v}" for k, v in sorted(sim.events.items()))
    case = sim.build(f"{name}-{ctx.case_seed}", ape=ape, seed=ctx.case_seed,
                     values="exact" if ctx.family == "exact" else "random", description=description,
                     tags=(f"family:{ctx.family}",) + tags, page_padding=page_padding,
                     ring_block_padding=ring_padding)
    return widen_case(case, case_seed=ctx.case_seed, family=ctx.family,
                      value_range_chance=ctx.bounds.value_range_chance, layout_chance=ctx.bounds.layout_chance)


@st.composite
def batch_cases(draw, bounds: Bounds = TINY) -> Case:
    """One batch under test (a single drawn step) after at most one cache-only context step that
    gives its requests their cached prefixes (chunk starts at any residue mod P) and possibly a
    prefix-resumed request. Returns a 1- or 2-step :class:`cases.spec.Case` named ``gen-batch-<seed>``."""
    ctx = _new_ctx(draw, bounds)
    sim = ctx.sim
    n = draw(st.integers(1, bounds.max_live))
    context = []
    for _ in range(n):
        rid = sim.admit()
        # Cached length as whole pools plus a residue drawn on its own, so chunk starts hit every
        # residue mod P (kpool-algorithm.md §9 item 10) about equally often.
        limit = min(sim.max_len() - 1, bounds.max_step_tokens)
        P = sim.P
        cached = min(limit, P * draw(st.integers(0, limit // P)) + draw(st.integers(0, P - 1)))
        if cached:
            context.append(Action(rid, cached))
    if context:
        budget, kept = bounds.max_step_tokens * 2, []
        for a in context:      # keep the context step bounded
            if a.query_len <= budget:
                kept.append(a)
                budget -= a.query_len
        sim.step(kept, name="context", compute_topk=False, seed=ctx.case_seed * 1000,
                 inputs=ValueSpec(family=ctx.family, seed=ctx.case_seed * 1000, pool_seed=ctx.case_seed))
        if len(sim.requests) < bounds.max_live and _chance(draw, 70):
            _admit(draw, ctx)
    # The batch under test is mostly scored (the context step already updated caches only) and
    # mostly prefill chunks: most prefill faults need a multi-row chunk.
    ctx.bounds = replace(bounds, chunk_weight=max(bounds.chunk_weight, 4))
    _draw_step(draw, ctx, 1, kind=draw(st.sampled_from(("eager", "full", "eager", "cache-only"))))
    return _finish_case(draw, ctx, "gen-batch", "generated batch after a cache-only context step")


@st.composite
def _engine_step(draw, ctx: _Ctx) -> int:
    """One engine iteration: some requests finish, some are admitted, then one step is drawn."""
    sim, bounds = ctx.sim, ctx.bounds
    for rid in sorted(sim.requests):
        if _chance(draw, 20):
            sim.finish(rid)
    if not sim.requests:
        _admit(draw, ctx)
    while len(sim.requests) < bounds.max_live and _chance(draw, 35):
        _admit(draw, ctx)
    index = len(sim.steps)
    # Engine sequences keep the builder's metadata: a rewrite's draw would shift every later draw
    # of the derandomized ci budget, whose coverage (pool-boundary decodes) and fault searches
    # (undersized ring) the tests pin; the batches draw the accepted-metadata rewrites.
    _draw_step(draw, ctx, index, accepted=False)
    return index


@st.composite
def engine_cases(draw, bounds: Bounds = TINY) -> Case:
    """A whole engine sequence (2..``max_steps`` steps) over one cache pair: between steps
    requests finish (pages and ring block freed for reuse) and new ones are admitted (fresh or a
    prefix resume); each step is eager, FULL-mode replay or cache-only. Returns a
    :class:`cases.spec.Case` named ``gen-engine-<seed>``.

    The steps are the elements of a hypothesis list (each element drawn against the engine state
    the earlier ones left), so shrinking deletes whole steps, leading ones included."""
    ctx = _new_ctx(draw, bounds)
    draw(st.lists(_engine_step(ctx), min_size=min(2, bounds.max_steps), max_size=bounds.max_steps))
    return _finish_case(draw, ctx, "gen-engine", "generated engine sequence")


def scaled(bounds: Bounds, **changes) -> Bounds:
    """``bounds`` with fields replaced (profiles build theirs from :data:`TINY`)."""
    return replace(bounds, **changes)
