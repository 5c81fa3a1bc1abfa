"""Finite values from the whole range the contract allows (issue 19 family 1; kpool-algorithm.md
§2 dtypes: k, gate, ape fp32, q bf16, weights fp32 or bf16, any finite value; §4.3, §5.3).

The other value families draw N(0, a few) or ``(-8, 8)``; a kernel whose arithmetic is wrong only
far from there passes them: dot operands converted to fp16 (exact on every bf16 value inside
fp16's normal range), a softmax max that skips a slot (the same result up to rounding unless the
skipped logit is far above the others), a ``-1e30``-style threshold in place of the LOWEST / -inf
handling, flush-to-zero of subnormals. Each *range class* overwrites a step's live rows with values
of one such region, built from bit patterns (no rounding of the generator), and bounded so that
no fp32 score or pooled key overflows in any summation order (an overflow that depends on the
order would be a certificate question, not a kernel one; the exact constructions of the seed
scenario ``value-range`` cover FLT_MAX and +inf scores):

==================  =================================================================================
class               values (live rows)
==================  =================================================================================
``fp16-overflow``   q and k ``+-2^[16, 30]`` in half the elements (beyond fp16's 65504), weights
                    ``+-2^[16, 20]`` in half the rows
``fp16-underflow``  q ``+-2^[-23, -15]`` (fp16 subnormals), in half the rows ``+-2^[-40, -26]``
                    (below fp16's smallest subnormal), k ``+-2^[-40, -15]``, weights ``+-2^[-30, -15]``
``subnormal``       q bf16 subnormals in half the rows, fp32 subnormal k, gate and weights in a
                    quarter of the elements each
``far-below``       weights ``2^[96, 104]``, all negative in half the rows: scores near ``-2^110``,
                    far below any ``-1e30`` threshold (and far above ``+1e30`` in the others)
``gate-spread``     gate logits ``+-2^[5, 9]``: slots of one pool hundreds apart (softmax near
                    one-hot; a max that skips a slot overflows ``exp``)
``range-ends``      gate ``+-2^[120, 127]`` in half the elements (near ``+-FLT_MAX``), k
                    ``+-2^[100, 126]`` (near the bf16 top) with q ``+-2^[-120, -100]``
``neg-zero``        ``-0.0`` in a quarter of the elements of q, k, gate and weights
==================  =================================================================================

:func:`apply_range_class` applies one class to a step's inputs in place; :func:`range_ape`
gives a case APE with spread, ``-0.0`` and subnormal entries. :func:`range_class_for` picks a
class from a seed (the generators, :mod:`cases.wide_inputs`).
"""
from __future__ import annotations

import random
from typing import Optional

import torch

RANGE_CLASSES = ("fp16-overflow", "fp16-underflow", "subnormal", "far-below", "gate-spread", "range-ends",
                 "neg-zero")


def _values(shape, g: torch.Generator, exp_lo: int, exp_hi: int, sign: Optional[int], bits: int,
            dtype: torch.dtype) -> torch.Tensor:
    """``+-(1 + m / 2^bits) * 2^e``, ``e`` uniform in ``[exp_lo, exp_hi]``, or subnormals
    ``m * 2^(-126 - bits)`` when ``exp_lo == -127``; computed exactly in float64 and converted to
    ``dtype``, where every such value is representable (no rounding)."""
    shape = tuple(shape)
    s = torch.randint(0, 2, shape, generator=g) if sign is None else torch.full(shape, sign)
    if exp_lo == -127:
        m = torch.randint(1, 2 ** bits, shape, generator=g).to(torch.float64)
        mag = torch.ldexp(m, torch.tensor(-126 - bits, dtype=torch.float64))
    else:
        m = torch.randint(0, 2 ** bits, shape, generator=g).to(torch.float64)
        e = torch.randint(exp_lo, exp_hi + 1, shape, generator=g).to(torch.float64)
        mag = torch.ldexp(1.0 + m / 2 ** bits, e)
    return torch.where(s == 1, -mag, mag).to(dtype)


def bf16_values(shape, g: torch.Generator, exp_lo: int, exp_hi: int, *, sign: Optional[int] = None) -> torch.Tensor:
    """bf16 ``+-1.m * 2^e`` (7 mantissa bits) with ``e`` uniform in ``[exp_lo, exp_hi]`` (normal:
    ``exp_lo >= -126``), or bf16 subnormals when ``exp_lo == exp_hi == -127``. ``sign``: 0, 1 or
    random per element. Exact (no rounding)."""
    return _values(shape, g, exp_lo, exp_hi, sign, 7, torch.bfloat16)


def fp32_values(shape, g: torch.Generator, exp_lo: int, exp_hi: int, *, sign: Optional[int] = None) -> torch.Tensor:
    """fp32 ``+-1.m * 2^e`` (23 mantissa bits) as :func:`bf16_values`; subnormals when
    ``exp_lo == exp_hi == -127``. Exact (no rounding)."""
    return _values(shape, g, exp_lo, exp_hi, sign, 23, torch.float32)


def _mix(dst: torch.Tensor, new: torch.Tensor, g: torch.Generator, fraction: float) -> None:
    """Overwrite about ``fraction`` of ``dst``'s elements with ``new``'s (in place)."""
    pick = torch.rand(tuple(dst.shape), generator=g) < fraction
    dst[pick] = new.to(dst.dtype)[pick]


def _rows(dst: torch.Tensor, new: torch.Tensor, g: torch.Generator, fraction: float) -> None:
    """Overwrite about ``fraction`` of ``dst``'s rows with ``new``'s (in place)."""
    pick = torch.rand(dst.shape[0], generator=g) < fraction
    dst[pick] = new.to(dst.dtype)[pick]


def apply_range_class(name: str, inputs: dict, T_live: int, g: torch.Generator) -> None:
    """Overwrite the live rows ``[0, T_live)`` of ``inputs`` (``k, gate`` fp32 ``[T, D]``, ``q``
    bf16 ``[T, H, D]``, ``weights`` fp32|bf16 ``[T, H]``) with range class ``name`` (module
    table), in place. Every value is bf16-exact where the tensor is bf16 (weights included).

    Raises:
        ValueError: unknown class.
    """
    if name not in RANGE_CLASSES:
        raise ValueError(f"range class must be one of {RANGE_CLASSES}, got {name!r}")
    if T_live == 0:
        return
    k, gate, q, w = (inputs[n][:T_live] for n in ("k", "gate", "q", "weights"))
    w_bf16 = w.dtype == torch.bfloat16
    wvals = (lambda lo, hi, **kw: bf16_values(w.shape, g, lo, hi, **kw)) if w_bf16 else \
        (lambda lo, hi, **kw: fp32_values(w.shape, g, lo, hi, **kw))
    if name == "fp16-overflow":
        _mix(q, bf16_values(q.shape, g, 16, 30), g, 0.5)
        _mix(k, bf16_values(k.shape, g, 16, 30), g, 0.5)
        _rows(w, wvals(16, 20), g, 0.5)
    elif name == "fp16-underflow":
        q.copy_(bf16_values(q.shape, g, -23, -15))                 # fp16 subnormals: low bits lost
        _rows(q, bf16_values(q.shape, g, -40, -26), g, 0.5)        # below fp16's smallest subnormal
        k.copy_(bf16_values(k.shape, g, -40, -15).to(torch.float32))
        w.copy_(wvals(-30, -15))
    elif name == "subnormal":
        _rows(q, bf16_values(q.shape, g, -127, -127), g, 0.5)
        _mix(k, fp32_values(k.shape, g, -127, -127), g, 0.25)
        _mix(gate, fp32_values(gate.shape, g, -127, -127), g, 0.25)
        _mix(w, wvals(-127, -127), g, 0.25)
    elif name == "far-below":
        w.copy_(wvals(96, 104))
        neg = torch.rand(w.shape[0], generator=g) < 0.5
        w[neg] = -w[neg].abs()
    elif name == "gate-spread":
        gate.copy_(fp32_values(gate.shape, g, 5, 9))
    elif name == "range-ends":
        _mix(gate, fp32_values(gate.shape, g, 120, 127), g, 0.5)
        k.copy_(fp32_values(k.shape, g, 100, 126))
        q.copy_(bf16_values(q.shape, g, -120, -100))
    else:   # neg-zero
        for t in (q, k, gate, w):
            _mix(t, torch.full(tuple(t.shape), -0.0), g, 0.25)


def range_ape(P: int, D: int, seed: int) -> torch.Tensor:
    """A case APE from the whole range: ``+-2^[5, 9]`` logits (hundreds apart), ``-0.0`` and fp32
    subnormals (fp32 ``[P, D]``)."""
    g = torch.Generator().manual_seed(int(seed) & 0x7FFFFFFF)
    ape = fp32_values((P, D), g, 5, 9)
    _mix(ape, torch.full((P, D), -0.0), g, 0.2)
    _mix(ape, fp32_values((P, D), g, -127, -127), g, 0.2)
    return ape


def seeded_chance(label: str, seed: int, percent: int) -> bool:
    """True for about ``percent`` % of the seeds (a pure function of ``(label, seed)``)."""
    return percent > 0 and random.Random(f"{label}-{int(seed)}").randrange(100) < percent


def range_class_for(seed: int, percent: int) -> Optional[str]:
    """The range class of a case with seed ``seed`` (a pure function): one of
    :data:`RANGE_CLASSES` for about ``percent`` % of the seeds, else ``None``."""
    if not seeded_chance("range", seed, percent):
        return None
    return random.Random(f"range-class-{int(seed)}").choice(RANGE_CLASSES)
