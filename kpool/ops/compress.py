"""KPool cache update: pool compression then tail-ring write (kpool-algorithm.md §5).

Two ordered launches (§5.4 "launch 2 runs strictly after launch 1"):

1. :func:`_compress_kernel` — every live row that completes a pool compresses the pool's
   P-token window (from this call's inputs, or from the ring as it was before the call) into
   one bf16 row of the compressed cache (§5.1-§5.3, canonical order of
   ``reference.numerics.compress_pools``, §11). Compression has no reduction over ``D``, so it
   stays bitwise equal to the reference on every backend: software ``exp_fp32``,
   ``tl.math.div_rn``, no FMA (``enable_fp_fusion=False``), RNE on the int32 bits.
2. :func:`_ring_write_kernel` — the last ``C`` live rows of every request copy their raw
   K and gate bit-exactly into the request's ring (§5.4).

When the caller's ``max_query_len`` shows that no ring write can land on a ring row that the
compression reads (:func:`one_cache_launch`: queries of at most ``C - P + 1`` rows, decode and
MTP verify), :func:`_update_kernel` runs both as one launch, split by program id: the order of
§5.4 then orders nothing, and the bits are the same.

Tiling (``kpool.ops.plan.compress_plan``): a tile is ``BLOCK_J * P`` consecutive token rows x
``D_SPLIT`` channels (in chunks of ``BLOCK_D``).
When the tile lies inside one request (every prefill tile but the edges), its rows have
consecutive positions (validation guarantees it), so exactly ``BLOCK_J`` of them complete a
pool, every ``P``-th from the first: one lane per pool, no idle lanes. Any other tile (request
boundaries, decode batches) walks its rows as ``P`` groups of ``BLOCK_J`` lanes. A launch of few
rows (``T <= latency_rows``: decode) takes the latency tile instead, one pool's ``P`` rows x
``BLOCK_D`` channels, all rows at once (``ROWS_AT_ONCE``), so its rows and channels spread over
many programs. Channels go in chunks of ``BLOCK_D`` so the live tiles stay in registers (no
spills). ``T_live`` is read on the device (``kpool.ops._portable.live_rows``): nothing here reads
device data on the host, so the launches can be captured in a graph. Every guard (live row,
position window, slot and ring block in range) is evaluated in the kernel, so bad metadata never
writes and never faults; validation proper is the caller's job (``kpool/indexer.py``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import INT32_MAX
from . import plan as launch_plan
from ._portable import INT32_MIN_C, bf16_rne_int16, exp_fp32, live_rows, request_of_rows

INT32_MAX_C = tl.constexpr(INT32_MAX)
# Runtime sizes and outer strides are listed in ``do_not_specialize``: Triton would otherwise
# compile a new variant for every combination of "== 1" / "% 16 == 0" among them, and a batch
# stream varies them all the time (page size, padding, ring capacity). Unit inner strides and D
# stay specialized (they do not vary). The cache pointers are views behind guard bands, so their
# 16-byte alignment varies too. Specialization changes addressing only, never the math.
_COMPRESS_NO_SPECIALIZE = ["num_rows", "num_requests", "search_steps", "page_size", "num_slots", "ring_capacity",
                           "num_tail_blocks", "stride_k_t", "stride_gate_t", "stride_ape_p", "stride_cache_n",
                           "stride_cache_b", "stride_tail_blk", "stride_tail_plane", "stride_tail_c",
                           "stride_positions_t", "stride_raw_seq_lens_r", "stride_slot_mapping_t",
                           "stride_tail_block_table_r"]
_RING_NO_SPECIALIZE = ["num_rows", "num_requests", "ring_capacity", "num_tail_slots", "stride_k_t", "stride_gate_t",
                       "stride_tail_blk", "stride_tail_plane", "stride_tail_c", "stride_positions_t",
                       "stride_tail_slot_mapping_t"]


@triton.jit
def _negative_zeros_like(x):
    """fp32 ``-0.0`` in the shape of ``x``, from its bits (``-tl.zeros_like`` is ``0 - 0.0 = +0.0``):
    the identity of fp32 addition, ``-0.0 + y == y`` bit for bit for every ``y``."""
    return (tl.zeros_like(x).to(tl.int32, bitcast=True) | INT32_MIN_C).to(tl.float32, bitcast=True)


@triton.jit
def _window_tile(in_ptr, stride_in_t, stride_in_d, tail_ptr, plane_off, w, qs_pos, in_shift, t_live,
                 ring_base, ring_ok, ring_capacity, stride_tail_c, stride_tail_d, valid, dims, dmask):
    """fp32 ``[BLOCK_J, BLOCK_D]`` tile of window position ``w`` (one per lane): from the inputs
    at row ``w + in_shift`` (= ``qs_r + (w - qs_pos)``) when ``w >= qs_pos``, else from ring
    plane ``plane_off`` at ``w % C``, 0.0 when the ring block is out of range (§5.2).
    Masked-off lanes may form out-of-range addresses; they are never dereferenced."""
    from_in = w >= qs_pos
    in_row = w + in_shift
    in_ok = valid & from_in & (in_row >= 0) & (in_row < t_live)
    x_in = tl.load(in_ptr + (in_row.to(tl.int64) * stride_in_t)[:, None] + dims[None, :] * stride_in_d,
                   mask=in_ok[:, None] & dmask[None, :], other=0.0)
    ring_use = valid & (w < qs_pos) & ring_ok
    ring_off = ring_base + plane_off + ((w % ring_capacity) * stride_tail_c).to(tl.int64)
    x_ring = tl.load(tail_ptr + ring_off[:, None] + dims[None, :] * stride_tail_d,
                     mask=ring_use[:, None] & dmask[None, :], other=0.0)
    return tl.where(from_in[:, None], x_in, x_ring)


@triton.jit
def _window_group(in_ptr, stride_in_t, stride_in_d, tail_ptr, plane_off, w, qs_pos, in_shift, t_live,
                  ring_base, ring_ok, ring_capacity, stride_tail_c, stride_tail_d, valid, dims, dmask,
                  SLOTS: tl.constexpr):
    """:func:`_window_tile` of window positions ``w .. w + SLOTS - 1`` (``SLOTS <= 4``), returned
    as four tiles; those past ``SLOTS`` repeat the first (never used). All loads are issued
    together: one memory round trip per group."""
    x0 = _window_tile(in_ptr, stride_in_t, stride_in_d, tail_ptr, plane_off, w, qs_pos, in_shift, t_live,
                      ring_base, ring_ok, ring_capacity, stride_tail_c, stride_tail_d, valid, dims, dmask)
    x1 = x0
    x2 = x0
    x3 = x0
    if SLOTS > 1:
        x1 = _window_tile(in_ptr, stride_in_t, stride_in_d, tail_ptr, plane_off, w + 1, qs_pos, in_shift, t_live,
                          ring_base, ring_ok, ring_capacity, stride_tail_c, stride_tail_d, valid, dims, dmask)
    if SLOTS > 2:
        x2 = _window_tile(in_ptr, stride_in_t, stride_in_d, tail_ptr, plane_off, w + 2, qs_pos, in_shift, t_live,
                          ring_base, ring_ok, ring_capacity, stride_tail_c, stride_tail_d, valid, dims, dmask)
    if SLOTS > 3:
        x3 = _window_tile(in_ptr, stride_in_t, stride_in_d, tail_ptr, plane_off, w + 3, qs_pos, in_shift, t_live,
                          ring_base, ring_ok, ring_capacity, stride_tail_c, stride_tail_d, valid, dims, dmask)
    return x0, x1, x2, x3


@triton.jit
def _group_logits(gate_ptr, stride_gate_t, stride_gate_d, ape_ptr, stride_ape_p, stride_ape_d, tail_ptr,
                  stride_tail_plane, w0, j, qs_pos, in_shift, t_live, ring_base, ring_ok, ring_capacity,
                  stride_tail_c, stride_tail_d, valid, dims, dmask, SLOTS: tl.constexpr):
    """fp32 ``[BLOCK_J, BLOCK_D]`` logits ``s_i = gate_i + ape_i`` of window slots ``j .. j + SLOTS - 1``
    (one add each, §5.3 step 1): the gate at window position ``w0 + i`` (:func:`_window_group`,
    gate plane of the ring) plus APE row ``i``. Four tiles, as :func:`_window_group`."""
    g0, g1, g2, g3 = _window_group(gate_ptr, stride_gate_t, stride_gate_d, tail_ptr, stride_tail_plane, w0 + j,
                                   qs_pos, in_shift, t_live, ring_base, ring_ok, ring_capacity, stride_tail_c,
                                   stride_tail_d, valid, dims, dmask, SLOTS)
    s0 = g0 + tl.load(ape_ptr + j * stride_ape_p + dims * stride_ape_d, mask=dmask, other=0.0)[None, :]
    s1 = s0
    s2 = s0
    s3 = s0
    if SLOTS > 1:
        s1 = g1 + tl.load(ape_ptr + (j + 1) * stride_ape_p + dims * stride_ape_d, mask=dmask, other=0.0)[None, :]
    if SLOTS > 2:
        s2 = g2 + tl.load(ape_ptr + (j + 2) * stride_ape_p + dims * stride_ape_d, mask=dmask, other=0.0)[None, :]
    if SLOTS > 3:
        s3 = g3 + tl.load(ape_ptr + (j + 3) * stride_ape_p + dims * stride_ape_d, mask=dmask, other=0.0)[None, :]
    return s0, s1, s2, s3


@triton.jit
def _max_into(m, s0, s1, s2, s3, FIRST: tl.constexpr, SLOTS: tl.constexpr):
    """The running max ``m`` folded with ``s_FIRST .. s_{SLOTS-1}``, in slot order (§5.3 step 2)."""
    if FIRST <= 0:
        m = tl.maximum(m, s0)
    if FIRST <= 1 and SLOTS > 1:
        m = tl.maximum(m, s1)
    if FIRST <= 2 and SLOTS > 2:
        m = tl.maximum(m, s2)
    if SLOTS > 3:
        m = tl.maximum(m, s3)
    return m


@triton.jit
def _group_exps(s0, s1, s2, s3, m, SLOTS: tl.constexpr):
    """``e_i = exp(s_i - m)`` of a group (§5.3 step 3); those past ``SLOTS`` repeat ``e_0``."""
    e0 = exp_fp32(s0 - m)
    e1 = e0
    e2 = e0
    e3 = e0
    if SLOTS > 1:
        e1 = exp_fp32(s1 - m)
    if SLOTS > 2:
        e2 = exp_fp32(s2 - m)
    if SLOTS > 3:
        e3 = exp_fp32(s3 - m)
    return e0, e1, e2, e3


@triton.jit
def _group_exps_at(gate_ptr, stride_gate_t, stride_gate_d, ape_ptr, stride_ape_p, stride_ape_d, tail_ptr,
                   stride_tail_plane, w0, j, qs_pos, in_shift, t_live, ring_base, ring_ok, ring_capacity,
                   stride_tail_c, stride_tail_d, valid, dims, dmask, m, SLOTS: tl.constexpr):
    """:func:`_group_exps` of slots ``j .. j + SLOTS - 1``, their logits recomputed
    (:func:`_group_logits`: the same bits as in pass 1); passes 2 and 3 when P is several groups."""
    s0, s1, s2, s3 = _group_logits(gate_ptr, stride_gate_t, stride_gate_d, ape_ptr, stride_ape_p, stride_ape_d,
                                   tail_ptr, stride_tail_plane, w0, j, qs_pos, in_shift, t_live, ring_base, ring_ok,
                                   ring_capacity, stride_tail_c, stride_tail_d, valid, dims, dmask, SLOTS)
    return _group_exps(s0, s1, s2, s3, m, SLOTS)


@triton.jit
def _sum_into(z, e0, e1, e2, e3, FIRST: tl.constexpr, SLOTS: tl.constexpr):
    """``z`` plus ``e_FIRST .. e_{SLOTS-1}``, left to right (§5.3 step 4)."""
    if FIRST <= 0:
        z = z + e0
    if FIRST <= 1 and SLOTS > 1:
        z = z + e1
    if FIRST <= 2 and SLOTS > 2:
        z = z + e2
    if SLOTS > 3:
        z = z + e3
    return z


@triton.jit
def _weighted(e, z, kv):
    """One term ``div_rn(e_j, Z) * K_j`` of §5.3 step 5, the product rounded before its add."""
    term = tl.math.div_rn(e, z) * kv
    return term


@triton.jit
def _weighted_into(out, e0, e1, e2, e3, z, k0, k1, k2, k3, SLOTS: tl.constexpr):
    """``out`` plus the group's terms :func:`_weighted`, left to right (§5.3 step 5)."""
    out = out + _weighted(e0, z, k0)
    if SLOTS > 1:
        out = out + _weighted(e1, z, k1)
    if SLOTS > 2:
        out = out + _weighted(e2, z, k2)
    if SLOTS > 3:
        out = out + _weighted(e3, z, k3)
    return out


@triton.jit
def _compress_rows(rows, d_first, d_end, num_rows, k_ptr, gate_ptr, ape_ptr, cache_ptr, tail_ptr,
                   positions_ptr, cum_query_lens_ptr, raw_seq_lens_ptr, slot_mapping_ptr, tail_block_table_ptr,
                   num_requests, search_steps, D, page_size, num_slots, ring_capacity, num_tail_blocks,
                   stride_k_t, stride_k_d, stride_gate_t, stride_gate_d, stride_ape_p, stride_ape_d,
                   stride_cache_n, stride_cache_b, stride_cache_d,
                   stride_tail_blk, stride_tail_plane, stride_tail_c, stride_tail_d,
                   stride_positions_t, stride_raw_seq_lens_r, stride_slot_mapping_t,
                   stride_tail_block_table_r, P: tl.constexpr, BLOCK_D: tl.constexpr):
    """Compress channels ``[d_first, d_end)`` of the pool completed by each of ``rows`` (int32
    ``[BLOCK_J]``) that completes one; other lanes are masked (§5.1: a live row at position ``p`` with ``(p + 1) % P == 0`` and a
    compressed slot in range)."""
    # slots of an unrolled group: all P up to 4, else the largest of 4, 3, 2, 1 that divides P
    SLOTS: tl.constexpr = 4 if P % 4 == 0 else (3 if P % 3 == 0 else (2 if P % 2 == 0 else 1))
    live = live_rows(rows, num_rows, cum_query_lens_ptr, num_requests)
    t_live = tl.load(cum_query_lens_ptr + num_requests - 1)
    pos = tl.load(positions_ptr + rows * stride_positions_t, mask=live, other=-1)
    slot = tl.load(slot_mapping_ptr + rows * stride_slot_mapping_t, mask=live, other=-1)
    pos_ok = (pos >= 0) & (pos < INT32_MAX_C - P)
    # Narrow to int32 before tl.where: int64 select is not in the A2/A3 subset.
    p = tl.where(pos_ok, pos.to(tl.int32), 0)
    valid = live & pos_ok & ((p + 1) % P == 0) & (slot >= 0) & (slot < num_slots)
    # Destination row from the slot alone: any op mixing the i1 `valid` into a 1-D int value
    # (tl.where, .to(int32)) crashes Triton 3.6's CUDA layout pass (TritonGPURemoveLayout-
    # Conversions) at some tile shapes. Invalid lanes get a meaningless address, never used:
    # their store is masked by `valid`.
    slot32 = slot.to(tl.int32)
    page = slot32 // page_size
    prow = slot32 - page * page_size
    dst = page.to(tl.int64) * stride_cache_n + prow.to(tl.int64) * stride_cache_b

    r = request_of_rows(rows, cum_query_lens_ptr, num_requests, search_steps)
    end_r = tl.load(cum_query_lens_ptr + r)
    qs_row = tl.load(cum_query_lens_ptr + r - 1, mask=r > 0, other=0)
    raw = tl.load(raw_seq_lens_ptr + r * stride_raw_seq_lens_r)
    qs_pos = raw - (end_r - qs_row)
    ring_blk = tl.load(tail_block_table_ptr + r * stride_tail_block_table_r)
    ring_ok = (ring_blk >= 0) & (ring_blk < num_tail_blocks)
    ring_base = ring_blk.to(tl.int64) * stride_tail_blk
    in_shift = qs_row - qs_pos
    w0 = p - (P - 1)
    for d0 in range(d_first, d_end, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        dmask = dims < D
        # Pass 1: m = sequential max of s_j = gate_j + ape_j, from m = s_0, SLOTS slots at a time.
        s0, s1, s2, s3 = _group_logits(gate_ptr, stride_gate_t, stride_gate_d, ape_ptr, stride_ape_p, stride_ape_d,
                                       tail_ptr, stride_tail_plane, w0, 0, qs_pos, in_shift, t_live, ring_base,
                                       ring_ok, ring_capacity, stride_tail_c, stride_tail_d, valid, dims, dmask,
                                       SLOTS)
        m = _max_into(s0, s0, s1, s2, s3, 1, SLOTS)
        for g in range(SLOTS, P, SLOTS):
            t0, t1, t2, t3 = _group_logits(gate_ptr, stride_gate_t, stride_gate_d, ape_ptr, stride_ape_p,
                                           stride_ape_d, tail_ptr, stride_tail_plane, w0, g, qs_pos, in_shift,
                                           t_live, ring_base, ring_ok, ring_capacity, stride_tail_c, stride_tail_d,
                                           valid, dims, dmask, SLOTS)
            m = _max_into(m, t0, t1, t2, t3, 0, SLOTS)
        # Pass 2: Z = left-to-right sum of e_j = exp(s_j - m); pass 3: out = sum_j div_rn(e_j, Z) * K_j,
        # each product rounded before its add. The sums start at -0.0, the identity of fp32
        # addition (-0.0 + x == x bit for bit for every x, +-0.0 and NaN included): the same bits
        # as a sum that starts at its first term.
        if P == SLOTS:
            # One group (every P <= 4, GLM's P = 4): the logits stay live, each exp is computed
            # once, and the key tiles are loaded with them (one memory round trip).
            k0, k1, k2, k3 = _window_group(k_ptr, stride_k_t, stride_k_d, tail_ptr, 0, w0, qs_pos, in_shift, t_live,
                                           ring_base, ring_ok, ring_capacity, stride_tail_c, stride_tail_d, valid,
                                           dims, dmask, SLOTS)
            e0, e1, e2, e3 = _group_exps(s0, s1, s2, s3, m, SLOTS)
            z = _sum_into(_negative_zeros_like(m), e0, e1, e2, e3, 0, SLOTS)
            out = _weighted_into(_negative_zeros_like(m), e0, e1, e2, e3, z, k0, k1, k2, k3, SLOTS)
        else:
            # Larger P: each pass recomputes its groups' logits (same bits, from L1) instead of
            # keeping P live tiles, to bound registers and compile time (P = 16 unrolled whole:
            # 24-37 s, 255 registers, a 6 KiB spill; its first group kept live: 21 s).
            z = _negative_zeros_like(m)
            for g in range(0, P, SLOTS):
                f0, f1, f2, f3 = _group_exps_at(gate_ptr, stride_gate_t, stride_gate_d, ape_ptr, stride_ape_p,
                                                stride_ape_d, tail_ptr, stride_tail_plane, w0, g, qs_pos, in_shift,
                                                t_live, ring_base, ring_ok, ring_capacity, stride_tail_c,
                                                stride_tail_d, valid, dims, dmask, m, SLOTS)
                z = _sum_into(z, f0, f1, f2, f3, 0, SLOTS)
            out = _negative_zeros_like(m)
            for g in range(0, P, SLOTS):
                f0, f1, f2, f3 = _group_exps_at(gate_ptr, stride_gate_t, stride_gate_d, ape_ptr, stride_ape_p,
                                                stride_ape_d, tail_ptr, stride_tail_plane, w0, g, qs_pos, in_shift,
                                                t_live, ring_base, ring_ok, ring_capacity, stride_tail_c,
                                                stride_tail_d, valid, dims, dmask, m, SLOTS)
                c0, c1, c2, c3 = _window_group(k_ptr, stride_k_t, stride_k_d, tail_ptr, 0, w0 + g, qs_pos, in_shift,
                                               t_live, ring_base, ring_ok, ring_capacity, stride_tail_c,
                                               stride_tail_d, valid, dims, dmask, SLOTS)
                out = _weighted_into(out, f0, f1, f2, f3, z, c0, c1, c2, c3, SLOTS)
        tl.store(cache_ptr + dst[:, None] + dims[None, :] * stride_cache_d, bf16_rne_int16(out),
                 mask=valid[:, None] & dmask[None, :])


@triton.jit
def _compress_tiles(pid, nprog,
        k_ptr, gate_ptr, ape_ptr, cache_ptr, tail_ptr,
        positions_ptr, cum_query_lens_ptr, raw_seq_lens_ptr, slot_mapping_ptr, tail_block_table_ptr,
        num_rows, num_requests, search_steps, D, page_size, num_slots, ring_capacity, num_tail_blocks,
        stride_k_t, stride_k_d, stride_gate_t, stride_gate_d, stride_ape_p, stride_ape_d,
        stride_cache_n, stride_cache_b, stride_cache_d,
        stride_tail_blk, stride_tail_plane, stride_tail_c, stride_tail_d,
        stride_positions_t, stride_raw_seq_lens_r, stride_slot_mapping_t, stride_tail_block_table_r,
        P: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr, D_SPLIT: tl.constexpr,
        ROWS_AT_ONCE: tl.constexpr, BLOCK_R: tl.constexpr):
    """The tiles ``pid, pid + nprog, ...`` of launch 1 (:func:`_compress_kernel`)."""
    lanes = tl.arange(0, BLOCK_J)
    t_live = tl.load(cum_query_lens_ptr + num_requests - 1)
    n_chunks = tl.cdiv(D, D_SPLIT)
    for tile in range(pid, tl.cdiv(num_rows, BLOCK_J * P) * n_chunks, nprog):
        # tile = (row tile, channel chunk): channels are independent, so small batches (decode)
        # still spread over several programs.
        d_first = (tile % n_chunks) * D_SPLIT
        d_end = tl.minimum(d_first + D_SPLIT, D)
        t0 = (tile // n_chunks) * (BLOCK_J * P)
        t1 = t0 + (BLOCK_J * P - 1)
        if ROWS_AT_ONCE:
            # Every row of the tile in one group (lane = row): the interpreter pays per
            # operation, not per lane, and a compiled latency tile (one pool's P rows) then runs
            # one pass of the window instead of P dependent ones.
            rows = t0 + tl.arange(0, BLOCK_R)
            group_rows = tl.where(rows <= t1, rows, num_rows)
            groups = 1
        else:
            r0 = request_of_rows(t0, cum_query_lens_ptr, num_requests, search_steps)
            r1 = request_of_rows(t1, cum_query_lens_ptr, num_requests, search_steps)
            qs0 = tl.load(cum_query_lens_ptr + r0 - 1, mask=r0 > 0, other=0)
            qe0 = tl.load(cum_query_lens_ptr + r0)
            # A tile inside one request has consecutive positions (validated metadata), so its
            # completing rows are every P-th from the first one: one group of BLOCK_J lanes, each
            # lane a pool. Any other tile walks all its rows as P groups (lane = row).
            single = (r0 == r1) & (t0 >= qs0) & (t1 < qe0) & (t1 < t_live)
            pos0 = tl.load(positions_ptr + t0 * stride_positions_t, mask=single, other=P - 1).to(tl.int32)
            first = (P - 1) - (pos0 % P)
            groups = tl.where(single, 1, P)
            group_rows = t0 + first + lanes * P          # group g: these rows + g
        for group in range(0, groups):
            _compress_rows(group_rows + group, d_first, d_end, num_rows, k_ptr, gate_ptr, ape_ptr, cache_ptr,
                           tail_ptr, positions_ptr, cum_query_lens_ptr, raw_seq_lens_ptr, slot_mapping_ptr,
                           tail_block_table_ptr, num_requests, search_steps, D, page_size, num_slots,
                           ring_capacity, num_tail_blocks, stride_k_t, stride_k_d, stride_gate_t, stride_gate_d,
                           stride_ape_p, stride_ape_d, stride_cache_n, stride_cache_b, stride_cache_d,
                           stride_tail_blk, stride_tail_plane, stride_tail_c, stride_tail_d,
                           stride_positions_t, stride_raw_seq_lens_r, stride_slot_mapping_t,
                           stride_tail_block_table_r, P, BLOCK_D)


@triton.jit(do_not_specialize=_COMPRESS_NO_SPECIALIZE, do_not_specialize_on_alignment=["cache_ptr", "tail_ptr"])
def _compress_kernel(
        k_ptr, gate_ptr, ape_ptr, cache_ptr, tail_ptr,
        positions_ptr, cum_query_lens_ptr, raw_seq_lens_ptr, slot_mapping_ptr, tail_block_table_ptr,
        num_rows, num_requests, search_steps, D, page_size, num_slots, ring_capacity, num_tail_blocks,
        stride_k_t, stride_k_d, stride_gate_t, stride_gate_d, stride_ape_p, stride_ape_d,
        stride_cache_n, stride_cache_b, stride_cache_d,
        stride_tail_blk, stride_tail_plane, stride_tail_c, stride_tail_d,
        stride_positions_t, stride_raw_seq_lens_r, stride_slot_mapping_t, stride_tail_block_table_r,
        P: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr, D_SPLIT: tl.constexpr,
        ROWS_AT_ONCE: tl.constexpr, BLOCK_R: tl.constexpr):
    """Launch 1 (kpool-algorithm.md §5.1-§5.3). ``cache_ptr`` is an int16 view of the bf16
    compressed cache (bit-exact RNE store); ``tail_ptr`` the fp32 ring (read only)."""
    _compress_tiles(tl.program_id(0), tl.num_programs(0), k_ptr, gate_ptr, ape_ptr, cache_ptr, tail_ptr, positions_ptr,
        cum_query_lens_ptr, raw_seq_lens_ptr, slot_mapping_ptr, tail_block_table_ptr, num_rows, num_requests,
        search_steps, D, page_size, num_slots, ring_capacity, num_tail_blocks, stride_k_t, stride_k_d, stride_gate_t,
        stride_gate_d, stride_ape_p, stride_ape_d, stride_cache_n, stride_cache_b, stride_cache_d, stride_tail_blk,
        stride_tail_plane, stride_tail_c, stride_tail_d, stride_positions_t, stride_raw_seq_lens_r,
        stride_slot_mapping_t, stride_tail_block_table_r, P, BLOCK_J, BLOCK_D, D_SPLIT, ROWS_AT_ONCE, BLOCK_R)


@triton.jit
def _ring_write_tiles(pid, nprog,
        k_ptr, gate_ptr, tail_ptr, positions_ptr, cum_query_lens_ptr, tail_slot_mapping_ptr,
        num_rows, num_requests, D, ring_capacity, num_tail_slots,
        stride_k_t, stride_k_d, stride_gate_t, stride_gate_d,
        stride_tail_blk, stride_tail_plane, stride_tail_c, stride_tail_d,
        stride_positions_t, stride_tail_slot_mapping_t, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """The tiles ``pid, pid + nprog, ...`` of launch 2 (:func:`_ring_write_kernel`)."""
    offs_t = tl.arange(0, BLOCK_T)
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < D
    per = tl.maximum(tl.minimum(ring_capacity, BLOCK_T), 1)
    reqs = BLOCK_T // per
    chunks = tl.cdiv(ring_capacity, per)
    lane_req = offs_t // per
    lane_row = offs_t - lane_req * per
    for tile in range(pid, tl.cdiv(num_requests, reqs) * chunks, nprog):
        group = tile // chunks
        r = group * reqs + lane_req
        has_req = (lane_req < reqs) & (r < num_requests)
        span_start = tl.load(cum_query_lens_ptr + r - 1, mask=has_req & (r > 0), other=0)
        span_end = tl.load(cum_query_lens_ptr + r, mask=has_req, other=0)
        first = tl.maximum(span_start, span_end - ring_capacity)
        rows = first + (tile - group * chunks) * per + lane_row
        # the request's last C rows; padding rows (>= T_live) are never stashed (§5.5 FULL mode)
        in_batch = live_rows(rows, num_rows, cum_query_lens_ptr, num_requests)
        near_end = has_req & in_batch & (rows >= 0) & (rows < span_end)   # only these read their metadata
        pos = tl.load(positions_ptr + rows * stride_positions_t, mask=near_end, other=-1)
        tslot = tl.load(tail_slot_mapping_ptr + rows * stride_tail_slot_mapping_t, mask=near_end, other=-1)
        valid = near_end & (pos >= 0) & (tslot >= 0) & (tslot < num_tail_slots)
        ts32 = tl.where(valid, tslot.to(tl.int32), 0)
        blk = ts32 // ring_capacity
        sl = ts32 - blk * ring_capacity
        dst = blk.to(tl.int64) * stride_tail_blk + sl.to(tl.int64) * stride_tail_c
        src_row = tl.where(valid, rows, 0).to(tl.int64)
        mask = valid[:, None] & dmask[None, :]
        kv = tl.load(k_ptr + (src_row * stride_k_t)[:, None] + dims[None, :] * stride_k_d, mask=mask, other=0)
        tl.store(tail_ptr + dst[:, None] + dims[None, :] * stride_tail_d, kv, mask=mask)
        gv = tl.load(gate_ptr + (src_row * stride_gate_t)[:, None] + dims[None, :] * stride_gate_d, mask=mask,
                     other=0)
        tl.store(tail_ptr + (dst + stride_tail_plane)[:, None] + dims[None, :] * stride_tail_d, gv, mask=mask)


@triton.jit(do_not_specialize=_RING_NO_SPECIALIZE, do_not_specialize_on_alignment=["tail_ptr"])
def _ring_write_kernel(
        k_ptr, gate_ptr, tail_ptr, positions_ptr, cum_query_lens_ptr, tail_slot_mapping_ptr,
        num_rows, num_requests, D, ring_capacity, num_tail_slots,
        stride_k_t, stride_k_d, stride_gate_t, stride_gate_d,
        stride_tail_blk, stride_tail_plane, stride_tail_c, stride_tail_d,
        stride_positions_t, stride_tail_slot_mapping_t, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Launch 2 (kpool-algorithm.md §5.4). ``k_ptr``, ``gate_ptr``, ``tail_ptr`` are int32
    views of the fp32 tensors: the copy moves bit patterns (NaN payloads included). The grid
    walks only the rows that are stashed, never all ``T``: a tile's ``BLOCK_T`` lanes hold
    ``per = min(C, BLOCK_T)`` consecutive rows of each of ``BLOCK_T // per`` requests' last ``C``
    rows (``kpool.ops.plan.ring_write_plan``)."""
    _ring_write_tiles(tl.program_id(0), tl.num_programs(0), k_ptr, gate_ptr, tail_ptr, positions_ptr,
        cum_query_lens_ptr, tail_slot_mapping_ptr, num_rows, num_requests, D, ring_capacity, num_tail_slots,
        stride_k_t, stride_k_d,
        stride_gate_t, stride_gate_d, stride_tail_blk, stride_tail_plane, stride_tail_c, stride_tail_d,
        stride_positions_t, stride_tail_slot_mapping_t, BLOCK_T, BLOCK_D)


@triton.jit(do_not_specialize=_COMPRESS_NO_SPECIALIZE + ["num_tail_slots", "stride_tail_slot_mapping_t",
                                                        "compress_programs"],
             do_not_specialize_on_alignment=["cache_ptr", "tail_ptr", "ring_tail_ptr"])
def _update_kernel(
        k_ptr, gate_ptr, ape_ptr, cache_ptr, tail_ptr,
        positions_ptr, cum_query_lens_ptr, raw_seq_lens_ptr, slot_mapping_ptr, tail_block_table_ptr,
        num_rows, num_requests, search_steps, D, page_size, num_slots, ring_capacity, num_tail_blocks,
        stride_k_t, stride_k_d, stride_gate_t, stride_gate_d, stride_ape_p, stride_ape_d,
        stride_cache_n, stride_cache_b, stride_cache_d,
        stride_tail_blk, stride_tail_plane, stride_tail_c, stride_tail_d,
        stride_positions_t, stride_raw_seq_lens_r, stride_slot_mapping_t, stride_tail_block_table_r,
        ring_k_ptr, ring_gate_ptr, ring_tail_ptr, tail_slot_mapping_ptr, num_tail_slots, stride_tail_slot_mapping_t,
        compress_programs,
        P: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr, D_SPLIT: tl.constexpr,
        ROWS_AT_ONCE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, RING_BLOCK_D: tl.constexpr):
    """Both launches of the cache update in one, for a batch whose ring writes cannot reach a ring
    row that the compression reads (every query at most ``C - P + 1`` rows: decode, MTP verify;
    the host decides, :func:`compress_and_write_cache`): programs ``[0, compress_programs)`` run
    launch 1's tiles, the others launch 2's. Arguments: launch 1's, then launch 2's own (the
    int32 views ``ring_*_ptr``, the ring slots), the program split, both launches' constexprs
    (launch 2's ``BLOCK_D`` as ``RING_BLOCK_D``)."""
    pid = tl.program_id(0)
    if pid < compress_programs:
        _compress_tiles(pid, compress_programs, k_ptr, gate_ptr, ape_ptr, cache_ptr, tail_ptr, positions_ptr,
                        cum_query_lens_ptr, raw_seq_lens_ptr, slot_mapping_ptr, tail_block_table_ptr, num_rows,
                        num_requests, search_steps, D, page_size, num_slots, ring_capacity, num_tail_blocks,
                        stride_k_t, stride_k_d, stride_gate_t, stride_gate_d, stride_ape_p, stride_ape_d,
                        stride_cache_n, stride_cache_b, stride_cache_d, stride_tail_blk, stride_tail_plane,
                        stride_tail_c, stride_tail_d, stride_positions_t, stride_raw_seq_lens_r,
                        stride_slot_mapping_t, stride_tail_block_table_r, P, BLOCK_J, BLOCK_D, D_SPLIT,
                        ROWS_AT_ONCE, BLOCK_R)
    else:
        _ring_write_tiles(pid - compress_programs, tl.num_programs(0) - compress_programs, ring_k_ptr,
                          ring_gate_ptr, ring_tail_ptr, positions_ptr, cum_query_lens_ptr, tail_slot_mapping_ptr,
                          num_rows, num_requests, D, ring_capacity, num_tail_slots, stride_k_t, stride_k_d,
                          stride_gate_t, stride_gate_d, stride_tail_blk, stride_tail_plane, stride_tail_c,
                          stride_tail_d, stride_positions_t, stride_tail_slot_mapping_t, BLOCK_T, RING_BLOCK_D)


def _unit_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its channels have unit stride and it starts 16-byte aligned (every serving
    engine's projection output and APE parameter), else a contiguous copy: one input layout per
    launch, so the compression and the ring write compile one variant of it, not one per inner
    stride and start alignment (issue 20, fewer compilations). Row strides stay free."""
    if t.stride(1) == 1 and t.data_ptr() % 16 == 0:
        return t
    copy = torch.empty(tuple(t.shape), dtype=t.dtype, device=t.device)    # strides (D, 1), even for D = 1
    copy.copy_(t)
    return copy


def one_cache_launch(max_query_len, ring_capacity: int, index_kpool: int) -> bool:
    """Whether no ring write of the step can land on a ring row its compression reads, so both
    launches may run as one (kpool-algorithm.md §5.4): a request with ``cached`` rows before the
    step reads positions ``[cached - P + 1, cached - 1]`` from its ring and writes positions up to
    ``cached + q - 1`` at slot ``p % C``; two of them share a slot only ``C`` or more positions
    apart, which needs ``q + P - 2 >= C``; at ``P = 1`` nothing is read from the ring. ``max_query_len``
    ``None`` (unknown): False."""
    if max_query_len is None:
        return False
    return int(index_kpool) == 1 or int(max_query_len) <= int(ring_capacity) - int(index_kpool) + 1


def compress_and_write_cache(*, k, gate, ape, compressed_cache, tail_cache, positions, cum_query_lens,
                             raw_seq_lens, slot_mapping, tail_block_table, tail_slot_mapping,
                             index_kpool: int, launch_options: dict | None = None,
                             max_query_len: int | None = None) -> None:
    """Update both KPool caches for one forward, in place (kpool-algorithm.md §5).

    Launch 1 compresses every pool completed by a live row into ``compressed_cache`` (window
    read from ``k``/``gate`` or, for positions before this call's chunk, from the pre-call
    ring); launch 2 then writes each request's last ``C`` live rows into ``tail_cache``.
    ``T_live = cum_query_lens[R - 1]`` is read by the kernels; the launch depends only on
    shapes (``T``, ``R``, ``D``), so it is the same for every replay of a captured graph.

    Args:
        k: fp32 ``[T, D]`` raw keys (any strides).
        gate: fp32 ``[T, D]`` raw gate logits, before APE (any strides).
        ape: fp32 ``[P, D]`` per-slot position embedding.
        compressed_cache: bf16 ``[N, B, 1, D]`` (any strides, e.g. padded pages); updated.
        tail_cache: fp32 ``[num_tail_blocks, 2, C, D]`` (any strides, e.g. the padded-block view
            of public case C03); updated.
        positions: int64 ``[T]`` absolute positions (contiguous per request, as validated).
        cum_query_lens: int32 ``[R]`` exclusive query ends (no leading zero).
        raw_seq_lens: int32 ``[R]`` token lengths including this step.
        slot_mapping: int64 ``[T]`` compressed write slot ``page * B + row`` or -1.
        tail_block_table: int32 ``[R, >=1]`` ring block per request (column 0 read).
        tail_slot_mapping: int64 ``[T]`` ring slot ``block * C + p % C`` or -1.
        index_kpool: ``P`` (compile-time constant of launch 1).
        launch_options: Triton launch kwargs; default from ``kpool.ops.plan`` (the backend's
            ``kpool.platform.launch_options``; cuda: ``enable_fp_fusion=False``, required for
            bit parity).
        max_query_len: host bound on every request's query rows (``kpool.indexer.forward``), or
            ``None``. At most ``C - P + 1`` (decode, MTP verify with ``C = P + speculative
            tokens``), both launches run as one (:func:`_update_kernel`, where the backend's
            ``TUNING["ring_write"]`` ``FUSED`` allows): a row's ring write then lands ``<= q - 1 +
            P - 1 < C`` positions after the oldest ring row the compression reads, so never on
            one of them, and the order of §5.4 has nothing left to order. Trusted, as the caller
            validated it.

    Returns:
        None. Nothing is launched when ``T == 0`` or ``R == 0``.

    Raises:
        Nothing of its own: inputs are validated by the caller (``kpool/indexer.py``); bad
        slots / ring blocks are skipped in the kernel (never written, never faulting).
    """
    num_requests = int(cum_query_lens.shape[0])
    T = int(k.shape[0])
    if T == 0 or num_requests == 0:
        return
    if cum_query_lens.stride(0) != 1:
        cum_query_lens = cum_query_lens.contiguous()   # request_of_rows reads it with unit stride
    search_steps = num_requests.bit_length()
    k, gate, ape = _unit_rows(k), _unit_rows(gate), _unit_rows(ape)
    D = int(k.shape[1])
    N, B = int(compressed_cache.shape[0]), int(compressed_cache.shape[1])
    num_tail_blocks, C = int(tail_cache.shape[0]), int(tail_cache.shape[2])
    first = launch_plan.compress_plan(T, D, int(index_kpool), k.device, launch_options)
    second = launch_plan.ring_write_plan(num_requests, C, D, k.device, launch_options)
    compress_args = (
        k, gate, ape, compressed_cache.view(torch.int16), tail_cache,
        positions, cum_query_lens, raw_seq_lens, slot_mapping, tail_block_table,
        T, num_requests, search_steps, D, B, N * B, C, num_tail_blocks,
        k.stride(0), k.stride(1), gate.stride(0), gate.stride(1), ape.stride(0), ape.stride(1),
        compressed_cache.stride(0), compressed_cache.stride(1), compressed_cache.stride(3),
        tail_cache.stride(0), tail_cache.stride(1), tail_cache.stride(2), tail_cache.stride(3),
        positions.stride(0), raw_seq_lens.stride(0), slot_mapping.stride(0), tail_block_table.stride(0))
    # launch 2's arguments, one tuple for both paths (a change at this launch site reaches both)
    ring_args = (
        k.view(torch.int32), gate.view(torch.int32), tail_cache.view(torch.int32),
        positions, cum_query_lens, tail_slot_mapping,
        T, num_requests, D, C, num_tail_blocks * C,
        k.stride(0), k.stride(1), gate.stride(0), gate.stride(1),
        tail_cache.stride(0), tail_cache.stride(1), tail_cache.stride(2), tail_cache.stride(3),
        positions.stride(0), tail_slot_mapping.stride(0))
    if one_cache_launch(max_query_len, C, int(index_kpool)) and launch_plan.fused_update(k.device):
        ring_k, ring_gate, ring_tail, _, _, ring_slots, _, _, _, _, num_tail_slots, *_, stride_slots = ring_args
        _update_kernel[(first.grid + second.grid,)](
            *compress_args, ring_k, ring_gate, ring_tail, ring_slots, num_tail_slots, stride_slots, first.grid,
            **first.constexprs, BLOCK_T=second.constexprs["BLOCK_T"], RING_BLOCK_D=second.constexprs["BLOCK_D"],
            **first.options)
        return
    _compress_kernel[(first.grid,)](*compress_args, **first.constexprs, **first.options)
    _ring_write_kernel[(second.grid,)](*ring_args, **second.constexprs, **second.options)
