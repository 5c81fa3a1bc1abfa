"""Floating-point facts shared by both certificates (docs/certificates.md §1).

The error model of every conforming fp32 implementation, and the two sum bounds built on it:

* :data:`U_FAITHFUL` ``= 2^-23``: every fp32 operation's error is below one ulp of its exact
  result (faithful rounding; IEEE round-to-nearest has half of that). NVIDIA tensor cores are
  not IEEE per addition (truncated alignment, round-toward-zero normalisation are reported), so
  RNE cannot be assumed for them.
* :data:`KAPPA_BLOCK` ``= 5/4``: a fused block adder of ``m >= 5`` inputs (``>= 4`` exact
  products plus the accumulator) that aligns to the largest input and truncates is within
  ``m / (m - 1) <= 5/4`` of the cost of ``m - 1`` faithful additions.
* :data:`ETA` ``= 2^-126``: absolute error an operation may add on underflow (a result or a
  subnormal input flushed to zero).

:func:`sum_error_bound` is the any-order, any-association bound of docs/certificates.md §1.3:
``|fl(sum x) - sum x| <= kappa u (1 + gamma) Phi(|x|)`` with
``Phi = sum_{k=2..n} (sum of the k largest |x_i|)``.
"""
from __future__ import annotations

import numpy as np
import torch

U_RNE = 2.0 ** -24
"""Unit roundoff of IEEE fp32 round-to-nearest."""
U_FAITHFUL = 2.0 ** -23
"""Unit roundoff of a faithful fp32 operation (error below 1 ulp of the exact result); the
model of both certificates (docs/certificates.md §1.1)."""
KAPPA_BLOCK = 1.25
"""Cost factor of a block adder with truncated alignment (docs/certificates.md §1.2)."""
ETA = 2.0 ** -126
"""Absolute error per operation from underflow or flush-to-zero (docs/certificates.md §1.1)."""


def gamma(n: float, u: float = U_FAITHFUL) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)`` (``n`` may be fractional: ``kappa * (n - 1)``).

    ``(1 + u)^n - 1 <= exp(n u) - 1 <= gamma_n``: the relative growth of ``n`` chained
    roundings.

    Raises:
        ValueError: ``n u >= 1`` (the bound does not exist).
    """
    if n * u >= 1:
        raise ValueError(f"gamma_{n} undefined for u={u}")
    return n * u / (1.0 - n * u)


def ordered_sum_magnitude(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """``Phi(a) = sum_{k=2..n} T_k`` along ``axis``, ``T_k`` the sum of the ``k`` largest entries
    of ``a >= 0`` (docs/certificates.md §1.3).

    The largest possible sum of the magnitudes of all partial sums that any summation tree over
    ``n`` terms forms. Sorted ascending, entry ``i`` (1-based) appears in ``T_k`` for ``k >= n-i+1``
    i.e. ``i`` times, except the largest, which appears ``n - 1`` times (``T_1`` is no addition).

    Returns:
        float64 array of ``a``'s shape without ``axis`` (0 where ``n <= 1``).
    """
    s = np.sort(np.asarray(a, dtype=np.float64), axis=axis)
    n = s.shape[axis]
    if n <= 1:
        return np.zeros_like(s.sum(axis=axis))
    shape = [1] * s.ndim
    shape[axis] = n
    weights = np.arange(1, n + 1, dtype=np.float64).reshape(shape)
    return (s * weights).sum(axis=axis) - np.take(s, n - 1, axis=axis)


def sum_error_bound(a: np.ndarray, axis: int = -1, *, u: float = U_FAITHFUL,
                    kappa: float = KAPPA_BLOCK) -> np.ndarray:
    """Largest error of summing ``n`` fp32 terms of magnitudes ``a`` (float64 ``>= 0``) along
    ``axis`` in any order and association, with binary, FMA or block adders
    (docs/certificates.md §1.3):

    ``kappa u (1 + gamma_{kappa (n-1)}) Phi(a) + ETA (n - 1) [sum a > 0]``.

    Returns:
        float64, ``a``'s shape without ``axis``.
    """
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[axis]
    if n <= 1:
        return np.zeros_like(a.sum(axis=axis))
    rel = kappa * u * (1.0 + gamma(kappa * (n - 1), u))
    nonzero = (a.sum(axis=axis) > 0).astype(np.float64)
    return rel * ordered_sum_magnitude(a, axis) + ETA * (n - 1) * nonzero


def fp32_ulp(x: np.ndarray) -> np.ndarray:
    """ulp of fp32 at ``|x|`` (float64 array in, float64 array out): the gap from ``fp32(|x|)``
    to the next larger fp32 (``2^-149`` at zero)."""
    ax = np.abs(np.asarray(x, dtype=np.float64)).astype(np.float32)
    return np.spacing(ax).astype(np.float64)


def bf16_bits_to_f64(bits: torch.Tensor) -> np.ndarray:
    """float64 values of int16 bf16 bit patterns (any shape)."""
    b = bits.cpu().to(torch.int32) & 0xFFFF
    return (b << 16).view(torch.float32).to(torch.float64).numpy()


def bf16_order_key(bits: torch.Tensor) -> torch.Tensor:
    """int32 key, monotone in the bf16 value: adjacent representable values differ by 1
    (``+0`` and ``-0`` share key 0)."""
    b = bits.cpu().to(torch.int32) & 0xFFFF
    return torch.where(b >= 0x8000, -(b & 0x7FFF), b)


def bf16_is_nan(bits: torch.Tensor) -> torch.Tensor:
    """bool: the int16 bf16 bit patterns that are NaN (incl. the harness sentinel 0x7FA5)."""
    b = bits.to(torch.int32) & 0x7FFF
    return b > 0x7F80
