"""Score mode (M) helpers (kpool-algorithm.md §4.2 (M), §11): the head merge ``qbar = sum_h w_h q_h``
in the reference's order, its exact three-part bf16 split that the score kernels use as three
heads without ReLU, and the exact fallback for tiles holding a non-finite value.

Imports Triton; import it only after ``kpool.platform.resolve_device()``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import plan as launch_plan
from ._portable import bf16_bits_to_f32, int32_of, load_weight_f32, split_bf16x3

TINY_QBAR = tl.constexpr(2.0 ** -46)
QBAR_SCALE = tl.constexpr(2.0 ** 64)
QBAR_UNSCALE = tl.constexpr(2.0 ** -64)


@triton.jit
def merged_needs_exact(key_tile, nonfinite_ptrs, DOT_F32: tl.constexpr):
    """Mode (M): whether a tile needs the exact fallback: a NaN or infinite key element, or a
    row whose ``qbar`` has one. The three-part split multiplies its zero parts by every key
    element, and ``0 * inf`` is NaN where the reference's ``qbar_d * c_d`` is not."""
    k = key_tile.to(tl.float32)
    # Counts (exact int32 sums; triton-ascend 3.2's interpreter reduces max element by element).
    bad_key = tl.sum(tl.where(k - k == 0, 0, 1))
    bad_row = tl.sum(tl.where(tl.load(nonfinite_ptrs) != 0, 1, 0), axis=0)
    return (bad_key + bad_row) > 0


@triton.jit
def merged_exact(qbar_ptrs, cache_ptr, cells, load_ok, stride_cache_d, D, DOT_F32: tl.constexpr):
    """Mode (M) scores in the reference's own order (kpool-algorithm.md §11): ``sum_d qbar[d] *
    c[d]`` sequentially over d from 0.0 (``qbar_ptrs`` and ``cells`` broadcast to the tile's
    shape): bit for bit ``reference.numerics.pool_scores``, NaN and infinities included."""
    acc = tl.zeros_like(tl.load(qbar_ptrs) * cells.to(tl.float32))
    for d in range(D):
        qb = tl.load(qbar_ptrs + d)
        if DOT_F32:
            c = bf16_bits_to_f32(tl.load(cache_ptr + cells + d * stride_cache_d, mask=load_ok, other=0))
        else:
            c = tl.load(cache_ptr + cells + d * stride_cache_d, mask=load_ok, other=0.0).to(tl.float32)
        acc = acc + qb * c
    return acc


# H, D and the weights' dtype are runtime values (issue 20, fewer compilations): one variant per
# padded head dim DP and tile, whatever the heads, dims and weight dtype.
@triton.jit(do_not_specialize=["stride_q_t", "stride_q_h", "weights_offset", "stride_weights_t", "stride_weights_h",
                                "weight_words", "stride_split_t", "stride_split_h", "stride_qbar_t", "row_start",
                                "num_rows", "H", "D"])
def _merge_heads_kernel(
    q_ptr, stride_q_t, stride_q_h, stride_q_d,
    weights_ptr, weights_offset, stride_weights_t, stride_weights_h, weight_words,
    split_ptr, stride_split_t, stride_split_h, unit_ptr, qbar_ptr, stride_qbar_t, nonfinite_ptr, row_start, num_rows,
    H, D, DP: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):
    """Score mode (M), first half (kpool-algorithm.md §4.2 (M), §11): ``qbar[t, d] = sum_h
    w[t, h] * q[t, h, d]`` sequentially over h from 0.0, the reference's order bit for bit, for
    the rows ``[row_start, row_start + num_rows)``; stored as its exact three-part bf16 split
    (``split[t, k, d]``, k = hi, mid, lo; int16 bits, :func:`split_bf16x3`), which the score
    kernels use as three heads without ReLU, weighted by ``unit[t, k]`` (1.0, or 2^-64 for a
    row split scaled by 2^64): ``qbar . c = hi . c + mid . c + lo . c`` with exact bf16 products.
    ``qbar`` itself (fp32 ``[T, D]``) and a per-row flag ``nonfinite[t]`` (a NaN or infinite
    ``qbar`` element) are stored too: the score kernels' exact fallback reads them."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    local = tl.arange(0, BLOCK_ROWS)
    dims = tl.arange(0, DP)
    for rb in range(pid, tl.cdiv(num_rows, BLOCK_ROWS), nprog):
        row0 = (row_start + rb * BLOCK_ROWS).to(tl.int64)
        row_ok = rb * BLOCK_ROWS + local < num_rows
        mask = row_ok[:, None] & (dims < D)[None, :]
        q_ptrs = q_ptr + row0 * stride_q_t + local[:, None] * stride_q_t + dims[None, :] * stride_q_d
        w_ptrs = weights_ptr + weights_offset + row0 * stride_weights_t + local * stride_weights_t
        qbar = tl.zeros([BLOCK_ROWS, DP], dtype=tl.float32)
        for h in range(H):
            w_h = load_weight_f32(w_ptrs + h * stride_weights_h, row_ok, weight_words)
            q_h = bf16_bits_to_f32(tl.load(q_ptrs + h * stride_q_h, mask=mask, other=0))
            qbar = qbar + w_h[:, None] * q_h
        # A row whose |qbar| < 2^-46 is split scaled by 2^64 (exact), its unit weights set to 2^-64,
        # so the split stays exact (bf16 cannot hold bits below 2^-133).
        finite = qbar - qbar == 0
        tiny = tl.sum(tl.where(finite & (tl.abs(qbar) >= TINY_QBAR), 1, 0), axis=1) == 0   # every |qbar| tiny
        hi, mid, lo = split_bf16x3(tl.where(tiny[:, None], qbar * QBAR_SCALE, qbar))
        out = split_ptr + row0 * stride_split_t + local[:, None] * stride_split_t + dims[None, :]
        tl.store(out, hi, mask=mask)
        tl.store(out + stride_split_h, mid, mask=mask)
        tl.store(out + 2 * stride_split_h, lo, mask=mask)
        tl.store(qbar_ptr + row0 * stride_qbar_t + local[:, None] * stride_qbar_t + dims[None, :], qbar, mask=mask)
        bad = tl.sum(tl.where(mask & (qbar - qbar != 0), 1, 0), axis=1)                      # non-finite count
        tl.store(nonfinite_ptr + row0 + local, int32_of(bad), mask=row_ok)       # (int32_of: see _portable)
        unit = tl.where(tiny, QBAR_UNSCALE, 1.0)
        parts = tl.arange(0, 4)
        tl.store(unit_ptr + row0 * 3 + local[:, None] * 3 + parts[None, :], unit[:, None] + parts[None, :] * 0.0,
                 mask=row_ok[:, None] & (parts < 3)[None, :])


def merged_heads(q, weights, row_start: int, num_rows: int, launch_options):
    """Mode (M): ``(split bf16 [T, 3, D], weights fp32 [T, 3], qbar fp32 [T, D], nonfinite int32
    [T])`` for the rows of the chunk (:func:`_merge_heads_kernel`)."""
    T, H, D = q.shape
    # rows padded to 8 elements: the score kernels read the split as 16-byte vectors (score._rows_of_vectors)
    split = launch_plan.vector_rows((T, 3, D), torch.bfloat16, q.device)
    unit = torch.ones((T, 3), dtype=torch.float32, device=q.device)
    qbar = torch.zeros((T, D), dtype=torch.float32, device=q.device)
    nonfinite = torch.zeros((T,), dtype=torch.int32, device=q.device)
    w_base, w_offset, (w_stride_t, w_stride_h), w_words = launch_plan.word_view(weights)
    merge = launch_plan.merge_heads_plan(num_rows, D, q.device, launch_options)
    _merge_heads_kernel[(merge.grid,)](
        q.view(torch.int16), q.stride(0), q.stride(1), q.stride(2),
        w_base, w_offset, w_stride_t, w_stride_h, w_words,
        split.view(torch.int16), split.stride(0), split.stride(1), unit, qbar, qbar.stride(0), nonfinite, row_start,
        num_rows, H, D, **merge.constexprs, **merge.options)
    return split, unit, qbar, nonfinite
