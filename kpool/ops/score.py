"""Pool scoring on tensor cores, with the selection key fused in the epilogue (kpool-algorithm.md
§4.1-§4.4).

For live row ``t`` (request ``r``, position ``p``) and pool ``j < max_pool_seq_len``:
``visible = min((p + 1) // P, seq_lens[r])``; the key row is ``c_j = compressed_cache[
block_table[r, j // B], j % B, 0, :]`` (the physical page clamped into ``[0, N-1]`` only for
address legality); the raw score is

* (R): ``sum_h w[t,h] * relu(q[t,h,:] . c_j)``, * (M): ``sum_h w[t,h] * (q[t,h,:] . c_j)``
  (mathematically ``(sum_h w_h q_h) . c_j``, §4.2 (M); the order is certified like (R)'s);

each ``q_h . c_j`` is one ``tl.dot`` (bf16 x bf16 products, exact in fp32, accumulated in fp32
in the hardware's order; never tf32). The accumulation order differs from
``reference.numerics.pool_scores``; parity-contract.md §3.2 certifies exactly that difference
(``parity.checking.certificates``), and exact-data cases (every partial sum exact) stay bitwise. Each
cell is then sanitized (§4.3: invisible, NaN, ``<= LOWEST`` -> LOWEST; ``> FLT_MAX`` ->
FLT_MAX; ``-0.0`` -> ``+0.0``) and stored as an int64 selection key: high word the
order-preserving image of the score, low word ``-1 - j``, so ``torch.topk`` of a row's keys is
the canonical top-k (descending score, ties to the lower pool id; :mod:`kpool.ops.topk`).

Two tilings of one computation (``kpool.ops.plan``), chosen per request from its own query
length, so a row's bits never depend on the rest of the batch, the chunking or the padding:

* :func:`_score_decode_kernel` (requests of at most ``DECODE_ROWS`` rows: decode, MTP verify):
  a tile is one request x a segment of its pool blocks; the ``[BLOCK_N, D]`` key tiles (each
  pool row is D contiguous bf16: coalesced) are scored with one ``[BLOCK_N, DP] x [DP, HP]`` dot
  per row (when a request has 2-8 rows, MTP verify or a short request, each key tile is read once
  for all of them; one row a request streams its tiles through a pipelined loop), then ReLU, head
  weights and the head sum (a tree over the padded heads) in the epilogue.
* :func:`_score_prefill_kernel` (longer requests): a tile is ``BLOCK_M`` rows x ``BLOCK_N``
  pools; one ``[BLOCK_M, DP] x [DP, BLOCK_N]`` dot per head reuses the key tile, accumulating
  ``w_h * relu(.)`` in head order; a row block spanning several requests loops over them.
  Tiles whose pools are all invisible write LOWEST keys without touching the cache (causal skip).

Both kernels read ``T_live = cum_query_lens[R - 1]`` and the request boundaries on the device and
use only the batch-global row index (§9 item 12), so a launch depends on shapes alone.
Operands: ``DOT_F32`` (the interpreter) widens bf16 bits to fp32 for an IEEE fp32 dot; compiled
backends bitcast the bits to bf16. Heads, dims and tiles are padded to 16 with exact zeros
(masked ``other=0``); padded heads are removed with ``tl.where``, never multiplied (0 * NaN).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KPoolConfigError, KPoolDtypeError, KPoolShapeError
from . import plan as launch_plan
from ._portable import (INT32_MAX_C, KEY_LOWEST, KEY_LOWEST_C, int32_of, load_bf16_operand, load_f32, request_of_rows,
                        score_key_hi, visible_pools)
from .merged import merged_exact, merged_heads, merged_needs_exact

SCORE_MODES = {"relu": 0, "merged": 1}

_NO_SPECIALIZE = ["q_offset", "stride_q_t", "stride_q_h", "stride_weights_t", "stride_weights_h", "cache_offset",
                  "stride_cache_n", "stride_cache_b", "num_pages", "page_size", "num_requests",
                  "stride_block_table_r", "stride_block_table_m", "block_table_width", "stride_keys_t", "row_start",
                  "num_rows", "max_pool_seq_len",
                  "stride_qbar_t"]
_CONFIG_RUNTIME = ["H", "D", "P"]
# Heads, head dim and pool size are runtime ints too (issue 20: fewer compilations): only their
# padded tiles (HP, DP) and whether D fills DP (D_FULL: no channel mask, plain vector loads) are
# compile-time, so every configuration with the same padded shape shares one variant.
# Runtime sizes and outer strides are not specialized, so a stream of batches compiles one
# variant per padded configuration (HP, DP, D_FULL, mode, weight dtype) and cache vector width only. q and the
# cache arrive as their storage start (aligned by the allocator) with offsets and strides in units
# of VQ / VC (``kpool.ops.plan.vector_view``): rows are provably VQ/VC-aligned, so the key and
# query tiles load as 16-byte vectors although no stride is specialized. q is always VQ = 8 with a
# unit inner stride (a layout that is not is copied first: ``_rows_of_vectors``). The weight dtype
# stays compile-time here: a runtime dtype (``_portable.load_weight_f32``, as the head merge reads
# them) cost MTP=3 verify 5 % on the H200 (0.360 -> 0.379 ms, the per-row load in the key-tile
# loop). Addressing only, same math.


@triton.jit
def _key_cells(block_table_ptr, r, pools, load_ok, page_size, num_pages, cache_offset, stride_cache_n,
               stride_cache_b, stride_block_table_r, stride_block_table_m, block_table_width,
               WIDE: tl.constexpr, VC: tl.constexpr):
    """Element offset (from the cache's storage start) of each pool's key row, through request
    ``r``'s block table (the page clamped into range only for address legality); offset and
    strides are in units of ``VC`` elements."""
    page_idx = pools // page_size
    page = tl.load(block_table_ptr + r * stride_block_table_r + page_idx * stride_block_table_m,
                   mask=load_ok & (page_idx < block_table_width), other=0)
    page = tl.maximum(tl.minimum(page, num_pages - 1), 0)
    if WIDE:
        return (cache_offset + page.to(tl.int64) * stride_cache_n
                + ((pools % page_size) * stride_cache_b).to(tl.int64)) * VC
    else:
        return (cache_offset + page * stride_cache_n + (pools % page_size) * stride_cache_b) * VC


@triton.jit
def _store_keys(key_ptrs, pools, key_hi, mask):
    """Store int64 keys: high word the score image, low word ``0xFFFFFFFF - pool`` (ties to
    the lower id)."""
    key = (key_hi.to(tl.int64) << 32) | ((-1 - pools).to(tl.int64) & 0xFFFFFFFF)
    tl.store(key_ptrs, key, mask=mask)


@triton.jit
def _nonfinite_rows(key_tile):
    """Per row of a ``[BLOCK_N, DP]`` key tile: how many of its elements are NaN or infinite
    (exact int32 counts). The decode kernel's mode (M) sums them over a query row's own visible
    pools: nonzero exactly when ``merged_needs_exact`` finds a non-finite key in that row's own
    masked key tile (masked elements are zeros)."""
    k = key_tile.to(tl.float32)
    return tl.sum(tl.where(k - k == 0, 0, 1), axis=1)


@triton.jit
def _load_key_tile(cache_ptr, block_table_ptr, r, pools, ok, dims, D, page_size, num_pages, cache_offset,
                   stride_cache_n, stride_cache_b, stride_cache_d, stride_block_table_r, stride_block_table_m,
                   block_table_width, WIDE: tl.constexpr, VC: tl.constexpr, D_FULL: tl.constexpr,
                   DOT_F32: tl.constexpr):
    """``(cells, key_tile)`` of the decode kernel's pool block ``pools`` of request ``r``: each
    pool's key-row offset (:func:`_key_cells`) and the ``[BLOCK_N, DP]`` key tile of the pools
    ``ok`` (zeros elsewhere and past ``D``)."""
    cells = _key_cells(block_table_ptr, r, pools, ok, page_size, num_pages, cache_offset, stride_cache_n,
                       stride_cache_b, stride_block_table_r, stride_block_table_m, block_table_width, WIDE, VC)
    if D_FULL:      # no channel mask: the key rows load as plain vectors
        key_mask = ok[:, None]
    else:
        key_mask = ok[:, None] & (dims < D)[None, :]
    key_tile = load_bf16_operand(cache_ptr + cells[:, None] + dims[None, :] * stride_cache_d, key_mask, DOT_F32)
    return cells, key_tile


@triton.jit
def _load_query_row(q_ptr, q_offset, stride_q_t, stride_q_h, stride_q_d, weights_ptr, stride_weights_t,
                    stride_weights_h, t, heads, dims, H, D, VQ: tl.constexpr, W_BF16: tl.constexpr,
                    DOT_F32: tl.constexpr):
    """Row ``t``'s query as the dot's ``[DP, HP]`` operand and its fp32 head weights ``[HP]``."""
    q_t = load_bf16_operand(q_ptr + (q_offset + t.to(tl.int64) * stride_q_t) * VQ
                            + heads[None, :] * (stride_q_h * VQ) + dims[:, None] * stride_q_d,
                            (dims < D)[:, None] & (heads < H)[None, :], DOT_F32)
    w = load_f32(weights_ptr + t.to(tl.int64) * stride_weights_t + heads * stride_weights_h, heads < H, W_BF16)
    return q_t, w


@triton.jit
def _head_sum(s, w, heads, H, MODE: tl.constexpr):
    """One row's scores of a key tile, ``[BLOCK_N]`` fp32 (§4.2), from its dot ``s`` ``[BLOCK_N,
    HP]``: per head ``w * relu(s)`` (R) or ``w * s`` (M), summed over the heads."""
    if MODE == 0:   # w * relu(s), bit for bit (see the prefill kernel)
        term = tl.where(s < 0, (w * 0.0)[None, :], w[None, :] * s)
    else:
        term = w[None, :] * s
    # Head sum in tree order (certified, parity-contract.md §3.2); padded heads by
    # where, not by a zero weight (0 * NaN is NaN).
    score = tl.sum(tl.where((heads < H)[None, :], term, 0.0), axis=1)
    return score


@triton.jit
def _most_visible(positions_ptr, first, end, pools_of_req, P):
    """The largest visibility (kpool-algorithm.md §4.1) among the rows ``[first, end)`` (``end >
    first``) of one request, read row by row (positions are never assumed consecutive): how far
    a key tile shared by those rows is loaded."""
    vis = visible_pools(tl.load(positions_ptr + first).to(tl.int32), pools_of_req, P)
    for t in range(first + 1, end):
        vis = tl.maximum(vis, visible_pools(tl.load(positions_ptr + t).to(tl.int32), pools_of_req, P))
    return vis


@triton.jit
def _exact_and_store(score, needs_exact, qbar_row_ptr, cache_ptr, cells, load_ok, stride_cache_d, D_EXACT,
                     key_row, first_pool, offs_n, vis, max_pool_seq_len, MODE: tl.constexpr, DOT_F32: tl.constexpr):
    """Mode (M)'s exact fallback where ``needs_exact``, then the keys of pools ``first_pool +
    offs_n`` of one row: LOWEST past the row's ``vis`` visible pools, nothing past
    ``max_pool_seq_len``."""
    pools = first_pool + offs_n
    if MODE == 1:
        if needs_exact:
            score = merged_exact(qbar_row_ptr, cache_ptr, cells, load_ok, stride_cache_d, D_EXACT, DOT_F32)
    _store_keys(key_row + pools, pools, score_key_hi(score, pools >= vis), pools < max_pool_seq_len)


@triton.jit(do_not_specialize=_NO_SPECIALIZE + ["num_segments"] + _CONFIG_RUNTIME)
def _score_decode_kernel(
    q_ptr, q_offset, stride_q_t, stride_q_h, stride_q_d,
    weights_ptr, stride_weights_t, stride_weights_h,
    cache_ptr, cache_offset, stride_cache_n, stride_cache_b, stride_cache_d, num_pages, page_size,
    positions_ptr, cum_query_lens_ptr, seq_lens_ptr, num_requests,
    block_table_ptr, stride_block_table_r, stride_block_table_m, block_table_width,
    keys_ptr, stride_keys_t,
    row_start, num_rows, max_pool_seq_len, qbar_ptr, stride_qbar_t, nonfinite_ptr, num_segments, H, D, P,
    MODE: tl.constexpr, W_BF16: tl.constexpr, D_FULL: tl.constexpr,
    WIDE: tl.constexpr, VQ: tl.constexpr, VC: tl.constexpr, HP: tl.constexpr, DP: tl.constexpr,
    BLOCK_N: tl.constexpr, DECODE_ROWS: tl.constexpr, DOT_F32: tl.constexpr, KEY_TILE_OUTER: tl.constexpr,
    STACK_ROWS: tl.constexpr,
):
    """Keys of the rows ``[row_start, row_start + num_rows)`` that belong to decode-sized
    requests. Tile = (request, segment of its pool blocks): the request's metadata is loaded once,
    then one of two loop orders (``KEY_TILE_OUTER``, from the plan; the same bits either way):

    * key tile outer (MTP verify, short requests: the chunk has more rows than requests): the pool
      blocks stream through the outer loop (block table, key tile), each key tile read once per
      request, and the inner loop over the request's rows (at most ``DECODE_ROWS``) reuses it: per
      row its query and weights (cache-resident after the first block), the dot, the epilogue,
      the store. The tile is loaded up to the largest visibility among the request's rows; a
      score cell depends on its own key row only, pools past the row's own visibility are keyed
      LOWEST, and mode (M)'s exact-fallback test sees only the row's own visible key rows, so every
      row's cells are the bits it gets when scored alone. (Reading the tile per row made an
      MTP=3 batch read the cache four times: H200 334 us against 265 us this way.)
      With ``STACK_ROWS`` (mode (R) only, from the plan) the rows are not a loop: ``STACK_ROWS``
      rows' queries are one ``[DP, STACK_ROWS * HP]`` operand, loaded once, and each key tile is
      one dot for all of them, its ``[BLOCK_N, STACK_ROWS * HP]`` result summed over each row's
      heads. The key tiles then stream through the innermost loop, which the compiler pipelines
      (a request of more rows takes its rows ``STACK_ROWS`` at a time). Each cell is still one
      key row times one query column: a row's bits do not depend on the rows stacked beside it.
    * rows outer (one row a request, plain decode): each row's query is loaded once, then its
      pool blocks stream through an inner loop that Triton's pipeliner (innermost loops only)
      software-pipelines; key tile outer compiles without cp.async on sm_90 and ran the decode
      64 x 64k batch in 108 us against 96 us this way.

    ``keys_ptr``: the int64 ``[num_rows, max_pool_seq_len]`` scratch; q and the cache: bf16
    (int16 bits when DOT_F32) storage starts, offsets and outer strides in units of VQ / VC
    elements."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_pool_blocks = tl.cdiv(max_pool_seq_len, BLOCK_N)
    per_segment = tl.cdiv(n_pool_blocks, num_segments)
    heads = tl.arange(0, HP)
    dims = tl.arange(0, DP)
    offs_n = tl.arange(0, BLOCK_N)
    chunk_end = row_start + num_rows
    t_live = tl.load(cum_query_lens_ptr + num_requests - 1)
    for tile in range(pid, num_requests * num_segments, nprog):
        r = tile // num_segments
        segment = tile - r * num_segments
        q_lo = tl.load(cum_query_lens_ptr + r - 1, mask=r > 0, other=0)
        q_hi = tl.load(cum_query_lens_ptr + r)
        lo = tl.maximum(q_lo, row_start)
        hi = tl.minimum(tl.minimum(q_hi, chunk_end), t_live)
        if (q_hi - q_lo <= DECODE_ROWS) & (lo < hi):
            pools_of_req = tl.load(seq_lens_ptr + r)
            pb_first = segment * per_segment
            pb_end = tl.minimum(pb_first + per_segment, n_pool_blocks)
            if KEY_TILE_OUTER and STACK_ROWS > 0:
                cols = tl.arange(0, STACK_ROWS * HP)
                col_head = cols % HP
                for group in range(lo, hi, STACK_ROWS):
                    rows = group + tl.arange(0, STACK_ROWS)
                    row_ok = rows < hi
                    vis_rows = visible_pools(tl.load(positions_ptr + rows, mask=row_ok, other=0).to(tl.int32),
                                             pools_of_req, P)
                    vis_group = _most_visible(positions_ptr, group, tl.minimum(hi, group + STACK_ROWS), pools_of_req, P)
                    col_row = group + cols // HP
                    col_ok = (col_row < hi) & (col_head < H)
                    q_rows = load_bf16_operand(q_ptr + (q_offset + col_row.to(tl.int64)[None, :] * stride_q_t) * VQ
                                               + col_head[None, :] * (stride_q_h * VQ) + dims[:, None] * stride_q_d,
                                               (dims < D)[:, None] & col_ok[None, :], DOT_F32)   # [DP, ROWS * HP]
                    w_rows = load_f32(weights_ptr + col_row.to(tl.int64) * stride_weights_t
                                      + col_head * stride_weights_h, col_ok, W_BF16)
                    key_rows = keys_ptr + (rows - row_start).to(tl.int64) * stride_keys_t
                    for pb in range(pb_first, pb_end):
                        pools = pb * BLOCK_N + offs_n
                        cells, key_tile = _load_key_tile(cache_ptr, block_table_ptr, r, pools, pools < vis_group, dims,
                                                         D, page_size, num_pages, cache_offset, stride_cache_n,
                                                         stride_cache_b, stride_cache_d, stride_block_table_r,
                                                         stride_block_table_m, block_table_width, WIDE, VC, D_FULL,
                                                         DOT_F32)
                        s = tl.dot(key_tile, q_rows, input_precision="ieee")          # [BLOCK_N, ROWS * HP]
                        term = tl.where(s < 0, (w_rows * 0.0)[None, :], w_rows[None, :] * s)   # w * relu(s)
                        # each row's head sum in the tree order of _head_sum; padded heads by where
                        score = tl.sum(tl.where((heads < H)[None, None, :],
                                                tl.reshape(term, (BLOCK_N, STACK_ROWS, HP)), 0.0), axis=2)
                        _store_keys(key_rows[None, :] + pools[:, None], pools[:, None],
                                    score_key_hi(score, pools[:, None] >= vis_rows[None, :]),
                                    (pools < max_pool_seq_len)[:, None] & row_ok[None, :])
            elif KEY_TILE_OUTER:
                # The request's rows share each key tile: it is loaded for the largest visibility
                # among them (positions are read per row, never assumed consecutive), and each row
                # then masks the pools past its own visibility (score_key_hi: LOWEST, as before).
                vis_max = _most_visible(positions_ptr, lo, hi, pools_of_req, P)
                for pb in range(pb_first, pb_end):
                    pools = pb * BLOCK_N + offs_n
                    tile_ok = pools < vis_max
                    cells, key_tile = _load_key_tile(cache_ptr, block_table_ptr, r, pools, tile_ok, dims, D,
                                                     page_size, num_pages, cache_offset, stride_cache_n, stride_cache_b,
                                                     stride_cache_d, stride_block_table_r, stride_block_table_m,
                                                     block_table_width, WIDE, VC, D_FULL, DOT_F32)
                    if MODE == 1:
                        key_nonfinite = _nonfinite_rows(key_tile)
                    for i in range(0, hi - lo):
                        t = lo + i                  # (a tensor on every backend: the interpreter's range yields ints)
                        vis = visible_pools(tl.load(positions_ptr + t).to(tl.int32), pools_of_req, P)
                        load_ok = pools < vis       # this row's own visible pools
                        q_t, w = _load_query_row(q_ptr, q_offset, stride_q_t, stride_q_h, stride_q_d, weights_ptr,
                                                 stride_weights_t, stride_weights_h, t, heads, dims, H, D, VQ, W_BF16,
                                                 DOT_F32)
                        # Each score cell depends on its own key row only, so the key rows this row
                        # does not see (loaded for a longer row) change none of its visible cells.
                        s = tl.dot(key_tile, q_t, input_precision="ieee")                   # [BLOCK_N, HP]
                        score = _head_sum(s, w, heads, H, MODE)
                        needs_exact = False
                        if MODE == 1:
                            # merged_needs_exact's test on this row's own visible key rows only (as
                            # when the tile was loaded for this row): a non-finite key that only a
                            # longer row sees must not move this row to the exact path. Counted per
                            # key row once per tile: masking the tile per row spilled at H=32, D=128
                            # on sm_90 (ptxas).
                            bad_keys = tl.sum(tl.where(load_ok, key_nonfinite, 0), axis=0)
                            needs_exact = (bad_keys > 0) | (tl.load(nonfinite_ptr + t) != 0)
                        _exact_and_store(score, needs_exact, qbar_ptr + t.to(tl.int64) * stride_qbar_t, cache_ptr,
                                         cells, load_ok, stride_cache_d, DP if D_FULL else D,
                                         keys_ptr + (t - row_start).to(tl.int64) * stride_keys_t, pb * BLOCK_N,
                                         offs_n, vis, max_pool_seq_len, MODE, DOT_F32)
            else:
                for i in range(0, hi - lo):
                    t = lo + i                      # (a tensor on every backend: the interpreter's range yields ints)
                    vis = visible_pools(tl.load(positions_ptr + t).to(tl.int32), pools_of_req, P)
                    q_t, w = _load_query_row(q_ptr, q_offset, stride_q_t, stride_q_h, stride_q_d, weights_ptr,
                                             stride_weights_t, stride_weights_h, t, heads, dims, H, D, VQ, W_BF16,
                                             DOT_F32)
                    for pb in range(pb_first, pb_end):
                        pools = pb * BLOCK_N + offs_n
                        load_ok = pools < vis
                        cells, key_tile = _load_key_tile(cache_ptr, block_table_ptr, r, pools, load_ok, dims, D,
                                                         page_size, num_pages, cache_offset, stride_cache_n,
                                                         stride_cache_b, stride_cache_d, stride_block_table_r,
                                                         stride_block_table_m, block_table_width, WIDE, VC,
                                                         D_FULL, DOT_F32)
                        s = tl.dot(key_tile, q_t, input_precision="ieee")                   # [BLOCK_N, HP]
                        score = _head_sum(s, w, heads, H, MODE)
                        needs_exact = False
                        if MODE == 1:
                            needs_exact = merged_needs_exact(key_tile, nonfinite_ptr + t + tl.arange(0, 1), DOT_F32)
                        _exact_and_store(score, needs_exact, qbar_ptr + t.to(tl.int64) * stride_qbar_t, cache_ptr,
                                         cells, load_ok, stride_cache_d, DP if D_FULL else D,
                                         keys_ptr + (t - row_start).to(tl.int64) * stride_keys_t, pb * BLOCK_N,
                                         offs_n, vis, max_pool_seq_len, MODE, DOT_F32)


@triton.jit(do_not_specialize=["num_requests", "row_start", "num_rows"])
def _prefill_blocks_kernel(cum_query_lens_ptr, block_ends_ptr, num_requests, row_start, num_rows,
                           BLOCK_M: tl.constexpr, DECODE_ROWS: tl.constexpr, BLOCK_R: tl.constexpr):
    """Row blocks of the prefill kernel, aligned to request starts (one program).

    ``block_ends[r]`` = number of ``BLOCK_M``-row blocks of the prefill-sized requests ``<= r``
    (requests of at most ``DECODE_ROWS`` rows have none); ``block_ends[R]`` and
    ``block_ends[R + 1]`` = the first and one past the last block holding a row of
    ``[row_start, row_start + num_rows)``. Integer prefix sums (exact in any order).

    The chunk's two edge rows find their requests in the same sweep over the requests as the
    prefix sums: ``r(t) = #{i < R - 1 : cum_query_lens[i] <= t}`` (``request_of_rows``, clamped
    as there), with every load independent of the others (a binary search was ~7 dependent loads:
    most of this launch's time on a decode batch)."""
    lanes = tl.arange(0, BLOCK_R)
    edge = tl.arange(0, 2)
    edge_row = tl.where(edge == 0, row_start, row_start + num_rows - 1)
    before = edge * 0                          # blocks of the requests before each edge row's
    e_lo = edge * 0                            # the edge request's start: the ends before it, summed as lengths
    e_hi = edge * 0 + INT32_MAX_C              # its end: the least end from it on
    carry = num_requests * 0                   # an int32 scalar zero
    for base in range(0, num_requests, BLOCK_R):
        r = base + lanes
        ok = r < num_requests
        end = tl.load(cum_query_lens_ptr + r, mask=ok, other=0)
        start = tl.load(cum_query_lens_ptr + r - 1, mask=ok & (r > 0), other=0)
        qlen = end - start
        blocks = tl.where(ok & (qlen > DECODE_ROWS), (qlen + BLOCK_M - 1) // BLOCK_M, 0)
        # inclusive prefix sum as a masked row sum (exact integers; no scan primitive needed)
        prefix = tl.sum(tl.where(lanes[None, :] <= lanes[:, None], blocks[None, :], 0), axis=1)
        tl.store(block_ends_ptr + r, int32_of(carry + prefix), mask=ok)     # (int32_of: see _portable)
        # [2, BLOCK_R]: requests ending at or before the edge row (ends are non-decreasing: a prefix)
        earlier = ok[None, :] & (r < num_requests - 1)[None, :] & (end[None, :] <= edge_row[:, None])
        before = before + tl.sum(tl.where(earlier, blocks[None, :], 0), axis=1)
        e_lo = e_lo + tl.sum(tl.where(earlier, qlen[None, :], 0), axis=1)
        later = tl.where(earlier, INT32_MAX_C, tl.where(ok, end, INT32_MAX_C)[None, :])   # (no `~`: 3.2's interpreter)
        e_hi = tl.minimum(e_hi, tl.min(later, axis=1))  # portable-ok: reduction -- int32 min is exact in any order
        carry = carry + tl.sum(tl.where(ok, blocks, 0), axis=0)
    e_len = e_hi - e_lo
    e_blocks = tl.where(e_len > DECODE_ROWS, (e_len + BLOCK_M - 1) // BLOCK_M, 0)
    inside = edge_row - e_lo < e_len
    own = tl.where(inside, (edge_row - e_lo) // BLOCK_M + edge, e_blocks)   # the last edge counts its block
    own = tl.where(e_len > DECODE_ROWS, own, 0)
    tl.store(block_ends_ptr + num_requests + edge, int32_of(before + own))


# The same runtime arguments as _score_decode_kernel up to nonfinite_ptr, deliberately: the
# launcher passes one argument tuple to both kernels (a Triton kernel takes no struct).
@triton.jit(do_not_specialize=_NO_SPECIALIZE + ["search_steps"] + _CONFIG_RUNTIME)
def _score_prefill_kernel(
    q_ptr, q_offset, stride_q_t, stride_q_h, stride_q_d,
    weights_ptr, stride_weights_t, stride_weights_h,
    cache_ptr, cache_offset, stride_cache_n, stride_cache_b, stride_cache_d, num_pages, page_size,
    positions_ptr, cum_query_lens_ptr, seq_lens_ptr, num_requests,
    block_table_ptr, stride_block_table_r, stride_block_table_m, block_table_width,
    keys_ptr, stride_keys_t,
    row_start, num_rows, max_pool_seq_len, qbar_ptr, stride_qbar_t, nonfinite_ptr, block_ends_ptr, search_steps,
    H, D, P, MODE: tl.constexpr, W_BF16: tl.constexpr, D_FULL: tl.constexpr,
    WIDE: tl.constexpr, VQ: tl.constexpr, VC: tl.constexpr, DP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DECODE_ROWS: tl.constexpr, DOT_F32: tl.constexpr,
):
    """Keys of the rows of ``[row_start, row_start + num_rows)`` that belong to requests longer
    than ``DECODE_ROWS``. A tile is one request's block of ``BLOCK_M`` rows (blocks aligned to
    the request start, ``block_ends`` from :func:`_prefill_blocks_kernel`) x ``BLOCK_N`` pools,
    so one key tile serves every row of the tile."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_pool_blocks = tl.cdiv(max_pool_seq_len, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, DP)
    chunk_end = row_start + num_rows
    t_live = tl.load(cum_query_lens_ptr + num_requests - 1)
    first_block = tl.load(block_ends_ptr + num_requests)
    n_blocks = tl.load(block_ends_ptr + num_requests + 1) - first_block
    for tile in range(pid, n_blocks * n_pool_blocks, nprog):
        v = first_block + tile // n_pool_blocks
        pb = tile % n_pool_blocks
        r = request_of_rows(v, block_ends_ptr, num_requests, search_steps)
        b = v - tl.load(block_ends_ptr + r - 1, mask=r > 0, other=0)
        q_lo = tl.load(cum_query_lens_ptr + r - 1, mask=r > 0, other=0)
        q_hi = tl.load(cum_query_lens_ptr + r)
        row0 = q_lo + b * BLOCK_M                          # batch-global rows (§9 item 12)
        rows = row0 + offs_m
        mine = (rows >= row_start) & (rows < chunk_end) & (rows < q_hi) & (rows < t_live)
        pos = tl.load(positions_ptr + rows, mask=mine, other=0).to(tl.int32)
        pools_of_req = tl.load(seq_lens_ptr + r)
        vis = tl.where(mine, visible_pools(pos, pools_of_req, P), 0)
        max_vis = tl.max(vis, axis=0)  # portable-ok: reduction -- int32 max is exact in any order
        pools = pb * BLOCK_N + offs_n
        if pb * BLOCK_N < max_vis:
            load_ok = pools < max_vis
            cells = _key_cells(block_table_ptr, r, pools, load_ok, page_size, num_pages, cache_offset,
                               stride_cache_n, stride_cache_b, stride_block_table_r, stride_block_table_m,
                               block_table_width, WIDE, VC)
            if D_FULL:
                key_mask = load_ok[None, :]
            else:
                key_mask = (dims < D)[:, None] & load_ok[None, :]
            key_t = load_bf16_operand(cache_ptr + cells[None, :] + dims[:, None] * stride_cache_d,
                                      key_mask, DOT_F32)   # [DP, BLOCK_N]
            # Rows past the request read its last row (address legality; their results are never
            # stored), so the query loads need no row mask and pipeline as plain vectors.
            local = tl.minimum(offs_m, q_hi - 1 - row0).to(tl.int64)
            q_ptrs = (q_ptr + (q_offset + row0.to(tl.int64) * stride_q_t) * VQ + local[:, None] * (stride_q_t * VQ)
                      + dims[None, :] * stride_q_d)
            w_ptrs = weights_ptr + (row0 + local) * stride_weights_t
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for h in range(3 if MODE == 1 else H):     # mode (M): qbar's three parts (a constant trip count)
                if D_FULL:
                    q_h = load_bf16_operand(q_ptrs + h * (stride_q_h * VQ), None, DOT_F32)   # [BLOCK_M, DP]
                else:
                    q_h = load_bf16_operand(q_ptrs + h * (stride_q_h * VQ), (dims < D)[None, :], DOT_F32)
                s = tl.dot(q_h, key_t, input_precision="ieee")                              # [BLOCK_M, BLOCK_N]
                w_h = load_f32(w_ptrs + h * stride_weights_h, None, W_BF16)
                # Heads in order, from 0.0, as the reference; w * relu(s) written as a select of
                # two products (the same bits: relu keeps NaN and -0.0, w * 0.0 keeps an infinite
                # or NaN weight's NaN), which keeps fewer registers live than ReLU then product.
                if MODE == 0:
                    acc = acc + tl.where(s < 0, (w_h * 0.0)[:, None], w_h[:, None] * s)
                else:
                    acc = acc + w_h[:, None] * s
            if MODE == 1:
                if merged_needs_exact(key_t, nonfinite_ptr + row0 + local, DOT_F32):
                    acc = merged_exact(qbar_ptr + (row0 + local)[:, None] * stride_qbar_t, cache_ptr,
                                        cells[None, :], load_ok[None, :], stride_cache_d, DP if D_FULL else D, DOT_F32)
            key_ptrs = (keys_ptr + (row0 - row_start).to(tl.int64) * stride_keys_t + offs_m[:, None] * stride_keys_t
                        + pools[None, :])
            _store_keys(key_ptrs, pools[None, :], score_key_hi(acc, pools[None, :] >= vis[:, None]),
                        mine[:, None] & (pools < max_pool_seq_len)[None, :])
        else:   # nothing visible in this tile: LOWEST keys, the cache untouched
            key_ptrs = (keys_ptr + (row0 - row_start).to(tl.int64) * stride_keys_t + offs_m[:, None] * stride_keys_t
                        + pools[None, :])
            _store_keys(key_ptrs, pools[None, :], tl.full([BLOCK_M, BLOCK_N], KEY_LOWEST_C, tl.int32),
                        mine[:, None] & (pools < max_pool_seq_len)[None, :])


def _check(q, weights, compressed_cache, block_table, score_mode, keys, num_rows, max_pool_seq_len):
    if score_mode not in SCORE_MODES:
        raise KPoolConfigError(f"score_mode must be one of {tuple(SCORE_MODES)}, got {score_mode!r}")
    if q.dtype != torch.bfloat16 or compressed_cache.dtype != torch.bfloat16:
        raise KPoolDtypeError(f"q and compressed_cache must be bfloat16, got {q.dtype} and {compressed_cache.dtype}")
    if weights.dtype not in (torch.float32, torch.bfloat16):
        raise KPoolDtypeError(f"weights must be float32 or bfloat16, got {weights.dtype}")
    if keys.dtype != torch.int64:
        raise KPoolDtypeError(f"score keys must be int64, got {keys.dtype}")
    if q.dim() != 3 or weights.shape != q.shape[:2] or compressed_cache.dim() != 4 \
            or compressed_cache.shape[3] != q.shape[2] or block_table.dim() != 2:
        raise KPoolShapeError(
            f"shape mismatch: q {tuple(q.shape)}, weights {tuple(weights.shape)}, "
            f"cache {tuple(compressed_cache.shape)}, block_table {tuple(block_table.shape)}")
    if keys.dim() != 2 or keys.shape[0] < num_rows or keys.shape[1] < max_pool_seq_len \
            or (keys.numel() > 0 and keys.stride(1) != 1):
        raise KPoolShapeError(f"key scratch {tuple(keys.shape)} (stride {keys.stride()}) cannot hold "
                              f"[{num_rows}, {max_pool_seq_len}] with unit column stride")


def _rows_of_vectors(q: torch.Tensor) -> torch.Tensor:
    """``q`` itself when it reads as 16-byte vectors (unit inner stride; offset, row and head strides
    multiples of 8 elements: every serving engine's layout, GLM's ``[T, H, 128]`` included), else a
    copy in rows padded to 8 elements (zeros past D, never read): one query layout per launch, so
    the score kernels compile one variant of it (issue 20, fewer compilations), not one per vector
    width and inner stride."""
    if q.stride(2) == 1 and all(v % 8 == 0 for v in (q.storage_offset(), q.stride(0), q.stride(1))):
        return q
    padded = launch_plan.vector_rows(q.shape, q.dtype, q.device)
    padded.copy_(q)
    return padded


def score_keys(*, q: torch.Tensor, weights: torch.Tensor, compressed_cache: torch.Tensor,
               positions: torch.Tensor, cum_query_lens: torch.Tensor, seq_lens: torch.Tensor,
               block_table: torch.Tensor, max_pool_seq_len: int, index_kpool: int, score_mode: str,
               row_start: int, num_rows: int, keys: torch.Tensor, launch_options=None,
               max_query_len: int | None = None) -> torch.Tensor:
    """Selection keys of every pool for the batch rows ``row_start .. row_start + num_rows - 1``
    (kpool-algorithm.md §4.1-§4.4; see the module docstring for the math and the key layout).

    Only live rows (``t < cum_query_lens[R - 1]``, read on the device) are written; rows of
    decode-sized requests by the decode kernel, the others by the prefill kernel (each skipping
    the other's rows; the prefill kernel and its row-block helper are launched only when ``T >
    DECODE_ROWS`` and ``max_query_len`` (when given) exceeds it, since no request can then be
    longer: two launches fewer for a decode or MTP batch, decided from host ints). q, weights, the
    cache and the block table are read through their strides; positions, cum_query_lens and
    seq_lens are made contiguous first.

    Args:
        q: bf16 ``[T, H, D]`` queries (any strides).
        weights: fp32 or bf16 ``[T, H]`` head weights (upcast to fp32).
        compressed_cache: bf16 ``[N, B, 1, D]`` pooled keys (page stride may be padded).
        positions: int64 ``[T]`` absolute positions (contiguous per request).
        cum_query_lens: int32 ``[R]`` exclusive query ends (no leading zero), ``R >= 1``.
        seq_lens: int32 ``[R]`` complete pools per request (not raw token lengths).
        block_table: int32 ``[R, M]`` logical -> physical compressed page (any strides).
        max_pool_seq_len: key-row length (host int, ``<= M * B``).
        index_kpool: ``P`` tokens per pool.
        score_mode: ``"relu"`` (per-head ReLU, §4.2 (R)) or ``"merged"`` (§4.2 (M)).
        row_start, num_rows: the chunk of batch rows (``row_start + num_rows <= T``).
        keys: int64 ``[>= num_rows, >= max_pool_seq_len]`` scratch with unit column stride; row
            ``i`` receives batch row ``row_start + i`` when that row is live.
        launch_options: Triton launch kwargs; default from ``kpool.ops.plan``.
        max_query_len: host int bound on every request's query length (the serving engine's
            ``max_query_len``), or ``None`` (bounded by ``T``). Trusted: a smaller value than a
            request's length leaves that request's rows unwritten (``kpool.indexer.forward``
            checks it when validating).

    Returns:
        ``keys[:num_rows, :max_pool_seq_len]`` (the same storage).

    Raises:
        KPoolDtypeError: q not bf16, weights not fp32/bf16, cache not bf16, keys not int64.
        KPoolShapeError: mismatched shapes, a too-small ``keys`` or one without unit column
            stride, rows outside ``q``.
        KPoolConfigError: an unknown ``score_mode``.
    """
    _check(q, weights, compressed_cache, block_table, score_mode, keys, num_rows, max_pool_seq_len)
    result = keys[:num_rows, :max_pool_seq_len]
    R = int(cum_query_lens.shape[0])
    if num_rows <= 0 or max_pool_seq_len <= 0 or R == 0:
        return result
    T, H, D = q.shape
    if row_start < 0 or row_start + num_rows > T:
        raise KPoolShapeError(f"rows [{row_start}, {row_start + num_rows}) outside q's {T} rows")
    N, B = compressed_cache.shape[0], compressed_cache.shape[1]
    positions, cum_query_lens, seq_lens = positions.contiguous(), cum_query_lens.contiguous(), seq_lens.contiguous()
    q = _rows_of_vectors(q)
    if score_mode == "merged":
        q, weights, qbar, nonfinite = merged_heads(q, weights, row_start, num_rows, launch_options)
        H = 3
    else:   # unused placeholders of the merged-mode fallback
        qbar, nonfinite = keys, cum_query_lens
    w_bf16 = weights.dtype == torch.bfloat16
    w_arg = weights.view(torch.int16) if w_bf16 else weights
    span = 1 + sum((s - 1) * st for s, st in zip(compressed_cache.shape, compressed_cache.stride()))
    decode = launch_plan.score_decode_plan(R, max_pool_seq_len, H, D, q.device, launch_options, num_rows=num_rows,
                                           merged=score_mode == "merged")
    # The interpreter gets int16 views (its dots run in fp32 from the bits); compiled backends
    # the bf16 tensors themselves (tensor-core operands straight from memory).
    as_bits = decode.constexprs["DOT_F32"]
    q_arg, cache_arg = (q.view(torch.int16), compressed_cache.view(torch.int16)) if as_bits else (q, compressed_cache)
    q_base, q_offset, (stride_q_t, stride_q_h), vq = launch_plan.vector_view(q_arg, (q.stride(0), q.stride(1)), 8)
    cache_base, cache_offset, (stride_cache_n, stride_cache_b), vc = launch_plan.vector_view(
        cache_arg, (compressed_cache.stride(0), compressed_cache.stride(1)), 8)
    if vc not in (1, 8):   # 2 or 4 (never a serving layout): scalar loads, two variants fewer
        cache_offset, stride_cache_n, stride_cache_b = cache_offset * vc, stride_cache_n * vc, stride_cache_b * vc
        vc = 1
    common = dict(H=H, D=D, P=int(index_kpool), MODE=SCORE_MODES[score_mode], W_BF16=w_bf16,
                  D_FULL=D == decode.constexprs["DP"], WIDE=span >= 2 ** 31, VQ=vq, VC=vc)
    args = (q_base, q_offset, stride_q_t, stride_q_h, q.stride(2), w_arg, weights.stride(0), weights.stride(1),
            cache_base, cache_offset, stride_cache_n, stride_cache_b, compressed_cache.stride(3), N, B,
            positions, cum_query_lens, seq_lens, R,
            block_table, block_table.stride(0), block_table.stride(1), block_table.shape[1],
            keys, keys.stride(0), row_start, num_rows, max_pool_seq_len, qbar, qbar.stride(0), nonfinite)
    _score_decode_kernel[(decode.grid,)](*args, launch_plan.decode_segments(decode, R, max_pool_seq_len), **common,
                                         **decode.constexprs, **decode.options)
    longest = T if max_query_len is None else min(T, max_query_len)
    if longest <= decode.constexprs["DECODE_ROWS"]:   # no request is long enough for the prefill kernel
        return result
    prefill = launch_plan.score_prefill_plan(num_rows, R, T, max_pool_seq_len, D, q.device, launch_options)
    steps = R.bit_length()
    block_ends = torch.empty(R + 2, dtype=torch.int32, device=q.device)
    blocks = launch_plan.prefill_blocks_plan(prefill, q.device, launch_options)
    _prefill_blocks_kernel[(blocks.grid,)](cum_query_lens, block_ends, R, row_start, num_rows,
                                           **blocks.constexprs, **blocks.options)
    _score_prefill_kernel[(prefill.grid,)](*args, block_ends, steps, **common, **prefill.constexprs,
                                           **prefill.options)
    return result


def score_pools(*, out: torch.Tensor, **kwargs) -> torch.Tensor:
    """Sanitized fp32 scores (``-0.0`` as ``+0.0``) of the rows of :func:`score_keys` (same
    arguments, with ``out`` fp32 ``[>= num_rows, >= max_pool_seq_len]`` instead of ``keys``):
    the scores the selection ranks, decoded from the keys; rows that are not live come out LOWEST.

    Raises:
        As :func:`score_keys`; KPoolDtypeError / KPoolShapeError for a bad ``out``.
    """
    from .topk import key_scores
    n, width = int(kwargs["num_rows"]), int(kwargs["max_pool_seq_len"])
    if out.dtype != torch.float32:
        raise KPoolDtypeError(f"score scratch must be float32, got {out.dtype}")
    if out.dim() != 2 or out.shape[0] < n or out.shape[1] < width:
        raise KPoolShapeError(f"score scratch {tuple(out.shape)} cannot hold [{n}, {width}]")
    keys = torch.full((n, width), KEY_LOWEST << 32, dtype=torch.int64, device=out.device)
    score_keys(keys=keys, **kwargs)
    result = out[:n, :width]
    result.copy_(key_scores(keys))
    return result
