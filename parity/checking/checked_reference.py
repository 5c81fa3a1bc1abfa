"""The reference side of a parity run that must reject bad metadata (parity-contract.md §5: both
sides reject with the same exception type, and nothing is written).

The reference never validates (it must not import :mod:`kpool`), so the harness restates the
metadata rules here, independently of :mod:`kpool.validation`, and runs them before the
reference forward of every step that expects an error (:mod:`parity.running.runner`), of every public
case (:mod:`parity.running.public`) and of every generated example (:mod:`parity.running.generated`).
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


def _span(t):
    """Byte range ``[lo, hi)`` of ``t``'s elements in its storage (``None`` when empty)."""
    if t.numel() == 0:
        return None
    lo = t.storage_offset()
    hi = lo + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1
    base = t.untyped_storage().data_ptr()
    return base + lo * t.element_size(), base + hi * t.element_size()


def _overlaps_itself(t) -> bool:
    """Sufficient test that two elements of ``t`` share memory: sorted by stride, some stride is
    not larger than the extent of the smaller dimensions."""
    dims = sorted((abs(st), n) for n, st in zip(t.shape, t.stride()) if n > 1)
    extent = 0
    for st, n in dims:
        if st <= extent:
            return True
        extent += (n - 1) * st
    return False


def check_arguments(*, k, gate, q, weights, ape, compressed_cache, tail_cache, index_topk, index_kpool,
                    score_mode, compute_topk, max_pool_seq_len, pack_tail=True, output_buffer=None,
                    always_select_tail=True, **metadata) -> None:
    """Harness-side argument check for the reference (parity-contract.md §5), an independent
    restatement of the tensor and scalar rules of kpool-algorithm.md §2, §3, §4.6: Python ints
    (not bools, not numpy) and bools; ``P >= 1``, ``K_tok`` a positive multiple of ``P``, a known
    score mode; tensors of the documented dtypes and shapes (k, gate fp32 ``[T, D]``, ape fp32
    ``[P, D]``, compressed bf16 ``[N >= 1, B >= 1, 1, D]``, ring fp32 ``[blocks >= 1, 2, C >= P,
    D]`` with unit head-dim strides, q bf16 ``[T, H >= 1, D]``, weights fp32/bf16 ``[T, H]``,
    ``tail_block_table`` with a column); an int32 output buffer ``[>= T, >= W]`` with unit column
    stride and rows that do not overlap; one device; no written tensor (caches, output rows)
    overlapping itself or another argument.

    Raises:
        ValueError: the first rule broken (the builtin base of every kpool rejection, see
            :func:`check_metadata`).
    """
    import torch

    from kpool.config import SCORE_MODES

    def bad(why):
        raise ValueError(f"arguments rejected: {why}")
    for name, v in (("index_topk", index_topk), ("index_kpool", index_kpool), ("max_pool_seq_len", max_pool_seq_len)):
        if type(v) is not int:
            bad(f"{name} is a {type(v).__name__}, not a Python int")
    for name, v in (("compute_topk", compute_topk), ("pack_tail", pack_tail), ("always_select_tail", always_select_tail)):
        if type(v) is not bool:
            bad(f"{name} is not a bool")
    P, K = index_kpool, index_topk
    if P < 1 or K < 1 or K % P:
        bad(f"index_kpool={P}, index_topk={K}")
    if score_mode not in SCORE_MODES:
        bad(f"score_mode {score_mode!r}")
    tensors = dict(k=k, gate=gate, ape=ape, compressed_cache=compressed_cache, tail_cache=tail_cache,
                   **{n: v for n, v in metadata.items() if n in ("positions", "cum_query_lens", "raw_seq_lens", "seq_lens", "block_table", "slot_mapping", "tail_block_table", "tail_slot_mapping")})
    if compute_topk:
        tensors.update(q=q, weights=weights)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            bad(f"{name} is not a tensor")
    want = dict(k=(torch.float32,), gate=(torch.float32,), ape=(torch.float32,), compressed_cache=(torch.bfloat16,),
                tail_cache=(torch.float32,), q=(torch.bfloat16,), weights=(torch.float32, torch.bfloat16))
    for name, dtypes in want.items():
        if name in tensors and tensors[name].dtype not in dtypes:
            bad(f"{name} dtype {tensors[name].dtype}")
    c, r = compressed_cache, tail_cache
    if c.dim() != 4 or c.shape[2] != 1 or r.dim() != 4 or r.shape[1] != 2 or r.shape[3] != c.shape[3]:
        bad(f"cache shapes {list(c.shape)}, {list(r.shape)}")
    D, T = c.shape[3], k.shape[0] if k.dim() == 2 else -1
    if r.shape[2] < P or c.stride(3) != 1 or r.stride(3) != 1 or 0 in (c.shape[0], c.shape[1], r.shape[0]):
        bad("ring capacity < P, a head-dim stride != 1 or an empty cache")
    if list(k.shape) != [T, D] or list(gate.shape) != [T, D] or list(ape.shape) != [P, D]:
        bad(f"k {list(k.shape)}, gate {list(gate.shape)}, ape {list(ape.shape)} for D={D}, P={P}")
    tbt = metadata.get("tail_block_table")
    if tbt is not None and (tbt.dim() != 2 or tbt.shape[1] < 1):
        bad("tail_block_table needs a column")
    written = [c, r]
    if compute_topk:
        if q.dim() != 3 or q.shape[0] != T or q.shape[2] != D or q.shape[1] < 1 or list(weights.shape) != [T, q.shape[1]]:
            bad(f"q {list(q.shape)}, weights {list(weights.shape)}")
        if output_buffer is not None:
            W = K + (P - 1 if always_select_tail else 0)
            o = output_buffer
            if not isinstance(o, torch.Tensor) or o.dtype != torch.int32 or o.dim() != 2 or o.shape[0] < T \
                    or o.shape[1] < W or o.stride(1) != 1 or (T > 1 and o.stride(0) < o.shape[1]):
                bad("output_buffer shape, dtype or strides")
            ob = o[:T]
            tensors["output_buffer"] = ob
            written.append(ob)
    if len({t.device for t in tensors.values()}) != 1:
        bad("tensors on several devices")
    for w in written:
        if _overlaps_itself(w):
            bad(f"a written tensor {list(w.shape)} overlaps itself")
        ws = _span(w)
        for name, t in tensors.items():
            ts = _span(t)
            if t is not w and ws is not None and ts is not None and ts[0] < ws[1] and ws[0] < ts[1]:
                bad(f"{name} shares memory with a written tensor")


def checked_reference(forward=None):
    """``forward`` (default ``reference.stateful.forward``) preceded by :func:`check_metadata`:
    the reference side of a parity run that must reject bad metadata like the kernel does
    (skipped when called with ``validate=False``, as the kernel's own validation is).

    Returns a callable with the forward signature of docs/design.md."""
    if forward is None:
        from reference.stateful import forward
    if getattr(forward, "__checked_metadata__", False):
        return forward

    def checked(*, validate: bool = True, **kwargs):
        # validate=False: a stale-metadata step of the unvalidated path (cases.unvalidated), where
        # the contract is what the kernels do with the positions, not a rejection
        check_arguments(**kwargs)
        if validate:
            check_metadata(**kwargs)
        return forward(**kwargs)
    checked.__wrapped__ = forward
    checked.__checked_metadata__ = True
    return checked


def is_checked(fn) -> bool:
    """Whether ``fn`` is (a recorder of) :func:`checked_reference`'s wrapper, which takes
    ``validate`` (its ``__wrapped__`` hides that from :func:`inspect.signature`)."""
    for _ in range(4):
        if fn is None or getattr(fn, "__checked_metadata__", False):
            return fn is not None
        fn = getattr(fn, "forward", None)
    return False
