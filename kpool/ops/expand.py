"""Index expansion: selected pool keys to token ids with the causal tail (kpool-algorithm.md §4.5, §7).

:func:`_expand_kernel` writes every element of the ``[T, width]`` output: history columns from
the selected keys (pool id and validity read back from each key, :mod:`kpool.ops.topk`), the
causal tail (packed or fixed), -1 for invalid slots, alignment columns (``>= W``) and padding
rows (``t >= T_live``, with ``T_live = cum_query_lens[R - 1]`` read on the device). Portable
subset only (platform-numerics.md §6.1): int32 arithmetic, ``tl.where``, a grid-stride loop.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KPoolDtypeError, KPoolShapeError
from . import plan as launch_plan
from ._portable import KEY_LOWEST_C

# As in compress.py, runtime sizes and outer strides are in ``do_not_specialize`` so a stream of
# batches does not compile one variant per "== 1" / "% 16" pattern, nor per 16-byte alignment of
# a caller's output buffer; addressing only, same math. P is a runtime int too (one variant for
# every pool size: issue 20, fewer compilations).


@triton.jit(do_not_specialize=["num_rows", "width", "num_requests", "selected", "index_topk", "out_width",
                                "stride_out_t", "stride_top_keys_t", "stride_top_keys_k", "P"],
             do_not_specialize_on_alignment=["out_ptr"])
def _expand_kernel(
    out_ptr, stride_out_t, num_rows, width,
    positions_ptr, cum_query_lens_ptr, num_requests, top_keys_ptr, stride_top_keys_t, stride_top_keys_k,
    selected, index_topk, out_width, P,
    PACK: tl.constexpr, TAIL: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    """``top_keys_ptr``: the int64 ``[T, selected]`` selected keys (:mod:`kpool.ops.topk`)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_row_blocks = tl.cdiv(num_rows, BLOCK_ROWS)
    n_col_blocks = tl.cdiv(width, BLOCK_COLS)
    local = tl.arange(0, BLOCK_ROWS)
    t_live = tl.load(cum_query_lens_ptr + num_requests - 1)      # read on the device (FULL mode)
    for tile in range(pid, n_row_blocks * n_col_blocks, nprog):
        rb = tile // n_col_blocks
        cb = tile % n_col_blocks
        row0 = rb * BLOCK_ROWS
        rows = row0 + local
        cols = cb * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        live = (rows < t_live) & (rows < num_rows)
        pos = tl.load(positions_ptr + rows, mask=live, other=0).to(tl.int32)
        # Step 1, history: column c holds token pool_id[c // P] * P + c % P of a valid slot.
        slot = cols // P
        hist = live[:, None] & ((cols < index_topk) & (slot < selected))[None, :]
        key = tl.load(top_keys_ptr + rows[:, None] * stride_top_keys_t + (slot * stride_top_keys_k)[None, :],
                      mask=hist, other=0)
        high = (key >> 32).to(tl.int32)                              # the score's image
        pool = (0xFFFFFFFF - (key & 0xFFFFFFFF)).to(tl.int32)        # the inverted pool id
        val = tl.where(hist & (high > KEY_LOWEST_C), pool * P + (cols % P)[None, :], -1)
        if TAIL:
            # Step 2, causal tail (§7): P-1 lanes at tail_col, overwriting history there (none
            # when P = 1: tail_count is 0 and no lane is in [0, P - 1)).
            tail_start = ((pos + 1) // P) * P
            tail_count = pos + 1 - tail_start
            if PACK:
                tail_col = tl.minimum(tail_start, index_topk)
            else:
                tail_col = tl.zeros_like(tail_start) + index_topk
            lane = cols[None, :] - tail_col[:, None]
            in_tail = (lane >= 0) & (lane < P - 1)
            tail_val = tl.where(lane < tail_count[:, None], tail_start[:, None] + lane, -1)
            val = tl.where(in_tail, tail_val, val)
        # Steps 3-4: alignment columns (>= W) and padding rows (>= T_live) are -1.
        val = tl.where(live[:, None] & (cols < out_width)[None, :], val, -1)
        out_offs = local[:, None] * stride_out_t + cols[None, :]
        tl.store(out_ptr + row0.to(tl.int64) * stride_out_t + out_offs, val,
                 mask=(rows < num_rows)[:, None] & (cols < width)[None, :])


def expand_indices(*, top_keys: torch.Tensor, positions: torch.Tensor, cum_query_lens: torch.Tensor,
                   index_topk: int, index_kpool: int, pack_tail: bool, out: torch.Tensor,
                   always_select_tail: bool = True, launch_options=None) -> None:
    """Write every row of ``out`` (kpool-algorithm.md §4.5 steps 1-4, §7), in place.

    Live row ``t < T_live = cum_query_lens[R - 1]`` (position ``p``), column ``c``: history
    ``c < K_tok``: ``pool * P + c % P`` where ``pool`` is the pool of key ``top_keys[t, c // P]``
    if ``c // P < selected`` and that key is valid (score ``> LOWEST``), else -1; then the tail:
    ``tail_start = ((p+1)//P)*P``, ``tail_count = p + 1 - tail_start``, ``tail_col =
    min(tail_start, K_tok)`` if ``pack_tail`` else ``K_tok``; columns ``tail_col + i``
    (``0 <= i < P-1``) get ``tail_start + i`` if ``i < tail_count`` else -1 (overwriting
    history); columns ``>= W = K_tok + P - 1``: -1. Rows ``t >= T_live``: -1 over the full
    width. With ``always_select_tail=False`` (HF's ``index_kpool_always_select_tail=False``,
    kpool-algorithm.md §10) there is no tail step and ``W = K_tok``. Equals
    ``reference.numerics.expand_row`` row by row.

    Args:
        top_keys: int64 ``[>= T_live, selected]`` selected keys in rank order (unit column stride;
            rows ``>= T_live`` are never read; ``selected`` may be 0).
        positions: int64 ``[>= T]`` absolute positions (only live rows are read; made contiguous).
        cum_query_lens: int32 ``[R]`` exclusive query ends (``R = 0``: every row is padding).
        index_topk, index_kpool: ``K_tok`` and ``P``.
        pack_tail: packed (column ``min(tail_start, K_tok)``) or fixed (column ``K_tok``) tail.
        always_select_tail: append the causal tail (default); ``False``: history only, ``W = K_tok``.
        out: int32 ``[T, width >= W]``, unit column stride, any row stride; every element is written.
        launch_options: Triton launch kwargs (default from ``kpool.ops.plan``).

    Raises:
        KPoolDtypeError: wrong dtypes. KPoolShapeError: ``width < W``, non-unit column strides.
    """
    if out.dtype != torch.int32 or top_keys.dtype != torch.int64:
        raise KPoolDtypeError(f"need int32 out and int64 top_keys, got {out.dtype}, {top_keys.dtype}")
    P, K = index_kpool, index_topk
    W = K + P - 1 if always_select_tail else K
    if out.dim() != 2 or out.shape[1] < W or (out.numel() > 0 and out.stride(1) != 1):
        raise KPoolShapeError(f"out {tuple(out.shape)} (stride {out.stride()}) needs width >= {W} "
                              "and unit column stride")
    if top_keys.dim() != 2 or (top_keys.numel() > 0 and top_keys.stride(1) != 1):
        raise KPoolShapeError(f"top_keys {tuple(top_keys.shape)} must be 2-D with unit column stride")
    T, width = out.shape
    if T == 0:
        return None
    R = int(cum_query_lens.shape[0])
    if R == 0:                     # no request: every row is padding
        out.fill_(-1)
        return None
    selected = int(top_keys.shape[1])
    if top_keys.numel() == 0:                  # nothing selected: a valid dummy pointer, never read
        top_keys = torch.zeros(1, 1, dtype=torch.int64, device=out.device)
    plan = launch_plan.expand_plan(T, width, out.device, launch_options)
    _expand_kernel[(plan.grid,)](
        out, out.stride(0), T, width,
        positions.contiguous(), cum_query_lens.contiguous(), R, top_keys, top_keys.stride(0), top_keys.stride(1),
        selected, K, W, P=P, PACK=bool(pack_tail), TAIL=bool(always_select_tail), **plan.constexprs, **plan.options)
    return None
