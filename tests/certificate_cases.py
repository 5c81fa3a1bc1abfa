"""Builders shared by the certificate tests (not a public API): a hand-made near-tie row set,
index-row surgery, a small exact-logit tie case, and stand-in forwards that score like a fast
kernel would (another fp32 accumulation order, or a planted fault) on top of the reference.

The stand-ins replace :func:`reference.numerics.pool_scores` inside
:func:`reference.stateful.forward` for one call: compression, the ring and selection stay the
reference's, so only the score rounding (or the fault) differs.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from cases.spec import CacheGeometry, Case, Step
from cases.values import exact_logit_inputs
from kpool.config import SMALL
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from parity.checking import certificates as certs
from parity.checking import compare as cmp
from reference import numerics as rn
from reference import stateful
from reference.numerics import canonical_topk, expand_row, pool_scores, sanitize_scores

P, K, W, D, H = SMALL.index_kpool, SMALL.index_topk, SMALL.output_width, SMALL.index_head_dim, SMALL.index_n_heads
F32 = torch.float32


def run(case, kernel, **kw):
    """:func:`parity.running.runner.run_case` on the session device; ``kernel`` is a stand-in operator
    that claims no output bitwise (the certificates apply), unless ``bitwise_outputs`` says."""
    from parity.running.runner import run_case
    kw.setdefault("bitwise_outputs", ())
    return run_case(case, device=os.environ.get("KPOOL_DEVICE", "cpu"), kernel_forward=kernel, **kw)


def tie_setup(exact_scores: bool = False):
    """One request of 17 tokens (positions 0..16, 4 complete pools on pages [0, 1], B=2) and a
    cache whose pools score, for every row: pool 0 highest, pools 1 and 2 tied to within 2^-27 of
    the score (far inside the fp32 bound), pool 3 far below. q = 1 (head 0) / 0.5 (head 1),
    weights = 1 / 0.5. Returns ``(meta, reference rows [T, 1, W], TieContext)``."""
    meta = build_metadata(BatchSpec([RequestSpec(0, 17, [0, 1], 0)]), index_kpool=P, ring_capacity=P, page_size=2)
    T = meta.num_tokens
    cache = torch.zeros(2, 2, 1, D, dtype=torch.bfloat16)
    cache[0, 0, 0] = 1.0                                  # pool 0
    cache[0, 1, 0] = 0.5                                  # pool 1
    cache[1, 0, 0] = 0.5                                  # pool 2 ~ pool 1
    cache[0, 1, 0, D - 1] = 2.0 ** -20
    cache[1, 0, 0, D - 1] = 2.0 ** -20 * (1 + 2.0 ** -7)
    cache[1, 1, 0] = 0.25                                 # pool 3
    q = torch.ones(T, H, D, dtype=torch.bfloat16)
    q[:, 1] = 0.5
    weights = torch.tensor([[1.0, 0.5]] * T)
    rows = []
    pools = torch.stack([cache[j // 2, j % 2, 0] for j in range(4)])
    for t in range(T):
        p = int(meta.positions[t])
        vis = torch.tensor([min((p + 1) // P, 4)])
        s = sanitize_scores(pool_scores(q[t:t + 1], weights[t:t + 1], pools, "relu"), vis)
        ids, valid = canonical_topk(s, 2)
        rows.append(expand_row(ids[0].tolist(), valid[0].tolist(), p, index_topk=K, index_kpool=P,
                               pack_tail=True, width=W))
    ref = torch.tensor(rows, dtype=torch.int32).unsqueeze(1)
    ctx = certs.TieContext(q=q, weights=weights, kernel_cache=cache, reference_cache=cache,
                           positions=meta.positions, cum_query_lens=meta.cum_query_lens, seq_lens=meta.seq_lens,
                           block_table=meta.block_table, index_topk=K, index_kpool=P, exact_scores=exact_scores)
    return meta, ref, ctx


def swap_pool(rows, t, old, new):
    """``rows`` with pool ``old`` replaced by pool ``new`` in row ``t``'s history columns."""
    out = rows.clone()
    for c in range(K):
        if int(out[t, 0, c]) // P == old and int(out[t, 0, c]) >= 0:
            out[t, 0, c] = new * P + c % P
    return out


def compare_rows(kern, ref, meta, ctx, tie_policy="canonical"):
    """:func:`parity.checking.compare.compare_indices` of the small-config rows."""
    return cmp.compare_indices(kern, ref, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
                               index_topk=K, index_kpool=P, pack_tail=True, compute_topk=True, context=ctx,
                               tie_policy=tie_policy)


def geometry():
    return CacheGeometry(num_pages=8, page_size=2, num_tail_blocks=4, page_padding=3, ring_block_padding=5, guard=16)


def tie_case(values="random", identical_keys=False):
    """Exact-logit pools [3, 2, 2, 1]: pools 1 and 2 tie exactly (K_pool = 2 picks 0 and 1).
    Their keys differ (pool 1 also has 1.0 in channel 1, which no query reads) unless
    ``identical_keys``: identical keys score identically on every backend, so under the
    canonical tie policy no swap of them is ever a legitimate tie."""
    base = exact_logit_inputs({0: [3.0, 2.0, 2.0, 1.0]})

    def inputs(case, step, meta):
        x = base(case, step, meta)
        if not identical_keys:
            pool1 = (meta.positions.cpu() // P == 1) & (torch.arange(meta.num_tokens) < meta.num_live_tokens)
            x["k"][pool1, 1] = 1.0
        return x
    steps = [Step("prefill", BatchSpec([RequestSpec(0, 17, [4, 1], 1)]), request_ids=[0], seed=1, inputs=inputs)]
    return Case("tie", "small", SMALL, geometry(), steps, ape=torch.zeros(P, D), seed=4, values=values)


def swapping_kernel(new_pool, tail_row=None):
    """The reference, then pool 1 replaced by ``new_pool`` in every row that sees pools 0..2
    (and the tail column of ``tail_row`` changed)."""
    def forward(**kw):
        out = stateful.forward(**kw)
        pos = kw["positions"]
        for t in range(out.shape[0]):
            if int(pos[t]) >= 11:                                    # rows that see pools 0, 1, 2
                for c in range(K):
                    if int(out[t, 0, c]) // P == 1 and int(out[t, 0, c]) >= 0:
                        out[t, 0, c] = new_pool * P + c % P
        if tail_row is not None:
            out[tail_row, 0, K] += 1
        return out
    return forward


# ---- stand-in scorers: other fp32 accumulation orders (what tl.dot / torch.matmul do) ----------

def _operands(q, weights, pools):
    qf, wf, cf = q.to(F32), weights.to(F32), pools.to(F32)
    if cf.dim() == 2:
        cf = cf.unsqueeze(0).expand(qf.shape[0], -1, -1)
    return qf, wf, cf


def scores_matmul(q, weights, pools, score_mode="relu"):
    """fp32 ``torch.matmul`` for the per-head dots and the head sum (merged: per-head dots, then
    the weighted head sum, as a tensor-core kernel does)."""
    qf, wf, cf = _operands(q, weights, pools)
    dots = torch.matmul(cf, qf.transpose(1, 2))                     # [rows, n, H]
    if score_mode == "relu":
        dots = rn.relu_fp32(dots)
    return torch.matmul(dots, wf.unsqueeze(2)).squeeze(2)


def scores_reversed(q, weights, pools, score_mode="relu"):
    """The reference's sequential order with ``d`` and ``h`` reversed."""
    return rn.pool_scores(q.flip(-1).flip(-2), weights.flip(-1), pools.flip(-1), score_mode)


def _pairwise_sum(x: torch.Tensor) -> torch.Tensor:
    while x.shape[-1] > 1:
        n = x.shape[-1]
        x = torch.cat([x[..., 0:n - 1:2] + x[..., 1::2], x[..., n - n % 2:]], dim=-1)
    return x[..., 0]


def scores_pairwise(q, weights, pools, score_mode="relu"):
    """Pairwise (tree) sums over ``d`` and over ``h``, products exact in fp32."""
    qf, wf, cf = _operands(q, weights, pools)
    dots = _pairwise_sum(cf[:, :, None, :] * qf[:, None, :, :])     # [rows, n, H]
    if score_mode == "relu":
        dots = rn.relu_fp32(dots)
    return _pairwise_sum(dots * wf[:, None, :])


SCORERS = {"matmul": scores_matmul, "reversed": scores_reversed, "pairwise": scores_pairwise}


def standin_forward(scorer: Optional[Callable] = None, *, head0_weight_scale: Optional[float] = None):
    """A forward that is :func:`reference.stateful.forward` with its scores computed by
    ``scorer`` (default: the reference's own order) and, when ``head0_weight_scale`` is given,
    head 0's weight multiplied by it (a planted fault that moves scores only slightly)."""
    def forward(**kw):
        kw.pop("max_score_rows", None)   # a kernel-side knob (score chunking); the reference has no scratch
        if head0_weight_scale is not None and kw.get("weights") is not None:
            w = kw["weights"].clone()
            w[:, 0] *= head0_weight_scale
            kw = dict(kw, weights=w)
        saved = stateful.pool_scores
        stateful.pool_scores = scorer or rn.pool_scores
        try:
            return stateful.forward(**kw)
        finally:
            stateful.pool_scores = saved
    return forward
