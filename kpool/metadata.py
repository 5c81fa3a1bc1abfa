"""Cache metadata of one KPool forward and its builder (kpool-algorithm.md §3, §6).

This module imports only ``torch`` (never Triton or a kernel module), so a model
runner can build metadata in a process that has no kernels loaded; a test checks
that in a fresh subprocess.

Vocabulary (kpool-algorithm.md §3.4, §6):

* ``positions`` int64 ``[T]``: absolute token positions; padded rows carry 0.
* ``cum_query_lens`` int32 ``[R]``: exclusive query ends, no leading zero.
* ``raw_seq_lens`` int32 ``[R]``: token lengths including this step (used by compression).
* ``seq_lens`` int32 ``[R]``: complete pools ``raw_seq_lens // P`` (used by selection).
* ``block_table`` int32 ``[R, M]``: logical compressed page -> physical page.
* ``slot_mapping`` int64 ``[T]``: compressed write slot ``page * B + row`` of the row that
  completes a pool, else ``-1`` (§3.2).
* ``tail_block_table`` int32 ``[R, 1]``: ring block per request (§3.3).
* ``tail_slot_mapping`` int64 ``[T]``: circular ring slot ``block * C + p % C`` (§3.3).
* ``max_pool_seq_len``: host int, score-row length (``M * B`` in FULL mode, else ``max(seq_lens)``).
* ``max_query_len``: host int, the longest live query this step (``None``: unknown), a launch hint
  of the production kernels (``kpool.indexer.forward``), not an input of the math.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional, Sequence

import torch

from .errors import KPoolMetadataError
from .rules import as_bool, as_int, reject


@dataclass(frozen=True)
class RequestSpec:
    """One request of a batch, as a scheduler sees it.

    Attributes:
        cached_len: tokens of this request already processed before this step (its first
            query position). Units: tokens.
        query_len: tokens scheduled in this step (>= 0; 0 = zero-length request).
        block_table: physical compressed-cache pages, logical page ``m`` -> ``block_table[m]``.
        ring_block: the request's tail-ring block (§3.3).
    """

    cached_len: int
    query_len: int
    block_table: Sequence[int]
    ring_block: int

    @property
    def raw_seq_len(self) -> int:
        """Token length including this step (``raw_seq_lens`` entry)."""
        return self.cached_len + self.query_len


@dataclass(frozen=True)
class BatchSpec:
    """A batch description that :func:`build_metadata` turns into tensors.

    Attributes:
        requests: the live requests, in row order.
        num_tokens: ``T`` rows of the launch; ``None`` means exactly the live tokens.
            ``T > T_live`` adds FULL-mode padding rows (§6 "FULL-mode padding").
        full_mode: FULL-graph mode: ``max_pool_seq_len = M * B`` (static capacity) instead of
            ``max(seq_lens)``.
        num_padded_requests: extra zero-length requests appended to the request-shaped
            metadata (FULL draft graphs pad requests to the token bucket, §6).
        block_table_width: ``M``; ``None`` means the longest request table (at least 1).
        stale_tail_slots: give padded rows positive, stale ring slots (they must never write,
            §5.4 "Positive stale padding slots must never write into block zero").
    """

    requests: Sequence[RequestSpec]
    num_tokens: Optional[int] = None
    full_mode: bool = False
    num_padded_requests: int = 0
    block_table_width: Optional[int] = None
    stale_tail_slots: bool = False


@dataclass
class KPoolMetadata:
    """Tensors describing one forward (kpool-algorithm.md §6). See the module docstring
    for every field's dtype and shape. ``num_live_tokens`` is ``T_live = cum_query_lens[-1]``
    (0 when there are no requests), a host int; ``max_query_len`` the longest request's query
    rows (``None``: unknown), a host int that lets a decode or MTP step skip the prefill launches.
    A caller that rewrites the tensors in place without :meth:`copy_` must update it too (or set
    ``None``): with ``validate=False`` the kernels trust it, and a stale hint below a request's
    length leaves that request's rows unscored."""

    positions: torch.Tensor
    cum_query_lens: torch.Tensor
    raw_seq_lens: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    tail_block_table: torch.Tensor
    tail_slot_mapping: torch.Tensor
    max_pool_seq_len: int
    num_live_tokens: int = field(default=0)
    max_query_len: Optional[int] = None

    @property
    def num_tokens(self) -> int:
        """``T``: rows of the launch, padding included."""
        return int(self.positions.shape[0])

    @property
    def num_requests(self) -> int:
        """``R``: rows of the request-shaped metadata, padded requests included."""
        return int(self.cum_query_lens.shape[0])

    def tensors(self) -> dict:
        """The tensor fields by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)}

    def forward_kwargs(self) -> dict:
        """Keyword arguments shared by ``kpool.indexer.forward`` and
        ``reference.stateful.forward`` (every field except ``num_live_tokens`` and
        ``max_query_len``, which :class:`kpool.backend.KPoolIndexerBackend` passes to the kernels only)."""
        kwargs = self.tensors()
        kwargs["max_pool_seq_len"] = self.max_pool_seq_len
        return kwargs

    def to(self, device) -> "KPoolMetadata":
        """Copy every tensor to ``device``."""
        moved = {name: t.to(device) for name, t in self.tensors().items()}
        return KPoolMetadata(max_pool_seq_len=self.max_pool_seq_len, num_live_tokens=self.num_live_tokens,
                             max_query_len=self.max_query_len, **moved)

    def clone(self) -> "KPoolMetadata":
        """Deep copy (independent storage)."""
        cloned = {name: t.clone() for name, t in self.tensors().items()}
        return KPoolMetadata(max_pool_seq_len=self.max_pool_seq_len, num_live_tokens=self.num_live_tokens,
                             max_query_len=self.max_query_len, **cloned)

    def copy_(self, other: "KPoolMetadata") -> "KPoolMetadata":
        """Write ``other`` into this metadata's buffers in place, as a graph replay does
        (public case C19). Shapes and ``max_pool_seq_len`` must match (captured graphs keep
        shapes and scalar attributes stable, §6); a captured ``max_query_len`` stays (the graph's
        launches were chosen from it), so ``other``'s must be known and no larger.

        Raises:
            KPoolMetadataError: when a shape or ``max_pool_seq_len`` differs, or ``other`` has a
                longer (or unknown) ``max_query_len`` than a captured one.
        """
        if other.max_pool_seq_len != self.max_pool_seq_len:
            raise KPoolMetadataError(
                f"max_pool_seq_len must stay {self.max_pool_seq_len} across replays, got {other.max_pool_seq_len}")
        if self.max_query_len is not None and (other.max_query_len is None
                                               or other.max_query_len > self.max_query_len):
            raise KPoolMetadataError(f"max_query_len={other.max_query_len} does not fit the captured "
                                     f"max_query_len={self.max_query_len}")
        pairs = [(name, dst, getattr(other, name)) for name, dst in self.tensors().items()]
        for name, dst, src in pairs:        # every shape first: a refused copy writes nothing
            if src.shape != dst.shape:
                raise KPoolMetadataError(f"{name}: captured shape {tuple(dst.shape)} != new {tuple(src.shape)}")
        for _, dst, src in pairs:
            dst.copy_(src)
        self.num_live_tokens = other.num_live_tokens
        return self


def build_metadata(batch: BatchSpec, *, index_kpool: int, ring_capacity: int, page_size: int,
                   device="cpu") -> KPoolMetadata:
    """Turn a :class:`BatchSpec` into :class:`KPoolMetadata` (kpool-algorithm.md §3.2-§3.4, §6).

    Args:
        batch: the batch description.
        index_kpool: ``P``, tokens per pool.
        ring_capacity: ``C``, ring rows per request.
        page_size: ``B``, pools per compressed page (``compressed_cache.shape[1]``).
        device: where the tensors are created.

    Returns:
        The metadata (``max_query_len`` the longest live query, 0 without requests); padded rows
        have position 0, ``slot_mapping = -1`` and ring slot ``-1``
        (or a stale positive slot with ``stale_tail_slots``); padded requests have zero length.

    Raises:
        KPoolTypeError: a count, length, page or ring id that is not an int (a float length,
            a bool...), a flag that is not a bool, or ``batch`` not a :class:`BatchSpec`.
        KPoolMetadataError: negative counts or lengths, ``P < 1``, ``C < P``, ``B < 1``,
            ``num_tokens < T_live``, or a block table too short for the request's complete pools
            or wider than ``block_table_width``.
    """
    P = as_int("index_kpool", index_kpool)
    C = as_int("ring_capacity", ring_capacity)
    B = as_int("page_size", page_size)
    if P < 1 or C < P or B < 1:
        reject("builder-count", f"need P >= 1, C >= P, B >= 1; got P={P}, C={C}, B={B}")
    if not hasattr(batch, "requests"):      # duck-typed: a mutant copy of this module gets real BatchSpecs
        reject("argument-type", f"batch must be a BatchSpec, got {type(batch).__name__}")
    live = [_checked_request(i, req) for i, req in enumerate(batch.requests)]
    for i, req in enumerate(live):
        needed_pages = -(-(req.raw_seq_len // P) // B)
        if len(req.block_table) < needed_pages:
            reject("builder-block-table",
                   f"request {i}: block table has {len(req.block_table)} pages, needs {needed_pages} "
                   f"for {req.raw_seq_len // P} pools at B={B}")
    t_live = sum(r.query_len for r in live)
    T = _count("num_tokens", batch.num_tokens, t_live)
    if T < t_live:
        reject("builder-count", f"num_tokens={T} is smaller than the live tokens {t_live}")
    R = len(live) + _count("num_padded_requests", batch.num_padded_requests, 0)
    M = _count("block_table_width", batch.block_table_width, 0) or max([len(r.block_table) for r in live] + [1])
    as_bool("full_mode", batch.full_mode)
    as_bool("stale_tail_slots", batch.stale_tail_slots)
    if any(len(r.block_table) > M for r in live):
        reject("builder-block-table", f"block_table_width={M} is narrower than a request's table")

    positions = torch.zeros(T, dtype=torch.int64)
    slot_mapping = torch.full((T,), -1, dtype=torch.int64)
    tail_slot_mapping = torch.full((T,), -1, dtype=torch.int64)
    cum = torch.zeros(R, dtype=torch.int32)
    raw = torch.zeros(R, dtype=torch.int32)
    table = torch.zeros((R, M), dtype=torch.int32)
    tail_table = torch.zeros((R, 1), dtype=torch.int32)

    row = 0
    for i, req in enumerate(live):
        table[i, :len(req.block_table)] = torch.tensor(list(req.block_table), dtype=torch.int32)
        tail_table[i, 0] = req.ring_block
        raw[i] = req.raw_seq_len
        for p in range(req.cached_len, req.raw_seq_len):
            positions[row] = p
            tail_slot_mapping[row] = req.ring_block * C + p % C
            if (p + 1) % P == 0:
                j = p // P
                slot_mapping[row] = int(req.block_table[j // B]) * B + j % B
            row += 1
        cum[i] = row
    cum[len(live):] = row
    if batch.stale_tail_slots and T > t_live:
        # Stale, positive slots from "a previous replay": they point at real ring rows.
        stale = torch.arange(T - t_live, dtype=torch.int64) % C
        tail_slot_mapping[t_live:] = stale
    seq_lens = raw // P
    if batch.full_mode:
        max_pool_seq_len = M * B
    else:
        max_pool_seq_len = int(seq_lens.max()) if R > 0 else 0
    meta = KPoolMetadata(positions=positions, cum_query_lens=cum, raw_seq_lens=raw, seq_lens=seq_lens,
                         block_table=table, slot_mapping=slot_mapping, tail_block_table=tail_table,
                         tail_slot_mapping=tail_slot_mapping, max_pool_seq_len=max_pool_seq_len,
                         num_live_tokens=t_live, max_query_len=max([r.query_len for r in live] + [0]))
    return meta.to(device)


def _count(name: str, value, default: int) -> int:
    """A non-negative int count of a :class:`BatchSpec` (``None`` -> ``default``)."""
    if value is None:
        return default
    value = as_int(name, value)
    if value < 0:
        reject("builder-count", f"{name} must be >= 0, got {value}")
    return value


def _checked_request(i: int, req) -> RequestSpec:
    """``req`` with every field a Python int (numpy integers accepted), lengths >= 0.

    Raises:
        KPoolTypeError: ``req`` is not a :class:`RequestSpec` or a field is not an int.
        KPoolMetadataError: a negative length.
    """
    if not all(hasattr(req, f) for f in ("cached_len", "query_len", "block_table", "ring_block")):
        reject("argument-type", f"request {i} must be a RequestSpec, got {type(req).__name__}")
    cached = as_int(f"request {i} cached_len", req.cached_len)
    qlen = as_int(f"request {i} query_len", req.query_len)
    if cached < 0 or qlen < 0:
        reject("builder-count", f"request {i}: negative length (cached_len={cached}, query_len={qlen})")
    table = [as_int(f"request {i} block_table[{m}]", b) for m, b in enumerate(req.block_table)]
    return RequestSpec(cached, qlen, table, as_int(f"request {i} ring_block", req.ring_block))
