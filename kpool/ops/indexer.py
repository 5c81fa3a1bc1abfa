"""Lightning-indexer kernels: pool scoring, canonical top-k, index expansion (kpool-algorithm.md §4).

Three steps, each with a thin launcher:

* :func:`score_pools` (Triton): sanitized fp32 scores of every pool for a chunk of query rows
  (§4.1 visibility, §4.2 score, §4.3 sanitization), in the exact operation order of
  ``reference.numerics.pool_scores`` / ``sanitize_scores`` (§11).
* :func:`select_topk` (torch): canonical selection, descending score and ties to the lower
  pool id (§4.4, parity-contract.md §2).
* :func:`expand_indices` (Triton): pool ids to token ids, the causal tail (packed or fixed), -1
  for invalid slots, alignment columns and padding rows (§4.5, §7).

Kernels use only the portable subset of platform-numerics.md §6.1: fp32 arithmetic (bf16 is
upcast right after the load, from its bits: the launchers pass bf16 tensors as int16 views and
the kernels shift the bits into the high half of an fp32, which is exact everywhere, whereas
the interpreter's own bf16 cast gets subnormals wrong), explicit sequential loops for every sum whose order matters,
``tl.where`` for ReLU and sanitization (``tl.maximum`` drops NaN on CUDA), int32 offsets with
int64 only for scalar bases (and for cache page offsets when the cache spans >= 2**31
elements), a grid sized from the vector-core count (NPU) or SM count (CUDA), at most 65535
programs, walking its tiles with a grid-stride loop (``kpool.ops._launch``).
Bitwise results do not depend on the tile sizes: a tile only decides which cells one program
computes, never the order of any cell's operations.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KPoolConfigError, KPoolDtypeError, KPoolShapeError
from ..platform import launch_options as _platform_launch_options
from ._launch import launch_grid
from ._portable import request_of_rows  # also makes runtime loop bounds work in the interpreter

LOWEST = torch.finfo(torch.float32).min
FLT_MAX = torch.finfo(torch.float32).max
_LOWEST = tl.constexpr(LOWEST)
_FLT_MAX = tl.constexpr(FLT_MAX)

MAX_GRID = 65535
"""Upper bound on programs per launch (Ascend coreDim limit, §1.3 of platform-numerics.md)."""

# Grid = min(tiles, cores * this, MAX_GRID) (kpool.ops._launch): one program per vector core on
# NPU (platform-numerics.md §1.3); several per SM on CUDA so that small tiles still hide memory
# latency (8 x 4 warps = half an SM's threads; a tuning knob, results do not depend on it).
_PROGRAMS_PER_CORE = {"cuda": 8, "npu": 1, "cpu": 1}

SCORE_MODES = {"relu": 0, "merged": 1}

# Tile sizes per backend: (BLOCK_ROWS, BLOCK_POOLS) for scoring, (BLOCK_ROWS, BLOCK_COLS) for
# expansion. Small tiles on devices (register / unified-buffer budget); on the interpreter up
# to 16 rows and as many pools as 2**18 accumulator cells allow (every interpreted op costs far
# more than its arithmetic, so few large tiles are fastest; 2**18 measured best for H=32, D=128).
_SCORE_TILES = {"cuda": (1, 32), "npu": (1, 32)}
_INTERP_MAX_ROWS = 16
_INTERP_TILE_ELEMENTS = 2 ** 18
_EXPAND_TILES = {"cpu": (16, 256), "cuda": (1, 256), "npu": (1, 256)}
# As in compress.py, runtime sizes and outer strides are in ``do_not_specialize`` so a stream of
# batches does not compile one variant per "== 1" / "% 16" pattern, nor per 16-byte alignment of
# the cache (behind a guard band) and of a caller's output buffer; addressing only, same math.


def _backend_of(t: torch.Tensor) -> str:
    kind = t.device.type
    return kind if kind in ("cuda", "npu") else "cpu"


def _options(t: torch.Tensor, launch_options) -> dict:
    return dict(_platform_launch_options(_backend_of(t)) if launch_options is None else launch_options)


def _grid(work: int, t: torch.Tensor) -> tuple:
    """1-D grid for ``work`` tiles on ``t``'s device: vector cores (npu), SMs (cuda), at most
    ``MAX_GRID`` (read at call time); the kernels grid-stride over the remaining tiles."""
    backend = _backend_of(t)
    return (launch_grid(work, backend, t.device, programs_per_core=_PROGRAMS_PER_CORE[backend],
                        limit=MAX_GRID),)


@triton.jit
def _bf16_bits_to_f32(bits):
    """fp32 value of bf16 bit patterns loaded as int16 (exact: the bf16 bits become the high half).
    The interpreter's own bf16 -> fp32 cast mishandles subnormals (platform-numerics.md §4.2)."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _load_f32(ptrs, mask, IS_BF16: tl.constexpr):
    """Load fp32, or bf16 through an int16 view, and return fp32 (masked lanes 0.0)."""
    if IS_BF16:
        return _bf16_bits_to_f32(tl.load(ptrs, mask=mask, other=0))
    else:
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit(do_not_specialize=["row_start", "num_rows", "stride_qt", "stride_qh", "stride_wt", "stride_wh",
                                "stride_qbar"])
def _merge_heads_kernel(
    q_ptr, stride_qt, stride_qh, stride_qd,
    w_ptr, stride_wt, stride_wh,
    qbar_ptr, stride_qbar,
    row_start, num_rows,
    H: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, W_BF16: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):
    """Score mode (M), first half: ``qbar[t, d] = sum_h w[t, h] * q[t, h, d]`` sequentially over
    h from 0.0 (§4.2 (M), §11), for rows ``row_start + i``, stored at ``qbar[i, d]``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    local = tl.arange(0, BLOCK_ROWS)
    dims = tl.arange(0, DP)
    for rb in range(pid, tl.cdiv(num_rows, BLOCK_ROWS), nprog):
        local0 = rb * BLOCK_ROWS
        row_ok = (local0 + local) < num_rows
        row0 = (row_start + local0).to(tl.int64)
        q_ptrs = q_ptr + row0 * stride_qt + local[:, None] * stride_qt + dims[None, :] * stride_qd
        w_ptrs = w_ptr + row0 * stride_wt + local * stride_wt
        q_mask = row_ok[:, None] & (dims < D)[None, :]
        qbar = tl.zeros([BLOCK_ROWS, DP], dtype=tl.float32)
        for h in range(H):
            w_h = _load_f32(w_ptrs, row_ok, W_BF16)
            q_h = (tl.load(q_ptrs, mask=q_mask, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
            qbar += w_h[:, None] * q_h
            q_ptrs += stride_qh
            w_ptrs += stride_wh
        out_ptrs = qbar_ptr + local0.to(tl.int64) * stride_qbar + local[:, None] * stride_qbar + dims[None, :]
        tl.store(out_ptrs, qbar, mask=q_mask)


@triton.jit(do_not_specialize=["row_start", "num_rows", "max_pool_seq_len", "num_requests",
                                "stride_qt", "stride_qh", "stride_wt", "stride_wh", "stride_qbar",
                                "stride_cn", "stride_cb", "num_pages", "page_size",
                                "stride_btr", "stride_btm", "bt_width", "stride_out"],
             do_not_specialize_on_alignment=["cache_ptr"])
def _score_kernel(
    q_ptr, stride_qt, stride_qh, stride_qd,
    w_ptr, stride_wt, stride_wh,
    qbar_ptr, stride_qbar,
    cache_ptr, stride_cn, stride_cb, stride_cd, num_pages, page_size,
    pos_ptr, cum_ptr, seq_lens_ptr, num_requests,
    bt_ptr, stride_btr, stride_btm, bt_width,
    out_ptr, stride_out,
    row_start, num_rows, max_pool_seq_len,
    H: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
    MODE: tl.constexpr, W_BF16: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_POOLS: tl.constexpr,
):
    """Sanitized scores of the tiles [BLOCK_ROWS rows x BLOCK_POOLS pools] (§4.1-§4.3).
    q and the cache arrive as int16 views of bf16; MODE 0 = (R), 1 = (M) reading ``qbar``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_pool_blocks = tl.cdiv(max_pool_seq_len, BLOCK_POOLS)
    local = tl.arange(0, BLOCK_ROWS)
    heads = tl.arange(0, HP)
    for tile in range(pid, tl.cdiv(num_rows, BLOCK_ROWS) * n_pool_blocks, nprog):
        rb = tile // n_pool_blocks
        pb = tile % n_pool_blocks
        local0 = rb * BLOCK_ROWS                     # first row of the tile within the chunk
        row_ok = (local0 + local) < num_rows
        rows = row_start + local0 + local            # batch-global rows (§9 item 12)
        req = request_of_rows(rows, cum_ptr, num_requests)
        pos = tl.load(pos_ptr + rows, mask=row_ok, other=0).to(tl.int32)
        pools_of_req = tl.load(seq_lens_ptr + req, mask=row_ok, other=0)
        visible = tl.where(row_ok, tl.minimum((pos + 1) // P, pools_of_req), 0)
        max_visible = tl.max(visible, axis=0)  # portable-ok: reduction -- int32 max is exact in any order

        pools = pb * BLOCK_POOLS + tl.arange(0, BLOCK_POOLS)
        out_ptrs = out_ptr + local0.to(tl.int64) * stride_out + local[:, None] * stride_out + pools[None, :]
        out_mask = row_ok[:, None] & (pools < max_pool_seq_len)[None, :]
        if pb * BLOCK_POOLS < max_visible:
            cell_vis = pools[None, :] < visible[:, None]      # [BR, BP]; invisible cells never load
            page_idx = pools // page_size
            page = tl.load(bt_ptr + req[:, None] * stride_btr + page_idx[None, :] * stride_btm,
                           mask=cell_vis & (page_idx < bt_width)[None, :], other=0)
            page = tl.maximum(tl.minimum(page, num_pages - 1), 0)   # address legality only
            if WIDE:
                cell_off = page.to(tl.int64) * stride_cn + ((pools % page_size) * stride_cb)[None, :]
            else:
                cell_off = page * stride_cn + ((pools % page_size) * stride_cb)[None, :]
            row0 = (row_start + local0).to(tl.int64)
            score = tl.zeros([BLOCK_ROWS, BLOCK_POOLS], dtype=tl.float32)
            if MODE == 0:
                # (R): d_h = sum_d c[d] * q[h, d] sequentially over d (from 0.0), all heads at once.
                q_mask = row_ok[:, None] & (heads < H)[None, :]
                q_offs = local[:, None] * stride_qt + heads[None, :] * stride_qh              # [BR, HP]
                q_ptrs = q_ptr + row0 * stride_qt + q_offs[:, None, :]
                c_ptrs = cache_ptr + cell_off[:, :, None]
                c_mask = cell_vis[:, :, None]                                       # [BR, BP, 1]
                q_mask3 = q_mask[:, None, :]                                        # [BR, 1, HP]
                acc = tl.zeros([BLOCK_ROWS, BLOCK_POOLS, HP], dtype=tl.float32)
                for d in range(D):
                    # bf16 bits -> fp32, inlined (a nested jit call is costly in the interpreter).
                    c = (tl.load(c_ptrs, mask=c_mask, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
                    qd = (tl.load(q_ptrs, mask=q_mask3, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
                    acc += c * qd
                    c_ptrs += stride_cd
                    q_ptrs += stride_qd
                # Canonical ReLU keeps NaN (where, not maximum); then w_h * relu(d_h) summed
                # sequentially over h: a sum of one value and zeros is exact, so each step adds
                # exactly that head's term, in head order.
                w = _load_f32(w_ptr + row0 * stride_wt + local[:, None] * stride_wt + heads[None, :] * stride_wh,
                              q_mask, W_BF16)
                term = w[:, None, :] * tl.where(acc < 0, 0.0, acc)
                for h in range(H):
                    score += tl.sum(tl.where((heads == h)[None, None, :], term, 0.0), axis=2)
            else:
                # (M): sum_d qbar[d] * c[d] sequentially over d (qbar from _merge_heads_kernel).
                qb_ptrs = qbar_ptr + local0.to(tl.int64) * stride_qbar + local[:, None] * stride_qbar
                c_ptrs = cache_ptr + cell_off
                for d in range(D):
                    qb = tl.load(qb_ptrs, mask=row_ok[:, None], other=0.0)                # [BR, 1]
                    c = (tl.load(c_ptrs, mask=cell_vis, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
                    score += qb * c
                    qb_ptrs += 1
                    c_ptrs += stride_cd
            # §4.3: invisible, NaN and <= LOWEST -> LOWEST; > FLT_MAX (+inf) -> FLT_MAX.
            # Invisible cells by comparison, not ``~cell_vis``: bool invert needs an int1 type
            # triton-ascend 3.2's interpreter builder lacks (get_int1_ty).
            low = (pools[None, :] >= visible[:, None]) | (score != score) | (score <= _LOWEST)
            score = tl.where(low, _LOWEST, tl.where(score > _FLT_MAX, _FLT_MAX, score))
            tl.store(out_ptrs, score, mask=out_mask)
        else:
            # Every cell of this tile is invisible: write LOWEST without touching the cache.
            tl.store(out_ptrs, tl.full([BLOCK_ROWS, BLOCK_POOLS], _LOWEST, tl.float32), mask=out_mask)


def _score_tiles(backend: str, num_rows: int, max_pool_seq_len: int, cells_per_pool: int):
    """(BLOCK_ROWS, BLOCK_POOLS) for a launch (see ``_SCORE_TILES``); ``cells_per_pool`` is the
    accumulator width per cell (padded heads for (R), 1 for (M))."""
    if backend != "cpu":
        return _SCORE_TILES[backend]
    rows = min(_INTERP_MAX_ROWS, triton.next_power_of_2(num_rows))
    budget = max(16, _INTERP_TILE_ELEMENTS // (rows * cells_per_pool))
    pools = 1 << (budget.bit_length() - 1)              # largest power of two <= budget
    return rows, min(pools, triton.next_power_of_2(max_pool_seq_len))


def score_pools(*, q: torch.Tensor, weights: torch.Tensor, compressed_cache: torch.Tensor,
                positions: torch.Tensor, cum_query_lens: torch.Tensor, seq_lens: torch.Tensor,
                block_table: torch.Tensor, max_pool_seq_len: int, index_kpool: int, score_mode: str,
                row_start: int, num_rows: int, out: torch.Tensor, launch_options=None,
                block_rows: int | None = None, block_pools: int | None = None) -> torch.Tensor:
    """Sanitized fp32 pool scores of query rows ``row_start .. row_start + num_rows - 1``
    (kpool-algorithm.md §4.1-§4.3, canonical order of §11).

    For row ``t`` (request ``r = r(t)`` from the batch-global row index, position ``p``) and pool
    ``j < max_pool_seq_len``: ``visible = min((p + 1) // P, seq_lens[r])``; the pool key is
    ``compressed_cache[block_table[r, j // B], j % B, 0, :]`` (physical page clamped into
    ``[0, N-1]`` only for address legality); the raw score is ``reference.numerics.pool_scores``
    bit for bit, then ``sanitize_scores`` (``j >= visible``, NaN, ``<= LOWEST`` -> LOWEST,
    ``> FLT_MAX`` -> FLT_MAX). q, weights, the cache, the block table and ``out`` are read through
    their strides; positions, cum_query_lens and seq_lens are made contiguous first. Mode ``"merged"``
    first writes ``qbar`` (fp32 ``[num_rows, D]``, a temporary) with a second small kernel.

    Args:
        q: bf16 ``[T, H, D]`` queries (any strides).
        weights: fp32 or bf16 ``[T, H]`` head weights (upcast to fp32).
        compressed_cache: bf16 ``[N, B, 1, D]`` pooled keys (page stride may be padded).
        positions: int64 ``[T]`` absolute positions.
        cum_query_lens: int32 ``[R]`` exclusive query ends (no leading zero).
        seq_lens: int32 ``[R]`` complete pools per request (not raw token lengths).
        block_table: int32 ``[R, M]`` logical -> physical compressed page (any strides).
        max_pool_seq_len: score-row length (host int, ``<= M * B``).
        index_kpool: ``P`` tokens per pool.
        score_mode: ``"relu"`` (per-head ReLU, §4.2 (R)) or ``"merged"`` (§4.2 (M)).
        row_start, num_rows: the chunk of live rows to score (``row_start + num_rows <= T_live``).
        out: fp32 ``[>= num_rows, >= max_pool_seq_len]`` scratch with unit column stride.
        launch_options: Triton launch kwargs; default ``kpool.platform.launch_options`` of the
            tensors' backend (``enable_fp_fusion=False`` on CUDA: no FMA contraction).
        block_rows, block_pools: tile override (powers of two); results are bitwise
            independent of them.

    Returns:
        ``out[:num_rows, :max_pool_seq_len]`` (the same storage), fp32 scores.

    Raises:
        KPoolDtypeError: q not bf16, weights not fp32/bf16, cache not bf16, out not fp32.
        KPoolShapeError: mismatched shapes, a too-small ``out`` or one without unit column
            stride, rows outside ``q``.
        KPoolConfigError: an unknown ``score_mode``.
    """
    if score_mode not in SCORE_MODES:
        raise KPoolConfigError(f"score_mode must be one of {tuple(SCORE_MODES)}, got {score_mode!r}")
    if q.dtype != torch.bfloat16 or compressed_cache.dtype != torch.bfloat16:
        raise KPoolDtypeError(f"q and compressed_cache must be bfloat16, got {q.dtype} and {compressed_cache.dtype}")
    if weights.dtype not in (torch.float32, torch.bfloat16):
        raise KPoolDtypeError(f"weights must be float32 or bfloat16, got {weights.dtype}")
    if out.dtype != torch.float32:
        raise KPoolDtypeError(f"score scratch must be float32, got {out.dtype}")
    if q.dim() != 3 or weights.shape != q.shape[:2] or compressed_cache.dim() != 4 \
            or compressed_cache.shape[3] != q.shape[2] or block_table.dim() != 2:
        raise KPoolShapeError(
            f"shape mismatch: q {tuple(q.shape)}, weights {tuple(weights.shape)}, "
            f"cache {tuple(compressed_cache.shape)}, block_table {tuple(block_table.shape)}")
    if out.dim() != 2 or out.shape[0] < num_rows or out.shape[1] < max_pool_seq_len \
            or (out.numel() > 0 and out.stride(1) != 1):
        raise KPoolShapeError(f"score scratch {tuple(out.shape)} (stride {out.stride()}) cannot hold "
                              f"[{num_rows}, {max_pool_seq_len}] with unit column stride")
    result = out[:num_rows, :max_pool_seq_len]
    if num_rows <= 0 or max_pool_seq_len <= 0:
        return result
    T, H, D = q.shape
    if row_start < 0 or row_start + num_rows > T:
        raise KPoolShapeError(f"rows [{row_start}, {row_start + num_rows}) outside q's {T} rows")
    N, B = compressed_cache.shape[0], compressed_cache.shape[1]
    mode = SCORE_MODES[score_mode]
    HP = triton.next_power_of_2(H)
    backend = _backend_of(q)
    options = _options(q, launch_options)
    br, bp = _score_tiles(backend, num_rows, max_pool_seq_len, HP if mode == 0 else 1)
    br, bp = block_rows or br, block_pools or bp
    w_bf16 = weights.dtype == torch.bfloat16
    w_arg = weights.view(torch.int16) if w_bf16 else weights
    q16 = q.view(torch.int16)               # bf16 bits; the kernels upcast exactly
    if mode == 1:
        qbar = torch.empty((num_rows, D), dtype=torch.float32, device=q.device)
        _merge_heads_kernel[_grid(triton.cdiv(num_rows, br), q)](
            q16, q.stride(0), q.stride(1), q.stride(2), w_arg, weights.stride(0), weights.stride(1),
            qbar, qbar.stride(0), row_start, num_rows,
            H=H, D=D, DP=triton.next_power_of_2(D), W_BF16=w_bf16, BLOCK_ROWS=br, **options)
    else:
        qbar = out                              # unused placeholder pointer
    # The kernel reads the 1-D metadata with unit stride (a copy only when a caller's is strided).
    positions, cum_query_lens, seq_lens = positions.contiguous(), cum_query_lens.contiguous(), seq_lens.contiguous()
    span = 1 + sum((s - 1) * st for s, st in zip(compressed_cache.shape, compressed_cache.stride()))
    tiles = triton.cdiv(num_rows, br) * triton.cdiv(max_pool_seq_len, bp)
    _score_kernel[_grid(tiles, q)](
        q16, q.stride(0), q.stride(1), q.stride(2),
        w_arg, weights.stride(0), weights.stride(1),
        qbar, qbar.stride(0),
        compressed_cache.view(torch.int16), compressed_cache.stride(0), compressed_cache.stride(1),
        compressed_cache.stride(3), N, B,
        positions, cum_query_lens, seq_lens, cum_query_lens.shape[0],
        block_table, block_table.stride(0), block_table.stride(1), block_table.shape[1],
        result, out.stride(0),
        row_start, num_rows, max_pool_seq_len,
        H=H, HP=HP, D=D, P=index_kpool, MODE=mode, W_BF16=w_bf16, WIDE=span >= 2 ** 31,
        BLOCK_ROWS=br, BLOCK_POOLS=bp, **options)
    return result


def select_topk(scores: torch.Tensor, selected: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical top-k of sanitized scores (kpool-algorithm.md §4.4, §11; parity-contract.md §2).

    A stable descending sort: higher score first, equal scores (``-0.0 == +0.0`` included) keep
    ascending pool id. Equals ``reference.numerics.canonical_topk``.

    Args:
        scores: fp32 ``[rows, n]`` sanitized scores (no NaN).
        selected: columns to keep, ``0 <= selected <= n`` (``min(K_pool, max_pool_seq_len)``).

    Returns:
        ``(pool_ids int32 [rows, selected], sorted_scores fp32 [rows, selected])``; a slot is
        valid iff its score ``> LOWEST``.

    Raises:
        KPoolShapeError: ``scores`` not 2-D or ``selected`` outside ``[0, n]``.
    """
    if scores.dim() != 2 or not 0 <= selected <= scores.shape[1]:
        raise KPoolShapeError(f"cannot select {selected} of scores {tuple(scores.shape)}")
    values, ids = torch.sort(scores, dim=1, descending=True, stable=True)
    return ids[:, :selected].to(torch.int32), values[:, :selected]


@triton.jit(do_not_specialize=["num_rows", "width", "num_live", "selected", "index_topk", "out_width",
                                "stride_out", "stride_ir", "stride_ic", "stride_sr", "stride_sc"],
             do_not_specialize_on_alignment=["out_ptr"])
def _expand_kernel(
    out_ptr, stride_out, num_rows, width,
    pos_ptr, ids_ptr, stride_ir, stride_ic, sc_ptr, stride_sr, stride_sc,
    num_live, selected, index_topk, out_width,
    P: tl.constexpr, PACK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_row_blocks = tl.cdiv(num_rows, BLOCK_ROWS)
    n_col_blocks = tl.cdiv(width, BLOCK_COLS)
    local = tl.arange(0, BLOCK_ROWS)
    for tile in range(pid, n_row_blocks * n_col_blocks, nprog):
        rb = tile // n_col_blocks
        cb = tile % n_col_blocks
        row0 = rb * BLOCK_ROWS
        rows = row0 + local
        cols = cb * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        live = rows < num_live
        pos = tl.load(pos_ptr + rows, mask=live, other=0).to(tl.int32)
        # Step 1, history: column c holds token pool_id[c // P] * P + c % P of a valid slot.
        slot = cols // P
        hist = live[:, None] & ((cols < index_topk) & (slot < selected))[None, :]
        ids = tl.load(ids_ptr + rows[:, None] * stride_ir + (slot * stride_ic)[None, :], mask=hist, other=0)
        sc = tl.load(sc_ptr + rows[:, None] * stride_sr + (slot * stride_sc)[None, :], mask=hist, other=_LOWEST)
        val = tl.where(hist & (sc > _LOWEST), ids * P + (cols % P)[None, :], -1)
        if P > 1:
            # Step 2, causal tail (§7): P-1 lanes at tail_col, overwriting history there.
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
        out_offs = local[:, None] * stride_out + cols[None, :]
        tl.store(out_ptr + row0.to(tl.int64) * stride_out + out_offs, val,
                 mask=(rows < num_rows)[:, None] & (cols < width)[None, :])


def expand_indices(*, pool_ids: torch.Tensor, pool_scores: torch.Tensor, positions: torch.Tensor,
                   num_live_tokens: int, index_topk: int, index_kpool: int, pack_tail: bool,
                   out: torch.Tensor, launch_options=None, block_rows: int | None = None,
                   block_cols: int | None = None) -> None:
    """Write every row of ``out`` (kpool-algorithm.md §4.5 steps 1-4, §7), in place.

    Live row ``t < num_live_tokens`` (position ``p``), column ``c``:
    history ``c < K_tok``: ``pool_ids[t, c // P] * P + c % P`` if ``c // P < selected`` and
    ``pool_scores[t, c // P] > LOWEST``, else -1; then the tail: ``tail_start = ((p+1)//P)*P``,
    ``tail_count = p + 1 - tail_start``, ``tail_col = min(tail_start, K_tok)`` if ``pack_tail``
    else ``K_tok``; columns ``tail_col + i`` (``0 <= i < P-1``) get ``tail_start + i`` if
    ``i < tail_count`` else -1 (overwriting history); columns ``>= W = K_tok + P - 1``: -1.
    Rows ``t >= num_live_tokens``: -1 over the full width. Equals
    ``reference.numerics.expand_row`` row by row.

    Args:
        pool_ids: int32 ``[num_live_tokens, selected]`` selected pools in rank order (any strides).
        pool_scores: fp32 ``[num_live_tokens, selected]`` their sanitized scores.
        positions: int64 ``[>= T]`` absolute positions (only live rows are read; any stride).
        num_live_tokens: ``T_live``.
        index_topk, index_kpool: ``K_tok`` and ``P``.
        pack_tail: packed (column ``min(tail_start, K_tok)``) or fixed (column ``K_tok``) tail.
        out: int32 ``[T, width >= W]``, unit column stride, any row stride; every element is written.
        launch_options: Triton launch kwargs (default: the backend's, see :func:`score_pools`).
        block_rows, block_cols: tile override (powers of two).

    Raises:
        KPoolDtypeError: wrong dtypes. KPoolShapeError: ``width < W``, non-unit column stride,
            ``num_live_tokens > T`` or selection shapes that disagree.
    """
    if out.dtype != torch.int32 or pool_ids.dtype != torch.int32 or pool_scores.dtype != torch.float32:
        raise KPoolDtypeError(f"need int32 out/pool_ids and fp32 pool_scores, got "
                              f"{out.dtype}, {pool_ids.dtype}, {pool_scores.dtype}")
    P, K = index_kpool, index_topk
    W = K + P - 1
    if out.dim() != 2 or out.shape[1] < W or (out.numel() > 0 and out.stride(1) != 1):
        raise KPoolShapeError(f"out {tuple(out.shape)} (stride {out.stride()}) needs width >= {W} "
                              "and unit column stride")
    T, width = out.shape
    if not 0 <= num_live_tokens <= T or pool_ids.dim() != 2 or pool_ids.shape != pool_scores.shape \
            or pool_ids.shape[0] != num_live_tokens:
        raise KPoolShapeError(f"selection {tuple(pool_ids.shape)}/{tuple(pool_scores.shape)} does not match "
                              f"{num_live_tokens} live rows of {T}")
    if T == 0:
        return None
    backend = _backend_of(out)
    default_rows, default_cols = _EXPAND_TILES[backend]
    br = block_rows or default_rows
    bc = block_cols or default_cols
    tiles = triton.cdiv(T, br) * triton.cdiv(width, bc)
    positions = positions.contiguous()     # read with unit stride (a copy only when strided)
    _expand_kernel[_grid(tiles, out)](
        out, out.stride(0), T, width,
        positions, pool_ids, pool_ids.stride(0), pool_ids.stride(1),
        pool_scores, pool_scores.stride(0), pool_scores.stride(1),
        num_live_tokens, pool_ids.shape[1], K, W,
        P=P, PACK=bool(pack_tail), BLOCK_ROWS=br, BLOCK_COLS=bc,
        **_options(out, launch_options))
    return None
