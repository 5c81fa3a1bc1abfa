"""Pools near the fp32 overflow (docs/certificates.md §2.4 "Partial-sum ceiling", "Exact
everywhere", "One sign"): which finite pools cannot overflow in any order, which are exact in
every order, and which can only overflow toward one infinity. Used by
:func:`parity.checking.certificates.scores.score_bounds`; kpool-algorithm.md §4.2 gives the
routes: (R) ``sum_h w_h relu(sum_d q_hd c_d)``; (M) per-head ``sum_h w_h (sum_d q_hd c_d)`` and
merged-query ``sum_d (sum_h w_h q_hd) c_d``.

Every array is float64 holding the fp32 / bf16 inputs exactly: ``q`` ``[H, D]``, ``w`` ``[H]``,
finite ``keys`` ``[v, D]``.
"""
from __future__ import annotations

import numpy as np

from .floats import KAPPA_BLOCK, U_FAITHFUL

FP32_MAX = float(np.finfo(np.float32).max)
"""The sanitized value of a ``+inf`` score (parity-contract.md §2)."""
OVERFLOW_CEILING = FP32_MAX
"""A finite pool whose :func:`ceilings` (the exact magnitudes of every sum and product of every
route, times the rounding growth) stay at or below this cannot overflow fp32 in any order: a
faithfully rounded operation whose exact result is at most FP32_MAX in magnitude is finite, and
by induction every computed value is at most its ceiling. Its bound holds."""


def _growth(q: np.ndarray) -> float:
    """Rounding growth of any computed partial sum over its exact magnitude, in any order:
    ``(1 + kappa u)^(H + D + 4)`` (a D-sum, a head sum, the products and the fp32 ``qbar``)."""
    H, D = q.shape
    return (1.0 + KAPPA_BLOCK * U_FAITHFUL) ** (H + D + 4)


def _magnitudes(q: np.ndarray, w: np.ndarray, keys: np.ndarray):
    """``(dots [v, H], heads [v], qbar [D], merged [v])``: the sums of magnitudes that bound
    every partial sum and product of each route: a head's dot ``sum_d |q_hd c_d|``, the head sum
    ``sum_h |w_h| dots_h``, a merged-query channel ``sum_h |w_h q_hd|`` and the merged dot
    ``sum_d qbar_d |c_d|``."""
    aq, aw, ac = np.abs(q), np.abs(w), np.abs(keys)
    dots = ac @ aq.T
    qbar = (aw[:, None] * aq).sum(axis=0)
    return dots, dots @ aw, qbar, ac @ qbar


def ceilings(q: np.ndarray, w: np.ndarray, keys: np.ndarray, score_mode: str) -> np.ndarray:
    """float64 ``[v]``: a ceiling on the magnitude of every partial sum and product of every
    evaluation route of ``score_mode`` (``"relu"`` or ``"merged"``), in any order and
    association with faithful rounding: the sums of magnitudes of :func:`_magnitudes` times
    :func:`_growth`. At or below :data:`OVERFLOW_CEILING` nothing can overflow."""
    dots, heads, qbar, merged = _magnitudes(q, w, keys)
    top = np.maximum(dots.max(axis=1, initial=0.0), heads)
    if score_mode == "merged":
        top = np.maximum(np.maximum(top, merged), qbar.max(initial=0.0))
    return top * _growth(q)


def _fp32(x: np.ndarray) -> np.ndarray:
    """bool: each float64 value is an fp32 value (finite, representable: rounding leaves it)."""
    with np.errstate(over="ignore"):
        return np.isfinite(x) & (x.astype(np.float32).astype(np.float64) == x)


def exact_everywhere(q: np.ndarray, w: np.ndarray, keys: np.ndarray, score_mode: str) -> np.ndarray:
    """bool ``[v]``: pools whose every route has at most one nonzero term in each of its sums and
    an fp32 value at every product and sum (so no operation rounds and ``x + 0 = x``): the score
    is the exact value in every order and association, bound 0, whatever its magnitude."""
    prods = keys[:, None, :] * q[None, :, :]                          # [v, H, D]
    dots = prods.sum(axis=-1)
    ok = ((prods != 0).sum(axis=-1) <= 1).all(axis=1) & _fp32(prods).all(axis=(1, 2)) & _fp32(dots).all(axis=1)
    heads = w[None, :] * (np.maximum(dots, 0.0) if score_mode == "relu" else dots)
    ok &= ((heads != 0).sum(axis=1) <= 1) & _fp32(heads).all(axis=1)
    if score_mode == "merged":
        wq = w[:, None] * q
        qbar = wq.sum(axis=0)
        merged = qbar[None, :] * keys
        ok &= bool(((wq != 0).sum(axis=0) <= 1).all() and _fp32(wq).all() and _fp32(qbar).all())
        ok &= ((merged != 0).sum(axis=1) <= 1) & _fp32(merged).all(axis=1)
    return ok


def one_signed(q: np.ndarray, w: np.ndarray, keys: np.ndarray, score_mode: str) -> np.ndarray:
    """float64 ``[v]``: ``+1`` for pools whose every product ``w_h q_hd c_d`` is ``>= 0``, ``-1``
    for ``<= 0``, ``0`` otherwise, where also no zero factor multiplies a sum that could
    overflow (``w_h = 0`` times a head's dot; in mode (M) ``c_d = 0`` times ``qbar_d``: ``0 *
    inf`` is NaN). Then every intermediate of every route has that sign or is that sign's
    infinity (the ReLU of a head whose terms have the other sign is exactly 0, in (R) a
    negative pool is 0 exactly): the score is a value its bound covers or, after an overflow,
    that infinity."""
    atoms = w[None, :, None] * q[None, :, :] * keys[:, None, :]       # [v, H, D]
    sign = np.where((atoms >= 0).all(axis=(1, 2)), 1.0, np.where((atoms <= 0).all(axis=(1, 2)), -1.0, 0.0))
    dots, _, qbar, _ = _magnitudes(q, w, keys)
    g = _growth(q)
    safe = ~((w == 0)[None, :] & (dots * g > OVERFLOW_CEILING)).any(axis=1)
    if score_mode == "merged":
        safe &= ~((keys == 0) & (qbar * g > OVERFLOW_CEILING)[None, :]).any(axis=1)
    return np.where(safe, sign, 0.0)
