"""Exact pool scores and the bound on any conforming fp32 implementation's scores
(docs/certificates.md §2; kpool-algorithm.md §4.2).

For one query row (``q`` bf16 ``[H, D]``, ``w`` fp32/bf16 ``[H]``) and its visible pooled keys
(bf16 ``[v, D]``), :func:`score_bounds` returns the float64 score of every pool and a bound
``b_j`` such that every implementation that

* forms the ``q_hd * c_d`` products exactly (bf16 x bf16 fits fp32), and
* sums over ``D`` and over ``H`` in any order and association, with faithful fp32 operations,
  FMAs or tensor-core block adders (:mod:`parity.checking.certificates.floats`),

computes a score within ``b_j`` of the exact one. Mode (R) ``sum_h w_h relu(sum_d q_hd c_d)``
uses that ReLU is 1-Lipschitz and that a head whose exact dot is at or below minus its dot bound
is exactly zero on every backend. Mode (M) takes the larger of the bounds for ``qbar = sum_h
w_h q_h`` kept in fp32 then one dot, and for per-head dots then a weighted head sum.

Not covered (the bound would be wrong): TF32 or bf16 rounding of fp32 operands (``tl.dot`` of
fp32 inputs without ``input_precision="ieee"``, a bf16 hi/lo split of ``qbar``), and FP8
accumulators narrower than fp32.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .floats import ETA, KAPPA_BLOCK, U_FAITHFUL, sum_error_bound
from .overflow import FP32_MAX, OVERFLOW_CEILING, ceilings, exact_everywhere, one_signed

SAFETY = 1.0 + 2.0 ** -20
"""Factor on every bound: absorbs the float64 evaluation of scores and bounds (its error is
below ``2^-46`` of the term magnitudes, the bound at least ``2^-23`` of them)."""
OVERFLOW_LIMIT = 2.0 ** 120
"""The infinite-factor rules' margin (:func:`_classify_infinite`): finite parts whose magnitudes
sum below it cannot overflow into the other infinity in any order."""
OVERFLOW_SURE = 2.0 ** 128
"""An exact same-sign partial sum at least this large (after the rounding shrink of its terms)
is beyond fp32 in every faithful rounding: some summation order overflows."""
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
        nan: bool, pools whose score is NaN in every summation order (a NaN key, or a NaN / two
            opposite infinities among the products ``w_h q_hd c_d``): sanitized to LOWEST.
        saturated: bool, unbounded pools whose score is ``+inf`` in every order (infinite
            products of one sign, the finite rest far from overflow): sanitized to exactly
            :data:`FP32_MAX` on every backend (docs/certificates.md §2.4).
        dead: bool, unbounded pools whose score is ``-inf`` or NaN in every order: LOWEST, never
            selectable (includes the unbounded ones of ``nan``).
        free: bool, finite pools that overflow fp32 in *some* summation order, and infinite
            ones that are ``+inf`` on one evaluation route and NaN / ``-inf`` on another
            (:data:`OVERFLOW_SURE`): a conforming implementation may score them anywhere,
            ``+inf`` (FP32_MAX) and LOWEST included (docs/certificates.md §2.4).
        capped: bool, finite unbounded pools whose products ``w_h q_hd c_d`` are all ``>= 0``
            (no zero factor meets a sum that could overflow) and whose upper end
            ``scores + bounds`` reaches :data:`FP32_MAX`: every order gives a value in
            ``[scores - bounds, FP32_MAX]`` (an overflow can only be ``+inf``, sanitized to
            FP32_MAX; docs/certificates.md §2.4 "One sign, capped").
    """

    scores: np.ndarray
    bounds: np.ndarray
    unbounded: np.ndarray
    provably_zero: np.ndarray
    nan: np.ndarray = field(default=None)
    saturated: np.ndarray = field(default=None)
    dead: np.ndarray = field(default=None)
    free: np.ndarray = field(default=None)
    capped: np.ndarray = field(default=None)

    def __post_init__(self):
        for name in ("nan", "saturated", "dead", "free", "capped"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(np.shape(self.scores), dtype=bool))

    @property
    def uncertain(self) -> np.ndarray:
        """Pools no rule covers (unbounded and neither saturated, dead, free nor capped)."""
        return self.unbounded & ~(self.saturated | self.dead | self.free | self.capped)


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
        u, kappa: the error model (:mod:`parity.checking.certificates.floats`).

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
        sb = ScoreBounds(np.full(v, -np.inf), bounds, np.ones(v, dtype=bool), zero, nan=nan_key.copy())
        _classify_infinite(q, w, keys, np.ones(v, dtype=bool), sb, score_mode)
        return sb
    clean = np.where((nan_key | inf_key)[:, None], 0.0, keys)
    chunk = _relu_chunk if score_mode == "relu" else _merged_chunk
    for lo in range(0, v, POOL_CHUNK):
        hi = min(v, lo + POOL_CHUNK)
        scores[lo:hi], bounds[lo:hi], zero[lo:hi] = chunk(q, w, clean[lo:hi], u, kappa)
    bounds *= SAFETY
    # Below the ceiling no partial sum of any route can overflow (or make inf - inf) in any order.
    ceiling = ceilings(q, w, clean, score_mode)
    unbounded = inf_key | ~np.isfinite(bounds) | (ceiling > OVERFLOW_CEILING)
    near = unbounded & ~(nan_key | inf_key)
    if near.any():                              # one nonzero term per sum, every value an fp32: exact
        exact = np.zeros(v, dtype=bool)
        exact[near] = exact_everywhere(q, w, clean[near], score_mode)
        bounds[exact], unbounded[exact] = 0.0, False
    scores[nan_key] = -np.inf
    bounds[nan_key] = 0.0
    zero &= ~(nan_key | inf_key)
    sb = ScoreBounds(scores, bounds, unbounded & ~nan_key, zero, nan=nan_key.copy())
    # at or below LOWEST in every order: sanitized to LOWEST, never valid (kpool-algorithm.md §4.3)
    sb.dead |= ~sb.unbounded & ~nan_key & (scores + bounds <= -FP32_MAX)
    if inf_key.any():
        _classify_infinite(q, w, keys, inf_key, sb, score_mode)
    huge = sb.unbounded & ~inf_key
    if huge.any():
        sign = np.zeros(v)
        sign[huge] = one_signed(q, w, clean[huge], score_mode)
        up = (sign > 0) & (scores + bounds >= FP32_MAX)
        sb.saturated |= up & (scores - bounds > FP32_MAX)   # no finite fp32 value is left: +inf
        sb.capped |= up & ~sb.saturated
        sb.dead |= (sign < 0) & (scores + bounds <= -FP32_MAX)   # -inf or LOWEST in every order
        rest = huge & ~(sb.saturated | sb.capped | sb.dead)
        sb.free[rest] = _overflows_in_some_order(q, w, clean[rest])
    return sb


def _atoms(q: np.ndarray, w: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The products ``w_h q_hd c_jd`` ``[v, H, D]`` in float64 with IEEE infinities and NaN
    (``0 * inf`` is NaN): every evaluation route of either mode multiplies the same three factors."""
    with np.errstate(invalid="ignore", over="ignore"):
        return w[None, :, None] * q[None, :, :] * keys[:, None, :]


# Classes of a sum's value over every summation order (docs/certificates.md §2.4): NAN (NaN in
# every order), NEG (-inf or NaN in every order: never selectable), POS (+inf or NaN), ANY.
NAN, NEG, POS, ANY = 0, 1, 2, 3


def _term_classes(t: np.ndarray) -> np.ndarray:
    """Classes of IEEE float64 products (``0 * inf`` is NaN): NaN, +inf, -inf or finite (ANY:
    a finite term says nothing about the sum's infinities)."""
    return np.select([np.isnan(t), t == np.inf, t == -np.inf], [NAN, POS, NEG], ANY)


def _sum_class(c: np.ndarray, axis: int) -> np.ndarray:
    """Class of a sum of terms of classes ``c`` in every order: NaN when a term is NaN or
    certain infinities of both signs meet; NEG / POS when one sign's infinity is there (an ANY
    term can only add the other infinity, i.e. NaN, or nothing); ANY otherwise."""
    nan = (c == NAN).any(axis) | ((c == POS).any(axis) & (c == NEG).any(axis))
    return np.select([nan, (c == NEG).any(axis), (c == POS).any(axis)], [NAN, NEG, POS], ANY)


def _scaled_class(c: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Class of ``value * x`` for a value of class ``c`` and a known factor ``x`` (broadcast):
    NaN x anything and infinity x 0 are NaN, an infinity's sign follows ``x``'s; a finite value
    times an infinite ``x`` may be NaN (the value 0) or either infinity: ANY."""
    inf = (c == POS) | (c == NEG)
    flip = np.where(c == POS, NEG, POS)
    return np.select([(c == NAN) | np.isnan(x) | (inf & (x == 0)), inf & (x > 0), inf & (x < 0)],
                     [NAN, c, flip], ANY)


def _route_classes(q, w, keys, score_mode: str) -> list:
    """``[class [v]]`` of the score of every pool on each evaluation route of its mode
    (kpool-algorithm.md §4.2): (R) ``sum_h w_h relu(sum_d q_hd c_d)``; (M) the per-head route
    ``sum_h w_h (sum_d q_hd c_d)`` and the merged-query route ``sum_d (sum_h w_h q_hd) c_d``."""
    with np.errstate(invalid="ignore", over="ignore"):
        heads = _sum_class(_term_classes(q[None, :, :] * keys[:, None, :]), -1)      # [v, H]
        if score_mode == "relu":            # relu(-inf) = 0 and relu(NaN) = NaN (canonical where)
            heads = np.where(heads == NEG, ANY, heads)
        routes = [_sum_class(_scaled_class(heads, w[None, :]), -1)]
        if score_mode == "merged":
            wq = w[:, None] * q                                                            # [H, D]
            qbar = _sum_class(_term_classes(wq), 0)                                        # [D]
            # a finite qbar_d keeps one sign in every order when its terms do (no cancellation; an
            # overflow only makes it that sign's infinity), or when its exact value exceeds every
            # order's rounding error far from overflow: times an infinite c_d, one infinity
            with np.errstate(invalid="ignore"):
                mag, exact = np.abs(wq).sum(0), wq.sum(0)
                clear = (mag < OVERFLOW_LIMIT) & (np.abs(exact) > 2 * (q.shape[0] + 2) * U_FAITHFUL * mag)
            sign = np.select([(wq >= 0).all(0) & (wq > 0).any(0), (wq <= 0).all(0) & (wq < 0).any(0), clear],
                             [1.0, -1.0, np.sign(exact)], 0.0)
            signed = (qbar == ANY) & (sign != 0)
            terms = _scaled_class(np.broadcast_to(np.where(signed, np.where(sign > 0, POS, NEG), qbar), keys.shape),
                                  keys)
            # ... but times a finite c_d it stays a finite product
            terms = np.where(np.isfinite(keys) & signed[None, :], ANY, terms)
            routes.append(_sum_class(terms, -1))
    return routes


def _classify_infinite(q, w, keys, pools: np.ndarray, sb: ScoreBounds, score_mode: str = "relu") -> None:
    """docs/certificates.md §2.4: for ``pools`` (bool mask) with an infinite factor, the score in
    every summation order of every evaluation route of the mode (:func:`_route_classes`): NaN
    when every route is NaN in every order (a NaN key always is); never selectable (``dead``)
    when every route is ``-inf`` or NaN; ``+inf`` (``saturated``) when all infinite products
    ``w_h q_hd c_d`` share that sign, none is NaN, and the finite products cannot overflow in
    any order (their magnitudes sum below :data:`OVERFLOW_LIMIT`). Sets ``nan``, ``saturated``,
    ``dead`` of ``sb`` in place; a pool infinite on every route but neither (``+inf`` on one,
    NaN on another) is ``free`` (FP32_MAX or LOWEST: any rank or none); pools that fit no rule
    stay unbounded (uncertain)."""
    idx = np.flatnonzero(pools)
    if not len(idx):
        return
    routes = _route_classes(q, w, keys[idx], score_mode)
    nan = np.logical_and.reduce([r == NAN for r in routes]) | np.isnan(keys[idx]).any(axis=1)
    dead = nan | np.logical_and.reduce([(r == NAN) | (r == NEG) for r in routes])
    sb.nan[idx[nan]] = True
    sb.dead[idx[dead]] = True
    for j in idx[~dead]:
        a = _atoms(q, w, keys[j:j + 1])[0]
        with np.errstate(invalid="ignore", over="ignore"):
            qc, wq = np.abs(keys[j][None, :] * q), np.abs(w[:, None] * q)
        # every partial sum of either route is below the sum of its finite terms' magnitudes
        tame = all(np.where(np.isfinite(x), x, 0.0).sum() < OVERFLOW_LIMIT for x in (a, qc, wq))
        if tame and not np.isnan(a).any() and (a == np.inf).any() and not (a == -np.inf).any():
            sb.saturated[j] = True
    # infinite on every route but +inf on some and NaN / -inf on others (or NaN by an overflow):
    # FP32_MAX (ranked with the saturated tie) or LOWEST (left out), i.e. any rank or none
    settled = np.logical_and.reduce([r != ANY for r in routes]) & ~dead
    sb.free[idx[settled & ~sb.saturated[idx]]] = True


def _overflows_in_some_order(q: np.ndarray, w: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """bool ``[v]``: finite pools for which some summation order of some route of §4.2 provably
    overflows fp32 (docs/certificates.md §2.4): a same-sign part of one of its sums (a head's dot,
    the weighted head sum, a ``qbar_d``, the ``qbar`` dot) reaches :data:`OVERFLOW_SURE` even
    after every term shrinks by its rounding (``(1 - n u)``); summing that part first overflows."""
    def sure(terms, axis):
        n = terms.shape[axis]
        shrink = max(1.0 - (n + 2) * U_FAITHFUL, 0.0)
        pos = np.where(terms > 0, terms, 0.0).sum(axis=axis)
        neg = np.where(terms < 0, -terms, 0.0).sum(axis=axis)
        return np.maximum(pos, neg) * shrink >= OVERFLOW_SURE
    prods = keys[:, None, :] * q[None, :, :]                          # [v, H, D], exact in float64
    dots = prods.sum(axis=-1)
    qbar = (w[:, None] * q).sum(axis=0)
    out = sure(prods, -1).any(axis=1) | sure(w[None, :] * dots, -1) | sure(qbar[None, :] * keys, -1)
    return out | bool(sure(w[:, None] * q, 0).any())
