"""Input validation of one KPool forward (kpool-algorithm.md §2, §3, §4.6; parity-contract.md §5).

Everything is checked before any kernel launch; on failure a named :mod:`kpool.errors`
exception is raised and nothing has been written. The value checks read the (small) metadata
tensors on the host, so they synchronise with the device; pass ``validate=False`` to
``kpool.indexer.forward`` inside a captured graph, where the kernels' own guards (no write for
out-of-range slots, padded rows, negative positions) still hold.
"""
from __future__ import annotations

import torch

from .errors import (KPoolBlockIdError, KPoolConfigError, KPoolDtypeError, KPoolMetadataError,
                     KPoolShapeError)
from .config import SCORE_MODES

_INT32_LIMIT = 2 ** 31


def _dtype(name: str, t: torch.Tensor, *allowed: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        raise KPoolDtypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in allowed:
        want = " or ".join(str(a).replace("torch.", "") for a in allowed)
        raise KPoolDtypeError(f"{name} must be {want}, got {str(t.dtype).replace('torch.', '')}")


def _shape(name: str, t: torch.Tensor, shape: tuple) -> None:
    """``shape`` entries of ``None`` match any size."""
    ok = t.dim() == len(shape) and all(s is None or s == n for s, n in zip(shape, t.shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise KPoolShapeError(f"{name} must have shape {want}, got {list(t.shape)}")


def validate_forward(*, k, gate, q, weights, ape, compressed_cache, tail_cache, positions,
                     cum_query_lens, raw_seq_lens, seq_lens, block_table, slot_mapping,
                     tail_block_table, tail_slot_mapping, max_pool_seq_len, index_topk,
                     index_kpool, score_mode, compute_topk, output_buffer) -> int:
    """Check every tensor and metadata value of a forward.

    Shapes (``T`` rows, ``R`` requests, ``M`` pages per request, ``N`` pages, ``B`` pools per
    page, ``C`` ring rows, ``H`` heads, ``D`` head dim, ``P`` pool size, ``W = K_tok + P - 1``):
    k, gate fp32 ``[T, D]``; q bf16 ``[T, H, D]`` and weights fp32/bf16 ``[T, H]`` (only when
    ``compute_topk``); ape fp32 ``[P, D]``; compressed_cache bf16 ``[N, B, 1, D]``; tail_cache fp32
    ``[blocks, 2, C >= P, D]``; positions int64 ``[T]``; cum_query_lens, raw_seq_lens, seq_lens int32
    ``[R]``; block_table int32 ``[R, M]``; slot_mapping, tail_slot_mapping int64 ``[T]``;
    tail_block_table int32 ``[R, >= 1]``; output_buffer int32 ``[>= T, >= W]`` with unit column stride
    and rows that do not overlap (row stride >= width).

    Value rules: ``index_kpool > 0`` and ``index_topk % index_kpool == 0``; ``cum_query_lens``
    non-decreasing, ``>= 0`` and ``cum[R-1] <= T``; ``0 <= query_len <= raw_seq_lens``;
    ``seq_lens == raw_seq_lens // P`` (pool lengths, not raw lengths: pitfall §9.2);
    ``0 <= max(seq_lens) <= max_pool_seq_len <= M * B``; live positions contiguous per request
    (``positions[qs + i] = raw - ql + i``) and ``< 2^31 - 1 - P``; block ids of every page a request can
    read in ``[0, N)``; ring blocks of requests with queries in ``[0, blocks)``; live
    ``slot_mapping`` in ``{-1} ∪ [0, N*B)``, live ``tail_slot_mapping`` in ``{-1} ∪ [0, blocks*C)``.

    Returns:
        ``T_live = cum_query_lens[-1]`` (0 when ``R == 0``).
    Raises:
        KPoolConfigError, KPoolDtypeError, KPoolShapeError, KPoolMetadataError, KPoolBlockIdError.
    """
    P = index_kpool
    if not isinstance(P, int) or P < 1:
        raise KPoolConfigError(f"index_kpool must be a positive int, got {P!r}")
    if not isinstance(index_topk, int) or index_topk < 1 or index_topk % P != 0:
        raise KPoolConfigError(
            f"KPool top-k must be divisible by its positive pool size: index_topk={index_topk}, index_kpool={P}")
    if score_mode not in SCORE_MODES:
        raise KPoolConfigError(f"score_mode must be one of {SCORE_MODES}, got {score_mode!r}")

    _dtype("compressed_cache", compressed_cache, torch.bfloat16)
    _dtype("tail_cache", tail_cache, torch.float32)
    _dtype("k", k, torch.float32)
    _dtype("gate", gate, torch.float32)
    _dtype("ape", ape, torch.float32)
    _dtype("positions", positions, torch.int64)
    for name, t in (("cum_query_lens", cum_query_lens), ("raw_seq_lens", raw_seq_lens),
                    ("seq_lens", seq_lens), ("block_table", block_table),
                    ("tail_block_table", tail_block_table)):
        _dtype(name, t, torch.int32)
    _dtype("slot_mapping", slot_mapping, torch.int64)
    _dtype("tail_slot_mapping", tail_slot_mapping, torch.int64)

    _shape("compressed_cache", compressed_cache, (None, None, 1, None))
    N, B, _, D = compressed_cache.shape
    _shape("tail_cache", tail_cache, (None, 2, None, D))
    blocks, _, C, _ = tail_cache.shape
    if C < P:
        raise KPoolShapeError(f"tail ring capacity C={C} must be >= index_kpool P={P}")
    if compressed_cache.stride(3) != 1 or tail_cache.stride(3) != 1:
        raise KPoolShapeError("the head-dim stride of both caches must be 1")
    if N == 0 or B == 0 or blocks == 0:
        raise KPoolShapeError("caches must not be empty")
    _shape("k", k, (None, D))
    T = k.shape[0]
    _shape("gate", gate, (T, D))
    _shape("ape", ape, (P, D))
    _shape("positions", positions, (T,))
    _shape("slot_mapping", slot_mapping, (T,))
    _shape("tail_slot_mapping", tail_slot_mapping, (T,))
    _shape("cum_query_lens", cum_query_lens, (None,))
    R = cum_query_lens.shape[0]
    _shape("raw_seq_lens", raw_seq_lens, (R,))
    _shape("seq_lens", seq_lens, (R,))
    _shape("block_table", block_table, (R, None))
    _shape("tail_block_table", tail_block_table, (R, None))
    if tail_block_table.shape[1] < 1:
        raise KPoolShapeError("tail_block_table needs at least one column")
    M = block_table.shape[1]
    W = index_topk + P - 1
    if compute_topk:
        _dtype("q", q, torch.bfloat16)
        _dtype("weights", weights, torch.float32, torch.bfloat16)
        _shape("q", q, (T, None, D))
        _shape("weights", weights, (T, q.shape[1]))
        if q.shape[1] < 1:
            raise KPoolShapeError("q needs at least one head")
        if output_buffer is not None:
            _dtype("output_buffer", output_buffer, torch.int32)
            if output_buffer.dim() != 2 or output_buffer.shape[0] < T or output_buffer.shape[1] < W:
                raise KPoolShapeError(
                    f"output_buffer must be [>= {T}, >= {W}], got {list(output_buffer.shape)}")
            if output_buffer.stride(1) != 1:
                raise KPoolShapeError("output_buffer must have unit column stride")
            if T > 1 and output_buffer.stride(0) < output_buffer.shape[1]:
                # every written row is written over the buffer's full width: rows must not overlap
                raise KPoolShapeError(f"output_buffer rows overlap: row stride {output_buffer.stride(0)} < "
                                      f"width {output_buffer.shape[1]}")
    devices = {t.device for t in (k, gate, ape, compressed_cache, tail_cache, positions, cum_query_lens,
                                  raw_seq_lens, seq_lens, block_table, slot_mapping, tail_block_table,
                                  tail_slot_mapping)}
    if compute_topk:
        devices |= {q.device, weights.device} | ({output_buffer.device} if output_buffer is not None else set())
    if len(devices) != 1:
        raise KPoolShapeError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if not isinstance(max_pool_seq_len, int) or max_pool_seq_len < 0 or max_pool_seq_len > M * B:
        raise KPoolMetadataError(f"max_pool_seq_len={max_pool_seq_len!r} must be an int in [0, M*B={M * B}]")
    if R == 0:
        return 0

    cum = cum_query_lens.cpu().to(torch.int64)
    raw = raw_seq_lens.cpu().to(torch.int64)
    pools = seq_lens.cpu().to(torch.int64)
    starts = torch.cat([cum.new_zeros(1), cum[:-1]])
    qlen = cum - starts
    if int(cum[0]) < 0 or bool((qlen < 0).any()):
        raise KPoolMetadataError(f"cum_query_lens must be non-negative and non-decreasing, got {cum.tolist()}")
    t_live = int(cum[-1])
    if t_live > T:
        raise KPoolMetadataError(f"cum_query_lens[-1]={t_live} exceeds the {T} token rows")
    if bool((raw < qlen).any()):
        bad = int(torch.nonzero(raw < qlen)[0])
        raise KPoolMetadataError(f"request {bad}: raw_seq_lens={int(raw[bad])} < query length {int(qlen[bad])}")
    if not torch.equal(pools, raw // P):
        bad = int(torch.nonzero(pools != raw // P)[0])
        raise KPoolMetadataError(
            f"request {bad}: seq_lens={int(pools[bad])} must be raw_seq_lens // P = {int(raw[bad]) // P} "
            "(pool lengths, not token lengths)")
    if int(pools.max()) > max_pool_seq_len:
        raise KPoolMetadataError(f"max(seq_lens)={int(pools.max())} exceeds max_pool_seq_len={max_pool_seq_len}")

    pos = positions[:t_live].cpu()
    req = torch.repeat_interleave(torch.arange(R), qlen)
    expected = (raw - qlen)[req] + (torch.arange(t_live) - starts[req])
    if not torch.equal(pos, expected):
        bad = int(torch.nonzero(pos != expected)[0])
        raise KPoolMetadataError(
            f"row {bad}: position {int(pos[bad])} != {int(expected[bad])} (positions must be contiguous per request)")
    if t_live and int(pos.max()) + P >= _INT32_LIMIT - 1:
        # the kernels' int32 window arithmetic needs p + P < 2^31 - 1 (kpool/ops/compress.py)
        raise KPoolMetadataError(f"positions must be < 2^31 - 1 - P = {_INT32_LIMIT - 1 - P}, "
                                 f"got {int(pos.max())}")

    table = block_table.cpu().to(torch.int64)
    pages_used = (pools + B - 1) // B
    cols = torch.arange(M)[None, :]
    read = cols < pages_used[:, None]
    bad_pages = read & ((table < 0) | (table >= N))
    if bool(bad_pages.any()):
        r, m = (int(v) for v in torch.nonzero(bad_pages)[0])
        raise KPoolBlockIdError(f"block_table[{r}, {m}] = {int(table[r, m])} is outside the {N} compressed pages")
    ring = tail_block_table[:, 0].cpu().to(torch.int64)
    bad_ring = (qlen > 0) & ((ring < 0) | (ring >= blocks))
    if bool(bad_ring.any()):
        r = int(torch.nonzero(bad_ring)[0])
        raise KPoolBlockIdError(f"tail_block_table[{r}, 0] = {int(ring[r])} is outside the {blocks} ring blocks")
    for name, slots, limit in (("slot_mapping", slot_mapping, N * B), ("tail_slot_mapping", tail_slot_mapping, blocks * C)):
        live = slots[:t_live].cpu()
        bad = (live < -1) | (live >= limit)
        if bool(bad.any()):
            t = int(torch.nonzero(bad)[0])
            raise KPoolBlockIdError(f"{name}[{t}] = {int(live[t])} is outside [-1, {limit})")
    return t_live
