"""C29: K = 512 pools (above aclnnTopk's 256): 600 / 300 / 0 visible, replay = eager.

P = 4, K_tok = 2048 (K = 512 pools): rows with 600, 300 and 0 visible pools, an eager launch and
the same launch in FULL mode (graph-replay shapes). The 600-pool row's set (the ``torch.topk``
set of the reference's logits) is checked in :mod:`parity.running.public.reference_checks`.
"""
from __future__ import annotations

from typing import List

from kpool.config import KPoolConfig

from ..spec import Case
from .common import TokenInputs, context_then_decode_steps, geometry, make_case, row_check, rows, set_check, sides, valid
from .model import Check, PublicCase

VISIBLE = (600, 300, 0)
"""Visible pools of the three decode rows."""


def build() -> List[Case]:
    """A cache-only context, an eager decode, the same decode in FULL mode."""
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=4, index_topk=2048)
    inputs = TokenInputs(cfg, seed=2929)
    pos = [4 * v + 2 for v in VISIBLE]                  # visible = v, tail of 3 tokens
    steps = context_then_decode_steps(pos, inputs, num_tokens=4)
    return [make_case("k512", cfg, geometry(num_pages=30, page_size=64, blocks=3), steps)]


def expect(runs) -> List[Check]:
    """The sparse path ran, the 300- and 0-pool rows as stated, the replay equals eager."""
    run = runs["k512"]
    out = []
    for side, call in sides(run, 1):
        r = rows(call)
        out.append(Check(f"{side}: sparse path ran: 600-pool row selects {len(valid(r[0])) - 3} < 2400 history tokens",
                         len(valid(r[0])) - 3 == 2048 < 2400))
        out.append(set_check(f"{side}: 300-pool row = its 300 pools + tail", r[1], list(range(1203))))
        out.append(Check(f"{side}: 300-pool row: -1 after its 1203 valid entries",
                         r[1][1203:] == [-1] * (len(r[1]) - 1203), verdict="wrong-index"))
        out.append(row_check(f"{side}: 0-pool row = only its tail", r[2], [0, 1, 2] + [-1] * (len(r[2]) - 3)))
        full = rows(run.call(2, side))
        out.append(Check(f"{side}: FULL-mode replay rows = eager rows, padding row -1",
                         full[:3] == r and all(v == -1 for v in full[3])))
    return out


CASE = PublicCase("C29", "K = 512 pools (above aclnnTopk's 256): 600 / 300 / 0 visible, replay = eager", build,
                  expect)
