"""C15: ragged MTP decode lengths: every row's tail is its own request's.

Ragged MTP decode lengths ``[1, 2, 3]`` (request 0 at 20; request 1 at 9, 10; request 2 at
30..32 with tokens 28, 29 in its ring beforehand), tail blocks ``[0, 1, 2]``; flat and as a
padded grid (FULL mode, 3 x 3). Each row's tail columns and request 2's pool 7 (the reference's
compression) are checked in :mod:`parity.running.public.reference_checks`.
"""
from __future__ import annotations

from typing import List

from ..bits import same_bits
from ..spec import Case
from .common import TokenInputs, config, geometry, make_case, make_step, rows, sides
from .model import Check, PublicCase

WANT_TAILS = ((20, [20]), (9, [8, 9]), (10, [8, 9, 10]), (30, [28, 29, 30]), (31, []), (32, [32]))
"""``(position, tail tokens)`` of the six live rows."""


def build() -> List[Case]:
    """The ragged step flat, and the same step padded to 9 rows."""
    cfg = config(index_topk=8, num_speculative_tokens=2)          # C = 6
    inputs = TokenInputs(cfg, seed=1515)
    tables = {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}
    context = make_step("context", [(0, 20, tables[0], 0), (0, 9, tables[1], 1), (0, 30, tables[2], 2)], [0, 1, 2],
                        inputs=inputs, compute_topk=False)
    ragged = [(20, 1, tables[0], 0), (9, 2, tables[1], 1), (30, 3, tables[2], 2)]
    geo = geometry(num_pages=10, page_size=4, blocks=3)
    flat = make_case("ragged-flat", cfg, geo, [context, make_step("decode-1-2-3", ragged, [0, 1, 2], inputs=inputs)])
    padded = make_case("ragged-padded-grid", cfg, geo, [context, make_step(
        "decode-1-2-3-padded", ragged, [0, 1, 2], inputs=inputs, num_tokens=9, full_mode=True,
        block_table_width=3)])
    return [flat, padded]


def expect(runs) -> List[Check]:
    """One row writes request 2's pool 7; the padded grid equals the flat run."""
    flat, padded = runs["ragged-flat"], runs["ragged-padded-grid"]
    out = []
    for side, call in sides(flat, 1):
        slots = call.meta["slot_mapping"].tolist()
        out.append(Check(f"{side}: pool 7 of req2 written by exactly one row", sum(1 for s in slots[3:6] if s >= 0) == 1))
    for side, call in sides(padded, 1):
        r = rows(call)
        flat_rows = rows(flat.call(1, side))
        out.append(Check(f"{side}: padded grid live rows = flat rows", r[:6] == flat_rows, verdict="wrong-index"))
        out.append(Check(f"{side}: padded-grid rows 6..8 all -1", all(v == -1 for row in r[6:] for v in row),
                         verdict="padding-leak"))
        out.append(Check(f"{side}: padded grid leaves the same caches as flat",
                         same_bits(call.compressed, flat.call(1, side).compressed)
                         and same_bits(call.tail, flat.call(1, side).tail), verdict="cache-mismatch"))
    return out


CASE = PublicCase("C15", "ragged MTP decode lengths: every row's tail is its own request's", build, expect)
