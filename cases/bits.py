"""Bit views of tensors: the one place that reinterprets values as same-width integers for a
bitwise comparison (parity-contract.md §1: every comparison is bitwise, NaN payloads and the
sign of zero included).

:mod:`parity.checking.compare` builds its comparators and ``assert_bitwise_equal`` on these; the public
cases' stated-value checks (:mod:`cases.public`) compare recorded tensors with them. Data only:
nothing here imports a kernel or the reference.
"""
from __future__ import annotations

from typing import Optional

import torch

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The same-width signed integer view of ``t`` (bf16/fp16 -> int16, fp32 -> int32, fp64 ->
    int64, bool -> int8; integer tensors are returned as they are), on ``t``'s device.

    Any strides work (a same-width dtype view never copies); the result shares ``t``'s storage.

    Raises:
        TypeError: ``t`` is not a tensor, or its element size has no integer type (complex).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"bits() needs a tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point and t.dtype != torch.bool:
        return t
    width = _INT_OF_WIDTH.get(t.element_size())
    if width is None or t.dtype.is_complex:
        raise TypeError(f"no integer view of {t.dtype}")
    if t.dtype == torch.bool:
        return t.to(torch.int8)
    return t.view(width)


def same_bits(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    """Whether ``a`` and ``b`` hold the same bits: same shape, same dtype, every element's bit
    pattern equal (any devices: both are compared on the CPU). ``None == None``."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(bits(a.detach().cpu()), bits(b.detach().cpu()))
