"""Seed scenarios of issue 19 families 1 and 2: ``value-range`` and ``strided-layouts`` (both
sizes; registered in :data:`cases.scenarios.SCENARIOS`, tagged ``family-switch:values`` /
``family-switch:layouts`` for the self-test's switch, :mod:`cases.families`).

* ``value-range``: one step per range class of :mod:`cases.ranges` over two requests (ordered so
  no fp32 score overflows in any order: small weights never meet huge keys), a third request
  alone on ``range-ends`` (keys near the bf16 top, queries near 2^-110), and an exact-logit
  step pair (public-cases.md "Exact-logit trick") whose scores are exact in any order:
  ``FLT_MAX`` and ``+inf`` in one row (ties to the lower pool, §4.3), a row whose every score is
  far below ``-1e30`` (``-2^110 |v|``), subnormal and ``-0.0`` scores, and bf16 neighbours at the
  small size's top-k boundary (a near tie). APE from the whole range.
* ``strided-layouts``: prefill, a mid-pool chunk, decodes, an MTP-style verify and a FULL replay
  with padding, each with its own :class:`cases.layouts.InputLayout`, so every field is used
  (weights transposed / column-padded / both, q padded head and row strides and strided
  channels, k transposed or row-padded, gate row-padded, APE transposed, strided metadata and
  column-major block tables) next to padded cache rows (``row_padding``), pages and ring blocks.
"""
from __future__ import annotations

import dataclasses

import torch

from kpool.config import GLM53_FLASH, SMALL, KPoolConfig

from .engine import Action, EngineSim, FullMode
from .genvalues import ValueSpec
from .layouts import InputLayout
from .ranges import range_ape
from .spec import Case, OutputBufferSpec
from .values import exact_logit_tensors, row_requests

SIZE_CONFIGS = {"small": SMALL, "glm5.3-flash": GLM53_FLASH}
"""The two sizes of :data:`cases.scenarios.SIZES` (this module cannot import that one: it imports this)."""

FLT_MAX = torch.finfo(torch.float32).max
EXACT_POOL_VALUES = {
    3: [1.0, 2.0, -1.0, -2.0, 0.5, -0.5, 4.0, 1.0],     # FLT_MAX and +inf (-> FLT_MAX) in one row
    4: [-1.0, -2.0, -0.5, -4.0, -1.0, -3.0],            # every score far below -1e30
    5: [1.0, 0.5, -1.0, 2.0, -0.5, 0.25],               # subnormal scores, -0.0 (relu of the others)
    6: [2.0, 1.0, 1.0078125, 0.99609375, 1.0],          # bf16 neighbours: a near tie at K_pool = 2
}
"""Pool key values (bf16-exact) of the exact-logit requests of ``value-range``."""
EXACT_WEIGHTS = {3: (FLT_MAX, 0.0), 4: (0.0, -2.0 ** 110), 5: (2.0 ** -140, -2.0 ** -140), 6: (1.0, 0.0)}
"""Head weights ``(w_0, w_1)`` per exact-logit request: head 0 scores ``w_0 relu(v)``, head 1
(query ``-e0``) ``w_1 relu(-v)``: ``FLT_MAX * v`` (``FLT_MAX`` or ``+inf``), ``-2^110 |v|``, or
subnormal scores of both signs. At most one nonzero term per score, or two whose sum is exact
(subnormals), so every score is exact in either score mode and any order: no overflow that depends
on the summation order (the merged mode's ``qbar = sum_h w_h q_h`` first would otherwise add
``FLT_MAX`` and ``2^110``)."""


def exact_range_inputs(case, step, metadata) -> dict:
    """``Step.inputs`` of the exact-logit requests (:data:`EXACT_POOL_VALUES`): pooled keys
    ``v * e0``, head 0 query ``e0`` and head 1 query ``-e0`` with the weights of
    :data:`EXACT_WEIGHTS`; every score is one product, exact in any order.

    Returns:
        ``dict(k, gate, q, weights)`` as :func:`cases.values.exact_logit_tensors`.
    """
    out = exact_logit_tensors(case.config, metadata, step.request_ids, EXACT_POOL_VALUES)
    req = row_requests(metadata)
    for t in range(metadata.num_live_tokens):
        w0, w1 = EXACT_WEIGHTS[step.request_ids[int(req[t])]]
        out["weights"][t, 0], out["weights"][t, 1] = w0, w1
        out["q"][t, 1, 0] = -1.0
    return out


def _sim(config: KPoolConfig, requests: int, longest: int) -> EngineSim:
    """An engine over ``requests`` requests of at most ``longest`` tokens, B = 4, tables from
    the middle of the free lists (not the identity), ring blocks at or above ``requests`` (never
    a request id or a batch index, as the other seed scenarios)."""
    max_pages = max(1, -(-longest // (config.index_kpool * 4)))
    sim = EngineSim(config, page_size=4, num_pages=requests * max_pages + 3, num_ring_blocks=2 * requests + 1,
                    max_pages=max_pages, pick=lambda n: n // 2)
    sim.free_ring = [b for b in sim.free_ring if b >= requests]
    for _ in range(requests):
        sim.admit()
    return sim


def value_range(size: str) -> Case:
    """``value-range`` (module docstring). Random data with range classes, certificates on."""
    cfg = SIZE_CONFIGS[size]
    P = cfg.index_kpool
    A, B = (40 * P + 1, 9 * P + 2) if size != "small" else (6 * P + 1, 3 * P + 2)
    n = {rid: len(v) * P for rid, v in EXACT_POOL_VALUES.items()}
    sim = _sim(cfg, 7, max(A + 2 * P + 8, *n.values()))
    seed = 1919

    def step(cls, name, actions):
        i = len(sim.steps)
        sim.step([Action(r, q) for r, q in actions], name=name, seed=i + 1,
                 inputs=exact_range_inputs if cls is None else ValueSpec(seed=seed * 100 + i, pool_seed=seed,
                                                                         range_class=cls))
    step("gate-spread", "prefill:gate-spread", [(0, A), (1, B)])
    step("far-below", "decode:far-below", [(1, 1), (0, 1)])
    step("neg-zero", "chunk:neg-zero", [(0, P + 1), (1, 2)])
    step("subnormal", "decode:subnormal", [(0, 1), (1, 1)])
    step("fp16-underflow", "decode:fp16-underflow", [(1, 1), (0, 1)])
    step("fp16-overflow", "chunk:fp16-overflow", [(0, 3), (1, P)])
    step("range-ends", "prefill:range-ends", [(2, 3 * P + 1)])
    step("range-ends", "decode:range-ends", [(2, 1)])
    step(None, "prefill:exact-extremes", [(rid, n[rid] - 1) for rid in sorted(n)])
    step(None, "decode:exact-extremes", [(rid, 1) for rid in (5, 3, 6, 4)])
    return sim.build("value-range", size=size, seed=seed, values="random",
                     ape=range_ape(P, cfg.index_head_dim, seed), page_padding=8, ring_block_padding=8,
                     description="whole finite range: gate logits hundreds apart, scores far below -1e30, FLT_MAX "
                                 "and +inf in one row, values beyond and below fp16's range, subnormals, -0.0",
                     tags=("suite:seed", "family-switch:values"))


STRIDED_STEPS = (
    InputLayout(weights="transposed", q_row_pad=3, k_transposed=True, metadata_step=2),
    InputLayout(weights="transposed-padded", weights_pad=3, q_head_pad=5, gate_row_pad=1, ape_transposed=True),
    InputLayout(weights="padded", weights_pad=1, q_dim_stride=2, k_row_pad=7, metadata_step=3),
    InputLayout(weights="transposed", q_head_pad=8, q_row_pad=8, k_row_pad=1, gate_row_pad=2),
    InputLayout(weights="transposed-padded", weights_pad=2, q_row_pad=1, k_transposed=True, metadata_step=2,
                ape_transposed=True),
)
"""The layouts of ``strided-layouts``' steps, in order."""


def strided_layouts(size: str) -> Case:
    """``strided-layouts`` (module docstring). Random data, MTP-1 ring, padded pages and ring blocks."""
    cfg = SIZE_CONFIGS[size].with_(num_speculative_tokens=1)
    P = cfg.index_kpool
    A, B = (40 * P + 2, 7 * P + 1) if size != "small" else (9 * P + 2, 4 * P + 1)
    sim = _sim(cfg, 2, A + 2 * P + 8)
    width = cfg.output_width + 5
    sim.step([Action(0, A), Action(1, B)], name="prefill", seed=1)
    sim.step([Action(1, P + 2), Action(0, 3)], name="chunk", seed=2)
    sim.step([Action(0, 1), Action(1, 1)], name="decode", seed=3)
    sim.step([Action(1, 2, accepted=1), Action(0, 2, accepted=1)], name="verify", seed=4)
    sim.step([Action(0, 1), Action(1, 1)], name="full-replay", seed=5, full=FullMode(2, 1, True),
             output_buffer=OutputBufferSpec(capacity=6, width=width, row_step=2))
    case = sim.build("strided-layouts", size=size, seed=2020, values="random", page_padding=16,
                     ring_block_padding=24,
                     description="every strided input view the forward accepts: weights [H,T] viewed [T,H] and "
                                 "column-padded, padded q head/row strides, strided k/gate rows, APE and metadata",
                     tags=("suite:seed", "family-switch:layouts"))
    steps = [dataclasses.replace(s, layout=layout) for s, layout in zip(case.steps, STRIDED_STEPS)]
    geo = case.geometry
    geometry = dataclasses.replace(geo, row_padding=3, guard=geo.guard + 2 * cfg.ring_capacity * 3)
    return dataclasses.replace(case, steps=steps, geometry=geometry)


def value_range_coverage_cases() -> list:
    """``[value-range at size small]`` renamed ``coverage-value-range`` (a guaranteed-coverage
    case of the generated engine runs, :mod:`cases.coverage_cases`): every range class and the
    exact FLT_MAX / +inf / below -1e30 scores in every profile's coverage; ``[]`` when the
    ``values`` family is switched off."""
    from .families import enabled
    if not enabled("values"):
        return []
    case = value_range("small")
    return [dataclasses.replace(case, name="coverage-value-range", size="generated",
                                tags=tuple(t for t in case.tags if t != "suite:seed") + ("coverage:value-range",))]


FAMILY_SCENARIOS = {"value-range": value_range, "strided-layouts": strided_layouts}
"""Scenario name -> ``fn(size) -> Case`` (added to :data:`cases.scenarios.SCENARIOS`)."""
