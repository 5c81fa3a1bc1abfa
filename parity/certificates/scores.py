"""Exact pool scores and the bound on any conforming fp32 implementation's scores
(docs/certificates.md §2; kpool-algorithm.md §4.2).

For one query row (``q`` bf16 ``[H, D]``, ``w`` fp32/bf16 ``[H]``) and its visible pooled keys
(bf16 ``[v, D]``), :func:`score_bounds` returns the float64 score of every pool and a bound
``b_j`` such that every implementation that

* forms the ``q_hd * c_d`` products exactly (bf16 x bf16 fits fp32), and
* sums over ``D`` and over ``H`` in any order and association, with faithful fp32 operations,
  FMAs or tensor-core block adders (:mod:`parity.certificates.floats`),

computes a score within ``b_j`` of the exact one. Mode (R) ``sum_h w_h relu(sum_d q_hd c_d)``
uses that ReLU is 1-Lipschitz and that a head whose exact dot is at or below minus its dot bound
is exactly zero on every backend. Mode (M) takes the larger of the bounds for ``qbar = sum_h
w_h q_h`` kept in fp32 then one dot, and for per-head dots then a weighted head sum.

Not covered (the bound would be wrong): TF32 or bf16 rounding of fp32 operands (``tl.dot`` of
fp32 inputs without ``input_precision="ieee"``, a bf16 hi/lo split of ``qbar``), and FP8
accumulators narrower than fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .floats import ETA, KAPPA_BLOCK, U_FAITHFUL, sum_error_bound

SAFETY = 1.0 + 2.0 ** -20
"""Factor on every bound: absorbs the float64 evaluation of scores and bounds (its error is
below ``2^-46`` of the term magnitudes, the bound at least ``2^-23`` of them)."""
OVERFLOW_LIMIT = 2.0 ** 120
"""A pool whose partial sums could reach this magnitude could overflow fp32 in some order: not
certifiable."""
POOL_CHUNK = 256
"""Pools per float64 block (``[chunk, H, D]`` temporaries stay small at GLM size)."""


@dataclass
class ScoreBounds:
    """Scores of one row's visible pools and their bounds (arrays of length ``v``).

    Attributes:
        scores: float64 exact scores; ``-inf`` where a key holds NaN (the score is NaN in every
            order, sanitized to LOWEST, never selectable: kpool-algorithm.md §4.3).
        bounds: float64 ``b_j``; ``0`` for NaN pools.
        unbounded: bool, pools whose score no bound covers (an infinite key or input, or a
            magnitude near the fp32 overflow).
        provably_zero: bool, mode (R) pools with every head at or below minus its dot bound:
            score exactly 0 on every backend.
    """

    scores: np.ndarray
    bounds: np.ndarray
    unbounded: np.ndarray
    provably_zero: np.ndarray


def _weighted_heads(w: np.ndarray, values: np.ndarray, dot_err: np.ndarray, active: np.ndarray,
                    u: float, kappa: float):
    """Error of ``sum_h fl(w_h * v_h)`` over heads (docs/certificates.md §2.2 steps 3-4), where
    ``v_h`` (exact ``values``, ``[..., H]``) is known to within ``dot_err`` and is exactly 0 where
    ``~active``. Returns ``(score, bound)``."""
    aw = np.abs(w)
    head_err = np.where(active, aw * dot_err * (1.0 + u) + u * aw * (np.abs(values) + dot_err) + ETA, 0.0)
    mags = aw * np.abs(values) + head_err
    score = (w * values).sum(axis=-1)
    return score, head_err.sum(axis=-1) + sum_error_bound(mags, axis=-1, u=u, kappa=kappa)


def _dot_errors(q: np.ndarray, keys: np.ndarray, u: float, kappa: float):
    """Per-head dots ``[v, H]`` of exact bf16 products and their any-order error bounds
    (docs/certificates.md §2.2 step 1): the D-sum bound plus underflow of the products (a
    subnormal operand flushed loses less than ``ETA`` times the other operand)."""
    x = keys[:, None, :] * q[None, :, :]                              # [v, H, D], exact in float64
    dots = x.sum(axis=-1)
    D = q.shape[1]
    flush = ETA * (D + np.abs(q).sum(axis=1)[None, :] + np.abs(keys).sum(axis=1)[:, None])
    return dots, sum_error_bound(np.abs(x), axis=-1, u=u, kappa=kappa) + flush


def _relu_chunk(q, w, keys, u, kappa):
    dots, err = _dot_errors(q, keys, u, kappa)
    active = dots + err > 0                     # else every backend's dot is <= 0: relu = 0 exactly
    score, bound = _weighted_heads(w, np.maximum(dots, 0.0), err, active, u, kappa)
    return score, bound, ~active.any(axis=1)


def _merged_chunk(q, w, keys, u, kappa):
    # (M) as per-head dots, then a weighted head sum (what a tensor-core kernel does) ...
    dots, err = _dot_errors(q, keys, u, kappa)
    score, per_head = _weighted_heads(w, dots, err, np.ones_like(dots, dtype=bool), u, kappa)
    # ... or qbar_d = sum_h w_h q_hd in fp32 (fp32 x bf16 products round), then one D-sum.
    wq = np.abs(w[:, None] * q)                                       # [H, D]
    qbar = (w[:, None] * q).sum(axis=0)
    qbar_err = (u * wq + ETA).sum(axis=0) + sum_error_bound((1.0 + u) * wq + ETA, axis=0, u=u, kappa=kappa)
    qbar_mag = np.abs(qbar) + qbar_err                                # [D]
    c = np.abs(keys)
    term_err = c * qbar_err + u * c * qbar_mag + ETA                  # [v, D]
    via_qbar = term_err.sum(axis=1) + sum_error_bound(c * qbar_mag * (1.0 + u) + ETA, axis=1, u=u, kappa=kappa)
    return score, np.maximum(per_head, via_qbar), np.zeros(keys.shape[0], dtype=bool)


def score_bounds(q: np.ndarray, w: np.ndarray, keys: np.ndarray, score_mode: str = "relu", *,
                 u: float = U_FAITHFUL, kappa: float = KAPPA_BLOCK) -> ScoreBounds:
    """Exact scores of one query row against ``v`` pooled keys, with the any-order fp32 bound
    (docs/certificates.md §2; kpool-algorithm.md §4.2).

    Args:
        q: float64 ``[H, D]`` (bf16 values); w: float64 ``[H]`` (fp32 or bf16 values);
        keys: float64 ``[v, D]`` (bf16 values).
        score_mode: ``"relu"`` (§4.2 (R)) or ``"merged"`` (§4.2 (M)).
        u, kappa: the error model (:mod:`parity.certificates.floats`).

    Returns:
        :class:`ScoreBounds`.

    Raises:
        ValueError: unknown ``score_mode``.
    """
    if score_mode not in ("relu", "merged"):
        raise ValueError(f"unknown score_mode {score_mode!r}")
    q, w, keys = (np.asarray(a, dtype=np.float64) for a in (q, w, keys))
    v = keys.shape[0]
    scores, bounds, zero = np.zeros(v), np.zeros(v), np.zeros(v, dtype=bool)
    nan_key = np.isnan(keys).any(axis=1)
    inf_key = np.isinf(keys).any(axis=1) & ~nan_key
    if not (np.isfinite(q).all() and np.isfinite(w).all()):
        return ScoreBounds(np.full(v, -np.inf), bounds, np.ones(v, dtype=bool), zero)
    clean = np.where((nan_key | inf_key)[:, None], 0.0, keys)
    chunk = _relu_chunk if score_mode == "relu" else _merged_chunk
    for lo in range(0, v, POOL_CHUNK):
        hi = min(v, lo + POOL_CHUNK)
        scores[lo:hi], bounds[lo:hi], zero[lo:hi] = chunk(q, w, clean[lo:hi], u, kappa)
    bounds *= SAFETY
    # Every partial sum of either mode is below this per-pool magnitude; far from fp32 overflow,
    # no order can overflow (or make inf - inf).
    H, D = q.shape
    magnitude = H * D * np.abs(q).max(initial=0.0) * np.abs(clean).max(axis=1, initial=0.0) * (1 + np.abs(w).max(initial=0.0))
    unbounded = inf_key | ~np.isfinite(bounds) | (magnitude >= OVERFLOW_LIMIT)
    scores[nan_key] = -np.inf
    bounds[nan_key] = 0.0
    zero &= ~(nan_key | inf_key)
    return ScoreBounds(scores, bounds, unbounded & ~nan_key, zero)
