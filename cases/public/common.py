"""Builders and record readers shared by the public cases (public-cases.md "Conventions").

Builders: :func:`config` (H = 2, D = 16, P = 4 unless overridden), :func:`geometry`,
:func:`make_case`, :func:`make_step`, :func:`context_then_decode_steps`, and
:class:`TokenInputs` (values that are a function of request, position and version, so one token
fed on two paths gets the same bits). Readers of recorded calls (:class:`cases.public.model.Call`):
:func:`rows`, :func:`valid`, :func:`pool_row`, :func:`pool_at`, :func:`ring_row`, :func:`sides`;
and the three common checks :func:`row_check`, :func:`set_check`, :func:`bits_check`.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from kpool.config import KPoolConfig
from kpool.metadata import BatchSpec, RequestSpec

from ..bits import same_bits
from ..genvalues import random_bf16, random_fp32
from ..spec import Case, CacheGeometry, Step
from ..values import _fill_padding, _generator, row_requests
from .model import PUBLIC_SIZE, Call, Check, PublicRun


# ---- builders ----------------------------------------------------------------------------------

def config(**kw) -> KPoolConfig:
    """H = 2, D = 16 (SMALL's shapes, the ones every backend has compiled), P = 4, K_tok = 8,
    overridden by ``kw``: the exact-logit inputs use head 0 only, so the extra head changes no
    stated value."""
    base = dict(index_n_heads=2, index_head_dim=16, index_kpool=4, index_topk=8)
    base.update(kw)
    return KPoolConfig(**base)


def geometry(num_pages=16, page_size=4, blocks=4, **kw) -> CacheGeometry:
    """A cache layout (:class:`cases.spec.CacheGeometry`) with ``blocks`` ring blocks."""
    return CacheGeometry(num_pages=num_pages, page_size=page_size, num_tail_blocks=blocks, **kw)


def make_case(name, config, geometry, steps, *, ape=None, values="random", description="", tags=()) -> Case:
    """A public case's :class:`cases.spec.Case` (size ``public``; zero APE unless given)."""
    if ape is None:
        ape = torch.zeros(config.index_kpool, config.index_head_dim, dtype=torch.float32)
    return Case(name=name, size=PUBLIC_SIZE, config=config, geometry=geometry, steps=steps, ape=ape,
                values=values, description=description, tags=tuple(tags))


def make_step(name, requests, rids, *, inputs, **kw) -> Step:
    """A :class:`cases.spec.Step` from ``requests``: ``[(cached, qlen, block_table, ring_block)]``;
    batch keywords (``num_tokens``, ``full_mode``, ``num_padded_requests``, ``block_table_width``,
    ``stale_tail_slots``) go to the :class:`kpool.metadata.BatchSpec`, the rest to the step."""
    batch_kw = {k: kw.pop(k) for k in ("num_tokens", "full_mode", "num_padded_requests", "block_table_width",
                                       "stale_tail_slots") if k in kw}
    batch = BatchSpec([RequestSpec(c, q, list(bt), ring) for c, q, bt, ring in requests], **batch_kw)
    return Step(name=name, batch=batch, request_ids=list(rids), inputs=inputs, **kw)


def context_then_decode_steps(positions, inputs, *, num_tokens: int) -> list:
    """Request ``r`` (pages ``10r .. 10r + 9``, ring block ``r``) gets a cache-only context of
    ``positions[r]`` tokens, then one decode token eagerly and the same decode again in FULL mode
    padded to ``num_tokens`` rows."""
    ids = list(range(len(positions)))
    tables = {r: list(range(r * 10, r * 10 + 10)) for r in ids}
    ctx = make_step("context", [(0, p, tables[r], r) for r, p in enumerate(positions)], ids, inputs=inputs,
                    compute_topk=False)
    dec = [(p, 1, tables[r], r) for r, p in enumerate(positions)]
    return [ctx, make_step("decode", dec, ids, inputs=inputs),
            make_step("decode-full", dec, ids, inputs=inputs, num_tokens=num_tokens, full_mode=True,
                      block_table_width=10)]


class TokenInputs:
    """``Step.inputs`` whose values are a function of (request id, position, version): the same
    token fed in two steps (chunked vs decode paths, speculative vs not) gets the same bits.

    Args:
        config: H, D. seed: value stream. fns: optional overrides ``fn(rid, pos) -> tensor`` for
            ``k`` (fp32 [D]), ``gate`` (fp32 [D]), ``q`` (bf16 [H, D]), ``weights`` (fp32 [H]).
        version: ``fn(step_name, rid, pos) -> int``: 0 for committed tokens, else a draft version
            (rejected MTP drafts get other bits).
        shared: every request sees the same token stream (C01's three paths over one sequence).
    """

    def __init__(self, config: KPoolConfig, seed: int = 0, version: Optional[Callable] = None,
                 shared: bool = False, **fns):
        self.config, self.seed, self.fns, self.shared = config, seed, fns, shared
        self.version = version or (lambda step, rid, pos: 0)

    def token(self, rid: int, pos: int, version: int = 0) -> dict:
        """The four values of one token (the same for every request when ``shared``)."""
        H, D = self.config.index_n_heads, self.config.index_head_dim
        g = _generator(self.seed, 0 if self.shared else rid, pos, version)
        out = dict(k=random_bf16((D,), g).to(torch.float32), gate=random_fp32((D,), g, -3, 1),
                   q=random_bf16((H, D), g), weights=random_fp32((H,), g, -6, -5))
        for name, fn in self.fns.items():
            out[name] = fn(rid, pos)
        return out

    def __call__(self, case, step, metadata) -> dict:
        H, D = self.config.index_n_heads, self.config.index_head_dim
        T, T_live = metadata.num_tokens, metadata.num_live_tokens
        k, gate = torch.zeros(T, D), torch.zeros(T, D)
        q, w = torch.zeros(T, H, D, dtype=torch.bfloat16), torch.zeros(T, H)
        req = row_requests(metadata)
        for t in range(T_live):
            rid, pos = step.request_ids[int(req[t])], int(metadata.positions[t])
            v = self.token(rid, pos, self.version(step.name, rid, pos))
            k[t], gate[t], q[t], w[t] = v["k"], v["gate"], v["q"], v["weights"]
        _fill_padding(T_live, k, gate, q, w, _generator(self.seed, 0xBAD))
        return dict(k=k, gate=gate, q=q, weights=w)


# ---- readers of recorded calls -----------------------------------------------------------------

def rows(call: Call) -> List[List[int]]:
    """Index rows of a recorded call as int lists (``[T][W]``)."""
    return call.out[:, 0, :].tolist()


def valid(row: Sequence[int]) -> List[int]:
    """The non-negative entries of a row, sorted."""
    return sorted(v for v in row if v >= 0)


def pool_row(call: Call, request: int, j: int) -> torch.Tensor:
    """bf16 ``[D]`` compressed row of pool ``j`` of the call's request ``request`` (through its
    block table), after the call."""
    B = call.compressed.shape[1]
    page = int(call.meta["block_table"][request, j // B])
    return call.compressed[page, j % B, 0]


def pool_at(call: Call, table: Sequence[int], j: int) -> torch.Tensor:
    """bf16 ``[D]`` compressed row of pool ``j`` of a request with block table ``table`` (for a
    request that is not in the call's batch)."""
    B = call.compressed.shape[1]
    return call.compressed[table[j // B], j % B, 0]


def ring_row(call: Call, block: int, slot: int) -> torch.Tensor:
    """fp32 ``[2, D]`` (K, gate) of a ring row after the call."""
    return call.tail[block, :, slot]


def sides(run: PublicRun, step: int):
    """``(("kernel", call), ("reference", call))`` of ``step``."""
    return (("kernel", run.call(step, "kernel")), ("reference", run.call(step, "reference")))


def row_check(name, got: Sequence[int], want: Sequence[int]) -> Check:
    """A row equal to ``want``, entry for entry."""
    return Check(name, list(got) == list(want), f"got {list(got)}, want {list(want)}")


def set_check(name, got: Sequence[int], want: Sequence[int]) -> Check:
    """A row whose non-negative entries are the set ``want``."""
    return Check(name, valid(got) == sorted(want), f"got {valid(got)}, want {sorted(want)}")


def bits_check(name, got: torch.Tensor, want: torch.Tensor, verdict: str = "cache-mismatch") -> Check:
    """Two tensors bit for bit (:func:`cases.bits.same_bits`)."""
    return Check(name, same_bits(got, want), f"got {got.tolist()}, want {want.tolist()}", verdict)
