"""Shared by the bad-input tests (parity-contract.md §5): build a forward's keyword set from a
batch, snapshot every byte a forward could touch, and assert a rejection by rule."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import pytest
import torch

from kpool.cache import allocate_caches
from kpool.config import KPoolConfig
from kpool.errors import KPoolError
from kpool.metadata import BatchSpec, build_metadata
from parity.checking.compare import same_bits
from tests.helpers import random_forward_kwargs


def batch_kwargs(config: KPoolConfig, batch: BatchSpec, *, page_size: int, num_pages: int, num_tail_blocks: int,
                 device="cpu", seed: int = 0):
    """``(caches, kwargs)`` for ``kpool.indexer.forward`` from an explicit batch (random inputs)."""
    g = torch.Generator().manual_seed(seed)
    meta = build_metadata(batch, index_kpool=config.index_kpool, ring_capacity=config.ring_capacity,
                          page_size=page_size, device=device)
    caches = allocate_caches(config, num_pages=num_pages, page_size=page_size, num_tail_blocks=num_tail_blocks,
                             guard=8, device=device)
    return caches, random_forward_kwargs(config, meta, caches, g, device)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "meta" or t.numel() == 0:        # no bytes to compare
        return torch.zeros(0, dtype=torch.uint8)
    return t.detach().cpu().contiguous().view(torch.uint8).clone()


def snapshot(kw: dict, *extra: torch.Tensor) -> list:
    """Byte copies of every tensor in ``kw`` (inputs, caches, metadata, output buffer) and of
    ``extra`` (the caches' backings with their guard bands, an output buffer's backing)."""
    tensors = [v for v in kw.values() if isinstance(v, torch.Tensor)] + list(extra)
    return [_bytes(t) for t in tensors]


def assert_rejected(call: Callable[[], object], error: type, rule: Optional[str], kw: dict,
                    extra: Sequence[torch.Tensor] = (), match: Optional[str] = None) -> KPoolError:
    """``call()`` raises ``error`` for ``rule`` (``None``: a check outside the rule catalogue)
    before any launch: the raise comes from a check, not from :mod:`kpool.ops`, and every tensor
    of ``kw`` and ``extra`` is byte-identical afterwards. Returns the exception."""
    before = snapshot(kw, *extra)
    with pytest.raises(error, match=match) as info:
        call()
    assert getattr(info.value, "rule", None) == rule, f"rule {getattr(info.value, 'rule', None)!r} != {rule!r}: {info.value}"
    launched = [e for e in info.traceback if "/kpool/ops/" in str(e.path).replace("\\", "/")]
    assert not launched, f"raised inside the kernels' launchers: {launched}"
    after = snapshot(kw, *extra)
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if not same_bits(a, b)]
    assert not changed, f"tensors {changed} changed although the call was rejected"
    return info.value


def assert_corrupted_small_batch_rejected(corrupt: Callable[[dict], None], error: type, rule: Optional[str],
                                          device) -> KPoolError:
    """:func:`tests.helpers.small_batch` (SMALL config) with ``corrupt(kwargs)`` applied is
    rejected by ``kpool.indexer.forward`` as :func:`assert_rejected` says."""
    from kpool import SMALL
    from kpool.indexer import forward
    from tests.helpers import small_batch
    caches, kw = small_batch(SMALL, device=device)
    corrupt(kw)
    return assert_rejected(lambda: forward(**kw), error, rule, kw, (caches.compressed_backing, caches.tail_backing))
