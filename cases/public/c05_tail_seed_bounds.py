"""C05: tail-seed stores are bounded by the number of tail blocks.

P = 4, a ring of 2 blocks (plus the harness's guard bands); the request owns block 1.
(a) final chunk 200..209; (b) the same chunk with the ring block patched to 3537 (must be
rejected on both sides, nothing written); (c) a pool-aligned final chunk 200..207. The
``validate=False`` run of (b) (the kernels' own guards) is in :mod:`parity.running.public.kernel_checks`.

Adapted value: our ring write stores each request's last ``C`` rows (kpool-algorithm.md §5.4),
so (a) also writes tokens 206, 207 into slots 2, 3 and (c) writes 204..207 into slots 0..3; the
public case's "slots 2 and 3 unchanged" / "no tail write" describe a ring that seeds only the
open pool's tokens.
"""
from __future__ import annotations

from typing import List

from kpool.errors import KPoolBlockIdError

from ..bits import same_bits
from ..patches import MetadataPatch
from ..spec import Case
from .common import TokenInputs, config, geometry, make_case, make_step, ring_row, sides
from .model import Check, PublicCase


def build() -> List[Case]:
    """(a), (b) and (c), each after the same 200-token cache-only context."""
    cfg = config(index_topk=8)
    inputs = TokenInputs(cfg, seed=505)
    pages = list(range(14))
    context = make_step("context", [(0, 200, pages, 1)], [0], inputs=inputs, compute_topk=False)
    geo = geometry(num_pages=16, page_size=4, blocks=2)
    a = make_case("tail-seed-a", cfg, geo,
                  [context, make_step("chunk-200-209", [(200, 10, pages, 1)], [0], inputs=inputs)])
    b = make_case("tail-seed-b-bad-block", cfg, geo, [
        context, make_step("chunk-200-209-block-3537", [(200, 10, pages, 1)], [0], inputs=inputs,
                           patch_metadata=MetadataPatch("ring-block-out-of-range", (0, 3537, cfg.ring_capacity)),
                           expect_error=KPoolBlockIdError)])
    c = make_case("tail-seed-c-aligned", cfg, geo,
                  [context, make_step("chunk-200-207", [(200, 8, pages, 1)], [0], inputs=inputs)])
    return [a, b, c]


def expect(runs) -> List[Check]:
    """Ring slots of (a) and (c); (b) rejected on both sides before any write."""
    out = []
    a, b, c = runs["tail-seed-a"], runs["tail-seed-b-bad-block"], runs["tail-seed-c-aligned"]
    inputs = a.case.steps[0].inputs
    for side, call in sides(a, 1):
        want = {0: 208, 1: 209, 2: 206, 3: 207}
        ok = all(same_bits(ring_row(call, 1, s)[0], inputs.token(0, p)["k"])
                 and same_bits(ring_row(call, 1, s)[1], inputs.token(0, p)["gate"]) for s, p in want.items())
        out.append(Check(f"(a) {side}: block 1 slots 0, 1 = tokens 208, 209 (2, 3 = 206, 207: last C rows)", ok,
                         verdict="ring-mismatch"))
    err = b.result.findings[b.result.findings["output"] == "error"]
    out.append(Check("(b) both sides reject ring block 3537 with KPoolBlockIdError (reference: ValueError)",
                     list(err["verdict"]) == ["exact"], "; ".join(err["detail"].astype(str))))
    for side in ("kernel", "reference"):
        call = b.call(1, side)
        out.append(Check(f"(b) {side}: raised before writing; ring bitwise unchanged",
                         call.error is not None and same_bits(call.tail, b.call(0, side).tail),
                         repr(call.error), "stray-write"))
    for side, call in sides(c, 1):
        ok = all(same_bits(ring_row(call, 1, p % 4)[0], inputs.token(0, p)["k"]) for p in range(204, 208))
        out.append(Check(f"(c) {side}: pool-aligned chunk: ring holds its last C rows 204..207", ok,
                         verdict="ring-mismatch"))
    return out


CASE = PublicCase("C05", "tail-seed stores are bounded by the number of tail blocks", build, expect)
