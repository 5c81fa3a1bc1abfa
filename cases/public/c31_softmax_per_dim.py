"""C31: per-dimension softmax over slots with APE, one bf16 round.

One pool, P = 4, ``k_s = [s+1, -(s+1), 10 s, 0]``, gates dim 0 ``[0,0,0,5]``, dim 1 ``[5,0,0,0]``,
dim 2 zero; APE 0 (A) or ``ape[3, 2] = ln 3`` (B). Request 0 compresses it in a prefill, request
1 by decodes (window from the ring, which stores the raw gate); both must equal the float64
value rounded once to bf16.
"""
from __future__ import annotations

import math
from typing import List

import torch

from kpool.config import KPoolConfig

from ..spec import Case
from .common import TokenInputs, bits_check, geometry, make_case, make_step, pool_row
from .model import Check, PublicCase

LN3 = float(torch.tensor(math.log(3.0), dtype=torch.float32))
"""``ln 3`` rounded to fp32: case B's APE entry."""


def _k(rid, pos):
    s = pos % 4
    k = torch.zeros(16)
    k[0], k[1], k[2] = s + 1, -(s + 1), 10 * s
    return k


def _gate(rid, pos):
    s = pos % 4
    g = torch.zeros(16)
    g[0] = 5.0 if s == 3 else 0.0
    g[1] = 5.0 if s == 0 else 0.0
    return g


def build() -> List[Case]:
    """Cases A and B: a prefill of request 0 beside request 1's first decode, then its decodes."""
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=4, index_topk=4)
    inputs = TokenInputs(cfg, seed=3131, k=_k, gate=_gate)
    out = []
    for name, ape_val in (("softmax-per-dim-A", 0.0), ("softmax-per-dim-B", LN3)):
        ape = torch.zeros(4, 16)
        ape[3, 2] = ape_val
        steps = [make_step("prefill+decode-0", [(0, 4, [0], 0), (0, 1, [1], 1)], [0, 1], inputs=inputs)]
        steps += [make_step(f"decode-{p}", [(p, 1, [1], 1)], [1], inputs=inputs) for p in (1, 2, 3)]
        out.append(make_case(name, cfg, geometry(num_pages=2, page_size=1, blocks=2), steps, ape=ape))
    return out


def expect(runs) -> List[Check]:
    """The prefill pool is the float64 value rounded once; the decode-completed pool equals it."""
    e5 = math.exp(5.0)
    out = []
    for name, dim2 in (("softmax-per-dim-A", 15.0), ("softmax-per-dim-B", 20.0)):
        run = runs[name]
        want = torch.tensor([(1 + 2 + 3 + 4 * e5) / (3 + e5), (-e5 - 2 - 3 - 4) / (e5 + 3), dim2] + [0.0] * 13,
                            dtype=torch.float64).to(torch.float32).to(torch.bfloat16)
        for side in ("kernel", "reference"):
            prefill = pool_row(run.call(0, side), 0, 0)
            decode = pool_row(run.call(3, side), 0, 0)
            out.append(bits_check(f"{name} {side}: prefill pool = bf16([3.96037, -1.03963, {dim2:g}, 0...])", prefill,
                                  want))
            out.append(bits_check(f"{name} {side}: decode-completed pool = prefill pool", decode, prefill))
    return out


CASE = PublicCase("C31", "per-dimension softmax over slots with APE, one bf16 round", build, expect)
