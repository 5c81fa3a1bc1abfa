"""The any-order score bound (docs/certificates.md §1-§2; parity.checking.certificates.scores).

Emulated fp32 implementations of kpool-algorithm.md §4.2 -- sequential in several orders
(natural, reversed, by magnitude, positives first), pairwise, round-to-nearest or toward zero,
and tensor-core-like block adders that align ``k`` exact products and the accumulator to the
largest exponent, truncate, and normalise toward zero -- must all land within the bound of the
exact float64 score, on model-like random rows and on adversarial equal-term rows; the bound
is also shown not to be vacuous (an adversarial order reaches a sizeable part of it).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from parity.checking.certificates import floats, score_bounds

F32 = np.float32


def _bf16(x) -> np.ndarray:
    return torch.tensor(np.asarray(x), dtype=torch.float32).to(torch.bfloat16).double().numpy()


def _rz(x: np.ndarray) -> np.ndarray:
    """float64 -> nearest fp32 toward zero, as float64."""
    f = x.astype(F32)
    over = np.abs(f.astype(np.float64)) > np.abs(x)
    f[over] = np.nextafter(f[over], F32(0))
    return f.astype(np.float64)


def _rne(x: np.ndarray) -> np.ndarray:
    return x.astype(F32).astype(np.float64)


def _sequential(x: np.ndarray, order: str, rnd) -> np.ndarray:
    """Sum the last axis of exact terms ``x`` one by one in ``order``, rounding with ``rnd``."""
    if order == "reversed":
        x = x[..., ::-1]
    elif order in ("ascending", "descending"):
        idx = np.argsort(np.abs(x), axis=-1)
        x = np.take_along_axis(x, idx[..., ::-1] if order == "descending" else idx, axis=-1)
    elif order == "positives-first":
        idx = np.argsort(-x, axis=-1)                    # largest positive first, negatives last
        x = np.take_along_axis(x, idx, axis=-1)
    acc = np.zeros(x.shape[:-1])
    for i in range(x.shape[-1]):
        acc = rnd(acc + x[..., i])
    return acc


def _pairwise(x: np.ndarray, rnd) -> np.ndarray:
    while x.shape[-1] > 1:
        n = x.shape[-1]
        x = np.concatenate([rnd(x[..., 0:n - 1:2] + x[..., 1::2]), x[..., n - n % 2:]], axis=-1)
    return x[..., 0]


def _block(x: np.ndarray, k: int) -> np.ndarray:
    """Tensor-core-like accumulation: blocks of ``k`` exact terms plus the accumulator are
    aligned to the largest exponent, truncated to 24 bits there (no guard bits), summed exactly
    and normalised toward zero (docs/certificates.md §1.2)."""
    acc = np.zeros(x.shape[:-1])
    for lo in range(0, x.shape[-1], k):
        ins = np.concatenate([acc[..., None], x[..., lo:lo + k]], axis=-1)
        big = np.abs(ins).max(axis=-1, keepdims=True)
        quantum = np.where(big > 0, 2.0 ** (np.floor(np.log2(np.where(big > 0, big, 1.0))) - 23), 1.0)
        acc = _rz((np.trunc(ins / quantum) * quantum).sum(axis=-1))
    return acc


STRATEGIES = {
    **{f"seq-{o}-{r}": (lambda x, o=o, f=f: _sequential(x, o, f))
       for o in ("natural", "reversed", "ascending", "descending", "positives-first")
       for r, f in (("rne", _rne), ("rz", _rz))},
    "pairwise-rne": lambda x: _pairwise(x, _rne),
    "pairwise-rz": lambda x: _pairwise(x, _rz),
    **{f"block{k}": (lambda x, k=k: _block(x, k)) for k in (4, 8, 16)},
}


def _emulate(q, w, keys, mode, strategy, merged_via="heads"):
    """One emulated implementation's scores ``[v]`` (products of bf16 values exact)."""
    total = STRATEGIES[strategy]
    rnd = _rz if strategy.endswith("rz") or strategy.startswith("block") else _rne
    if mode == "merged" and merged_via == "qbar":
        qbar = total(np.moveaxis(rnd(w[:, None] * q), 0, -1))       # [D]: sum over h of fl(w_h q_hd)
        return total(rnd(keys * qbar[None, :]))
    dots = total(keys[:, None, :] * q[None, :, :])                   # [v, H]
    if mode == "relu":
        dots = np.where(dots < 0, 0.0, dots)
    return total(rnd(dots * w[None, :]))


def _random_row(H=32, D=128, v=48, seed=0):
    g = np.random.default_rng(seed)
    q = _bf16(g.standard_normal((H, D)))
    w = (g.standard_normal(H) / 64).astype(F32).astype(np.float64)
    keys = _bf16(g.standard_normal((v, D)) * 0.7)
    return q, w, keys


def _adversarial_row(H=32, D=128, v=4):
    """Every head the same all-positive dot: one product 2^10 first, then D - 1 products
    65025 * 2^-23 whose low 10 bits fall below the partial sum's ulp, so every addition after
    the first rounds the same way by about half an ulp (near the worst case of the sum bounds)."""
    a = 255 / 128                                                      # bf16 0x3FFF
    q = np.full((H, D), a)
    q[:, 0] = 2.0 ** 5
    keys = np.full((v, D), a * 2.0 ** -9)
    keys[:, 0] = 2.0 ** 5
    return q, np.full(H, F32(1 / 3)).astype(np.float64), keys


@pytest.mark.parametrize("mode, merged_via", [("relu", "heads"), ("merged", "heads"), ("merged", "qbar")])
@pytest.mark.parametrize("shape", [(32, 128), (2, 16)], ids=["glm", "small"])
def test_every_order_lands_inside_the_bound(mode, merged_via, shape):
    H, D = shape
    for q, w, keys in (_random_row(H, D, seed=1), _random_row(H, D, seed=2), _adversarial_row(H, D)):
        sb = score_bounds(q, w, keys, mode)
        assert np.isfinite(sb.scores).all() and not sb.unbounded.any()
        assert ((sb.bounds > 0) | sb.provably_zero).all()
        for name in STRATEGIES:
            err = np.abs(_emulate(q, w, keys, mode, name, merged_via) - sb.scores)
            assert (err <= sb.bounds).all(), (name, float((err / sb.bounds).max()))


def test_the_bound_is_not_vacuous():
    """On the adversarial row, the worst emulated order reaches a sizeable share of the bound."""
    q, w, keys = _adversarial_row()
    sb = score_bounds(q, w, keys, "relu")
    worst = max(float((np.abs(_emulate(q, w, keys, "relu", n) - sb.scores) / sb.bounds).max()) for n in STRATEGIES)
    assert worst > 0.25, worst


def test_relu_zero_heads_and_the_provably_zero_class():
    """A head whose exact dot is below minus its bound is 0 on every backend: it adds nothing to
    the bound; a pool with every head so is provably zero (an exact-tie class)."""
    q = np.array([[1.0, 1.0], [1.0, -1.0]])
    w = np.array([1.0, 1.0])
    keys = np.array([[-2.0, -1.0],                  # dots -3 and -1: score 0 exactly
                     [-1.0, 1.0]])                  # dots 0 and -2: head 0 may round either way
    sb = score_bounds(q, w, keys, "relu")
    assert sb.provably_zero.tolist() == [True, False]
    assert sb.bounds[0] == 0.0 and sb.scores[0] == 0.0
    only_head0 = score_bounds(q[:1], w[:1], keys[1:], "relu")          # dot exactly 0: still bounded
    assert only_head0.bounds[0] > 0 and not only_head0.provably_zero[0]


def test_nan_keys_are_invalid_and_infinite_keys_unbounded():
    q, w, keys = _random_row(2, 16, v=3)
    keys[1, 3] = np.nan
    keys[2, 0] = np.inf
    sb = score_bounds(q, w, keys, "relu")
    assert sb.scores[1] == -np.inf and sb.bounds[1] == 0 and not sb.unbounded[1]
    assert sb.unbounded.tolist() == [False, False, True] and np.isfinite(sb.bounds).all()
    huge = score_bounds(q * 2.0 ** 115, w, keys[:1], "relu")
    # every partial sum stays below 2^127 (docs/certificates.md §2.4): the bound scales with q
    assert huge.unbounded.tolist() == [False] and huge.bounds[0] == pytest.approx(sb.bounds[0] * 2.0 ** 115, rel=1e-6)
    assert score_bounds(q, w * np.inf, keys[:1], "relu").unbounded.all()


def test_ordered_sum_magnitude_and_sum_bound_by_hand():
    a = np.array([3.0, 1.0, 2.0])
    assert floats.ordered_sum_magnitude(a) == (3 + 2) + (3 + 2 + 1)  # T_2 + T_3
    assert floats.ordered_sum_magnitude(np.array([5.0])) == 0.0
    assert np.allclose(floats.ordered_sum_magnitude(np.array([[1.0, 1.0], [4.0, 0.0]])), [2.0, 4.0])
    u, kappa = 2.0 ** -23, 1.25
    g = kappa * 2 * u / (1 - kappa * 2 * u)
    assert floats.sum_error_bound(a) == pytest.approx(kappa * u * (1 + g) * 11 + 2 * 2.0 ** -126, rel=1e-15)
    assert floats.sum_error_bound(np.zeros(4)) == 0.0
    assert floats.gamma(10) == pytest.approx(10 * u / (1 - 10 * u))
    with pytest.raises(ValueError):
        floats.gamma(2 ** 23)
    with pytest.raises(ValueError):
        score_bounds(np.ones((1, 1)), np.ones(1), np.ones((1, 1)), "relu_per_head")
