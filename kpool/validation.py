"""Input validation of one KPool forward (kpool-algorithm.md §2, §3, §4.6, §5.4, §6;
parity-contract.md §5).

Everything is checked before any kernel launch; on failure a named :mod:`kpool.errors`
exception is raised (its ``rule`` names the rule of :data:`kpool.rules.RULES`) and nothing has
been written. Order: Python scalars, tensor types/dtypes/shapes/strides/device (no sync),
memory aliasing (:mod:`kpool.aliasing`, no sync), then the metadata values
(:mod:`kpool.metadata_checks`, one host copy of the metadata, i.e. one device sync). Pass
``validate=False`` to ``kpool.indexer.forward`` on the serving path or inside a captured graph,
where the kernels' own guards (no write for out-of-range slots, padded rows, negative positions)
still hold.
"""
from __future__ import annotations

import torch

from .aliasing import check_no_aliasing
from .config import SCORE_MODES
from .metadata_checks import check_metadata_values
from .rules import as_bool, as_int, reject


def _dtype(name: str, t, *allowed: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        reject("tensor-type", f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in allowed:
        want = " or ".join(str(a).replace("torch.", "") for a in allowed)
        reject("dtype", f"{name} must be {want}, got {str(t.dtype).replace('torch.', '')}")


def _shape(name: str, t: torch.Tensor, shape: tuple) -> None:
    """``shape`` entries of ``None`` match any size."""
    ok = t.dim() == len(shape) and all(s is None or s == n for s, n in zip(shape, t.shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        reject("shape", f"{name} must have shape {want}, got {list(t.shape)}")


def _check_scalars(*, index_kpool, index_topk, score_mode, compute_topk, pack_tail, max_pool_seq_len,
                   always_select_tail=True, max_query_len=None) -> None:
    """Python scalars: the kernels receive them as they are, so ints must be Python ints."""
    P = as_int("index_kpool", index_kpool, python_only=True)
    if P < 1:
        reject("index-kpool-positive", f"index_kpool must be a positive int, got {P}")
    K_tok = as_int("index_topk", index_topk, python_only=True)
    if K_tok < 1 or K_tok % P != 0:
        reject("index-topk-multiple", "KPool top-k must be divisible by its positive pool size: "
                                      f"index_topk={K_tok}, index_kpool={P}")
    if not isinstance(score_mode, str) or score_mode not in SCORE_MODES:
        reject("score-mode", f"score_mode must be one of {SCORE_MODES}, got {score_mode!r}")
    as_bool("compute_topk", compute_topk)
    as_bool("pack_tail", pack_tail)
    as_bool("always_select_tail", always_select_tail)
    as_int("max_pool_seq_len", max_pool_seq_len, python_only=True)
    if max_query_len is not None and as_int("max_query_len", max_query_len, python_only=True) < 0:
        reject("max-query-len-range", f"max_query_len must be None or an int >= 0, got {max_query_len}")


def _check_output_buffer(output_buffer, T: int, W: int) -> None:
    _dtype("output_buffer", output_buffer, torch.int32)
    if output_buffer.dim() != 2 or output_buffer.shape[0] < T or output_buffer.shape[1] < W:
        reject("output-buffer-shape", f"output_buffer must be [>= {T}, >= {W}], got {list(output_buffer.shape)}")
    if output_buffer.stride(1) != 1:
        reject("output-buffer-column-stride", "output_buffer must have unit column stride")
    if T > 1 and output_buffer.stride(0) < output_buffer.shape[1]:
        # every written row is written over the buffer's full width: rows must not overlap
        reject("output-buffer-row-overlap", f"output_buffer rows overlap: row stride {output_buffer.stride(0)} < "
                                            f"width {output_buffer.shape[1]}")


def validate_forward(*, k, gate, q, weights, ape, compressed_cache, tail_cache, positions,
                     cum_query_lens, raw_seq_lens, seq_lens, block_table, slot_mapping,
                     tail_block_table, tail_slot_mapping, max_pool_seq_len, index_topk,
                     index_kpool, score_mode, compute_topk, output_buffer, pack_tail=True,
                     always_select_tail=True, max_query_len=None) -> int:
    """Check every tensor and metadata value of a forward.

    Shapes (``T`` rows, ``R`` requests, ``M`` pages per request, ``N`` pages, ``B`` pools per
    page, ``C`` ring rows, ``H`` heads, ``D`` head dim, ``P`` pool size, ``W = K_tok + P - 1``, or
    ``K_tok`` with ``always_select_tail=False``):
    k, gate fp32 ``[T, D]``; q bf16 ``[T, H, D]`` and weights fp32/bf16 ``[T, H]`` (only when
    ``compute_topk``); ape fp32 ``[P, D]``; compressed_cache bf16 ``[N, B, 1, D]``; tail_cache fp32
    ``[blocks, 2, C >= P, D]``; positions int64 ``[T]``; cum_query_lens, raw_seq_lens, seq_lens int32
    ``[R]``; block_table int32 ``[R, M]``; slot_mapping, tail_slot_mapping int64 ``[T]``;
    tail_block_table int32 ``[R, >= 1]``; output_buffer int32 ``[>= T, >= W]`` with unit column stride
    and rows that do not overlap (row stride >= width).

    Scalars: ``index_kpool``, ``index_topk``, ``max_pool_seq_len`` Python ints (not bools, not
    numpy integers: they reach the kernels as they are); ``compute_topk``, ``pack_tail`` bools;
    ``index_kpool > 0`` and ``index_topk % index_kpool == 0``; ``max_query_len`` ``None`` or a
    Python int at least every request's query length (a launch hint, §6).

    Aliasing (:mod:`kpool.aliasing`): neither cache nor ``output_buffer[:T]`` overlaps itself or
    any other tensor argument; read-only tensors may share memory with each other.

    Metadata values (:mod:`kpool.metadata_checks`): ``cum_query_lens`` non-decreasing, ``>= 0`` and
    ``cum[R-1] <= T``; ``0 <= query_len <= raw_seq_lens``; ``seq_lens == raw_seq_lens // P`` (pool
    lengths, not raw lengths: pitfall §9.2); ``0 <= max(seq_lens) <= max_pool_seq_len <= M * B``;
    live positions contiguous per request (``positions[qs + i] = raw - ql + i``) and
    ``< INT32_MAX - P``; block ids of every page a request can read in ``[0, N)``; ring blocks of
    requests with queries in ``[0, blocks)`` and owned by one such request; live ``slot_mapping``
    exactly the §3.2 slot (``block_table[r, j // B] * B + j % B`` on a row completing pool ``j``,
    else ``-1``) and never written twice; live ``tail_slot_mapping`` exactly
    ``tail_block_table[r, 0] * C + p % C`` (§3.3). Padding rows are not checked (stale ring slots
    are legal there, §6 FULL mode).

    Returns:
        ``T_live = cum_query_lens[-1]`` (0 when ``R == 0``).
    Raises:
        KPoolTypeError, KPoolConfigError, KPoolDtypeError, KPoolShapeError, KPoolAliasingError,
        KPoolMetadataError, KPoolBlockIdError, KPoolWriteConflictError, KPoolSlotMappingError
        (the rule of each: :data:`kpool.rules.RULES`).
    """
    _check_scalars(index_kpool=index_kpool, index_topk=index_topk, score_mode=score_mode,
                   compute_topk=compute_topk, pack_tail=pack_tail, max_pool_seq_len=max_pool_seq_len,
                   always_select_tail=always_select_tail, max_query_len=max_query_len)
    P = index_kpool
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
        reject("ring-capacity", f"tail ring capacity C={C} must be >= index_kpool P={P}")
    if compressed_cache.stride(3) != 1 or tail_cache.stride(3) != 1:
        reject("cache-inner-stride", "the head-dim stride of both caches must be 1")
    if N == 0 or B == 0 or blocks == 0:
        reject("cache-empty", "caches must not be empty")
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
        reject("tail-block-table-columns", "tail_block_table needs at least one column")
    M = block_table.shape[1]
    read = dict(k=k, gate=gate, ape=ape, positions=positions, cum_query_lens=cum_query_lens,
                raw_seq_lens=raw_seq_lens, seq_lens=seq_lens, block_table=block_table,
                slot_mapping=slot_mapping, tail_block_table=tail_block_table,
                tail_slot_mapping=tail_slot_mapping)
    written = dict(compressed_cache=compressed_cache, tail_cache=tail_cache)
    if compute_topk:
        _dtype("q", q, torch.bfloat16)
        _dtype("weights", weights, torch.float32, torch.bfloat16)
        _shape("q", q, (T, None, D))
        _shape("weights", weights, (T, q.shape[1]))
        if q.shape[1] < 1:
            reject("q-heads", "q needs at least one head")
        read.update(q=q, weights=weights)
        if output_buffer is not None:
            _check_output_buffer(output_buffer, T, index_topk + (P - 1 if always_select_tail else 0))
            written["output_buffer"] = output_buffer[:T]
    devices = {t.device for t in (*read.values(), *written.values())}
    if len(devices) != 1:
        reject("one-device", f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if max_pool_seq_len < 0 or max_pool_seq_len > M * B:
        reject("max-pool-seq-len-range", f"max_pool_seq_len={max_pool_seq_len} must be in [0, M*B={M * B}]")

    check_no_aliasing(written, read)
    return check_metadata_values(
        positions=positions, cum_query_lens=cum_query_lens, raw_seq_lens=raw_seq_lens, seq_lens=seq_lens,
        block_table=block_table, slot_mapping=slot_mapping, tail_block_table=tail_block_table,
        tail_slot_mapping=tail_slot_mapping, max_pool_seq_len=max_pool_seq_len, index_kpool=P,
        num_pages=N, page_size=B, num_tail_blocks=blocks, ring_capacity=C, max_query_len=max_query_len)
