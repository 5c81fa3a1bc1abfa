"""Sentinel bytes, guard bands and per-step write sets (parity-contract.md §4).

Every cache element that holds no live data, every guard element around the cache views, and
every element of a caller output buffer start out holding a sentinel bit pattern:

* bf16 compressed cache: ``0x7FA5`` (a NaN with a payload no arithmetic produces);
* fp32 tail ring: ``0x7FA5A5A5`` (a signalling-NaN pattern);
* int32 output buffer: ``-777`` (never a token id, never the ``-1`` filler).

Before a step the harness snapshots the backing buffers; after it, every element outside the
step's *declared write set* must equal its pre-step bytes (else ``stray-write``) and every element
inside it must no longer hold the sentinel (else ``missing-write``). The write set comes from the
metadata alone (kpool-algorithm.md §5.1 compressed rows, §5.4 ring rows, §4.5 output rows), so a
kernel that writes from a padding row, through slot ``-1``, past a page, or with a wrong stride is
caught even when the bad bytes are never read back.

Compressed rows of the write set are re-laid with the sentinel before each step (both sides
alike): kpool-algorithm.md §5 writes them before anything reads them in the same forward, so this
changes no result and turns a skipped write into a visible sentinel. Ring rows are *not* re-laid:
launch 1 reads the pre-call ring, possibly at the very slots launch 2 rewrites (§5.4).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from kpool.cache import allocate_caches, as_int16, as_int32

BF16_SENTINEL_BITS = 0x7FA5
"""Sentinel of the bf16 compressed cache, as the int16 bit pattern (a NaN payload)."""
FP32_SENTINEL_BITS = 0x7FA5A5A5
"""Sentinel of the fp32 tail ring, as the int32 bit pattern (signalling NaN)."""
INT32_SENTINEL = -777
"""Sentinel of int32 output buffers."""

DEFAULT_GUARD_ROWS = 2
"""Output-buffer guard rows before and after the kernel-visible rows."""
DEFAULT_GUARD_COLS = 2
"""Output-buffer guard columns after ``width`` (the kernel view is ``[:, :width]``)."""




BF16_SENTINEL_INT16 = as_int16(BF16_SENTINEL_BITS)
FP32_SENTINEL_INT32 = as_int32(FP32_SENTINEL_BITS)


# --------------------------------------------------------------------------- write sets

@dataclass(frozen=True)
class WriteSet:
    """What one step may (and must) write (kpool-algorithm.md §5.1, §5.4, §4.5).

    Attributes:
        compressed_rows: ``(page, row)`` of every compressed-cache row written (all ``D`` channels).
        ring_rows: ``(block, slot)`` of every ring row written (both planes, all ``D`` channels).
        output_rows: rows ``< output_rows`` of the kernel-visible output view are written
            (columns ``< width`` of the buffer); 0 when nothing is returned.
    """

    compressed_rows: Tuple[Tuple[int, int], ...] = ()
    ring_rows: Tuple[Tuple[int, int], ...] = ()
    output_rows: int = 0


EMPTY_WRITE_SET = WriteSet()
"""The write set of a rejected step: nothing may change (parity-contract.md §5)."""


def compute_write_set(meta, *, index_kpool: int, ring_capacity: int, page_size: int, num_pages: int,
                      num_tail_blocks: int, compute_topk: bool) -> WriteSet:
    """Derive a step's write set from its (possibly patched) metadata.

    Args:
        meta: :class:`kpool.metadata.KPoolMetadata` (any device; read on the host).
        index_kpool: ``P``. ring_capacity: ``C``. page_size: ``B``. num_pages: ``N``.
        num_tail_blocks: ring blocks.
        compute_topk: whether an index buffer is written.

    Returns:
        :class:`WriteSet`. Compressed rows (§5.1): rows ``t < T_live`` with ``positions[t] >= 0``,
        ``(p + 1) % P == 0`` and ``0 <= slot_mapping[t] < N * B``. Ring rows (§5.4): per request
        the last ``min(C, ql_r)`` rows of ``[qs_r, cum[r])`` below ``T`` with ``positions >= 0`` and
        ``0 <= tail_slot < blocks * C``. Output rows: ``T`` when ``compute_topk``.
        ``T_live`` is ``cum_query_lens[-1]`` (what the kernels read), not ``meta.num_live_tokens``.
    """
    P, C, B = index_kpool, ring_capacity, page_size
    pos = meta.positions.detach().cpu().tolist()
    slots = meta.slot_mapping.detach().cpu().tolist()
    tail_slots = meta.tail_slot_mapping.detach().cpu().tolist()
    cum = meta.cum_query_lens.detach().cpu().tolist()
    T = len(pos)
    t_live = min(int(cum[-1]), T) if cum else 0

    compressed = []
    for t in range(max(t_live, 0)):
        p, s = int(pos[t]), int(slots[t])
        if p >= 0 and (p + 1) % P == 0 and 0 <= s < num_pages * B:
            compressed.append((s // B, s % B))

    ring = []
    start = 0
    for end in cum:
        end = int(end)
        for t in range(max(start, end - C), min(end, T)):
            s = int(tail_slots[t])
            if int(pos[t]) >= 0 and 0 <= s < num_tail_blocks * C:
                ring.append((s // C, s % C))
        start = end
    return WriteSet(compressed_rows=tuple(compressed), ring_rows=tuple(ring),
                    output_rows=T if compute_topk else 0)


# --------------------------------------------------------------------------- caches

def lay_cache_sentinels(caches) -> None:
    """Fill both backing buffers of :class:`kpool.cache.KPoolCaches` (views, page padding, block
    padding and guard bands) with the sentinels, in place. Done once at case start."""
    caches.compressed_backing.view(torch.int16).fill_(BF16_SENTINEL_INT16)
    caches.tail_backing.view(torch.int32).fill_(FP32_SENTINEL_INT32)


def case_caches(case, device="cpu"):
    """Both caches of ``case`` in its geometry (:func:`kpool.cache.allocate_caches`, zero-filled):
    a :class:`kpool.cache.KPoolCaches` on ``device``.

    Raises:
        kpool.errors.KPoolShapeError: bad sizes.
    """
    geo = case.geometry
    return allocate_caches(case.config, num_pages=geo.num_pages, page_size=geo.page_size,
                           num_tail_blocks=geo.num_tail_blocks, page_padding=geo.page_padding,
                           ring_block_padding=geo.ring_block_padding, guard=geo.guard, device=device,
                           row_padding=getattr(geo, "row_padding", 0))


def sentinel_caches(case):
    """:func:`case_caches` on the CPU with the sentinels laid everywhere (every side's starting
    state: the runner, the metamorphic relations and the public cases' direct runs)."""
    caches = case_caches(case)
    lay_cache_sentinels(caches)
    return caches


def relay_compressed_rows(caches, write_set: WriteSet) -> None:
    """Re-lay the bf16 sentinel over the compressed rows a step will write (module docstring)."""
    if not write_set.compressed_rows:
        return
    pages = torch.tensor([p for p, _ in write_set.compressed_rows], dtype=torch.int64)
    rows = torch.tensor([r for _, r in write_set.compressed_rows], dtype=torch.int64)
    dev = caches.compressed_cache.device
    caches.compressed_cache.view(torch.int16)[pages.to(dev), rows.to(dev)] = BF16_SENTINEL_INT16


def backing_bits(caches) -> Tuple[torch.Tensor, torch.Tensor]:
    """Host copies of both backings as integer bits: (int16 ``[n_c]``, int32 ``[n_t]``)."""
    return (caches.compressed_backing.view(torch.int16).detach().cpu().clone(),
            caches.tail_backing.view(torch.int32).detach().cpu().clone())


def flat_index(backing: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """int64 tensor of ``view.shape``: the flat index into ``backing`` of every view element."""
    idx = torch.arange(backing.numel(), dtype=torch.int64)
    return idx.as_strided(view.shape, view.stride(), view.storage_offset() - backing.storage_offset())


def compressed_write_mask(caches, write_set: WriteSet) -> torch.Tensor:
    """bool ``[compressed_backing.numel()]``: elements of the compressed rows in the write set."""
    mask = torch.zeros(caches.compressed_backing.numel(), dtype=torch.bool)
    if write_set.compressed_rows:
        idx = flat_index(caches.compressed_backing, caches.compressed_cache)  # [N, B, 1, D]
        pages = torch.tensor([p for p, _ in write_set.compressed_rows], dtype=torch.int64)
        rows = torch.tensor([r for _, r in write_set.compressed_rows], dtype=torch.int64)
        mask[idx[pages, rows].reshape(-1)] = True
    return mask


def ring_write_mask(caches, write_set: WriteSet) -> torch.Tensor:
    """bool ``[tail_backing.numel()]``: both planes of the ring rows in the write set."""
    mask = torch.zeros(caches.tail_backing.numel(), dtype=torch.bool)
    if write_set.ring_rows:
        idx = flat_index(caches.tail_backing, caches.tail_cache)  # [blocks, 2, C, D]
        blocks = torch.tensor([b for b, _ in write_set.ring_rows], dtype=torch.int64)
        slots = torch.tensor([s for _, s in write_set.ring_rows], dtype=torch.int64)
        mask[idx[blocks, :, slots].reshape(-1)] = True
    return mask


def _locate(backing: torch.Tensor, view: torch.Tensor, flat: int, names: Sequence[str],
            padding_name: str) -> dict:
    """Name the element at ``flat`` of ``backing``: a view coordinate, padding or a guard band."""
    off = flat - (view.storage_offset() - backing.storage_offset())
    if off < 0:
        return {"region": "guard-before"}
    idx = flat_index(backing, view)
    hit = (idx == flat).nonzero()
    if hit.numel():
        coord = hit[0].tolist()
        return {"region": "view", **{n: c for n, c in zip(names, coord) if n is not None}}
    if off >= view.shape[0] * view.stride(0):
        return {"region": "guard-after"}
    return {"region": padding_name, names[0]: off // view.stride(0)}


def locate_compressed(caches, flat: int) -> dict:
    """Location of compressed-backing element ``flat``: ``{region, page, page_row, channel}``."""
    return _locate(caches.compressed_backing, caches.compressed_cache, flat,
                   ("page", "page_row", None, "channel"), "page-padding")


def locate_ring(caches, flat: int) -> dict:
    """Location of ring-backing element ``flat``: ``{region, block, plane, slot, channel}``."""
    return _locate(caches.tail_backing, caches.tail_cache, flat,
                   ("block", "plane", "slot", "channel"), "block-padding")


@dataclass
class SentinelCheck:
    """Result of checking one buffer on one side after a step.

    Attributes:
        buffer: ``"compressed_cache"``, ``"tail_ring"`` or ``"output_buffer"``.
        stray: elements outside the write set whose bytes changed.
        first_stray: location dict of the first one (``None`` if none).
        missing: elements inside the write set still holding the sentinel.
        first_missing: location dict of the first one.
    """

    buffer: str
    stray: int = 0
    first_stray: Optional[dict] = None
    missing: int = 0
    first_missing: Optional[dict] = None

    @property
    def ok(self) -> bool:
        """No stray and no missing write."""
        return self.stray == 0 and self.missing == 0


def _check_flat(before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor, sentinel: int):
    stray = ((after != before) & ~mask).nonzero().flatten()
    missing = ((after == sentinel) & mask).nonzero().flatten()
    return stray, missing


def check_caches(caches, before: Tuple[torch.Tensor, torch.Tensor], write_set: WriteSet):
    """Check both caches against their pre-step snapshot (parity-contract.md §4).

    Args:
        caches: the side's :class:`kpool.cache.KPoolCaches` after the step.
        before: :func:`backing_bits` taken right before the step (after re-laying).
        write_set: the step's :class:`WriteSet`.

    Returns:
        ``[SentinelCheck("compressed_cache"), SentinelCheck("tail_ring")]``.
    """
    after = backing_bits(caches)
    out = []
    for name, b, a, mask, sentinel, locate in (
            ("compressed_cache", before[0], after[0], compressed_write_mask(caches, write_set),
             BF16_SENTINEL_INT16, locate_compressed),
            ("tail_ring", before[1], after[1], ring_write_mask(caches, write_set),
             FP32_SENTINEL_INT32, locate_ring)):
        stray, missing = _check_flat(b, a, mask, sentinel)
        out.append(SentinelCheck(
            buffer=name, stray=int(stray.numel()),
            first_stray=locate(caches, int(stray[0])) if stray.numel() else None,
            missing=int(missing.numel()),
            first_missing=locate(caches, int(missing[0])) if missing.numel() else None))
    return out


# --------------------------------------------------------------------------- output buffer

@dataclass
class GuardedOutputBuffer:
    """A caller output buffer (cases.spec.OutputBufferSpec) inside a sentinel-filled backing.

    Attributes:
        backing: int32 ``[2*guard_rows + capacity*row_step, width + guard_cols]``, all ``-777``.
        view: the kernel's buffer ``backing[guard_rows : guard_rows + capacity*row_step : row_step,
            :width]`` (int32 ``[capacity, width]``, unit column stride, row stride
            ``row_step * (width + guard_cols)``).
        guard_rows, guard_cols, row_step: layout parameters.
    """

    backing: torch.Tensor
    view: torch.Tensor
    guard_rows: int
    guard_cols: int
    row_step: int

    def write_mask(self, num_rows: int) -> torch.Tensor:
        """bool of ``backing.shape``: rows ``< num_rows`` of the view, columns ``< width``."""
        mask = torch.zeros(self.backing.shape, dtype=torch.bool)
        width = self.view.shape[1]
        rows = self.guard_rows + self.row_step * torch.arange(min(num_rows, self.view.shape[0]))
        mask[rows, :width] = True
        return mask

    def locate(self, brow: int, bcol: int) -> dict:
        """Name backing element ``(brow, bcol)``: guard rows/columns, a row between strided rows,
        or view row/column."""
        cap, width = self.view.shape
        rel = brow - self.guard_rows
        if rel < 0:
            return {"region": "guard-rows-before", "column": bcol}
        if rel >= cap * self.row_step:
            return {"region": "guard-rows-after", "column": bcol}
        if rel % self.row_step:
            return {"region": "between-rows", "row": rel // self.row_step, "column": bcol}
        if bcol >= width:
            return {"region": "guard-columns", "row": rel // self.row_step, "column": bcol}
        return {"region": "view", "row": rel // self.row_step, "column": bcol}

    def check(self, before: torch.Tensor, num_rows: int) -> SentinelCheck:
        """Stray/missing writes of a step that wrote rows ``< num_rows`` (parity-contract.md §4).

        Args:
            before: host copy of ``backing`` before the step.
            num_rows: ``WriteSet.output_rows``.
        """
        after = self.backing.detach().cpu()
        mask = self.write_mask(num_rows)
        stray = ((after != before) & ~mask).nonzero()
        missing = ((after == INT32_SENTINEL) & mask).nonzero()
        return SentinelCheck(
            buffer="output_buffer", stray=int(stray.shape[0]),
            first_stray=self.locate(*stray[0].tolist()) if stray.shape[0] else None,
            missing=int(missing.shape[0]),
            first_missing=self.locate(*missing[0].tolist()) if missing.shape[0] else None)


def allocate_output_buffer(spec, *, device="cpu", guard_rows: int = DEFAULT_GUARD_ROWS,
                           guard_cols: int = DEFAULT_GUARD_COLS) -> GuardedOutputBuffer:
    """Allocate ``spec`` (:class:`cases.spec.OutputBufferSpec`) with guards, filled with ``-777``.

    Raises:
        ValueError: non-positive capacity/width/row_step or negative guards.
    """
    if spec.capacity < 0 or spec.width < 1 or spec.row_step < 1 or min(guard_rows, guard_cols) < 0:
        raise ValueError(f"bad output buffer spec {spec} (guards {guard_rows}, {guard_cols})")
    rows = 2 * guard_rows + spec.capacity * spec.row_step
    backing = torch.full((rows, spec.width + guard_cols), INT32_SENTINEL, dtype=torch.int32, device=device)
    view = backing[guard_rows:guard_rows + spec.capacity * spec.row_step:spec.row_step, :spec.width]
    return GuardedOutputBuffer(backing=backing, view=view, guard_rows=guard_rows,
                               guard_cols=guard_cols, row_step=spec.row_step)
