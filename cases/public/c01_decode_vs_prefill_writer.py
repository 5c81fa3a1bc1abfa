"""C01: the decode tail writer produces the same pools as the prefill writer.

Paths A (one 32-token prefill), B (32 decodes) and C (a 10-token prefill, then 22 decodes) of one
token stream, as requests 0, 1, 2 of one case: every pool is bitwise identical on the three
paths, and after decode step ``t`` ring slot ``t % 4`` holds token ``t``'s K and gate bits.
The canonical value of pool 7 (the reference's compression) is checked in
:mod:`parity.running.public.reference_checks`.
"""
from __future__ import annotations

from typing import List

import torch

from ..bits import same_bits
from ..spec import Case
from .common import TokenInputs, config, geometry, make_case, make_step, pool_at, ring_row, sides
from .model import Check, PublicCase

TABLES = {0: [0, 1], 1: [2, 3], 2: [4, 5]}
"""Block table of each path's request."""


def build() -> List[Case]:
    """Requests 0, 1, 2 (rings 1, 2, 3; pages 0-1, 2-3, 4-5) feed the same tokens."""
    cfg = config(index_topk=8)
    inputs = TokenInputs(cfg, seed=101, shared=True)         # one token stream, three paths
    ring = {0: 1, 1: 2, 2: 3}
    steps = []
    for t in range(32):
        reqs, rids = [(t, 1, TABLES[1], ring[1])], [1]
        if t == 0:
            reqs = [(0, 32, TABLES[0], ring[0])] + reqs + [(0, 10, TABLES[2], ring[2])]
            rids = [0, 1, 2]
        elif t >= 10:
            reqs.append((t, 1, TABLES[2], ring[2]))
            rids.append(2)
        steps.append(make_step(f"t{t}", reqs, rids, inputs=inputs))
    ape = TokenInputs(cfg, seed=102).token(0, 0)["k"].repeat(4, 1) * torch.arange(1, 5, dtype=torch.float32)[:, None]
    return [make_case("decode-vs-prefill-writer", cfg, geometry(num_pages=8, page_size=4, blocks=4), steps, ape=ape,
                      description="C01: pools 0-7 from prefill, decode-only and mixed paths")]


def expect(runs) -> List[Check]:
    """Pools identical on the three paths; path B's ring slot after every decode."""
    run = runs["decode-vs-prefill-writer"]
    inputs = run.case.steps[0].inputs
    last = len(run.case.steps) - 1
    out = []
    for side, call in sides(run, last):
        for j in range(8):
            a, b, c = (pool_at(call, TABLES[r], j) for r in range(3))
            out.append(Check(f"{side}: pool {j} identical from prefill (A), decode (B) and mixed (C)",
                             same_bits(a, b) and same_bits(a, c), f"A={a.tolist()} B={b.tolist()} C={c.tolist()}",
                             "cache-mismatch"))
    bad = []
    for t in range(32):
        call = run.call(t)
        got = ring_row(call, 2, t % 4)
        tok = inputs.token(1, t)
        if not (same_bits(got[0], tok["k"]) and same_bits(got[1], tok["gate"])):
            bad.append(t)
    out.append(Check("path B: after step t ring slot t % 4 holds token t's K and gate bits", not bad,
                     f"steps {bad}", "ring-mismatch"))
    return out


CASE = PublicCase("C01", "the decode tail writer produces the same pools as the prefill writer", build, expect)
