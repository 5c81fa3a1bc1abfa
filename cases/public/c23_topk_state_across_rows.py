"""C23: top-k independent of earlier launches and row order; coarse-bin ties.

P = 1 (a pool is a token), K = 64: a decode batch of four requests with 1500, 3, 1500 and 1500
visible pools launched three times, then with the requests permuted. Row 3's logits sit in one
coarse bin (exactly 1.0 plus 64 bumped pools ``1 + i * 2^-20``), so a radix or bucketed top-k
that keeps state across rows or launches would show. The rows of the random requests 0 and 2 (the
``torch.topk`` set of the reference's logits) are checked in :mod:`parity.running.public.reference_checks`.
"""
from __future__ import annotations

from typing import List

import torch

from kpool.config import KPoolConfig

from ..genvalues import random_bf16
from ..spec import Case
from ..values import _fill_padding, _generator, row_requests
from .common import geometry, make_case, make_step, rows, set_check
from .model import Check, PublicCase

COUNTS = (1500, 3, 1500, 1500)
"""Visible pools of the four requests."""
BUMPED = 64
"""Pools of request 3 whose logit is raised by ``i * 2^-20`` (= K)."""


def bumped_pools() -> List[int]:
    """The positions (pool ids) of request 3's bumped pools, in bump order ``i = 1..64``."""
    return [int(j) for j in torch.randperm(COUNTS[3], generator=_generator(23, 3))[:BUMPED]]


def _inputs(case, step, metadata):
    """Keys: requests 0 and 2 random bf16 (random fp32 logits); request 3's pools ``[1, 0]``
    except the 64 bumped pools ``[1, i * 2^-8]`` (i = 1..64), so with ``q = [1, 2^-12]`` the
    logits are exactly 1.0 and ``1 + i * 2^-20`` (one exponent, one coarse bin); request 1 random."""
    cfg = case.config
    T, T_live, D, H = metadata.num_tokens, metadata.num_live_tokens, cfg.index_head_dim, cfg.index_n_heads
    req = row_requests(metadata)
    k = torch.zeros(T, D)
    q = torch.zeros(T, H, D, dtype=torch.bfloat16)
    spread = {j: i + 1 for i, j in enumerate(bumped_pools())}
    for t in range(T_live):
        rid, p = step.request_ids[int(req[t])], int(metadata.positions[t])
        if rid == 3:
            k[t, 0] = 1.0
            k[t, 1] = spread.get(p, 0) * 2.0 ** -8
            q[t, 0, 0], q[t, 0, 1] = 1.0, 2.0 ** -12
        else:
            k[t] = random_bf16((D,), _generator(23, rid, p)).to(torch.float32)
            q[t, 0] = random_bf16((D,), _generator(230, rid, p))
    w = torch.ones(T, H)
    _fill_padding(T_live, k, torch.zeros(T, D), q, w, _generator(23))
    return dict(k=k, gate=torch.zeros(T, D), q=q, weights=w)


def build() -> List[Case]:
    """A cache-only context, three identical launches, a permuted launch."""
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=1, index_topk=BUMPED)
    B = 128
    tables = {r: list(range(r * 12, r * 12 + 12)) for r in range(4)}
    ring = {r: r for r in range(4)}
    ctx = [(0, n - 1, tables[r], ring[r]) for r, n in enumerate(COUNTS)]
    launch = [(n - 1, 1, tables[r], ring[r]) for r, n in enumerate(COUNTS)]
    steps = [make_step("context", ctx, [0, 1, 2, 3], inputs=_inputs, compute_topk=False)]
    steps += [make_step(f"launch-{i}", launch, [0, 1, 2, 3], inputs=_inputs) for i in range(3)]
    perm = [2, 0, 3, 1]
    steps.append(make_step("launch-permuted", [launch[r] for r in perm], perm, inputs=_inputs))
    return [make_case("topk-state-across-rows", cfg, geometry(num_pages=48, page_size=B, blocks=4), steps)]


def expect(runs) -> List[Check]:
    """Rows 1 and 3 as stated; later and permuted launches repeat launch 1."""
    run = runs["topk-state-across-rows"]
    out = []
    for side in ("kernel", "reference"):
        r = rows(run.call(1, side))
        out.append(set_check(f"{side}: row 1 = {{0, 1, 2}} + -1", r[1], [0, 1, 2]))
        out.append(set_check(f"{side}: row 3 = exactly the 64 bumped pools", r[3], bumped_pools()))
        for i in (2, 3):
            out.append(Check(f"{side}: launch {i} rows = launch 1 rows (no state from earlier launches)",
                             rows(run.call(i, side)) == r))
        perm = run.case.steps[4].request_ids
        permuted = rows(run.call(4, side))
        out.append(Check(f"{side}: permuted batch: every request's row unchanged",
                         all(permuted[i] == r[rid] for i, rid in enumerate(perm))))
    return out


CASE = PublicCase("C23", "top-k independent of earlier launches and row order; coarse-bin ties", build, expect)
