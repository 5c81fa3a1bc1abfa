"""Exact canonical top-k at memory speed (kpool-algorithm.md §4.4, §11; parity-contract.md §2).

The score kernels (:mod:`kpool.ops.score`) store one int64 key per pool: high word the
order-preserving int32 image of the sanitized fp32 score (``-0.0`` folded into ``+0.0``), low
word ``0xFFFFFFFF - pool`` (stored as ``-1 - pool``). Keys of a row are unique, and key order is
the canonical order: descending score, ties to the lower pool id, LOWEST (invalid) last. So the
``selected`` largest keys, in descending key order, are exactly what a stable descending sort
of the scores puts first, bit for bit, whatever algorithm finds them.

:func:`select_topk` finds them with two or three portable Triton launches (no
``tl.sort``/``tl.topk``, no atomics, no histogram op: platform-numerics.md §6.1), only integer
compares and shifts, exact integer ``tl.sum`` counts and exact int32 ``tl.cumsum`` scans:

1. :func:`_select_kernel`, one row (or row segment) per tile, its 32-bit images held in
   registers (a 1-D block of ``NT * T``, read once): a bitwise binary search for the K-th
   largest image ``v`` (32 counting passes over the registers; after the sign pass each counts
   by subtract and shift on images clamped to ``v``'s half), then the tie fix-up: of the keys
   whose image is ``v`` only the largest low words (``0xFFFFFFFF - pool``: the lowest ids) are
   kept, as many as ``K - #(image > v)`` (a second bitwise search, over the low words; skipped
   when no tie crosses the K-th place). So the kernel returns the K largest of any unique int64
   keys. Exactly K lanes are chosen; each key is stored at its lane's exclusive prefix count,
   ``CHUNK`` lanes at a time (keys and images read again from the cache-resident row):
   compacted in pool order into a work row.
2. Only when a batch has fewer rows than cores (``kpool.ops.plan.topk_plans``): step 1 ran on
   ``S`` segments of each row (tile = (row, segment), ``S * K`` candidates a row, in pool order).
   The K largest keys of a row are among its segments' K largest (fewer than K keys of the row
   are above such a key, so fewer than K of its segment are). When the ranking of all ``S * K``
   candidates is cheap (few rows: ``TUNING["topk_order"]`` ``RANK_MERGE``), step 3 ranks them
   directly; otherwise the same select kernel first keeps the K largest candidates, in pool order.
3. :func:`_order_kernel`: each compacted key's rank is the number of the row's candidates above
   it (keys are unique: a permutation), counted block by block in registers; a key whose rank is
   below K is stored at its rank. Any ``K`` (the blocks loop at run time).

Rows past ``T_live = cum_query_lens[R - 1]`` (read on the device) are skipped; their output rows
are left as they were (the expansion never reads them). A row wider than the plan's register
tile (``kpool.ops.plan.topk_plans`` returns ``None``) falls back to ``torch.topk`` on the keys:
the same result.

The torch helpers (:func:`canonical_keys`, :func:`key_pool_ids`, :func:`key_scores`,
:func:`key_valid`) are the host-side twins used by tests and by :func:`score_pools`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KPoolDtypeError, KPoolShapeError
from . import plan as launch_plan
from ._portable import FLT_MAX, INT32_MIN, INT32_MIN_C, KEY_LOWEST, LOWEST, int32_of

INT64_MIN_C = tl.constexpr(-2 ** 63)


@triton.jit
def _count(cond):
    """Number of true lanes of a bool block (an exact int32 sum)."""
    return int32_of(tl.sum(tl.where(cond, 1, 0)))


@triton.jit(do_not_specialize=["stride_keys_t", "stride_work_t", "num_requests", "row_start", "num_rows", "width",
                                "selected", "segments", "segment_width"])
def _select_kernel(keys_ptr, image_ptr, stride_keys_t, work_ptr, stride_work_t, cum_query_lens_ptr, num_requests,
                   row_start, num_rows, width, selected, segments, segment_width,
                   NT: tl.constexpr, T: tl.constexpr, CHUNK: tl.constexpr):
    """Launch 1 of :func:`select_topk`: the ``selected`` largest keys of each segment of each live
    row of ``keys_ptr`` (int64 ``[num_rows, >= width]``, unit column stride; ``image_ptr`` the same
    memory as int32, whose odd elements are the keys' high words, little-endian), compacted in
    pool order into ``work_ptr`` (int64 ``[num_rows, >= segments * selected]``: segment ``s`` at
    ``s * selected``). A row is ``segments`` segments of ``segment_width`` keys (the last may hold
    fewer, at least ``selected``); tile = (row, segment). Row ``i`` is batch row ``row_start + i``;
    rows at or past ``T_live`` are skipped."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    col = tl.arange(0, NT * T)                                             # pool ids (1-D: one-level reductions)
    part = tl.arange(0, CHUNK)
    live = tl.minimum(num_rows, tl.load(cum_query_lens_ptr + num_requests - 1) - row_start)
    for tile in range(pid, live * segments, nprog):
        i = tile // segments
        first = (tile - i * segments) * segment_width
        lanes = tl.minimum(segment_width, width - first)                   # this segment's keys
        keys_row = keys_ptr + tl.cast(i, tl.int64) * stride_keys_t + first
        image_row = image_ptr + (tl.cast(i, tl.int64) * stride_keys_t + first) * 2 + 1
        # The row's images stay in registers for the counting passes (read once).
        image = tl.load(image_row + 2 * col, mask=col < lanes, other=INT32_MIN_C)
        # v = the largest int32 with #(image >= v) >= selected, bit by bit from the sign bit;
        # at_v = #(image >= v).
        at_v = _count(image >= 0)
        v = tl.where(at_v >= selected, 0, INT32_MIN_C)
        at_v = tl.where(at_v >= selected, at_v, lanes)
        # Every later candidate has v's sign, so the images are clamped to v's half (-1 or 0 at
        # its edge: no compare against v or a candidate changes). Then image - cand cannot
        # overflow, and #(image >= cand) = lanes + sum((image - cand) >> 31): a subtract and a
        # shift a lane, no compare-and-select (H200, 2048 rows: 5 % off the select).
        image = tl.where(v >= 0, tl.maximum(image, -1), tl.minimum(image, 0))
        for b in range(0, 31):
            # once exactly `selected` images reach v, v separates them from the rest: the lower
            # bits change nothing that is chosen (random rows: ~12 of the 31 passes skipped)
            if at_v != selected:
                cand = v | (1 << (30 - b))
                n = NT * T + int32_of(tl.sum((image - cand) >> 31))
                v = tl.where(n >= selected, cand, v)
                at_v = tl.where(n >= selected, n, at_v)
        # Ties at v beyond the K-th: keep the largest low words (0xFFFFFFFF - pool: the lowest
        # ids), as many as need. u = the largest int32 with #(tie & low >= u) >= need, low being
        # the low word with its sign bit flipped (unsigned order as signed), bit by bit again;
        # skipped when every pool at v is selected (at_v == selected: no tie crosses the K-th
        # place), u then INT32_MIN: every tie kept.
        u = INT32_MIN_C
        if at_v > selected:
            need = selected - _count(image > v)
            tie = (image == v) & (col < lanes)
            # INT32_MIN off the ties: never counted, since every candidate is above it
            low = tl.where(tie, tl.load(image_row - 1 + 2 * col, mask=tie, other=0) ^ INT32_MIN_C, INT32_MIN_C)
            at_u = _count(low >= 0)
            u = tl.where(at_u >= need, 0, INT32_MIN_C)
            at_u = tl.where(at_u >= need, at_u, NT * T)
            for b in range(0, 31):
                if at_u != need:     # as above: u already separates the kept ties
                    cand = u | (1 << (30 - b))
                    n = _count(low >= cand)
                    u = tl.where(n >= need, cand, u)
                    at_u = tl.where(n >= need, n, at_u)
        # Compaction: exactly `selected` keys are chosen (image > v, or image == v and low >= u);
        # each goes to its exclusive prefix count, CHUNK lanes at a time (a short scan each, keys
        # and images read again from the cache-resident row), until all are placed.
        work_row = work_ptr + tl.cast(i, tl.int64) * stride_work_t + (tile - i * segments) * selected
        placed = 0
        for c in range(0, tl.cdiv(lanes, CHUNK)):
            if placed < selected:
                lane = c * CHUNK + part
                image_c = tl.load(image_row + 2 * lane, mask=lane < lanes, other=INT32_MIN_C)
                key = tl.load(keys_row + lane, mask=(lane < lanes) & (image_c >= v), other=0)
                low_c = (key & 0xFFFFFFFF).to(tl.int32) ^ INT32_MIN_C
                chosen = (lane < lanes) & ((image_c > v) | ((image_c == v) & (low_c >= u)))
                slot = placed + int32_of(tl.cumsum(tl.where(chosen, 1, 0), axis=0)) - 1
                # (slot < selected: only keys that are not unique could choose more; never written past the row)
                tl.store(work_row + slot, key, mask=chosen & (slot < selected))
                placed += _count(chosen)


@triton.jit(do_not_specialize=["stride_work_t", "stride_out_t", "num_requests", "row_start", "num_rows",
                                "candidates", "selected"])
def _order_kernel(work_ptr, stride_work_t, out_ptr, stride_out_t, cum_query_lens_ptr, num_requests,
                  row_start, num_rows, candidates, selected, KB: tl.constexpr, CH: tl.constexpr):
    """The ranking launch of :func:`select_topk`: each of a row's ``candidates`` compacted keys
    (``selected`` of them, or a split row's ``segments * selected``: the ranking then does the
    merge) whose rank, the number of the row's candidates above it (keys are unique), is below
    ``selected`` goes to ``out_ptr`` (int64 ``[num_rows, >= selected]``) at that rank. Tile = (live
    row, ``CH`` of its candidates); the row's candidates come in blocks of ``KB`` as ``[KB, CH]``
    compares summed over the block axis, which the CUDA layout keeps inside each thread (no
    shuffles; docs/kernels.md, "The top-k under Nsight Compute")."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    block = tl.arange(0, KB)
    local = tl.arange(0, CH)
    live = tl.minimum(num_rows, tl.load(cum_query_lens_ptr + num_requests - 1) - row_start)
    chunks = tl.cdiv(candidates, CH)
    for tile in range(pid, live * chunks, nprog):
        i = tile // chunks
        mine = (tile - i * chunks) * CH + local
        work = work_ptr + tl.cast(i, tl.int64) * stride_work_t
        key = tl.load(work + mine, mask=mine < candidates, other=0)
        rank = tl.zeros([CH], dtype=tl.int32)
        for b in range(0, tl.cdiv(candidates, KB)):
            j = b * KB + block
            # past `candidates`: INT64_MIN, above no key (a key equal to it is not above it either)
            above = tl.load(work + j, mask=j < candidates, other=INT64_MIN_C)
            rank += int32_of(tl.sum(tl.where(above[:, None] > key[None, :], 1, 0), axis=0))
        tl.store(out_ptr + tl.cast(i, tl.int64) * stride_out_t + rank, key,
                 mask=(mine < candidates) & (rank < selected))


def select_topk(keys: torch.Tensor, selected: int, *, out=None, work=None, cum_query_lens=None, row_start: int = 0,
                launch_options=None) -> torch.Tensor:
    """The ``selected`` largest keys of every row, in descending order: the canonical top-k.

    Args:
        keys: int64 ``[rows, n]`` selection keys (unique per row), unit column stride.
        selected: keys to keep, ``0 <= selected <= n`` (``min(K_pool, max_pool_seq_len)``).
        out: optional int64 ``[>= rows, selected]`` result buffer (unit column stride); rows
            ``>= rows`` are untouched.
        work: optional int64 ``[>= rows, >= selected]`` compaction buffer (unit column stride); a
            row split into ``S`` segments (``kpool.ops.plan.topk_plans``) needs ``S * selected``
            columns, ``(S + 1) * selected`` when a launch merges them, so a narrower buffer splits
            rows into fewer segments (none at ``selected`` columns). ``kpool.ops.plan.topk_plans(...).work_width`` gives the width.
        cum_query_lens: optional int32 ``[R]`` exclusive query ends: rows ``i`` with
            ``row_start + i >= cum_query_lens[R - 1]`` (read on the device) are skipped and their
            ``out`` rows left as they were; ``None``: every row is selected.
        row_start: batch row of ``keys[0]`` (with ``cum_query_lens``).
        launch_options: Triton launch kwargs; default from ``kpool.ops.plan``.

    Returns:
        int64 ``[rows, selected]`` keys (``out[:rows]`` when given).

    Raises:
        KPoolShapeError: ``keys`` not 2-D, ``selected`` outside ``[0, n]``, or buffers too small.
        KPoolDtypeError: keys or buffers not int64.
    """
    if keys.dim() != 2 or not 0 <= selected <= keys.shape[1]:
        raise KPoolShapeError(f"cannot select {selected} of keys {tuple(keys.shape)}")
    rows, width = keys.shape
    for name, buf in (("keys", keys), ("out", out), ("work", work)):
        if buf is None:
            continue
        if buf.dtype != torch.int64:
            raise KPoolDtypeError(f"select_topk {name} must be int64, got {buf.dtype}")
        if name != "keys" and (buf.dim() != 2 or buf.shape[0] < rows or buf.shape[1] < selected):
            raise KPoolShapeError(f"select_topk {name} {tuple(buf.shape)} cannot hold [{rows}, {selected}]")
        if buf.numel() > 1 and buf.stride(1) != 1 and buf.shape[1] > 1:
            raise KPoolShapeError(f"select_topk {name} needs a unit column stride, got {buf.stride()}")
    if out is None:
        out = torch.empty((rows, selected), dtype=torch.int64, device=keys.device)
    result = out[:rows, :selected]
    if rows == 0 or selected == 0:
        return result
    # a given work buffer bounds the segments (their candidates, and the merged keys when a launch merges)
    plans = launch_plan.topk_plans(rows, width, selected, keys.device, launch_options,
                                   work_columns=None if work is None else work.shape[1])
    if plans is None:     # outside the register tiles: the same keys, sorted (every row: no host read of T_live)
        result.copy_(torch.topk(keys, selected, dim=1, largest=True, sorted=True).values)
        return result
    if work is None:
        work = torch.empty((rows, plans.work_width), dtype=torch.int64, device=keys.device)
    if cum_query_lens is None:
        cum_query_lens, row_start = torch.full((1,), rows, dtype=torch.int32, device=keys.device), 0
    cum_query_lens = cum_query_lens.contiguous()
    R = int(cum_query_lens.shape[0])
    if R == 0:                               # no request: no live row
        return result
    select, order = plans.select, plans.order
    _select_kernel[(select.grid,)](keys, keys.view(torch.int32), keys.stride(0), work, work.stride(0), cum_query_lens,
                                   R, row_start, rows, width, selected, plans.segments, plans.segment_width,
                                   **select.constexprs, **select.options)
    if plans.merge is not None:        # the row's K largest among its segments' (candidates: work[:, :S * K])
        merged = work[:, plans.segments * selected:]
        _select_kernel[(plans.merge.grid,)](work, work.view(torch.int32), work.stride(0), merged, merged.stride(0),
                                            cum_query_lens, R, row_start, rows, plans.segments * selected, selected,
                                            1, plans.segments * selected, **plans.merge.constexprs,
                                            **plans.merge.options)
        work = merged
    _order_kernel[(order.grid,)](work, work.stride(0), result, result.stride(0), cum_query_lens, R, row_start, rows,
                                 plans.candidates, selected, **order.constexprs, **order.options)
    return result


def canonical_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys of sanitized fp32 scores ``[rows, n]`` (pool id = column), as the kernels
    write them: ``(image(score) << 32) | (0xFFFFFFFF - j)``. NaN and values ``<= LOWEST`` map to
    LOWEST's image, values ``> FLT_MAX`` to FLT_MAX's, ``-0.0`` to ``+0.0``'s (§4.3)."""
    s = scores.to(torch.float32)
    s = torch.where(torch.isnan(s) | (s <= LOWEST), torch.full_like(s, LOWEST), s)
    s = torch.where(s > FLT_MAX, torch.full_like(s, FLT_MAX), s)
    s = torch.where(s == 0, torch.zeros_like(s), s)
    bits = s.contiguous().view(torch.int32)
    image = torch.where(bits < 0, -1 - (bits & 0x7FFFFFFF), bits).to(torch.int64)
    pools = torch.arange(s.shape[-1], dtype=torch.int64, device=s.device)
    return (image << 32) | (0xFFFFFFFF - pools)


def key_pool_ids(keys: torch.Tensor) -> torch.Tensor:
    """int32 pool ids of int64 keys (their low word is ``0xFFFFFFFF - pool``)."""
    return (0xFFFFFFFF - (keys & 0xFFFFFFFF)).to(torch.int32)


def key_valid(keys: torch.Tensor) -> torch.Tensor:
    """bool: the key's score is above LOWEST (a selectable pool, §4.3)."""
    return (keys >> 32) > KEY_LOWEST


def key_scores(keys: torch.Tensor) -> torch.Tensor:
    """fp32 sanitized scores of int64 keys (the inverse of the image; ``-0.0`` never occurs)."""
    image = (keys >> 32).to(torch.int32)
    bits = torch.where(image < 0, (-1 - image) | INT32_MIN, image)
    return bits.contiguous().view(torch.float32)
