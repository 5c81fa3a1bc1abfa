"""C09: prefill scoring never admits the query's own incomplete pool.

One 10-token prefill, K = 1 pool, pool logits ``[1, 100]``: a row inside pool 1 must not select
pool 1 (its own, incomplete) however large its logit. The universal causal-row checks are in
:mod:`parity.running.public.reference_checks`.
"""
from __future__ import annotations

from typing import List

from ..spec import Case
from ..values import exact_logit_inputs
from .common import config, geometry, make_case, make_step, row_check, rows, sides
from .model import Check, PublicCase


def build() -> List[Case]:
    """One exact-logit prefill."""
    cfg = config(index_topk=4)                       # K = 1, W = 7
    steps = [make_step("prefill-10", [(0, 10, [0], 1)], [0], inputs=exact_logit_inputs([1.0, 100.0]))]
    return [make_case("own-incomplete-pool", cfg, geometry(num_pages=2, page_size=4, blocks=2), steps,
                      values="exact")]


def expect(runs) -> List[Check]:
    """The stated rows of positions 3, 5, 6, 7, 9."""
    run = runs["own-incomplete-pool"]
    want = {3: [0, 1, 2, 3, -1, -1, -1], 5: [0, 1, 2, 3, 4, 5, -1], 6: [0, 1, 2, 3, 4, 5, 6],
            7: [4, 5, 6, 7, -1, -1, -1], 9: [4, 5, 6, 7, 8, 9, -1]}
    out = []
    for side, call in sides(run, 0):
        r = rows(call)
        out += [row_check(f"{side}: pos {p}", r[p], w) for p, w in want.items()]
    return out


CASE = PublicCase("C09", "prefill scoring never admits the query's own incomplete pool", build, expect)
