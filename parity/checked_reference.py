"""The reference side of a parity run that must reject bad metadata (parity-contract.md §5: both
sides reject with the same exception type, and nothing is written).

The reference never validates (it must not import :mod:`kpool`), so the harness restates the
metadata rules here, independently of :mod:`kpool.validation`, and runs them before the
reference forward of every step that expects an error (:mod:`parity.runner`), of every public
case (:mod:`parity.public`) and of every generated example (:mod:`parity.generated`).
"""
from __future__ import annotations

def check_metadata(*, positions, cum_query_lens, raw_seq_lens, seq_lens, block_table, slot_mapping,
                   tail_block_table, tail_slot_mapping, max_pool_seq_len, index_kpool,
                   compressed_cache, tail_cache, **_ignored) -> None:
    """Harness-side metadata check for the reference (parity-contract.md §5: both sides reject).

    An independent restatement of the metadata rules of kpool-algorithm.md §3-§4.6, §6 (the
    reference itself never validates): ``cum_query_lens`` non-decreasing and ``<= T``;
    ``0 <= query_len <= raw_seq_lens``; ``seq_lens == raw_seq_lens // P``;
    ``max(seq_lens) <= max_pool_seq_len <= M * B``; live positions contiguous per request;
    pages a request reads in ``[0, N)``; ring blocks of requests with rows in ``[0, blocks)``;
    live slots in ``{-1} ∪ [0, N*B)`` and ring slots in ``{-1} ∪ [0, blocks*C)``; then
    (:func:`_check_writers`) no ring block owned by two scheduled requests, no compressed slot
    written by two live rows, live slots exactly the §3.2 slot (``-1`` unless the row completes a
    pool) and ring slots exactly ``tail_block_table[r, 0] * C + p % C`` (§3.3).

    Raises:
        ValueError: the first rule broken. Deliberately the builtin type: parity-contract.md §5's
            "same exception type" accepts a builtin base of the kernel's named error (the
            reference never imports :mod:`kpool`), and a ``ValueError`` subclass of another name
            would not match.
    """
    P = int(index_kpool)
    N, B = int(compressed_cache.shape[0]), int(compressed_cache.shape[1])
    blocks, C = int(tail_cache.shape[0]), int(tail_cache.shape[2])
    M = int(block_table.shape[1])
    T = int(positions.shape[0])
    if not 0 <= int(max_pool_seq_len) <= M * B:
        raise ValueError(f"metadata rejected: max_pool_seq_len={max_pool_seq_len} outside [0, {M * B}]")
    cum = [int(c) for c in cum_query_lens.cpu().tolist()]
    if not cum:
        return
    raw = [int(r) for r in raw_seq_lens.cpu().tolist()]
    pools = [int(s) for s in seq_lens.cpu().tolist()]
    pos = positions.cpu().tolist()
    table = block_table.cpu().tolist()
    ring = [int(row[0]) for row in tail_block_table.cpu().tolist()]
    slots, tslots = slot_mapping.cpu().tolist(), tail_slot_mapping.cpu().tolist()
    start = 0
    for r, end in enumerate(cum):
        ql = end - start
        if start < 0 or ql < 0 or end > T:
            raise ValueError(f"metadata rejected: cum_query_lens {cum} not non-decreasing within [0, {T}]")
        if raw[r] < ql:
            raise ValueError(f"metadata rejected: request {r}: raw_seq_lens {raw[r]} < query length {ql}")
        if pools[r] != raw[r] // P:
            raise ValueError(f"metadata rejected: request {r}: seq_lens {pools[r]} != raw // P = {raw[r] // P}")
        if pools[r] > int(max_pool_seq_len):
            raise ValueError(f"metadata rejected: request {r}: seq_lens {pools[r]} > max_pool_seq_len {max_pool_seq_len}")
        for m in range(min(M, -(-pools[r] // B))):
            if not 0 <= int(table[r][m]) < N:
                raise ValueError(f"metadata rejected: block_table[{r}, {m}] = {table[r][m]} outside {N} pages")
        if ql > 0 and not 0 <= ring[r] < blocks:
            raise ValueError(f"metadata rejected: tail_block_table[{r}, 0] = {ring[r]} outside {blocks} ring blocks")
        for i, t in enumerate(range(start, end)):
            if int(pos[t]) != raw[r] - ql + i:
                raise ValueError(f"metadata rejected: row {t}: position {pos[t]} != {raw[r] - ql + i}")
            if not -1 <= int(slots[t]) < N * B:
                raise ValueError(f"metadata rejected: slot_mapping[{t}] = {slots[t]} outside [-1, {N * B})")
            if not -1 <= int(tslots[t]) < blocks * C:
                raise ValueError(f"metadata rejected: tail_slot_mapping[{t}] = {tslots[t]} outside [-1, {blocks * C})")
        start = end
    _check_writers(cum, pos, table, ring, slots, tslots, P=P, B=B, C=C)


def _check_writers(cum, pos, table, ring, slots, tslots, *, P: int, B: int, C: int) -> None:
    """The one-writer and exact-slot rules of §3.2, §3.3, §5.4 over host lists (see
    :func:`check_metadata`). Raises ValueError."""
    owners, written, start = {}, {}, 0
    for r, end in enumerate(cum):
        if end > start:
            if ring[r] in owners:
                raise ValueError(f"metadata rejected: requests {owners[ring[r]]} and {r} share ring block {ring[r]}")
            owners[ring[r]] = r
        for t in range(start, end):
            p = int(pos[t])
            want = int(table[r][p // P // B]) * B + (p // P) % B if (p + 1) % P == 0 else -1
            if int(slots[t]) >= 0 and int(slots[t]) in written:
                raise ValueError(f"metadata rejected: rows {written[int(slots[t])]} and {t} write slot {slots[t]}")
            if int(slots[t]) >= 0:
                written[int(slots[t])] = t
            if int(slots[t]) != want:
                raise ValueError(f"metadata rejected: slot_mapping[{t}] = {slots[t]}, position {p} needs {want}")
            if int(tslots[t]) != ring[r] * C + p % C:
                raise ValueError(f"metadata rejected: tail_slot_mapping[{t}] = {tslots[t]} != "
                                 f"{ring[r]} * {C} + {p} % {C}")
        start = end


def checked_reference(forward=None):
    """``forward`` (default ``reference.stateful.forward``) preceded by :func:`check_metadata`:
    the reference side of a parity run that must reject bad metadata like the kernel does.

    Returns a callable with the forward signature of docs/design.md."""
    if forward is None:
        from reference.stateful import forward
    if getattr(forward, "__checked_metadata__", False):
        return forward

    def checked(**kwargs):
        check_metadata(**kwargs)
        return forward(**kwargs)
    checked.__wrapped__ = forward
    checked.__checked_metadata__ = True
    return checked
