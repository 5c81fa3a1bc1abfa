"""C03: a padded-stride tail ring is addressed by its strides.

Ring block 3 of a ring whose blocks are padded by :data:`PADDING` elements: the prefill's last
three tokens land in block 3's slots 0..2. That the ring handed to the kernel really is a
non-contiguous view, that the dense-stride addresses of block 3 still hold the sentinel, and
that pool 2 is the canonical compression are checked in :mod:`parity.running.public.reference_checks`.
"""
from __future__ import annotations

from typing import List

from ..bits import same_bits
from ..spec import Case
from .common import TokenInputs, config, geometry, make_case, make_step, ring_row, sides
from .model import Check, PublicCase

PADDING = 256
"""Padding elements after every ring block."""


def build() -> List[Case]:
    """A prefill to position 10 and a decode at 11 into ring block 3 of a padded-stride ring."""
    cfg = config(index_topk=8)
    inputs = TokenInputs(cfg, seed=303)
    geo = geometry(num_pages=4, page_size=4, blocks=6, ring_block_padding=PADDING)
    steps = [make_step("prefill-to-10", [(0, 11, [2], 3)], [0], inputs=inputs),
             make_step("decode-11", [(11, 1, [2], 3)], [0], inputs=inputs)]
    return [make_case("padded-stride-ring", cfg, geo, steps, description="C03: ring block 3 of a padded-stride view")]


def expect(runs) -> List[Check]:
    """After the prefill, block 3's slots 0..2 hold tokens 8, 9, 10."""
    run = runs["padded-stride-ring"]
    inputs = run.case.steps[0].inputs
    out = []
    for side, call in sides(run, 0):
        ok = all(same_bits(ring_row(call, 3, s)[0], inputs.token(0, 8 + s)["k"])
                 and same_bits(ring_row(call, 3, s)[1], inputs.token(0, 8 + s)["gate"]) for s in range(3))
        out.append(Check(f"{side}: tail[3, :, 0..2] = K, gate of tokens 8, 9, 10", ok, verdict="ring-mismatch"))
    return out


CASE = PublicCase("C03", "a padded-stride tail ring is addressed by its strides", build, expect)
