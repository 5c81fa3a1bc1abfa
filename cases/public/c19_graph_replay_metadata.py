"""C19: graph replay sees each step's new metadata (in place).

A batch-2 decode FULL graph: captured with tail blocks ``[0, 1]``, tables ``[[2], [3]]``,
positions ``[5, 9]``; replay 1 swaps blocks and tables (positions 6, 10); replay 2 completes both
pools (positions 7, 11) with tables ``[[1], [0]]``. The replays re-point requests at other
physical blocks on purpose, so the physical state is no function of per-request history and the
case runs without the oracle. The in-place replay against an eager run (metadata refreshed with
``KPoolMetadata.copy_`` before each ``validate=False`` launch) is in
:mod:`parity.running.public.kernel_checks`.
"""
from __future__ import annotations

from typing import List

from ..spec import Case, Step
from .common import TokenInputs, config, geometry, make_case, make_step
from .model import Check, PublicCase

REPLAYS = (
    dict(name="capture", tails=(0, 1), tables=((2,), (3,)), positions=(5, 9)),
    dict(name="replay-1", tails=(1, 0), tables=((3,), (2,)), positions=(6, 10)),
    dict(name="replay-2", tails=(1, 0), tables=((1,), (0,)), positions=(7, 11)),
)
"""The captured step and its two replays."""


def _step(spec, inputs) -> Step:
    reqs = [(p, 1, list(t), ring) for p, t, ring in zip(spec["positions"], spec["tables"], spec["tails"])]
    return make_step(spec["name"], reqs, [0, 1], inputs=inputs, num_tokens=2, full_mode=True, block_table_width=1)


def build() -> List[Case]:
    """The three steps of :data:`REPLAYS`."""
    cfg = config(index_topk=8)
    inputs = TokenInputs(cfg, seed=1919)
    return [make_case("graph-replay-metadata", cfg, geometry(num_pages=4, page_size=4, blocks=2),
                      [_step(s, inputs) for s in REPLAYS])]


def expect(runs) -> List[Check]:
    """Ring slots and pool slots follow each replay's metadata."""
    run = runs["graph-replay-metadata"]
    out = []
    for i, spec in enumerate(REPLAYS[1:], start=1):
        call = run.call(i)
        slots = call.meta["tail_slot_mapping"].tolist()
        want = [b * 4 + p % 4 for b, p in zip(spec["tails"], spec["positions"])]
        out.append(Check(f"{spec['name']}: ring slots follow the replay's tail blocks", slots == want, f"{slots} vs {want}"))
    call = run.call(2)
    slots = call.meta["slot_mapping"].tolist()
    want = [t[0] * 4 + p // 4 for t, p in zip(REPLAYS[2]["tables"], REPLAYS[2]["positions"])]
    out.append(Check("replay-2: pools written to the replay's pages [[1], [0]]", slots == want, f"{slots} vs {want}"))
    return out


CASE = PublicCase("C19", "graph replay sees each step's new metadata (in place)", build, expect, check_oracle=False)
