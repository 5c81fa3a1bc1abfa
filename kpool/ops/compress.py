"""KPool cache update: pool compression then tail-ring write (kpool-algorithm.md §5).

Two ordered launches (§5.4 "launch 2 runs strictly after launch 1"):

1. :func:`_compress_pools_kernel` — every live row that completes a pool compresses the
   pool's P-token window (from this call's inputs, or from the ring as it was before the
   call) into one bf16 row of the compressed cache (§5.1-§5.3, canonical order of
   ``reference.numerics.compress_pools``, §11).
2. :func:`_ring_write_kernel` — the last ``C`` live rows of every request copy their raw
   K and gate bit-exactly into the request's ring (§5.4).

Both kernels use a fixed grid of ``min(work, cap)`` programs and a grid-stride loop over
blocks of ``BLOCK_T`` rows x ``BLOCK_D`` channels (platform-numerics.md §6.1). Every guard
(live row, position >= 0, slot and ring block in range) is evaluated in the kernel, so bad
metadata never writes and never faults; validation proper is the caller's job
(``kpool/indexer.py``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._portable import bf16_rne_int16, exp_fp32, request_of_rows

_GRID_CAP_LIMIT = 65535          # Ascend coreDim <= UINT16_MAX; also a sane cap elsewhere
_CPU_GRID_CAP = 4                # interpreter: programs run serially; keep the grid tiny
_TILE_ELEMS = {"cpu": 4096, "cuda": 2048, "npu": 1024}   # BLOCK_T * BLOCK_D per program
_MAX_BLOCK_T = 64
_grid_cap_cache: dict = {}
# Runtime sizes and outer strides are listed in ``do_not_specialize``: Triton would otherwise
# compile a new variant for every combination of "== 1" / "% 16 == 0" among them, and a batch
# stream varies them all the time (page size, padding, ring capacity). Unit inner strides and D
# stay specialized (they do not vary). The cache pointers are views behind guard bands, so their
# 16-byte alignment varies too. Specialization changes addressing only, never the math.


def cache_update_tiles(num_live: int, head_dim: int, backend: str) -> tuple:
    """``(BLOCK_T, BLOCK_D)`` of both cache-update launches (platform-numerics.md §6.1).

    ``BLOCK_D = next_pow2(head_dim)``; ``BLOCK_T`` fills ``_TILE_ELEMS[backend]`` elements, at
    most ``_MAX_BLOCK_T`` rows. Under the interpreter it also shrinks to ``next_pow2(num_live)``
    (its cost grows with the tile); compiled backends keep one ``BLOCK_T`` per head dim, so the
    number of live rows never causes a new compilation. Rows are independent: the tile changes
    which program writes a row, never its bits.

    Args:
        num_live: live token rows (>= 1). head_dim: D. backend: ``"cpu"``, ``"cuda"`` or ``"npu"``.
    Raises:
        KeyError: unknown backend.
    """
    block_d = triton.next_power_of_2(head_dim)
    block_t = max(1, min(_MAX_BLOCK_T, _TILE_ELEMS[backend] // block_d))
    if backend == "cpu":
        block_t = min(block_t, triton.next_power_of_2(num_live))
    return block_t, block_d


@triton.jit
def _window_tile(in_ptr, in_s0, in_s1, tail_ptr, plane_off, w, qs_pos, in_shift, num_live,
                 ring_base, ring_ok, C, t_s2, t_s3, valid, offs_d, dmask):
    """fp32 ``[BLOCK_T, BLOCK_D]`` tile of window position ``w`` (one per row): from the inputs
    at row ``w + in_shift`` (= ``qs_r + (w - qs_pos)``) when ``w >= qs_pos``, else from ring
    plane ``plane_off`` at ``w % C``, 0.0 when the ring block is out of range (§5.2).
    Masked-off lanes may form out-of-range addresses; they are never dereferenced."""
    from_in = w >= qs_pos
    in_row = w + in_shift
    in_ok = valid & from_in & (in_row >= 0) & (in_row < num_live)
    x_in = tl.load(in_ptr + (in_row.to(tl.int64) * in_s0)[:, None] + offs_d[None, :] * in_s1,
                   mask=in_ok[:, None] & dmask[None, :], other=0.0)
    ring_use = valid & (w < qs_pos) & ring_ok
    ring_off = ring_base + plane_off + ((w % C) * t_s2).to(tl.int64)
    x_ring = tl.load(tail_ptr + ring_off[:, None] + offs_d[None, :] * t_s3,
                     mask=ring_use[:, None] & dmask[None, :], other=0.0)
    return tl.where(from_in[:, None], x_in, x_ring)


@triton.jit(do_not_specialize=["num_live", "num_requests", "iters", "B", "num_slots", "C", "num_tail_blocks",
                                "k_s0", "g_s0", "ape_s0", "cc_s0", "cc_s1", "t_s0", "t_s1", "t_s2",
                                "pos_s", "raw_s", "slot_s", "tbt_s0"],
             do_not_specialize_on_alignment=["cc_ptr", "tail_ptr"])
def _compress_pools_kernel(
        k_ptr, gate_ptr, ape_ptr, cc_ptr, tail_ptr,
        pos_ptr, cum_ptr, raw_ptr, slot_ptr, tbt_ptr,
        num_live, num_requests, iters, D, B, num_slots, C, num_tail_blocks,
        k_s0, k_s1, g_s0, g_s1, ape_s0, ape_s1,
        cc_s0, cc_s1, cc_s3,
        t_s0, t_s1, t_s2, t_s3,
        pos_s, raw_s, slot_s, tbt_s0,
        P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Launch 1 (kpool-algorithm.md §5.1-§5.3). ``cc_ptr`` is an int16 view of the bf16
    compressed cache (bit-exact RNE store); ``tail_ptr`` the fp32 ring (read only)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    for it in range(0, iters):
        rows = (pid + it * nprog) * BLOCK_T + offs_t
        live = rows < num_live
        pos = tl.load(pos_ptr + rows * pos_s, mask=live, other=-1)
        slot = tl.load(slot_ptr + rows * slot_s, mask=live, other=-1)
        pos_ok = (pos >= 0) & (pos < 2147483647 - P)
        # Narrow to int32 before tl.where: int64 select is not in the A2/A3 subset.
        p = tl.where(pos_ok, pos.to(tl.int32), 0)
        valid = live & pos_ok & ((p + 1) % P == 0) & (slot >= 0) & (slot < num_slots)
        # Destination row from the slot alone: any op mixing the i1 `valid` into a 1-D int value
        # (tl.where, .to(int32)) crashes Triton 3.6's CUDA layout pass (TritonGPURemoveLayout-
        # Conversions) at some tile shapes. Invalid lanes get a meaningless address, never used:
        # their store is masked by `valid`.
        slot32 = slot.to(tl.int32)
        page = slot32 // B
        prow = slot32 - page * B
        dst = page.to(tl.int64) * cc_s0 + prow.to(tl.int64) * cc_s1

        # No data-dependent skip of row blocks without a completing row: an `if` on a reduced
        # mask made Triton 3.6's CUDA layout pass crash at small D; masked rows cost little.
        r = request_of_rows(rows, cum_ptr, num_requests)
        end_r = tl.load(cum_ptr + r)
        qs_row = tl.load(cum_ptr + r - 1, mask=r > 0, other=0)
        raw = tl.load(raw_ptr + r * raw_s)
        qs_pos = raw - (end_r - qs_row)
        ring_blk = tl.load(tbt_ptr + r * tbt_s0)
        ring_ok = (ring_blk >= 0) & (ring_blk < num_tail_blocks)
        ring_base = ring_blk.to(tl.int64) * t_s0
        in_shift = qs_row - qs_pos
        w0 = p - (P - 1)

        # Pass 1: m = sequential max of s_j = gate_j + ape_j.
        g = _window_tile(gate_ptr, g_s0, g_s1, tail_ptr, t_s1, w0, qs_pos, in_shift, num_live,
                         ring_base, ring_ok, C, t_s2, t_s3, valid, offs_d, dmask)
        a = tl.load(ape_ptr + offs_d * ape_s1, mask=dmask, other=0.0)
        m = g + a[None, :]
        for j in tl.static_range(1, P):
            g = _window_tile(gate_ptr, g_s0, g_s1, tail_ptr, t_s1, w0 + j, qs_pos, in_shift,
                             num_live, ring_base, ring_ok, C, t_s2, t_s3, valid, offs_d, dmask)
            a = tl.load(ape_ptr + j * ape_s0 + offs_d * ape_s1, mask=dmask, other=0.0)
            m = tl.maximum(m, g + a[None, :])
        # Pass 2: Z = left-to-right sum of e_j = exp(s_j - m). s_j is recomputed (same bits)
        # instead of kept in P live tiles, to bound on-chip memory for large P.
        z = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for j in tl.static_range(P):
            g = _window_tile(gate_ptr, g_s0, g_s1, tail_ptr, t_s1, w0 + j, qs_pos, in_shift,
                             num_live, ring_base, ring_ok, C, t_s2, t_s3, valid, offs_d, dmask)
            a = tl.load(ape_ptr + j * ape_s0 + offs_d * ape_s1, mask=dmask, other=0.0)
            e = exp_fp32((g + a[None, :]) - m)
            if j == 0:
                z = e
            else:
                z = z + e
        # Pass 3: out = sum_j div_rn(e_j, Z) * K_j, each product rounded before its add.
        out = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for j in tl.static_range(P):
            g = _window_tile(gate_ptr, g_s0, g_s1, tail_ptr, t_s1, w0 + j, qs_pos, in_shift,
                             num_live, ring_base, ring_ok, C, t_s2, t_s3, valid, offs_d, dmask)
            a = tl.load(ape_ptr + j * ape_s0 + offs_d * ape_s1, mask=dmask, other=0.0)
            e = exp_fp32((g + a[None, :]) - m)
            kv = _window_tile(k_ptr, k_s0, k_s1, tail_ptr, 0, w0 + j, qs_pos, in_shift,
                              num_live, ring_base, ring_ok, C, t_s2, t_s3, valid, offs_d, dmask)
            term = tl.math.div_rn(e, z) * kv
            if j == 0:
                out = term
            else:
                out = out + term

        tl.store(cc_ptr + dst[:, None] + offs_d[None, :] * cc_s3, bf16_rne_int16(out),
                 mask=valid[:, None] & dmask[None, :])


@triton.jit(do_not_specialize=["num_live", "num_requests", "iters", "C", "num_tail_slots",
                                "k_s0", "g_s0", "t_s0", "t_s1", "t_s2", "pos_s", "tslot_s"],
             do_not_specialize_on_alignment=["tail_ptr"])
def _ring_write_kernel(
        k_ptr, gate_ptr, tail_ptr, pos_ptr, cum_ptr, tslot_ptr,
        num_live, num_requests, iters, D, C, num_tail_slots,
        k_s0, k_s1, g_s0, g_s1, t_s0, t_s1, t_s2, t_s3, pos_s, tslot_s,
        BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Launch 2 (kpool-algorithm.md §5.4). ``k_ptr``, ``gate_ptr``, ``tail_ptr`` are int32
    views of the fp32 tensors: the copy moves bit patterns (NaN payloads included)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    for it in range(0, iters):
        rows = (pid + it * nprog) * BLOCK_T + offs_t
        live = rows < num_live
        r = request_of_rows(rows, cum_ptr, num_requests)
        end_r = tl.load(cum_ptr + r)
        pos = tl.load(pos_ptr + rows * pos_s, mask=live, other=-1)
        tslot = tl.load(tslot_ptr + rows * tslot_s, mask=live, other=-1)
        valid = live & (rows >= end_r - C) & (pos >= 0) & (tslot >= 0) & (tslot < num_tail_slots)
        ts32 = tl.where(valid, tslot.to(tl.int32), 0)
        blk = ts32 // C
        sl = ts32 - blk * C
        dst = blk.to(tl.int64) * t_s0 + sl.to(tl.int64) * t_s2
        src_row = tl.where(valid, rows, 0).to(tl.int64)
        mask = valid[:, None] & dmask[None, :]
        kv = tl.load(k_ptr + (src_row * k_s0)[:, None] + offs_d[None, :] * k_s1, mask=mask, other=0)
        tl.store(tail_ptr + dst[:, None] + offs_d[None, :] * t_s3, kv, mask=mask)
        gv = tl.load(gate_ptr + (src_row * g_s0)[:, None] + offs_d[None, :] * g_s1, mask=mask, other=0)
        tl.store(tail_ptr + (dst + t_s1)[:, None] + offs_d[None, :] * t_s3, gv, mask=mask)


def _backend_of(tensor) -> str:
    """'cuda', 'npu' or 'cpu' from a tensor's device type (never touches the Triton driver)."""
    kind = tensor.device.type
    return kind if kind in ("cuda", "npu") else "cpu"


def _grid_cap(backend: str, tensor) -> int:
    """Programs per launch: SM count (cuda), vector cores (npu), a few (cpu), <= 65535."""
    if backend == "cpu":
        return _CPU_GRID_CAP
    index = tensor.device.index
    key = (backend, index)
    if key not in _grid_cap_cache:
        if backend == "cuda":
            cap = torch.cuda.get_device_properties(tensor.device).multi_processor_count
        else:
            if index is None:
                index = torch.npu.current_device()
            props = triton.runtime.driver.active.utils.get_device_properties(index)
            cap = props.get("num_vectorcore") or props.get("num_aicore") or 1
        _grid_cap_cache[key] = max(1, min(int(cap), _GRID_CAP_LIMIT))
    return _grid_cap_cache[key]


def compress_and_write_cache(*, k, gate, ape, compressed_cache, tail_cache, positions, cum_query_lens,
                             raw_seq_lens, slot_mapping, tail_block_table, tail_slot_mapping,
                             num_live_tokens: int, index_kpool: int,
                             launch_options: dict | None = None) -> None:
    """Update both KPool caches for one forward, in place (kpool-algorithm.md §5).

    Launch 1 compresses every pool completed by a live row into ``compressed_cache`` (window
    read from ``k``/``gate`` or, for positions before this call's chunk, from the pre-call
    ring); launch 2 then writes each request's last ``C`` live rows into ``tail_cache``.

    Args:
        k: fp32 ``[T, D]`` raw keys (any strides).
        gate: fp32 ``[T, D]`` raw gate logits, before APE (any strides).
        ape: fp32 ``[P, D]`` per-slot position embedding.
        compressed_cache: bf16 ``[N, B, 1, D]`` (any strides, e.g. padded pages); updated.
        tail_cache: fp32 ``[num_tail_blocks, 2, C, D]`` (any strides, e.g. the padded-block view
            of public case C03); updated.
        positions: int64 ``[T]`` absolute positions.
        cum_query_lens: int32 ``[R]`` exclusive query ends (no leading zero).
        raw_seq_lens: int32 ``[R]`` token lengths including this step.
        slot_mapping: int64 ``[T]`` compressed write slot ``page * B + row`` or -1.
        tail_block_table: int32 ``[R, >=1]`` ring block per request (column 0 read).
        tail_slot_mapping: int64 ``[T]`` ring slot ``block * C + p % C`` or -1.
        num_live_tokens: ``T_live = cum_query_lens[-1]`` (host int); rows ``>= T_live`` never write.
        index_kpool: ``P`` (compile-time constant of launch 1).
        launch_options: Triton launch kwargs; default ``kpool.platform.launch_options(backend)``
            for the backend of ``k``'s device (cuda: ``enable_fp_fusion=False``, required for
            bit parity).

    Returns:
        None. Nothing is launched when ``num_live_tokens == 0`` or ``R == 0``.

    Raises:
        Nothing of its own: inputs are validated by the caller (``kpool/indexer.py``); bad
        slots / ring blocks are skipped in the kernel (never written, never faulting).
    """
    num_requests = int(cum_query_lens.shape[0])
    num_live = int(num_live_tokens)
    if num_live <= 0 or num_requests == 0:
        return
    backend = _backend_of(k)
    if launch_options is None:
        from kpool.platform import launch_options as _platform_launch_options
        launch_options = _platform_launch_options(backend)
    if cum_query_lens.stride(0) != 1:
        cum_query_lens = cum_query_lens.contiguous()   # request_of_rows reads it with unit stride

    P = int(index_kpool)
    D = int(k.shape[1])
    N, B = int(compressed_cache.shape[0]), int(compressed_cache.shape[1])
    num_tail_blocks, C = int(tail_cache.shape[0]), int(tail_cache.shape[2])
    block_t, block_d = cache_update_tiles(num_live, D, backend)
    work = triton.cdiv(num_live, block_t)
    grid = min(work, _grid_cap(backend, k))
    iters = triton.cdiv(work, grid)

    _compress_pools_kernel[(grid,)](
        k, gate, ape, compressed_cache.view(torch.int16), tail_cache,
        positions, cum_query_lens, raw_seq_lens, slot_mapping, tail_block_table,
        num_live, num_requests, iters, D, B, N * B, C, num_tail_blocks,
        k.stride(0), k.stride(1), gate.stride(0), gate.stride(1), ape.stride(0), ape.stride(1),
        compressed_cache.stride(0), compressed_cache.stride(1), compressed_cache.stride(3),
        tail_cache.stride(0), tail_cache.stride(1), tail_cache.stride(2), tail_cache.stride(3),
        positions.stride(0), raw_seq_lens.stride(0), slot_mapping.stride(0), tail_block_table.stride(0),
        P=P, BLOCK_T=block_t, BLOCK_D=block_d, **launch_options)

    _ring_write_kernel[(grid,)](
        k.view(torch.int32), gate.view(torch.int32), tail_cache.view(torch.int32),
        positions, cum_query_lens, tail_slot_mapping,
        num_live, num_requests, iters, D, C, num_tail_blocks * C,
        k.stride(0), k.stride(1), gate.stride(0), gate.stride(1),
        tail_cache.stride(0), tail_cache.stride(1), tail_cache.stride(2), tail_cache.stride(3),
        positions.stride(0), tail_slot_mapping.stride(0),
        BLOCK_T=block_t, BLOCK_D=block_d, **launch_options)

