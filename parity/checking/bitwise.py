"""The tests' one bitwise assertion (:func:`assert_bitwise_equal`) and its message
(:func:`bitwise_mismatch`): same shape, dtype and every element's bit pattern, the first differing
element named (parity-contract.md §1: bitwise). Split from :mod:`.compare`, which re-exports both.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from cases.bits import bits


def _value_text(b: int, floating: bool, hex_width: int) -> str:
    """An element for a message: integers as values, floats as their bit pattern."""
    return f"0x{b & ((1 << (4 * hex_width)) - 1):0{hex_width}X}" if floating else str(b)


def bitwise_mismatch(actual: Optional[torch.Tensor], expected: Optional[torch.Tensor], *, name: str = "tensor",
                     dims: Optional[Sequence[str]] = None) -> Optional[str]:
    """Why ``actual`` and ``expected`` do not hold the same bits, or ``None`` when they do
    (:func:`assert_bitwise_equal` raises with this message).

    Args:
        actual / expected: tensors of any dtype and device (compared on the CPU), or ``None``.
        name: what is compared, first word of the message.
        dims: a name per dimension for the location (``("page", "row", None, "ch")``: ``None``
            leaves a dimension out); default ``index=(i, j, ...)``.
    Returns:
        ``None``, or e.g. ``"compressed: 3/2048 differ, first page=2 row=1 ch=9: 0x3F80 vs
        0x3F81"`` (floats as bit patterns, integers as values; shape or dtype differences said
        as such).
    """
    if actual is None or expected is None:
        if actual is None and expected is None:
            return None
        return f"{name}: {'actual' if actual is None else 'expected'} is None"
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return (f"{name}: actual {actual.dtype}{list(actual.shape)} vs expected "
                f"{expected.dtype}{list(expected.shape)}")
    a, e = bits(actual.detach().cpu()), bits(expected.detach().cpu())
    diff = a != e
    n = int(diff.sum())
    if n == 0:
        return None
    first = diff.nonzero()[0].tolist()
    if dims is None:
        where = f"index={tuple(first)}"
    else:
        where = " ".join(f"{d}={i}" for d, i in zip(dims, first) if d is not None)
    floating = actual.dtype.is_floating_point
    width = 2 * actual.element_size()
    at = tuple(first)
    return (f"{name}: {n}/{diff.numel()} differ, first {where}: "
            f"{_value_text(int(a[at]), floating, width)} vs {_value_text(int(e[at]), floating, width)}")


def assert_bitwise_equal(actual: Optional[torch.Tensor], expected: Optional[torch.Tensor], *,
                         name: str = "tensor", dims: Optional[Sequence[str]] = None) -> None:
    """Assert that two tensors hold the same bits (same shape, dtype, every element's bit
    pattern: NaN payloads and ``-0.0`` count), in the style of ``torch.testing``'s messages.

    Args:
        actual / expected: tensors (any device) or ``None`` (equal only to ``None``).
        name: what is compared (the message's first word). dims: per-dimension names for the
            location (see :func:`bitwise_mismatch`).
    Raises:
        AssertionError: ``"<name>: 3/2048 differ, first page=2 row=1 ch=9: 0x3F80 vs 0x3F81"``.
    """
    message = bitwise_mismatch(actual, expected, name=name, dims=dims)
    if message is not None:
        raise AssertionError(message)
