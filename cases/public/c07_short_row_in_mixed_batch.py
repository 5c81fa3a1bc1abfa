"""C07: rows with fewer visible pools than K never expand uninitialised pool ids.

A packed prefill of request 0 (3 tokens, no complete pool) next to request 1 (13 tokens, pool
logits ``v = [1, 3, 2]``), K = 2 pools, written into a caller buffer of 20 rows. The universal
causal-row checks are in :mod:`parity.running.public.reference_checks`.
"""
from __future__ import annotations

from typing import List

from ..spec import Case, OutputBufferSpec
from ..values import exact_logit_inputs
from .common import config, geometry, make_case, make_step, row_check, rows, set_check, sides
from .model import Check, PublicCase


def build() -> List[Case]:
    """One exact-logit step of two requests."""
    cfg = config(index_topk=8)                       # K = 2 pools, W = 11
    steps = [make_step("packed-prefill", [(0, 3, [0], 1), (0, 13, [2, 3], 2)], [0, 1],
                       inputs=exact_logit_inputs({1: [1.0, 3.0, 2.0]}),
                       output_buffer=OutputBufferSpec(capacity=20, width=11))]
    return [make_case("short-row-in-mixed-batch", cfg, geometry(num_pages=4, page_size=2, blocks=3), steps,
                      values="exact")]


def expect(runs) -> List[Check]:
    """Request 0's rows are its own tokens; request 1's rows select by score; no garbage."""
    run = runs["short-row-in-mixed-batch"]
    out = []
    for side, call in sides(run, 0):
        r = rows(call)
        for t in range(3):
            out.append(set_check(f"{side}: req0 pos {t} = {{0..{t}}}", r[t], range(t + 1)))
        want = {5: [0, 1, 2, 3, 4, 5], 7: list(range(8)), 11: list(range(4, 12)), 12: list(range(4, 13))}
        for p, w in want.items():
            out.append(set_check(f"{side}: req1 pos {p}", r[3 + p], w))
        out.append(row_check(f"{side}: req1 pos 11 row (pools 1, 2 by score)", r[3 + 11],
                             [4, 5, 6, 7, 8, 9, 10, 11, -1, -1, -1]))
        garbage = [v for row in r for v in row if v < -1 or v >= 13]
        out.append(Check(f"{side}: no garbage value anywhere", not garbage, f"{garbage[:5]}"))
    return out


CASE = PublicCase("C07", "rows with fewer visible pools than K never expand uninitialised pool ids", build, expect)
