"""The step context and index-row parsing of the §3.2 tie certificate (parity-contract.md §3.2;
docs/certificates.md §2 and §4): which pools row ``t`` sees, their exact float64 scores and
any-order bounds, and the selection an index row encodes. :mod:`.ties` judges rows with them.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np
import torch

from reference.numerics import visible_pools

from .scores import ScoreBounds, score_bounds

TIE_POLICIES = ("canonical", "any")
"""Tie policies of an implementation (module docstring); ``canonical`` is the default."""


def check_tie_policy(tie_policy: str) -> str:
    """``tie_policy`` if it is one of :data:`TIE_POLICIES`.

    Raises:
        ValueError: anything else.
    """
    if tie_policy not in TIE_POLICIES:
        raise ValueError(f"tie_policy must be one of {TIE_POLICIES}, got {tie_policy!r}")
    return tie_policy


@dataclass
class TieContext:
    """What the §3.2 certificate needs for one step (all host or device tensors; read on host).

    Attributes:
        q: bf16 ``[T, H, D]``; weights: fp32 or bf16 ``[T, H]``.
        kernel_cache / reference_cache: bf16 ``[N, B, 1, D]`` each side's compressed cache
            after the step (each row is judged against the scores of its own side's cache).
        positions, cum_query_lens, seq_lens, block_table: the step's metadata.
        index_topk, index_kpool: ``K_tok``, ``P``; score_mode: ``"relu"`` or ``"merged"``;
        pack_tail: the tail layout.
        exact_scores: the step's data is exact (``Case.values == "exact"``): every summation
            order gives the exact score, so the bounds are zero. Only the ``any`` tie policy
            certifies anything with such a context.
    """

    q: torch.Tensor
    weights: torch.Tensor
    kernel_cache: torch.Tensor
    reference_cache: torch.Tensor
    positions: torch.Tensor
    cum_query_lens: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    index_topk: int
    index_kpool: int
    score_mode: str = "relu"
    pack_tail: bool = True
    exact_scores: bool = False
    _host: dict = field(default_factory=dict, repr=False)

    def host(self, name: str) -> torch.Tensor:
        """CPU copy of a tensor field, made once."""
        if name not in self._host:
            self._host[name] = getattr(self, name).detach().cpu()
        return self._host[name]


def visible_keys_f64(ctx: TieContext, t: int, cache: torch.Tensor) -> np.ndarray:
    """float64 ``[v, D]`` pooled keys of row ``t``'s visible pools, ``v = min((p+1)//P,
    seq_lens[r])``, read through the block table (kpool-algorithm.md §4.1)."""
    P = ctx.index_kpool
    cum = [int(c) for c in ctx.host("cum_query_lens").tolist()]
    r = bisect.bisect_right(cum, t)
    p = int(ctx.host("positions")[t])
    v = visible_pools(p, int(ctx.host("seq_lens")[r]), P)
    N, B, _, D = cache.shape
    bt = ctx.host("block_table")[r]
    M = int(bt.shape[0])
    pages = [min(max(int(bt[min(j // B, M - 1)]), 0), N - 1) for j in range(v)]
    # The kernel side's cache lives on the device: gather there, compute on the host.
    return cache[pages, [j % B for j in range(v)], 0].cpu().to(torch.float64).numpy() if v else np.zeros((0, D))


def row_scores_f64(ctx: TieContext, t: int, cache: torch.Tensor, *,
                   keys: Optional[np.ndarray] = None) -> ScoreBounds:
    """Exact scores and any-order bounds of every visible pool of row ``t`` (kpool-algorithm.md
    §4.1-§4.2; docs/certificates.md §2), zero bounds under :attr:`TieContext.exact_scores`.

    Args:
        keys: the row's :func:`visible_keys_f64` when the caller already gathered them.
    Returns:
        :class:`parity.checking.certificates.scores.ScoreBounds` over the ``v`` visible pools.
    """
    c = visible_keys_f64(ctx, t, cache) if keys is None else keys
    q = ctx.host("q")[t].to(torch.float64).numpy()                    # [H, D]
    w = ctx.host("weights")[t].to(torch.float64).numpy()              # [H]
    sb = score_bounds(q, w, c, ctx.score_mode)
    if ctx.exact_scores:
        sb.bounds = np.zeros_like(sb.bounds)
    return sb


def parse_row(row: Sequence[int], tail: Sequence[bool], *, index_topk: int, index_kpool: int):
    """The selection encoded in one index row's history columns (kpool-algorithm.md §4.5 step 1).

    Args:
        row: the ``W`` ints of a row; tail: bool per column, True for the row's tail columns.

    Returns:
        ``(pools, valid)``: ``pools`` lists the pool id of each slot (``-1`` for an empty slot)
        and ``valid`` says whether the history columns are well formed (each slot the full
        expansion ``pool * P + c % P`` of one pool, or all ``-1``; pools distinct; empty slots
        only after the filled ones).
    """
    P, K = index_kpool, index_topk
    pools: List[int] = []
    ok = True
    for s in range(K // P):
        cols = [c for c in range(s * P, (s + 1) * P) if not tail[c]]
        vals = [int(row[c]) for c in cols]
        if not vals or all(v == -1 for v in vals):
            pools.append(-1)
            continue
        pool = vals[0] // P if vals[0] >= 0 else -1
        if pool < 0 or any(v != pool * P + c % P for v, c in zip(vals, cols)):
            ok = False
            pools.append(-2)
            continue
        pools.append(pool)
    filled = [p for p in pools if p >= 0]
    if len(set(filled)) != len(filled):
        ok = False
    first_empty = next((i for i, p in enumerate(pools) if p < 0), len(pools))
    if any(p >= 0 for p in pools[first_empty:]):
        ok = False
    return pools, ok
