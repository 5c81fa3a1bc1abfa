"""Memory aliasing of the tensors of one forward (kpool-algorithm.md §3.1, §3.3, §4.6).

A forward writes three tensors: the compressed cache, the tail ring and (with ``compute_topk``)
the rows ``[:T]`` of ``output_buffer``. Everything else is read only: ``k``, ``gate``, ``q``,
``weights``, ``ape`` and every metadata tensor.

Rules (rejected with :class:`kpool.errors.KPoolAliasingError`):

* a written tensor must not overlap itself (``written-self-overlap``: e.g. an ``as_strided``
  cache with a zero stride, where two slots would be one memory row);
* a written tensor must not share a byte with any other tensor argument, written or read
  (``written-aliases``): a kernel writing it would change an input it still reads, or the other
  written tensor, in an order the launches do not define.

Accepted: read-only tensors sharing memory with each other or overlapping themselves (``k`` and
``gate`` as two column halves of one projection output, an expanded ``ape``, ``seq_lens`` a view
of ``raw_seq_lens``...): nothing writes them during the forward, so their values are what the
caller passed. Interleaved views of one allocation that share no byte (a padded page's gap
holding another tensor) are accepted too: the test is exact, on byte intervals, not on storages.

Cost: one ``data_ptr`` range comparison per pair when the tensors' byte extents are disjoint
(every real allocation); the exact test (sorted contiguous runs) only runs when extents
intersect or a written tensor's strides are not nested.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .rules import reject

MAX_RUNS = 2 ** 24
"""Above this many contiguous runs the exact test gives up and treats the pair as overlapping."""


def byte_extent(t: torch.Tensor) -> Optional[Tuple[int, int]]:
    """``[lo, hi)``: absolute addresses of the first and one past the last byte ``t`` can touch;
    ``None`` for an empty tensor."""
    if t.numel() == 0:
        return None
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    lo = t.data_ptr()
    return lo, lo + (last + 1) * t.element_size()


def has_nested_strides(t: torch.Tensor) -> bool:
    """Sufficient test that no two elements of ``t`` share memory: with dims sorted by stride,
    each stride exceeds the span of all inner dims."""
    span = 0
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if stride <= span:
            return False
        span += (size - 1) * stride
    return True


def contiguous_runs(t: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Absolute byte intervals ``(starts, ends)`` (int64 CPU) of ``t``'s maximal contiguous runs
    of elements (one per page of a padded cache, one per row of a strided buffer); ``None`` when
    there would be more than :data:`MAX_RUNS`."""
    dims = [(s, n) for n, s in zip(t.shape, t.stride()) if n > 1]
    inner = sorted(d for d in dims if d[0] > 0)
    run = 1
    while inner and inner[0][0] == run:       # merge the dims that continue the run
        run *= inner.pop(0)[1]
    outer = inner + [d for d in dims if d[0] == 0]
    count = 1
    for _, n in outer:
        count *= n
    if count > MAX_RUNS:
        return None
    offsets = torch.zeros(1, dtype=torch.int64)
    for s, n in outer:
        offsets = (offsets[:, None] + torch.arange(n, dtype=torch.int64)[None, :] * s).reshape(-1)
    size = t.element_size()
    starts = t.data_ptr() + offsets * size
    return starts, starts + run * size


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share at least one byte (exact, see the module docstring)."""
    return _overlaps(a, b, byte_extent(a), byte_extent(b))


def _overlaps(a, b, ea, eb) -> bool:
    if ea is None or eb is None or ea[1] <= eb[0] or eb[1] <= ea[0]:
        return False
    ra, rb = contiguous_runs(a), contiguous_runs(b)
    if ra is None or rb is None:
        return True
    order = torch.argsort(rb[0])
    b_start, b_end_max = rb[0][order], torch.cummax(rb[1][order], 0).values
    before = torch.searchsorted(b_start, ra[1])        # runs of b starting before each run of a ends
    reach = b_end_max[(before - 1).clamp(min=0)]
    return bool(((before > 0) & (reach > ra[0])).any())


def self_overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share memory (exact)."""
    if t.numel() <= 1 or has_nested_strides(t):
        return False
    runs = contiguous_runs(t)
    if runs is None:
        return True
    order = torch.argsort(runs[0])
    starts, ends = runs[0][order], runs[1][order]
    return bool((starts[1:] < torch.cummax(ends, 0).values[:-1]).any())


def check_no_aliasing(written: Dict[str, torch.Tensor], read: Dict[str, torch.Tensor]) -> None:
    """Reject a written tensor that overlaps itself or any other tensor (module docstring).

    Args:
        written: name -> tensor the forward writes (caches, ``output_buffer[:T]``).
        read: name -> tensor the forward only reads (``None`` entries are skipped).

    Raises:
        KPoolAliasingError: rule ``written-self-overlap`` or ``written-aliases``.
    """
    for name, t in written.items():
        if self_overlaps(t):
            reject("written-self-overlap", f"{name} overlaps itself (shape {list(t.shape)}, strides "
                                         f"{list(t.stride())}): two of its rows would be one memory row")
    tensors = list(written.items()) + [(n, t) for n, t in read.items() if t is not None]
    extents = [byte_extent(t) for _, t in tensors]
    for i, (name, t) in enumerate(tensors[:len(written)]):
        for j in range(i + 1, len(tensors)):       # each written tensor against every later argument
            if _overlaps(t, tensors[j][1], extents[i], extents[j]):
                other = tensors[j][0]
                reject("written-aliases", f"{name} shares memory with {other}: the forward writes {name}, "
                                          f"so {other} would change under it; pass separate storage")
