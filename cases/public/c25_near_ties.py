"""C25: near-ties: same bits, same choice every run, reference on the kernel's rows.

One decode row, K = 2, 5 visible pools, real softmax pooling (random gate and APE); the 2nd and
3rd logits differ by 2^-23 (1 fp32 ulp at 1.0, far below 1 bf16 ulp of the pooled key) or by
2^-17 (64 fp32 ulps). The repeated kernel launches and the reference fed the kernel's bf16 cache
rows are in :mod:`parity.running.public.kernel_checks`.
"""
from __future__ import annotations

from typing import List

import torch

from ..genvalues import random_bf16
from ..spec import Case
from ..values import _generator
from .common import TokenInputs, config, geometry, make_case, make_step, row_check, rows, sides
from .model import Check, PublicCase

CASE_NAMES = ("near-tie-1ulp", "margin-64ulp")


def _key(margin_exp: int):
    """Pool keys: dims 0, 1 set per pool (all P tokens share them, so the pooled key restores them
    exactly whatever the random gate and APE), other dims random. Ranked pools: 4 (v=2), then
    1 and 3 (v=1, u differing by 1), then 0, 2. With ``q = [1, 2^margin_exp, 0...]`` the 2nd/3rd
    logits differ by ``2^margin_exp``."""
    v = {0: 0.5, 1: 1.0, 2: 0.25, 3: 1.0, 4: 2.0}
    u = {0: 0.0, 1: 1.0, 2: 0.0, 3: 2.0, 4: 0.0}

    def k_of(rid, pos):
        j = pos // 4
        key = random_bf16((16,), _generator(25, rid, pos)).to(torch.float32)
        key[0], key[1] = v.get(j, 0.0), u.get(j, 0.0)
        return key

    def q_of(rid, pos):
        q = torch.zeros(2, 16, dtype=torch.bfloat16)          # head 1 stays 0 (weight 0 too)
        q[0, 0], q[0, 1] = 1.0, 2.0 ** margin_exp
        return q
    return k_of, q_of


def build() -> List[Case]:
    """The two margins, each a cache-only context then one scored decode."""
    out = []
    for name, margin in zip(CASE_NAMES, (-23, -17)):
        cfg = config(index_topk=8)
        k_of, q_of = _key(margin)
        inputs = TokenInputs(cfg, seed=2525, k=k_of, q=q_of, weights=lambda rid, pos: torch.tensor([1.0, 0.0]))
        ape = TokenInputs(cfg, seed=2526).token(0, 0)["gate"].repeat(4, 1) * torch.tensor([[1.0], [-0.5], [0.25], [2.0]])
        steps = [make_step("context", [(0, 21, [0, 1], 1)], [0], inputs=inputs, compute_topk=False),
                 make_step("decode-21", [(21, 1, [0, 1], 1)], [0], inputs=inputs)]
        out.append(make_case(name, cfg, geometry(num_pages=3, page_size=4, blocks=2), steps, ape=ape))
    return out


def expect(runs) -> List[Check]:
    """Pools 4 then 3 (the near-tied winner) on both sides."""
    out = []
    for name in CASE_NAMES:
        for side, call in sides(runs[name], 1):
            out.append(row_check(f"{name} {side}: pools 4 then 3 (logit 1 + 2 * 2^m beats 1 + 2^m)", rows(call)[0][:8],
                                 [16, 17, 18, 19, 12, 13, 14, 15]))
    return out


CASE = PublicCase("C25", "near-ties: same bits, same choice every run, reference on the kernel's rows", build, expect)
