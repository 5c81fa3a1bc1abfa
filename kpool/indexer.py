"""Orchestration of one KPool indexer forward (kpool-algorithm.md §4-§7).

``forward`` validates, updates both caches (compression, then the ring write), and unless
``compute_topk=False`` scores pools, selects the top-k in canonical order, expands pool ids to
token ids with the causal tail, and masks padding rows. The kernels live in :mod:`kpool.ops`
and are imported on first use (never at ``import kpool``).
"""
from __future__ import annotations

import sys

import torch

from .errors import KPoolShapeError
from .validation import validate_forward

SCORE_SCRATCH_BYTES = 256 * 2 ** 20
"""Upper bound of the score scratch (rows x max_pool_seq_len int64 keys, 8 B each), §4.6."""


def forward(*, k, gate, q, weights, ape, compressed_cache, tail_cache, positions, cum_query_lens,
            raw_seq_lens, seq_lens, block_table, slot_mapping, tail_block_table, tail_slot_mapping,
            max_pool_seq_len: int, index_topk: int, index_kpool: int, score_mode: str = "relu",
            pack_tail: bool = True, compute_topk: bool = True, output_buffer=None,
            validate: bool = True, max_score_rows: int | None = None, always_select_tail: bool = True,
            max_query_len: int | None = None):
    """One KPool indexer forward on the production Triton kernels.

    Args (shapes as in :func:`kpool.validation.validate_forward`):
        k, gate: fp32 ``[T, D]`` raw keys / gate logits of this step's rows.
        q: bf16 ``[T, H, D]``; weights: fp32 or bf16 ``[T, H]`` (unused when ``compute_topk=False``).
        ape: fp32 ``[P, D]``.
        compressed_cache: bf16 ``[N, B, 1, D]``, updated in place (§5.3).
        tail_cache: fp32 ``[blocks, 2, C, D]``, updated in place (§5.4).
        positions ... tail_slot_mapping, max_pool_seq_len: :class:`kpool.metadata.KPoolMetadata` fields.
        index_topk, index_kpool: ``K_tok`` and ``P``.
        score_mode: ``"relu"`` or ``"merged"`` (§4.2).
        pack_tail: packed (default) or fixed tail column (§4.5).
        compute_topk: ``False`` = cache-only update, returns ``None`` (§5.5).
        output_buffer: optional int32 ``[>= T, >= W]`` caller buffer (unit column stride): rows
            ``< T`` are written (columns ``>= W`` set to -1), rows ``>= T`` untouched.
        validate: run :func:`validate_forward` first (host sync). With ``False`` the forward makes
            no device-to-host copy and no host decision on device data (the kernels read
            ``T_live = cum_query_lens[R - 1]`` and the request bounds themselves; every launch is
            sized from shapes and host ints), so it can be captured in a CUDA/NPU graph and
            replayed with the metadata rewritten in place (FULL mode). The caller then guarantees
            valid metadata: the kernels still skip out-of-range slots and ring blocks, but trust
            ``cum_query_lens`` and ``positions`` to lie within the tensors.
        max_score_rows: force token chunking of the score scratch (results are chunk-invariant).
        always_select_tail: append the causal tail (default, every serving implementation);
            ``False`` is HF's ``index_kpool_always_select_tail=False`` (kpool-algorithm.md §10):
            history columns only, ``W = K_tok``.
        max_query_len: host int, at least every request's query length this step (the serving
            engine's ``max_query_len``; :attr:`kpool.metadata.KPoolMetadata.max_query_len`), or
            ``None``. A launch hint: a batch whose requests have at most ``DECODE_ROWS`` rows
            (decode, MTP verify) skips the prefill score kernel and its helper, whatever ``T``,
            and one of at most ``C - P + 1`` rows (any at ``P = 1``) runs the two cache launches as one.
            Checked when ``validate`` (rule ``max-query-len-range``); trusted otherwise, like the
            rest of the metadata. The result does not depend on it.

    Launches: compression, ring write (one launch for both when ``max_query_len <= C - P + 1``),
    then per score chunk (one for scratch-sized batches) the decode score kernel, the prefill
    score kernel and its row-block helper (only when ``T > DECODE_ROWS`` and ``max_query_len``,
    when given, exceeds it: no request is long enough otherwise), the two top-k kernels, then the
    expansion: 8 launches, 6 for ``T <= 8``, 5 for a hinted decode or MTP batch (plus the head
    merge in mode (M), and a merge launch for a split top-k row). Launch
    plans are cached per shape (:mod:`kpool.ops.plan`), so the host work per forward does not grow
    with the batch.

    Returns:
        int32 ``[T, 1, W]`` token ids (``output_buffer[:T, :W]`` viewed as ``[T, 1, W]`` when given),
        or ``None`` when ``compute_topk=False``.

    Raises:
        The :mod:`kpool.errors` exceptions of :func:`validate_forward`, before any launch;
        KPoolShapeError when the output or top-k buffers cannot be allocated (before any launch).
    """
    P = index_kpool
    T = k.shape[0] if isinstance(k, torch.Tensor) else 0
    if validate:
        validate_forward(
            k=k, gate=gate, q=q, weights=weights, ape=ape, compressed_cache=compressed_cache,
            tail_cache=tail_cache, positions=positions, cum_query_lens=cum_query_lens,
            raw_seq_lens=raw_seq_lens, seq_lens=seq_lens, block_table=block_table,
            slot_mapping=slot_mapping, tail_block_table=tail_block_table,
            tail_slot_mapping=tail_slot_mapping, max_pool_seq_len=max_pool_seq_len,
            index_topk=index_topk, index_kpool=P, score_mode=score_mode, compute_topk=compute_topk,
            pack_tail=pack_tail, output_buffer=output_buffer, always_select_tail=always_select_tail,
            max_query_len=max_query_len)
    # after validation: a non-int index_topk is a named error, not a TypeError
    W = index_topk + (P - 1 if always_select_tail else 0)
    compress_ops, indexer_ops, plan_ops = _ops()

    R = int(cum_query_lens.shape[0])
    # Every buffer of the top-k path is allocated before the first launch: an impossible size
    # (say a huge index_topk) fails here, with the caches untouched.
    if compute_topk:
        selected = min(index_topk // P, max_pool_seq_len) if T > 0 and R > 0 else 0
        rows_per_chunk = plan_ops.score_scratch_rows(max_pool_seq_len, SCORE_SCRATCH_BYTES, max_score_rows)
        chunk_rows = min(rows_per_chunk, T)
        # a batch of fewer rows than cores splits the top-k's rows: its work rows hold the candidates
        plans = plan_ops.topk_plans(chunk_rows, max_pool_seq_len, selected, k.device) if selected > 0 else None
        out, top_keys, top_index, scratch = _allocate(k.device, T, W, selected, max_pool_seq_len, chunk_rows,
                                                      output_buffer, plans.work_width if plans else selected)
    compress_ops.compress_and_write_cache(
        k=k, gate=gate, ape=ape, compressed_cache=compressed_cache, tail_cache=tail_cache,
        positions=positions, cum_query_lens=cum_query_lens, raw_seq_lens=raw_seq_lens,
        slot_mapping=slot_mapping, tail_block_table=tail_block_table,
        tail_slot_mapping=tail_slot_mapping, index_kpool=P, max_query_len=max_query_len)
    if not compute_topk:
        return None
    if T == 0:
        return out[:, :W].unsqueeze(1)
    if selected > 0:
        for row_start in range(0, T, rows_per_chunk):
            n = min(rows_per_chunk, T - row_start)
            keys = indexer_ops.score_keys(
                q=q, weights=weights, compressed_cache=compressed_cache, positions=positions,
                cum_query_lens=cum_query_lens, seq_lens=seq_lens, block_table=block_table,
                max_pool_seq_len=max_pool_seq_len, index_kpool=P, score_mode=score_mode,
                row_start=row_start, num_rows=n, keys=scratch, max_query_len=max_query_len)
            indexer_ops.select_topk(keys, selected, out=top_keys[row_start:row_start + n], work=top_index,
                                    cum_query_lens=cum_query_lens, row_start=row_start)
    indexer_ops.expand_indices(
        top_keys=top_keys, positions=positions, cum_query_lens=cum_query_lens, index_topk=index_topk,
        index_kpool=P, pack_tail=pack_tail, out=out, always_select_tail=always_select_tail)
    return out[:, :W].unsqueeze(1)


_COMPRESS, _INDEXER, _PLAN = (f"{__package__}.ops.{name}" for name in ("compress", "indexer", "plan"))


def _ops():
    """``(kpool.ops.compress, kpool.ops.indexer, kpool.ops.plan)``: imported on the first forward (never
    at ``import kpool``), then read from ``sys.modules`` (an import statement per forward costs
    microseconds). Their attributes are read at each call, so a test may still replace a step
    (``kpool.ops.indexer.score_keys``)."""
    modules = sys.modules
    try:
        return modules[_COMPRESS], modules[_INDEXER], modules[_PLAN]
    except KeyError:
        from .ops import compress as compress_ops
        from .ops import indexer as indexer_ops
        from .ops import plan as plan_ops
        return compress_ops, indexer_ops, plan_ops


def _allocate(device, T: int, W: int, selected: int, max_pool_seq_len: int, chunk_rows: int, output_buffer,
              work_width: int):
    """The top-k path's buffers: ``(out [T, >= W] int32, top_keys [T, selected] int64, top_index
    [chunk_rows, work_width] int64 (the top-k's compaction rows, ``select_topk(work=)``: ``selected``
    columns, more for split rows, ``kpool.ops.plan.TopkPlans.work_width``), scratch [chunk_rows,
    max_pool_seq_len] int64 keys or None)`` with ``selected = min(K_pool, max_pool_seq_len)``
    (kpool-algorithm.md §4.4). Sizes are host ints (shapes), never device data.

    Raises:
        KPoolShapeError: a buffer cannot be allocated (e.g. an absurd ``index_topk``).
    """
    try:
        out = output_buffer[:T] if output_buffer is not None else torch.empty((T, W), dtype=torch.int32, device=device)
        top_keys = torch.empty((T, selected), dtype=torch.int64, device=device)
        top_index = torch.empty((chunk_rows if selected else 0, work_width), dtype=torch.int64, device=device)
        scratch = (torch.empty((chunk_rows, max_pool_seq_len), dtype=torch.int64, device=device)
                   if selected > 0 else None)
    except RuntimeError as exc:   # torch.OutOfMemoryError and the CPU allocator's error
        raise KPoolShapeError(f"cannot allocate the top-k buffers for T={T} rows of width W={W} "
                              f"({selected} pools each): {exc}") from exc
    return out, top_keys, top_index, scratch
