"""C21: rejected draft keys never enter a later completed pool.

Committed through position 5 (pool 0 done, ring holds k4, k5); verify drafts at 6, 7, 8 (7
completes pool 1), only 6 accepted; then k7', k8', k9'. Variants: 5 drafts (6..11, more than P);
a run without speculation; and the negative control with an undersized ring ``C = P`` (MTP-2 with
4 slots: kernels and reference agree, the oracle must not). Pool 1's canonical value (the
reference's compression) is checked in :mod:`parity.running.public.reference_checks`.

Adapted value: our ring has ``C = P + spec`` slots, so k8', k9' sit at slots ``8 % C``, ``9 % C``
(slots 0 and 1 of the public case's P-slot ring).
"""
from __future__ import annotations

from typing import List

from ..bits import same_bits
from ..spec import Case
from .common import TokenInputs, bits_check, config, geometry, make_case, make_step, pool_row, ring_row, rows, sides
from .model import Check, PublicCase


def version(step_name: str, rid: int, pos: int) -> int:
    """Drafts that get rejected have other bits than the tokens replayed later."""
    return 1 if step_name.startswith("verify") and pos > 6 else 0


def build() -> List[Case]:
    """Three speculative variants and the run without speculation."""
    out = []
    for name, spec, drafts, capacity in (("mtp-2-drafts", 2, 3, None), ("mtp-5-drafts", 5, 6, None),
                                         ("mtp-undersized-ring", 2, 3, 4)):
        cfg = config(index_topk=8, num_speculative_tokens=spec, tail_ring_capacity=capacity)
        inputs = TokenInputs(cfg, seed=2121, version=version)
        table = [0, 1]
        steps = [make_step("prefill-0-5", [(0, 6, table, 1)], [0], inputs=inputs),
                 make_step("verify-6", [(6, drafts, table, 1)], [0], inputs=inputs),
                 make_step("replay-7-9", [(7, 3, table, 1)], [0], inputs=inputs)]
        out.append(make_case(name, cfg, geometry(num_pages=3, page_size=4, blocks=2), steps))
    cfg = config(index_topk=8, num_speculative_tokens=2)
    inputs = TokenInputs(cfg, seed=2121, version=version)
    table = [0, 1]
    out.append(make_case("no-speculation", cfg, geometry(num_pages=3, page_size=4, blocks=2), [
        make_step("prefill-0-5", [(0, 6, table, 1)], [0], inputs=inputs),
        make_step("decode-6", [(6, 1, table, 1)], [0], inputs=inputs),
        make_step("step-7-9", [(7, 3, table, 1)], [0], inputs=inputs)]))
    return out


def expect(runs) -> List[Check]:
    """The speculative runs equal the non-speculative one; the undersized ring fails the oracle only."""
    out = []
    base = runs["no-speculation"]
    inputs = base.case.steps[0].inputs
    for name in ("mtp-2-drafts", "mtp-5-drafts"):
        run = runs[name]
        C = run.case.config.ring_capacity
        for side, call in sides(run, 2):
            out.append(bits_check(f"{name} {side}: pool 1 = the non-speculative run's", pool_row(call, 0, 1),
                                  pool_row(base.call(2, side), 0, 1)))
            ok = all(same_bits(ring_row(call, 1, p % C)[0], inputs.token(0, p)["k"]) for p in (8, 9))
            out.append(Check(f"{name} {side}: ring slots 8 % C, 9 % C hold k8', k9'", ok, verdict="ring-mismatch"))
            out.append(Check(f"{name} {side}: rows of pos 7, 8, 9 = the non-speculative run's",
                             rows(call) == rows(base.call(2, side))))
    bad = runs["mtp-undersized-ring"].result.failures
    out.append(Check("undersized ring (C = P, MTP-2): only the oracle disagrees (reference-vs-oracle)",
                     not bad.empty and set(bad["output"]) == {"reference-vs-oracle"},
                     f"outputs {sorted(set(bad['output']))}"))
    return out


CASE = PublicCase("C21", "rejected draft keys never enter a later completed pool", build, expect,
                  must_fail=("mtp-undersized-ring",))
