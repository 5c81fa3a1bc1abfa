"""Exact canonical top-k without a full sort (kpool-algorithm.md §4.4, §11; parity-contract.md §2).

The score kernels (:mod:`kpool.ops.score`) store one int64 key per pool: high word the
order-preserving int32 image of the sanitized fp32 score (``-0.0`` folded into ``+0.0``), low
word ``0xFFFFFFFF - pool`` (stored as ``-1 - pool``). Keys of a row are unique, and key order is
the canonical order: descending score, ties to the lower pool id, LOWEST (invalid) last. So the
``selected`` largest keys, in descending key order, are exactly what a stable descending sort
of the scores puts first, bit for bit, whatever algorithm finds them. :func:`select_topk` uses
``torch.topk`` on the keys (no Triton ``tl.sort``/``tl.topk``: not in the portable subset,
platform-numerics.md §6.1); the expansion kernel reads the pool id and the validity back from
the selected keys.

The torch helpers (:func:`canonical_keys`, :func:`key_pool_ids`, :func:`key_scores`,
:func:`key_valid`) are the host-side twins used by tests and by :func:`score_pools`.
"""
from __future__ import annotations

import torch

from ..errors import KPoolShapeError
from ._portable import FLT_MAX, KEY_LOWEST, LOWEST

_INT32_MIN = -2 ** 31


def select_topk(keys: torch.Tensor, selected: int, *, out=None) -> torch.Tensor:
    """The ``selected`` largest keys of every row, in descending order: the canonical top-k.

    Args:
        keys: int64 ``[rows, n]`` selection keys (unique per row).
        selected: keys to keep, ``0 <= selected <= n`` (``min(K_pool, max_pool_seq_len)``).
        out: optional ``(values int64 [rows, selected], indices int64 [rows, selected])``
            buffers for ``torch.topk`` (the values are the result).

    Returns:
        int64 ``[rows, selected]`` keys (``out[0]`` when given).

    Raises:
        KPoolShapeError: ``keys`` not 2-D or ``selected`` outside ``[0, n]``.
    """
    if keys.dim() != 2 or not 0 <= selected <= keys.shape[1]:
        raise KPoolShapeError(f"cannot select {selected} of keys {tuple(keys.shape)}")
    if out is None:
        return torch.topk(keys, selected, dim=1, largest=True, sorted=True).values
    torch.topk(keys, selected, dim=1, largest=True, sorted=True, out=out)
    return out[0]


def canonical_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys of sanitized fp32 scores ``[rows, n]`` (pool id = column), as the kernels
    write them: ``(image(score) << 32) | (0xFFFFFFFF - j)``. NaN and values ``<= LOWEST`` map to
    LOWEST's image, values ``> FLT_MAX`` to FLT_MAX's, ``-0.0`` to ``+0.0``'s (§4.3)."""
    s = scores.to(torch.float32)
    s = torch.where(torch.isnan(s) | (s <= LOWEST), torch.full_like(s, LOWEST), s)
    s = torch.where(s > FLT_MAX, torch.full_like(s, FLT_MAX), s)
    s = torch.where(s == 0, torch.zeros_like(s), s)
    bits = s.contiguous().view(torch.int32)
    image = torch.where(bits < 0, -1 - (bits & 0x7FFFFFFF), bits).to(torch.int64)
    pools = torch.arange(s.shape[-1], dtype=torch.int64, device=s.device)
    return (image << 32) | (0xFFFFFFFF - pools)


def key_pool_ids(keys: torch.Tensor) -> torch.Tensor:
    """int32 pool ids of int64 keys (their low word is ``0xFFFFFFFF - pool``)."""
    return (0xFFFFFFFF - (keys & 0xFFFFFFFF)).to(torch.int32)


def key_valid(keys: torch.Tensor) -> torch.Tensor:
    """bool: the key's score is above LOWEST (a selectable pool, §4.3)."""
    return (keys >> 32) > KEY_LOWEST


def key_scores(keys: torch.Tensor) -> torch.Tensor:
    """fp32 sanitized scores of int64 keys (the inverse of the image; ``-0.0`` never occurs)."""
    image = (keys >> 32).to(torch.int32)
    bits = torch.where(image < 0, (-1 - image) | _INT32_MIN, image)
    return bits.contiguous().view(torch.float32)
