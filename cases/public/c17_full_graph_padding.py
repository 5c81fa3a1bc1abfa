"""C17: FULL-graph padding rows: seq_len 0, -4, stale 37.

A FULL graph captured at 8 tokens (uniform decode, next_n = 2, 4 request slots) replayed with 3
real requests x 2 tokens plus 1 padded request (2 padding rows, slot -1) whose seq_len is (a) 0
(what the builder writes), (b) -4 (must be rejected by name, never crash), (c) a stale 37; and
the eager run without padding that the real rows must equal. The ``validate=False`` run of (b)
is in :mod:`parity.running.public.kernel_checks`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from kpool.errors import KPoolMetadataError

from ..bits import same_bits
from ..patches import MetadataPatch
from ..spec import Case
from .common import TokenInputs, config, geometry, make_case, make_step, rows, sides
from .model import Check, PublicCase


@dataclass(frozen=True)
class NegativePaddedLength:
    """(b): padded requests ``>= first`` get ``raw_seq_lens = value`` (``seq_lens = value // P``),
    e.g. -4 from MTP draft-extend metadata: invalid, rejected before launch."""

    first: int
    value: int
    P: int

    def __call__(self, meta):
        meta = meta.clone()
        meta.raw_seq_lens[self.first:] = self.value
        meta.seq_lens[self.first:] = self.value // self.P
        return meta


def build() -> List[Case]:
    """(a), (b), (c) and the eager run, each after the same cache-only context."""
    cfg = config(index_topk=8, num_speculative_tokens=1)          # C = 5
    inputs = TokenInputs(cfg, seed=1717)
    tables = {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}
    ring = {0: 1, 1: 2, 2: 3}
    lens = {0: 9, 1: 14, 2: 21}
    context = make_step("context", [(0, lens[r], tables[r], ring[r]) for r in range(3)], [0, 1, 2], inputs=inputs,
                        compute_topk=False)
    real = [(lens[r], 2, tables[r], ring[r]) for r in range(3)]
    full = dict(num_tokens=8, full_mode=True, num_padded_requests=1, block_table_width=3)
    geo = geometry(num_pages=10, page_size=4, blocks=4)
    a = make_case("full-pad-seq0", cfg, geo, [context, make_step("replay-a", real, [0, 1, 2], inputs=inputs, **full)])
    b = make_case("full-pad-seq-minus4", cfg, geo, [context, make_step(
        "replay-b", real, [0, 1, 2], inputs=inputs, patch_metadata=NegativePaddedLength(3, -4, 4),
        expect_error=KPoolMetadataError, **full)])
    c = make_case("full-pad-seq37", cfg, geo, [context, make_step(
        "replay-c", real, [0, 1, 2], inputs=inputs,
        patch_metadata=MetadataPatch("stale-padded-lengths", (3, 37, 4)), **full)])
    eager = make_case("eager-no-padding", cfg, geo, [context, make_step("eager", real, [0, 1, 2], inputs=inputs)])
    return [a, b, c, eager]


def expect(runs) -> List[Check]:
    """(a) and (c) equal the eager run with padding rows -1; (b) is rejected by name."""
    out = []
    eager = runs["eager-no-padding"]
    for name in ("full-pad-seq0", "full-pad-seq37"):
        run = runs[name]
        for side, call in sides(run, 1):
            r, e = rows(call), rows(eager.call(1, side))
            out.append(Check(f"{name} {side}: padding rows 6, 7 all -1", all(v == -1 for row in r[6:] for v in row),
                             verdict="padding-leak"))
            out.append(Check(f"{name} {side}: real rows = the eager run's", r[:6] == e, verdict="wrong-index"))
            out.append(Check(f"{name} {side}: caches = the eager run's",
                             same_bits(call.compressed, eager.call(1, side).compressed)
                             and same_bits(call.tail, eager.call(1, side).tail), verdict="cache-mismatch"))
    a = runs["full-pad-seq0"]
    out.append(Check("(a) after the builder the padded request's seq_len buffer is 0",
                     int(a.call(1).meta["seq_lens"][3]) == 0 and int(a.call(1).meta["raw_seq_lens"][3]) == 0))
    b = runs["full-pad-seq-minus4"]
    err = b.result.findings[b.result.findings["output"] == "error"]
    out.append(Check("(b) seq_len -4 rejected by name on both sides (KPoolMetadataError / ValueError), no crash",
                     list(err["verdict"]) == ["exact"], "; ".join(err["detail"].astype(str))))
    return out


CASE = PublicCase("C17", "FULL-graph padding rows: seq_len 0, -4, stale 37", build, expect)
