"""C11: pooling never crosses a request boundary in a packed batch.

A flat prefill of two requests of 6 and 7 tokens whose keys are ``(t + 1) * e0`` for flat row
``t``: each request's pool 0 is the mean of its own first four rows, and its ring holds its own
last rows.
"""
from __future__ import annotations

from typing import List

import torch

from ..spec import Case
from .common import bits_check, config, geometry, make_case, make_step, pool_row, ring_row, sides
from .model import Check, PublicCase


def _inputs(case, step, metadata):
    cfg = case.config
    T, D = metadata.num_tokens, cfg.index_head_dim
    k = torch.zeros(T, D)
    k[:, 0] = torch.arange(1, T + 1, dtype=torch.float32)           # K[t] = (t + 1) * e0, flat row t
    return dict(k=k, gate=torch.zeros(T, D), q=torch.ones(T, cfg.index_n_heads, D, dtype=torch.bfloat16),
                weights=torch.full((T, cfg.index_n_heads), 2.0 ** -6))


def build() -> List[Case]:
    """One flat prefill of requests of 6 and 7 tokens."""
    cfg = config(index_topk=8)
    steps = [make_step("flat-prefill-6-7", [(0, 6, [3], 2), (0, 7, [1], 0)], [0, 1], inputs=_inputs)]
    return [make_case("request-boundary-pooling", cfg, geometry(num_pages=5, page_size=2, blocks=3), steps,
                      values="exact")]


def expect(runs) -> List[Check]:
    """Pool 0 of each request and its ring rows."""
    run = runs["request-boundary-pooling"]
    out = []
    D = run.case.config.index_head_dim
    for side, call in sides(run, 0):
        for r, v in ((0, 2.5), (1, 8.5)):
            want = torch.zeros(D, dtype=torch.bfloat16)
            want[0] = v
            out.append(bits_check(f"{side}: req{r} pool 0 = {v} * e0 (not 6.5: flat rows 4..7)", pool_row(call, r, 0),
                                  want))
        for block, slot_rows in ((2, {0: 4, 1: 5}), (0, {0: 10, 1: 11, 2: 12})):
            ok = all(float(ring_row(call, block, s)[0, 0]) == t + 1 for s, t in slot_rows.items())
            out.append(Check(f"{side}: ring block {block} slots {list(slot_rows)} = flat rows {list(slot_rows.values())}",
                             ok, verdict="ring-mismatch"))
    return out


CASE = PublicCase("C11", "pooling never crosses a request boundary in a packed batch", build, expect)
