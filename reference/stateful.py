"""Stateful reference of one KPool indexer forward (kpool-algorithm.md §3-§7, parity-contract.md §7).

Plain PyTorch with exactly the kernels' cache semantics, step by step:

1. pool compression (§5.1-§5.3) of every live row that completes a pool, the window read from
   this call's inputs or from the ring *as it was before the call*;
2. ring write (§5.4) of each request's last ``min(C, ql_r)`` rows, after all compressions;
3. selection (§4), only when ``compute_topk``: per-row scores against the request's pools read
   back through the block table, sanitization, canonical top-k, row expansion, ``-1`` padding.

All arithmetic goes through :mod:`reference.numerics` (``compress_pools``, ``pool_scores``,
``sanitize_scores``, ``canonical_topk``, ``expand_row``), so every rounding follows the canonical
order the kernels reproduce. Loops over requests and rows are deliberate: this is the readable
definition, not a fast path. This module never imports :mod:`kpool`.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from .numerics import compress_pools, index_rows, pool_scores, visible_pools

SCORE_CHUNK_ELEMENTS = 1 << 18
"""Rows are scored in chunks of about this many ``rows * pools * H`` fp32 elements. Scores are
element-wise per (row, pool), so chunking never changes a bit; it only bounds memory and keeps
the GLM-5.3-Flash shapes fast on a CPU (small chunks stay in cache)."""


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run the enclosed torch CPU ops on one intra-op thread, then restore the thread count.

    The reference issues many small element-wise ops; on a loaded 2-core host, OpenMP
    synchronisation between two threads made the GLM-size selection 15x slower than one thread.
    Element-wise fp32 results do not depend on the thread count, so no bit changes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def heads_innermost(q: torch.Tensor) -> torch.Tensor:
    """``q`` ``[rows, H, D]`` with the same values but memory strides ``(H*D, 1, H)``.

    Layout only: :func:`pool_scores` reads ``q[:, :, d]`` once per ``d``; with heads innermost
    that slice is contiguous, which makes the element-wise loop about 1.5x faster on a CPU.
    Every element-wise fp32 operation, and so every bit of the result, is unchanged."""
    return q.transpose(1, 2).contiguous().transpose(1, 2)


def request_bounds(cum_query_lens: torch.Tensor) -> list:
    """``[(qs_r, end_r)]`` for every request (kpool-algorithm.md §3.4): rows ``qs_r <= t < end_r``.

    Args:
        cum_query_lens: int ``[R]`` exclusive query ends, no leading zero.
    Returns:
        list of ``R`` ``(start, end)`` int pairs (``start == end`` for zero-length requests).
    """
    ends = [int(e) for e in cum_query_lens.tolist()]
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def forward(*, k, gate, q, weights, ape, compressed_cache, tail_cache, positions, cum_query_lens,
            raw_seq_lens, seq_lens, block_table, slot_mapping, tail_block_table, tail_slot_mapping,
            max_pool_seq_len, index_topk, index_kpool, score_mode="relu", pack_tail=True,
            compute_topk=True, output_buffer=None, always_select_tail=True) -> Optional[torch.Tensor]:
    """One KPool forward: cache update (always) then optional top-k (kpool-algorithm.md §4-§7).

    Args:
        k, gate: fp32 ``[T, D]`` raw keys and raw gate logits (before APE).
        q: bf16 ``[T, H, D]`` queries; weights: fp32 or bf16 ``[T, H]`` head weights. Both may be
            ``None`` when ``compute_topk=False``.
        ape: fp32 ``[P, D]`` per-slot position embedding.
        compressed_cache: bf16 ``[N, B, 1, D]`` (any strides), updated in place (§3.1).
        tail_cache: fp32 ``[blocks, 2, C, D]`` ring (any strides), updated in place (§3.3).
        positions: int64 ``[T]`` absolute positions (padded rows carry anything).
        cum_query_lens: int32 ``[R]`` exclusive query ends; ``T_live = cum_query_lens[-1]``.
        raw_seq_lens: int32 ``[R]`` token lengths including this step (compression, §5.2).
        seq_lens: int32 ``[R]`` complete pools per request (selection, §4.1).
        block_table: int32 ``[R, M]`` logical compressed page -> physical page.
        slot_mapping: int64 ``[T]`` compressed write slot ``page * B + row`` or ``-1`` (§3.2).
        tail_block_table: int32 ``[R, >=1]`` ring block per request (column 0 is read).
        tail_slot_mapping: int64 ``[T]`` ring slot ``block * C + p % C`` or ``-1``.
        max_pool_seq_len: host int, score-row length in pools.
        index_topk: ``K_tok`` (a positive multiple of P); index_kpool: ``P``.
        score_mode: ``"relu"`` (§4.2 (R)) or ``"merged"`` (§4.2 (M)).
        pack_tail: packed tail at column ``min(tail_start, K_tok)`` or fixed at ``K_tok`` (§4.5).
        compute_topk: ``False`` updates both caches and returns ``None`` (§5.5).
        output_buffer: optional int32 ``[capacity >= T, width >= W]``: rows ``< T`` are written
            over their whole width (columns ``>= W`` become -1), rows ``>= T`` are untouched.
        always_select_tail: ``False`` (HF ``index_kpool_always_select_tail=False``,
            kpool-algorithm.md §10): no tail step, ``W = K_tok``; everything else unchanged.

    Returns:
        int32 ``[T, 1, W]`` token indices within each request (``W = K_tok + P - 1``, or
        ``K_tok`` without the tail; ``-1`` =
        unused; padding rows ``t >= T_live`` all ``-1``), or ``output_buffer[:T, :W].unsqueeze(1)``,
        or ``None`` when ``compute_topk=False``. ``T == 0`` or ``R == 0``: the caches are not touched;
        the result is ``[T, 1, W]`` of -1 (every row is a padding row; empty when ``T == 0``).

    Raises:
        ValueError: ``index_topk`` not a positive multiple of ``index_kpool``, an unknown
            ``score_mode``, or an output buffer narrower than ``W`` / shorter than ``T``.

    Tensors on another device are processed on CPU copies and the results copied back.
    """
    P, K_tok = int(index_kpool), int(index_topk)
    if P < 1 or K_tok < 1 or K_tok % P != 0:
        raise ValueError("KPool top-k must be divisible by its positive pool size.")
    if score_mode not in ("relu", "merged"):
        raise ValueError(f"unknown score_mode {score_mode!r}")
    W = K_tok + P - 1 if always_select_tail else K_tok
    T = int(positions.shape[0])
    if output_buffer is not None and (output_buffer.shape[0] < T or output_buffer.shape[1] < W):
        raise ValueError(f"output_buffer {tuple(output_buffer.shape)} cannot hold [{T}, {W}]")

    args = dict(k=k, gate=gate, q=q, weights=weights, ape=ape, compressed_cache=compressed_cache,
                tail_cache=tail_cache, positions=positions, cum_query_lens=cum_query_lens,
                raw_seq_lens=raw_seq_lens, seq_lens=seq_lens, block_table=block_table,
                slot_mapping=slot_mapping, tail_block_table=tail_block_table,
                tail_slot_mapping=tail_slot_mapping, output_buffer=output_buffer)
    if any(t is not None and t.device.type != "cpu" for t in args.values()):
        return _forward_via_cpu(args, max_pool_seq_len=max_pool_seq_len, index_topk=K_tok,
                                index_kpool=P, score_mode=score_mode, pack_tail=pack_tail,
                                compute_topk=compute_topk, always_select_tail=always_select_tail)

    R = int(cum_query_lens.shape[0])
    if T == 0 or R == 0:
        # §5.5 / §9 item 3: empty batch, caches untouched. With R == 0 every one of the T rows is
        # a padding row, and padding rows are all -1 over their whole width (§4.5 step 4).
        if not compute_topk:
            return None
        out = output_buffer[:T] if output_buffer is not None else torch.empty((T, W), dtype=torch.int32)
        out.fill_(-1)
        return out[:, :W].unsqueeze(1)

    with single_threaded():
        return _forward_cpu(k=k, gate=gate, q=q, weights=weights, ape=ape, compressed_cache=compressed_cache,
                            tail_cache=tail_cache, positions=positions, cum_query_lens=cum_query_lens,
                            raw_seq_lens=raw_seq_lens, seq_lens=seq_lens, block_table=block_table,
                            slot_mapping=slot_mapping, tail_block_table=tail_block_table,
                            tail_slot_mapping=tail_slot_mapping, max_pool_seq_len=max_pool_seq_len,
                            K_tok=K_tok, P=P, score_mode=score_mode, pack_tail=pack_tail,
                            compute_topk=compute_topk, output_buffer=output_buffer,
                            always_select_tail=always_select_tail)


def _forward_cpu(*, k, gate, q, weights, ape, compressed_cache, tail_cache, positions, cum_query_lens,
                 raw_seq_lens, seq_lens, block_table, slot_mapping, tail_block_table, tail_slot_mapping,
                 max_pool_seq_len, K_tok, P, score_mode, pack_tail, compute_topk, output_buffer,
                 always_select_tail=True):
    """The three stages of :func:`forward` on CPU tensors of a non-empty batch (R >= 1, T >= 1)."""
    T, W = int(positions.shape[0]), (K_tok + P - 1 if always_select_tail else K_tok)
    bounds = request_bounds(cum_query_lens)
    T_live = min(bounds[-1][1], T)
    _compress_completed_pools(k=k, gate=gate, ape=ape, compressed_cache=compressed_cache,
                              tail_cache=tail_cache, positions=positions, bounds=bounds,
                              T_live=T_live, raw_seq_lens=raw_seq_lens, slot_mapping=slot_mapping,
                              tail_block_table=tail_block_table, P=P)
    _write_ring(k=k, gate=gate, tail_cache=tail_cache, positions=positions, bounds=bounds, T=T,
                tail_slot_mapping=tail_slot_mapping)
    if not compute_topk:
        return None

    width = W if output_buffer is None else int(output_buffer.shape[1])
    rows = _select(q=q, weights=weights, compressed_cache=compressed_cache, positions=positions,
                   bounds=bounds, T=T, T_live=T_live, seq_lens=seq_lens, block_table=block_table,
                   max_pool_seq_len=int(max_pool_seq_len), K_tok=K_tok, P=P, score_mode=score_mode,
                   pack_tail=pack_tail, width=width, always_select_tail=always_select_tail)
    if output_buffer is None:
        return rows.unsqueeze(1)
    output_buffer[:T].copy_(rows)
    return output_buffer[:T, :W].unsqueeze(1)


def _forward_via_cpu(args: dict, **scalars):
    """Run :func:`forward` on CPU copies of every tensor, then copy the caches (and the output
    buffer) back in place. Copies are byte copies, so NaN payloads and sentinels survive."""
    cpu = {name: (None if t is None else t.detach().to("cpu", copy=True)) for name, t in args.items()}
    out = forward(**cpu, **scalars)
    args["compressed_cache"].copy_(cpu["compressed_cache"])
    args["tail_cache"].copy_(cpu["tail_cache"])
    if out is None:
        return None
    device = args["compressed_cache"].device
    buffer = args["output_buffer"]
    if buffer is None:
        return out.to(device)
    buffer.copy_(cpu["output_buffer"])
    T, W = out.shape[0], out.shape[2]
    return buffer[:T, :W].unsqueeze(1)


def _compress_completed_pools(*, k, gate, ape, compressed_cache, tail_cache, positions, bounds,
                              T_live, raw_seq_lens, slot_mapping, tail_block_table, P) -> None:
    """§5.1-§5.3: compress every pool completed by a live row and store it at its slot.

    A row ``t < T_live`` compresses iff ``0 <= slot < N*B``, ``p >= 0`` and ``(p+1) % P == 0``.
    Window slot ``j`` is position ``w_j = p - (P-1) + j``: from this call's inputs when
    ``w_j >= qs_pos`` (the request's first position in this call), else from the ring as it was
    before the call; a ring block out of range reads zeros (caller bug, kernel behaviour).
    """
    N, B = int(compressed_cache.shape[0]), int(compressed_cache.shape[1])
    num_ring_blocks, C = int(tail_cache.shape[0]), int(tail_cache.shape[2])
    D = int(k.shape[1])
    # The window must see the pre-call ring even though §5.4 rewrites it in this call.
    ring_before = tail_cache.clone()
    k_windows, gate_windows, slots = [], [], []
    for r, (qs, end) in enumerate(bounds):
        qs_pos = int(raw_seq_lens[r]) - (end - qs)
        ring_block = int(tail_block_table[r, 0])
        for t in range(qs, min(end, T_live)):
            p, slot = int(positions[t]), int(slot_mapping[t])
            if not (0 <= slot < N * B and p >= 0 and (p + 1) % P == 0):
                continue
            k_win = torch.zeros(P, D, dtype=torch.float32)
            gate_win = torch.zeros(P, D, dtype=torch.float32)
            for j in range(P):
                w = p - (P - 1) + j
                if w >= qs_pos:
                    row = qs + (w - qs_pos)
                    k_win[j] = k[row]
                    gate_win[j] = gate[row]
                elif 0 <= ring_block < num_ring_blocks:
                    k_win[j] = ring_before[ring_block, 0, w % C]
                    gate_win[j] = ring_before[ring_block, 1, w % C]
            k_windows.append(k_win)
            gate_windows.append(gate_win)
            slots.append(slot)
    if not slots:
        return
    # compress_pools is element-wise per pool, so one batched call equals per-pool calls.
    pooled = compress_pools(torch.stack(k_windows), torch.stack(gate_windows), ape)
    for slot, value in zip(slots, pooled):
        compressed_cache[slot // B, slot % B, 0] = value


def _write_ring(*, k, gate, tail_cache, positions, bounds, T, tail_slot_mapping) -> None:
    """§5.4: for each request, its last ``min(C, ql_r)`` rows with ``p >= 0`` and a ring slot in
    ``[0, blocks*C)`` store raw K and gate (fp32 copies), in row order. Padded rows are never
    written, whatever their (possibly stale) slots."""
    num_ring_blocks, C = int(tail_cache.shape[0]), int(tail_cache.shape[2])
    for qs, end in bounds:
        end = min(end, T)
        for t in range(max(qs, end - C), end):
            p, slot = int(positions[t]), int(tail_slot_mapping[t])
            if p >= 0 and 0 <= slot < num_ring_blocks * C:
                tail_cache[slot // C, 0, slot % C] = k[t]
                tail_cache[slot // C, 1, slot % C] = gate[t]


def gather_request_pools(compressed_cache: torch.Tensor, block_table_row: torch.Tensor, n: int) -> torch.Tensor:
    """The request's pools ``j < n`` read through its block table (§3.1): pool ``j`` is row
    ``j % B`` of physical page ``block_table_row[j // B]``.

    The logical page is clamped into the table and the physical page into the cache only to
    keep addresses legal (§4.6); such pools are invisible under valid metadata.

    Args:
        compressed_cache: bf16 ``[N, B, 1, D]``.
        block_table_row: int ``[M]``.
        n: number of pools.
    Returns:
        bf16 ``[n, D]`` (a copy).
    """
    N, B, _, D = compressed_cache.shape
    M = int(block_table_row.shape[0])
    pools = torch.empty((n, D), dtype=compressed_cache.dtype)
    for j in range(n):
        page = int(block_table_row[min(j // B, M - 1)])
        page = min(max(page, 0), N - 1)
        pools[j] = compressed_cache[page, j % B, 0]
    return pools


def _select(*, q, weights, compressed_cache, positions, bounds, T, T_live, seq_lens, block_table,
            max_pool_seq_len, K_tok, P, score_mode, pack_tail, width, always_select_tail=True) -> torch.Tensor:
    """§4.1-§4.5: int32 ``[T, width]`` index rows; padded rows (``t >= T_live``) all ``-1``."""
    H = int(q.shape[1])
    selected = min(K_tok // P, max_pool_seq_len)
    out = torch.full((T, width), -1, dtype=torch.int32)
    for r, (qs, end) in enumerate(bounds):
        rows = list(range(qs, min(end, T_live)))
        if not rows:
            continue
        # Visible pools of a row: its complete pools, capped by the request's pool length (§4.1).
        visible = [visible_pools(int(positions[t]), int(seq_lens[r]), P) for t in rows]
        pools = gather_request_pools(compressed_cache, block_table[r], max_pool_seq_len)
        chunk = max(1, SCORE_CHUNK_ELEMENTS // max(1, max_pool_seq_len * H))
        for c0 in range(0, len(rows), chunk):
            chunk_rows = rows[c0:c0 + chunk]
            chunk_visible = torch.tensor(visible[c0:c0 + chunk], dtype=torch.int64)
            # Cells j >= visible are sanitized to LOWEST whatever their score, so scoring only
            # j < max(visible) of the chunk changes no bit of the sanitized row.
            n_scored = min(int(chunk_visible.max()), max_pool_seq_len)
            scores = torch.zeros((len(chunk_rows), max_pool_seq_len), dtype=torch.float32)
            if n_scored > 0:
                scores[:, :n_scored] = pool_scores(heads_innermost(q[chunk_rows]), weights[chunk_rows],
                                                   pools[:n_scored], score_mode)
            out[chunk_rows] = index_rows(scores, chunk_visible, positions[chunk_rows], selected=selected,
                                         index_topk=K_tok, index_kpool=P, pack_tail=pack_tail, width=width,
                                         always_select_tail=always_select_tail)
    return out
