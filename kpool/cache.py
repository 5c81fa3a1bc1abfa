"""Allocation of the two KPool caches (kpool-algorithm.md §3.1, §3.3).

* compressed cache: ``[N, B, 1, D]`` bf16, one row per complete pool, whole physical pages;
  a page may be padded (``stride(0) > B * D``), as real allocations are.
* tail ring: ``[num_tail_blocks, 2, C, D]`` fp32 (plane 0 raw K, plane 1 raw gate); a block
  may be padded too (public case C03: the ring is a view with a padded block stride).

Both are views into flat *backing* buffers with guard bands before and after, so a harness
can lay sentinels over every byte and find stray writes anywhere in the allocation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import KPoolConfig
from .rules import as_int, reject


@dataclass
class KPoolCaches:
    """The compressed cache and the tail ring of one layer, with their backing buffers.

    Attributes:
        compressed_cache: bf16 ``[N, B, 1, D]`` view (page stride may exceed ``B * D``).
        tail_cache: fp32 ``[num_tail_blocks, 2, C, D]`` view (block stride may exceed ``2 * C * D``).
        compressed_backing: flat bf16 buffer the compressed view lives in (guards included).
        tail_backing: flat fp32 buffer the ring view lives in (guards included).
    """

    compressed_cache: torch.Tensor
    tail_cache: torch.Tensor
    compressed_backing: torch.Tensor
    tail_backing: torch.Tensor

    @property
    def page_size(self) -> int:
        """``B``: pools per compressed page (``compressed_cache.shape[1]``)."""
        return int(self.compressed_cache.shape[1])

    @property
    def num_pages(self) -> int:
        """``N``: physical compressed pages."""
        return int(self.compressed_cache.shape[0])

    @property
    def num_tail_blocks(self) -> int:
        """Ring blocks (one per request slot)."""
        return int(self.tail_cache.shape[0])

    @property
    def ring_capacity(self) -> int:
        """``C``: ring rows per block."""
        return int(self.tail_cache.shape[2])

    def clone(self) -> "KPoolCaches":
        """Byte-identical copy with the same strides and storage offsets (backings included)."""
        cb = self.compressed_backing.clone()
        tb = self.tail_backing.clone()
        return KPoolCaches(
            compressed_cache=_same_view(cb, self.compressed_cache),
            tail_cache=_same_view(tb, self.tail_cache),
            compressed_backing=cb, tail_backing=tb)

    def to(self, device) -> "KPoolCaches":
        """Byte-identical copy on ``device`` with the same layout."""
        cb = self.compressed_backing.to(device, copy=True)
        tb = self.tail_backing.to(device, copy=True)
        return KPoolCaches(
            compressed_cache=_same_view(cb, self.compressed_cache),
            tail_cache=_same_view(tb, self.tail_cache),
            compressed_backing=cb, tail_backing=tb)

    def copy_(self, other: "KPoolCaches") -> "KPoolCaches":
        """Overwrite this allocation with ``other``'s bytes (same layout required)."""
        self.compressed_backing.copy_(other.compressed_backing)
        self.tail_backing.copy_(other.tail_backing)
        return self


def _same_view(backing: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    return backing.as_strided(view.shape, view.stride(), view.storage_offset())


def allocate_caches(config: KPoolConfig, *, num_pages: int, page_size: int, num_tail_blocks: int,
                    page_padding: int = 0, ring_block_padding: int = 0, guard: int = 0,
                    device="cpu", fill_bf16_bits: int = 0, fill_fp32_bits: int = 0,
                    row_padding: int = 0) -> KPoolCaches:
    """Allocate both caches in complete physical pages.

    Args:
        config: gives ``D`` and the ring capacity ``C``.
        num_pages: ``N`` compressed pages.
        page_size: ``B`` pools per page.
        num_tail_blocks: ring blocks.
        page_padding: extra elements after each compressed page (``stride(0) = B * D + page_padding``).
        ring_block_padding: extra elements after each ring block (C03's padded block stride).
        guard: guard elements before the first and after the last page/block of each backing.
        row_padding: extra elements after each row of both caches (the token / slot stride
            ``D + row_padding``, §3.1 "the token and dim strides are honoured").
        device: allocation device.
        fill_bf16_bits / fill_fp32_bits: initial bit pattern of every element (0 -> zeros).

    Returns:
        :class:`KPoolCaches`.

    Raises:
        KPoolTypeError: a size, padding or fill pattern that is not an int (numpy integers are
            accepted), or ``config`` without ``index_head_dim`` / ``ring_capacity``.
        KPoolShapeError: non-positive sizes or negative paddings.
    """
    if not all(hasattr(config, a) for a in ("index_head_dim", "ring_capacity")):
        reject("argument-type", f"config must be a KPoolConfig, got {type(config).__name__}")
    D, C = config.index_head_dim, config.ring_capacity
    num_pages, page_size, num_tail_blocks, page_padding, ring_block_padding, guard, fill_bf16_bits, fill_fp32_bits, \
        row_padding = (as_int(name, value) for name, value in (
            ("num_pages", num_pages), ("page_size", page_size), ("num_tail_blocks", num_tail_blocks),
            ("page_padding", page_padding), ("ring_block_padding", ring_block_padding), ("guard", guard),
            ("fill_bf16_bits", fill_bf16_bits), ("fill_fp32_bits", fill_fp32_bits), ("row_padding", row_padding)))
    if num_pages < 1 or page_size < 1 or num_tail_blocks < 1:
        reject("allocation-size", f"need positive sizes, got N={num_pages}, B={page_size}, blocks={num_tail_blocks}")
    if min(page_padding, ring_block_padding, guard, row_padding) < 0:
        reject("allocation-size", f"paddings and guard must be >= 0, got page_padding={page_padding}, "
                                  f"ring_block_padding={ring_block_padding}, guard={guard}, row_padding={row_padding}")
    row = D + row_padding
    page_stride = page_size * row + page_padding
    cb = torch.empty(2 * guard + num_pages * page_stride, dtype=torch.int16, device=device)
    cb.fill_(as_int16(fill_bf16_bits))
    cb = cb.view(torch.bfloat16)
    compressed = cb.as_strided((num_pages, page_size, 1, D), (page_stride, row, row, 1), guard)

    block_stride = 2 * C * row + ring_block_padding
    tb = torch.empty(2 * guard + num_tail_blocks * block_stride, dtype=torch.int32, device=device)
    tb.fill_(as_int32(fill_fp32_bits))
    tb = tb.view(torch.float32)
    tail = tb.as_strided((num_tail_blocks, 2, C, D), (block_stride, C * row, row, 1), guard)
    return KPoolCaches(compressed_cache=compressed, tail_cache=tail, compressed_backing=cb, tail_backing=tb)


def as_int16(bits: int) -> int:
    """A 16-bit pattern as the signed int16 value torch fills with."""
    bits &= 0xFFFF
    return bits - 0x10000 if bits >= 0x8000 else bits


def as_int32(bits: int) -> int:
    """A 32-bit pattern as the signed int32 value torch fills with."""
    bits &= 0xFFFFFFFF
    return bits - 0x100000000 if bits >= 0x80000000 else bits


def check_cache_layout(compressed_cache: torch.Tensor, tail_cache: torch.Tensor, config: KPoolConfig) -> None:
    """Check both caches against ``config`` (kpool-algorithm.md §2 guards, §3.1, §3.3): called by
    :meth:`kpool.backend.KPoolIndexerBackend.forward` with ``validate=True``.

    Args:
        compressed_cache: bf16 ``[N, B, 1, D]``; tail_cache: fp32 ``[blocks, 2, C, D]``.
        config: gives ``D = index_head_dim`` and ``C = ring_capacity`` (``P +
            num_speculative_tokens`` unless ``tail_ring_capacity`` is set).

    Raises:
        KPoolDtypeError: a cache not a tensor, compressed cache not bf16 or ring not fp32.
        KPoolShapeError: wrong rank, a head dim other than the config's ``D``
            (``config-head-dim``), a ring capacity other than the config's ``C``
            (``config-ring-capacity``: a ring sized for another ``num_speculative_tokens`` puts
            ``p % C`` at other rows than the metadata builder did), a non-unit dim stride, or an
            empty cache.
    """
    D, C = config.index_head_dim, config.ring_capacity
    for name, t, dtype in (("compressed cache", compressed_cache, torch.bfloat16), ("tail ring", tail_cache, torch.float32)):
        if not isinstance(t, torch.Tensor):
            reject("tensor-type", f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            reject("dtype", f"{name} must be {str(dtype).replace('torch.', '')}, got {str(t.dtype).replace('torch.', '')}")
    if compressed_cache.dim() != 4 or compressed_cache.shape[2] != 1:
        reject("shape", f"compressed cache must be [N, B, 1, D], got {list(compressed_cache.shape)}")
    if tail_cache.dim() != 4 or tail_cache.shape[1] != 2:
        reject("shape", f"tail ring must be [blocks, 2, C, D], got {list(tail_cache.shape)}")
    for name, t in (("compressed cache", compressed_cache), ("tail ring", tail_cache)):
        if t.shape[3] != D:
            reject("config-head-dim", f"{name} head dim {t.shape[3]} != the config's index_head_dim {D}")
    if tail_cache.shape[2] != C:
        reject("config-ring-capacity",
               f"tail ring capacity C={tail_cache.shape[2]} != the config's {C} (index_kpool "
               f"{config.index_kpool} + num_speculative_tokens {config.num_speculative_tokens}"
               + (f", tail_ring_capacity {config.tail_ring_capacity})" if config.tail_ring_capacity is not None else ")"))
    if compressed_cache.stride(3) != 1 or tail_cache.stride(3) != 1:
        reject("cache-inner-stride", "the head-dim stride of both caches must be 1")
    if compressed_cache.numel() == 0 or tail_cache.numel() == 0:
        reject("cache-empty", "caches must not be empty")
