"""Guaranteed-coverage cases: fixed cases every generated run checks before it draws any
(hypothesis explicit examples, :func:`parity.running.generated.run_generated`), so the input classes that
a small budget can miss by chance are always exercised (kpool-algorithm.md §9 items 3 and 10):

* :func:`residue_case`: for one pool size ``P``, chunks that start at every residue
  ``cached_len % P`` in ``0..P-1`` (multi-row chunks, so pools complete mid-chunk, and every tail
  length ``(p + 1) % P`` is scored);
* :func:`empty_steps_case`: steps with ``T == 0`` (a zero-length request), ``R == 0`` with and
  without padding rows, a cache-only ``T == 0`` step and a zero-length request beside a live one;
* :func:`rejection_and_nan_case`: a NaN compressed pool (NaN scores) and an out-of-range ring
  block both sides must reject.

:func:`guaranteed_cases` gives the batch generator one residue case per ``P`` its bounds allow,
and the engine generator the empty-steps and the rejection/NaN sequences. Data only: nothing here runs a kernel.
"""
from __future__ import annotations

from typing import Callable, List, Optional

from kpool.config import KPoolConfig

from .engine import Action, EngineSim, FullMode
from .genvalues import ValueSpec, random_ape
from .scenarios_range import value_range_coverage_cases
from .spec import Case


def _pick_middle(n: int) -> int:
    """Free-list choice: the middle entry, so block tables are not the identity."""
    return n // 2


def residue_case(P: int, *, heads: int = 2, head_dim: int = 4, topk_pools: int = 2, page_size: int = 2,
                 seed: int = 0) -> Case:
    """``n = min(P, 4)`` requests; a cache-only context step gives request ``i`` the cached length
    ``P + i`` (residue ``i``), then ``ceil(P / n)`` scored steps give every request a chunk of
    ``max(n, 2)`` rows, which moves its residue on by ``n``: the chunk starts cover ``0..P-1``.

    Returns:
        a :class:`cases.spec.Case` named ``coverage-residues-P<P>`` (random values)."""
    n = min(P, 4)
    chunk = max(n, 2)
    steps = -(-P // n)
    cfg = KPoolConfig(index_n_heads=heads, index_head_dim=head_dim, index_kpool=P, index_topk=topk_pools * P)
    longest = P + n - 1 + steps * chunk
    max_pages = max(1, -(-longest // (P * page_size)))
    sim = EngineSim(cfg, page_size=page_size, num_pages=n * max_pages + 2, num_ring_blocks=n + 1,
                    max_pages=max_pages, pick=_pick_middle)
    rids = [sim.admit() for _ in range(n)]
    base = seed * 1000 + P * 100
    sim.step([Action(r, P + i) for i, r in enumerate(rids)], name="context", compute_topk=False,
             inputs=ValueSpec(seed=base), seed=base)
    for s in range(steps):
        order = rids[s % n:] + rids[:s % n]          # the row order changes between steps
        sim.step([Action(r, chunk) for r in order], name=f"chunks-{s}", inputs=ValueSpec(seed=base + s + 1),
                 seed=base + s + 1)
    D = head_dim
    return sim.build(f"coverage-residues-P{P}", ape=random_ape(P, D, base), seed=base, values="random",
                     description=f"chunk starts at every residue mod {P}", tags=("coverage:residues",))


def empty_steps_case(config: Optional[KPoolConfig] = None, *,
                     inputs: Callable[[int], object] = lambda i: ValueSpec(seed=i),
                     name: str = "coverage-empty-steps") -> Case:
    """A prefill, then ``T == 0`` (a zero-length request), ``R == 0`` with 2 stale padding rows,
    ``R == 0`` and ``T == 0``, a cache-only ``T == 0`` step, a zero-length request beside a
    decode, and a decode of both requests (§9 item 3, §5.5 empty batch).

    Args:
        config: default H=2, D=4, P=4, K_tok=8, MTP-1.
        inputs: ``fn(step_seed) -> Step.inputs`` (tests wrap the values in odd layouts).
    """
    cfg = config or KPoolConfig(index_n_heads=2, index_head_dim=4, index_kpool=4, index_topk=8,
                                num_speculative_tokens=1)
    max_pages = max(3, -(-11 // (2 * cfg.index_kpool)))      # request a reaches 11 tokens
    sim = EngineSim(cfg, page_size=2, num_pages=2 * max_pages + 4, num_ring_blocks=3, max_pages=max_pages,
                    pick=_pick_middle)
    a, b = sim.admit(), sim.admit()
    sim.step([Action(a, 9), Action(b, 6)], name="prefill", inputs=inputs(1), seed=1)
    sim.step([Action(a, 0)], name="T=0", inputs=inputs(2), seed=2)
    sim.step([], name="R=0,T=2", full=FullMode(pad_rows=2, stale=True), inputs=inputs(3), seed=3)
    sim.step([], name="R=0,T=0", full=FullMode(), inputs=inputs(4), seed=4)
    sim.step([Action(b, 0)], name="cache-only,T=0", compute_topk=False, inputs=inputs(5), seed=5)
    sim.step([Action(b, 0), Action(a, 1)], name="zero-length+decode", inputs=inputs(6), seed=6)
    sim.step([Action(a, 1), Action(b, 1)], name="decode", inputs=inputs(7), seed=7)
    return sim.build(name, ape=random_ape(cfg.index_kpool, cfg.index_head_dim, 7), seed=7, values="random",
                     description="empty steps: T == 0, R == 0, zero-length requests", tags=("coverage:empty",))


def rejection_and_nan_case(config: Optional[KPoolConfig] = None) -> Case:
    """A prefill whose pool-completing row carries a NaN key (a NaN compressed pool, then NaN
    scores: §4.3 sanitization), a step with an out-of-range ring block that both sides must reject
    with nothing written (parity-contract.md §5, public case C05), and a decode scoring the NaN pool.
    """
    from kpool.errors import KPoolBlockIdError

    from .genvalues import Special
    from .patches import MetadataPatch
    cfg = config or KPoolConfig(index_n_heads=2, index_head_dim=4, index_kpool=4, index_topk=8)
    P = cfg.index_kpool
    max_pages = max(2, -(-(2 * P + 2) // (2 * P)))
    sim = EngineSim(cfg, page_size=2, num_pages=2 * max_pages + 2, num_ring_blocks=2, max_pages=max_pages,
                    pick=_pick_middle)
    a = sim.admit()
    nan_key = (Special("k", P - 1, 0, "nan"),)          # row P - 1 completes pool 0
    sim.step([Action(a, 2 * P)], name="prefill-nan-key", inputs=ValueSpec(seed=1, specials=nan_key), seed=1)
    sim.step([Action(a, 1)], name="bad-ring-block", inputs=ValueSpec(seed=2), seed=2,
             patch=MetadataPatch("ring-block-out-of-range", (0, sim.num_ring_blocks + 5, sim.C)),
             expect_error=KPoolBlockIdError)
    sim.step([Action(a, 1)], name="decode", inputs=ValueSpec(seed=3), seed=3)
    return sim.build("coverage-rejection-nan", ape=random_ape(P, cfg.index_head_dim, 3), seed=3, values="random",
                     description="a NaN compressed pool, a rejected out-of-range ring block", tags=("coverage:nan",))


def guaranteed_cases(kind: str, bounds) -> List[Case]:
    """The fixed cases of a generated run of ``kind`` within ``bounds``
    (:class:`cases.strategies.Bounds`): ``batch`` -> one :func:`residue_case` per allowed ``P``;
    ``engine`` -> :func:`empty_steps_case` (when the bounds allow empty steps),
    :func:`rejection_and_nan_case` and the exact whole-range steps of
    :func:`cases.scenarios_range.value_range_coverage_cases` (FLT_MAX and +inf scores, scores far
    below -1e30: no random draw makes them).

    Raises:
        ValueError: unknown ``kind``.
    """
    heads = min(2, bounds.max_heads)
    dim = bounds.head_dims[0]          # the shrink target: the commonest D of the profile
    if kind == "batch":
        return [residue_case(P, heads=heads, head_dim=dim, topk_pools=min(2, bounds.max_topk_pools))
                for P in bounds.kpools]
    if kind == "engine":
        if not bounds.empty_steps:
            return []
        P = 4 if 4 in bounds.kpools else bounds.kpools[0]
        cfg = KPoolConfig(index_n_heads=heads, index_head_dim=dim, index_kpool=P, index_topk=2 * P,
                          num_speculative_tokens=1)
        return [empty_steps_case(cfg), rejection_and_nan_case(cfg.with_(num_speculative_tokens=0)),
                *value_range_coverage_cases()]
    raise ValueError(f"kind must be 'batch' or 'engine', got {kind!r}")
