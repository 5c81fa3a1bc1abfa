"""C27: logits and rows bitwise deterministic run to run.

A decode batch of 4 x 1 token with visible pools :data:`VISIBLE`, H = 32, random bf16 q and k,
K = 16 pools: an eager launch, then the same launch in FULL mode (8 token rows, static
``max_pool_seq_len``); the repeat rewrites identical cache rows. P = 1 (the case is about the
logits kernel; a pool per token keeps the context short under the interpreter). Each row's
``torch.topk`` set of the reference's logits is checked in :mod:`parity.running.public.reference_checks`,
the repeated launches in :mod:`parity.running.public.kernel_checks`.
"""
from __future__ import annotations

from typing import List

from kpool.config import KPoolConfig

from ..spec import Case
from .common import TokenInputs, context_then_decode_steps, geometry, make_case, rows, valid
from .model import Check, PublicCase

VISIBLE = (300, 1, 299, 64)
"""Visible pools of the four decode rows."""


def build() -> List[Case]:
    """A cache-only context, an eager decode, the same decode in FULL mode."""
    cfg = KPoolConfig(index_n_heads=32, index_head_dim=16, index_kpool=1, index_topk=16)
    inputs = TokenInputs(cfg, seed=2727)
    pos = [v - 1 for v in VISIBLE]                        # P = 1: visible = p + 1
    steps = context_then_decode_steps(pos, inputs, num_tokens=8)
    return [make_case("determinism", cfg, geometry(num_pages=40, page_size=32, blocks=4), steps)]


def expect(runs) -> List[Check]:
    """FULL mode repeats the eager rows, its padding is -1, the sparse path ran."""
    run = runs["determinism"]
    return [Check("FULL-mode rows = eager rows", rows(run.call(2))[:4] == rows(run.call(1))),
            Check("FULL-mode padding rows all -1", all(v == -1 for row in rows(run.call(2))[4:] for v in row)),
            Check("sparse path ran: the 300-pool row selects 16 pools", len(valid(rows(run.call(1))[0])) == 16)]


CASE = PublicCase("C27", "logits and rows bitwise deterministic run to run", build, expect)
