"""C13: never select a partial pool (ties).

Pool logits ``[3, 2, 2]`` after a 12-token context, a decode at position 12 with K = 2: pool 0
and the lower of the tied pools 1, 2, then the tail. The universal causal-row checks are in
:mod:`parity.running.public.reference_checks`.
"""
from __future__ import annotations

from typing import List

from ..spec import Case
from ..values import exact_logit_inputs
from .common import config, geometry, make_case, make_step, row_check, rows, sides
from .model import Check, PublicCase


def build() -> List[Case]:
    """A cache-only context, then one scored decode."""
    cfg = config(index_topk=8)                       # K = 2
    inputs = exact_logit_inputs([3.0, 2.0, 2.0])
    steps = [make_step("context", [(0, 12, [0, 1], 1)], [0], inputs=inputs, compute_topk=False),
             make_step("decode-12", [(12, 1, [0, 1], 1)], [0], inputs=inputs)]
    return [make_case("partial-pool-tie", cfg, geometry(num_pages=3, page_size=2, blocks=2), steps, values="exact")]


def expect(runs) -> List[Check]:
    """The decode row, entry for entry."""
    run = runs["partial-pool-tie"]
    out = []
    for side, call in sides(run, 1):
        out.append(row_check(f"{side}: pool 0 + the lower tied pool 1 + tail 12", rows(call)[0],
                             [0, 1, 2, 3, 4, 5, 6, 7, 12, -1, -1]))
    return out


CASE = PublicCase("C13", "never select a partial pool (ties)", build, expect)
