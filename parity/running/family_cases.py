"""The fixed cases issue 19's families 3-6 add to every generated run (explicit examples before
the budget, like :mod:`cases.coverage_cases`), and the values that make a claimed-bitwise
compressed cache testable (family 5).

Why family 5 needs its own values: a compressed element is the bf16 rounding of an fp32 pooled
value, so a kernel change that moves that fp32 value by an ulp (an approximate or reciprocal
division, a product taken before the division, an FMA) changes the stored bf16 only when the
fp32 value lies within an ulp of a bf16 rounding midpoint: about 2^-16 of random elements. The
seed cases hold a few thousand elements; such a change passes them. :func:`boundary_values_case`
draws every pooled element *on* a midpoint (the reference's own fp32 arithmetic,
:func:`reference.numerics.pooled_fp32`, solving for the last window key), so each 1-ulp move
flips about half of them: with the cache claimed bitwise that is a ``cache-mismatch``; without the
claim the rounding-boundary certificate accepts every one (issue 19: "only ab would see it").

:func:`family_cases` is what :func:`parity.running.generated.run_generated` adds: the structure cases
(:mod:`cases.structure`), the unvalidated stale-metadata case and the boundary-values case, each
family unless switched off (:mod:`cases.families`); the size family runs outside the generated
suite, on devices only (:mod:`parity.running.size_cases`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import List

import torch

from cases.bits import same_bits
from cases.engine import Action, EngineSim
from cases.families import enabled
from cases.genvalues import random_ape
from cases.spec import Case
from cases.structure import small_config, structure_cases, unvalidated_case
from kpool.config import KPoolConfig

BOUNDARY_TOKENS = (10, 14)
"""Rows of the boundary-values case's two steps: pools 0-1, then pools 2-5 (pool 2 straddles:
rows 8, 9 come from the ring)."""


def _midpoints(x: torch.Tensor) -> torch.Tensor:
    """fp32 bf16 rounding midpoints next to ``x`` (fp32): the upper 16 bits of ``x`` with
    ``0x8000`` below them (exactly between two adjacent bf16 values)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits & -65536) | 0x8000).view(torch.float32)


def boundary_windows(ape: torch.Tensor, pools: int, g: torch.Generator, jitter: int = 24):
    """Raw key and gate windows whose pooled fp32 values lie on (or an ulp from) bf16 midpoints.

    Args:
        ape: fp32 ``[P, D]``. pools: windows to draw. g: generator.
        jitter: last-key candidates each side of the solved value (fp32 ulps).
    Returns:
        ``(k [pools, P, D], gate [pools, P, D])`` fp32.
    """
    from reference.numerics import pooled_fp32
    P, D = ape.shape
    gate = torch.randn(pools, P, D, generator=g) * 0.5
    k = torch.randn(pools, P, D, generator=g)
    k[:, P - 1] = 0
    acc = pooled_fp32(k, gate, ape)                                    # the sum without the last key
    e = torch.exp(gate + ape - (gate + ape).max(dim=1, keepdim=True).values)
    a_last = (e[:, P - 1] / e.sum(dim=1)).double()                      # ~ e_{P-1} / Z (only a guess)
    target = _midpoints((acc.double() + a_last * torch.randn(pools, D, generator=g).double()).float())
    solved = ((target.double() - acc.double()) / a_last).float()
    steps = torch.arange(-jitter, jitter + 1, dtype=torch.int32)
    cand = (solved.contiguous().view(torch.int32)[None] + steps[:, None, None]).view(torch.float32)   # [J, pools, D]
    kc = k[None].repeat(len(steps), 1, 1, 1)
    kc[:, :, P - 1] = cand
    out = pooled_fp32(kc.reshape(-1, P, D), gate.repeat(len(steps), 1, 1), ape).reshape(len(steps), pools, D)
    dist = (out.view(torch.int32).long() - target.view(torch.int32).long()[None]).abs()
    dist[~torch.isfinite(out)] = 2 ** 40
    best = dist.argmin(dim=0)                                           # [pools, D]
    k[:, P - 1] = cand.gather(0, best[None]).squeeze(0)
    return k, gate


class _SameBits:
    """Equality of a table-input dataclass by its fields' bits (tensors bitwise, the rest by
    ``==``), so two draws of one fixed selection compare equal (``ab``, goldens)."""

    def __eq__(self, other) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(same_bits(a, b) if isinstance(a, torch.Tensor) else a == b
                   for a, b in ((getattr(self, f.name), getattr(other, f.name)) for f in fields(self)))

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False)
class BoundaryInputs(_SameBits):
    """``Step.inputs``: ``k``/``gate`` of a live row from the tables at its position, q and
    weights random (seeded), padding rows zero.

    Attributes:
        k / gate: fp32 ``[L, D]`` per absolute position. heads: ``H``. seed: q / weights stream.
    """

    k: torch.Tensor = field(repr=False)
    gate: torch.Tensor = field(repr=False)
    heads: int = 2
    seed: int = 0

    def __call__(self, case, step, metadata) -> dict:
        T, T_live = metadata.num_tokens, metadata.num_live_tokens
        D = self.k.shape[1]
        pos = metadata.positions[:T_live].to(torch.int64)
        k, gate = torch.zeros(T, D), torch.zeros(T, D)
        k[:T_live], gate[:T_live] = self.k[pos], self.gate[pos]
        g = torch.Generator().manual_seed(self.seed * 7919 + step.seed)
        return dict(k=k, gate=gate, q=torch.randn(T, self.heads, D, generator=g).to(torch.bfloat16),
                    weights=torch.randn(T, self.heads, generator=g) / 8)


def boundary_values_case(head_dim: int = 16, seed: int = 19) -> Case:
    """One request, a 10-row prefill then a 14-row chunk (pool 2 read partly from the ring),
    every pooled element on a bf16 rounding midpoint (module docstring). Random values otherwise."""
    cfg = small_config(index_head_dim=head_dim)
    P, D = cfg.index_kpool, head_dim
    L = sum(BOUNDARY_TOKENS)
    ape = random_ape(P, D, seed)
    g = torch.Generator().manual_seed(seed)
    k, gate = boundary_windows(ape, L // P, g)
    table_k, table_gate = k.reshape(L, D), gate.reshape(L, D)          # pool i = positions iP..iP+P-1
    sim = EngineSim(cfg, page_size=2, num_pages=6, num_ring_blocks=2, max_pages=4, pick=lambda n: n // 2)
    a = sim.admit()
    for i, rows in enumerate(BOUNDARY_TOKENS):
        sim.step([Action(a, rows)], name=f"chunk-{i}", seed=i + 1,
                 inputs=BoundaryInputs(table_k, table_gate, cfg.index_n_heads, seed))
    return sim.build("exactness-rounding-midpoints", ape=ape, seed=seed,
                     description="every pooled element on a bf16 rounding midpoint (claimed-bitwise cache)",
                     tags=("family:exactness", "exactness:midpoints"))


@dataclass(frozen=True, eq=False)
class TableInputs(_SameBits):
    """``Step.inputs``: every live row's ``k`` from ``k[request id, position]``, its ``q`` and
    ``weights`` from its request's ``q[request id]``, ``weights[request id]``; gate zero, padding
    rows zero."""

    k: torch.Tensor = field(repr=False)
    q: torch.Tensor = field(repr=False)
    weights: torch.Tensor = field(repr=False)

    def __call__(self, case, step, metadata) -> dict:
        from cases.values import row_requests
        T, T_live = metadata.num_tokens, metadata.num_live_tokens
        H, D = self.q.shape[1:]
        rid = torch.tensor([step.request_ids[int(r)] for r in row_requests(metadata)[:T_live]], dtype=torch.int64)
        pos = metadata.positions[:T_live].to(torch.int64)
        out = dict(k=torch.zeros(T, D), gate=torch.zeros(T, D), q=torch.zeros(T, H, D, dtype=torch.bfloat16),
                   weights=torch.zeros(T, H))
        out["k"][:T_live] = self.k[rid, pos]
        out["q"][:T_live], out["weights"][:T_live] = self.q[rid], self.weights[rid]
        return out


def iso_score_case(requests: int = 8, pools: int = 64, seed: int = 23) -> Case:
    """Score mode (M), P = 1, K_pool = ``pools / 2``: each request's pools ``(a_j, b_j, 0, 0)``
    lie on its decode row's iso-score line ``qbar_0 a + qbar_1 b = 1`` up to the bf16 rounding
    of ``b_j`` (relative gaps near 2^-15, far above the tie certificate's bound, near 1e-6 at
    D = 4), with ``a_j`` spread so that the two channels' shares of the score vary from pool to
    pool. A score path that rounds ``qbar`` per channel (a TF32 dot of the fp32 ``qbar``: relative
    errors up to 2^-10 that differ between channels) reorders pools across the top-k boundary;
    the exact three-part split does not. Then a decode scores every request."""
    H, D = 2, 4
    cfg = KPoolConfig(index_n_heads=H, index_head_dim=D, index_kpool=1, index_topk=pools // 2, score_mode="merged")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(requests, H, D, generator=g).to(torch.bfloat16)
    w = torch.randn(requests, H, generator=g) / 8 + torch.tensor([0.25, -0.25])
    qbar = (w.double()[:, :, None] * q.double()).sum(dim=1)                       # [R, D] (design only)
    t = torch.rand(requests, pools, generator=g).double() * 0.6 + 0.2
    a = (t / qbar[:, :1]).to(torch.bfloat16).double()
    b = ((1.0 - qbar[:, :1] * a) / qbar[:, 1:2]).to(torch.bfloat16).double()
    k = torch.zeros(requests, pools + 1, D)
    k[:, :pools, 0], k[:, :pools, 1] = a.float(), b.float()                  # the decode row's own pool: 0
    sim = EngineSim(cfg, page_size=16, num_pages=requests * -(-(pools + 1) // 16) + 2, num_ring_blocks=requests + 1,
                    max_pages=-(-(pools + 1) // 16), pick=lambda n: n // 2)
    rids = [sim.admit() for _ in range(requests)]
    inputs = TableInputs(k, q, w)
    sim.step([Action(r, pools) for r in rids], name="pools", compute_topk=False, inputs=inputs, seed=1)
    sim.step([Action(r, 1) for r in reversed(rids)], name="decode-iso-scores", inputs=inputs, seed=2)
    return sim.build("exactness-merged-iso-scores", ape=torch.zeros(1, D), seed=seed,
                     description="merged-mode pools on iso-score lines: qbar precision decides the top-k",
                     tags=("family:exactness", "exactness:iso-scores"))


def family_cases(kind: str) -> List[Case]:
    """The fixed cases of families 3-5 for a generated run of ``kind`` (``batch`` / ``engine``),
    without the families switched off (:func:`cases.families.enabled`)."""
    out: List[Case] = []
    if enabled("structure"):
        out += structure_cases(kind)
    if kind == "engine" and enabled("unvalidated"):
        out.append(unvalidated_case())
    if kind == "batch" and enabled("exactness"):
        out += [boundary_values_case(), iso_score_case()]
    return out
