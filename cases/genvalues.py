"""Bit-exact step inputs for generated cases (kpool-algorithm.md §2 dtypes, §11 "exact-data parity
cases"; public-cases.md "Exact-logit trick", C13, C25).

Every bf16 value is built from its bit pattern (sign, biased exponent, mantissa drawn as integers
and assembled into an int16 that is viewed as bf16), and every fp32 value likewise from an int32,
so no value ever depends on a float-to-bf16 rounding of the generator. Families:

* ``"random"``: k = bf16 with exponent in ``[2^-3, 2^1]`` (widened to fp32, as the ring holds it),
  gate = fp32 in ``(-8, 8)``, q = bf16 like k, weights = fp32 (or bf16) in ``(-2^-4, 2^-4)``.
* ``"exact"``: dyadic data as :mod:`cases.values` ``"exact"``: ``k = i/4``, ``q = i``,
  ``w = i/64`` (``|i| <= 4``), gate 0; every score partial sum is exact (any order).
* ``"ties"``: exact-logit keys: every token of pool ``j`` of request ``rid`` has key ``v * e0`` with
  ``v`` from :data:`TIE_VALUES` picked by a hash of ``(pool_seed, rid, j)``, so many pools share
  ``v`` and their scores are *bitwise* equal whatever q, w, gate and APE are (softmax weights sum
  to one and ``v`` is a power of two or 0, so the pooled key is exactly ``v * e0``; §5.3).
* ``"near-ties"``: the same with :data:`NEAR_TIE_VALUES` (neighbours one bf16 ulp apart).

``specials`` overwrite single elements with NaN / +inf / -inf in q, weights, k or gate
(kpool-algorithm.md §4.3 sanitization, §9 item 11). Rows ``>= T_live`` (FULL-mode padding) get
large garbage, as in :func:`cases.values.make_inputs`.

A :class:`ValueSpec` is a frozen dataclass and a ``Step.inputs`` callable; it serialises to JSON.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from .values import _fill_padding, _generator, row_requests

FAMILIES = ("random", "exact", "ties", "near-ties")
SPECIAL_TENSORS = ("q", "weights", "k", "gate")
SPECIAL_KINDS = ("nan", "+inf", "-inf")
TIE_VALUES = (0.0, 1.0, 2.0, 0.5, -1.0)
"""Pool key scales of the ``ties`` family: powers of two (exact under any softmax weights) and 0."""
NEAR_TIE_VALUES = (1.0, 1.0 + 2.0 ** -7, 1.0 - 2.0 ** -8, 2.0, 2.0 - 2.0 ** -7)
"""Pool key scales of the ``near-ties`` family: bf16 neighbours of 1 and 2 (one bf16 ulp apart)."""


# ---- bit-pattern constructors -----------------------------------------------------------------

def bf16_from_fields(sign: torch.Tensor, exponent: torch.Tensor, mantissa: torch.Tensor) -> torch.Tensor:
    """bf16 tensor from integer fields: ``bits = sign << 15 | exponent << 7 | mantissa``.

    Args:
        sign: int ``{0, 1}``; exponent: int biased exponent ``[0, 255]``; mantissa: int ``[0, 127]``
            (same shape).
    Returns:
        bf16 tensor of that shape (built from the bits; no rounding anywhere).
    """
    bits = (sign.to(torch.int32) << 15) | (exponent.to(torch.int32) << 7) | mantissa.to(torch.int32)
    bits = torch.where(bits >= 0x8000, bits - 0x10000, bits)
    return bits.to(torch.int16).view(torch.bfloat16)


def fp32_from_fields(sign: torch.Tensor, exponent: torch.Tensor, mantissa: torch.Tensor) -> torch.Tensor:
    """fp32 tensor from integer fields: ``bits = sign << 31 | exponent << 23 | mantissa``
    (mantissa in ``[0, 2^23)``). Returns fp32 of that shape, bit-exact."""
    bits = (sign.to(torch.int64) << 31) | (exponent.to(torch.int64) << 23) | mantissa.to(torch.int64)
    bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits)
    return bits.to(torch.int32).view(torch.float32)


def random_bf16(shape: Sequence[int], g: torch.Generator, exp_lo: int = -3, exp_hi: int = 1) -> torch.Tensor:
    """Random normal bf16 values ``+-1.m * 2^e``, ``e`` uniform in ``[exp_lo, exp_hi]``, from bits.

    Returns bf16 ``shape``."""
    sign = torch.randint(0, 2, tuple(shape), generator=g)
    exponent = torch.randint(127 + exp_lo, 127 + exp_hi + 1, tuple(shape), generator=g)
    mantissa = torch.randint(0, 128, tuple(shape), generator=g)
    return bf16_from_fields(sign, exponent, mantissa)


def random_fp32(shape: Sequence[int], g: torch.Generator, exp_lo: int, exp_hi: int) -> torch.Tensor:
    """Random normal fp32 values ``+-1.m * 2^e``, ``e`` uniform in ``[exp_lo, exp_hi]``, from bits.

    Returns fp32 ``shape``."""
    sign = torch.randint(0, 2, tuple(shape), generator=g)
    exponent = torch.randint(127 + exp_lo, 127 + exp_hi + 1, tuple(shape), generator=g)
    mantissa = torch.randint(0, 2 ** 23, tuple(shape), generator=g)
    return fp32_from_fields(sign, exponent, mantissa)


def dyadic(shape: Sequence[int], g: torch.Generator, int_range: int, scale_exp: int) -> torch.Tensor:
    """fp32 values ``i * 2^scale_exp`` with integer ``|i| <= int_range`` (exact in bf16 for
    ``int_range <= 256``). Returns fp32 ``shape``."""
    ints = torch.randint(-int_range, int_range + 1, tuple(shape), generator=g).to(torch.float32)
    return torch.ldexp(ints, torch.tensor(scale_exp, dtype=torch.float32))


def random_ape(P: int, D: int, seed: int, family: str = "random") -> torch.Tensor:
    """A case APE, fp32 ``[P, D]``: zeros for ``"exact"``, else random fp32 bits in ``(-4, 4)``."""
    if family == "exact":
        return torch.zeros(P, D, dtype=torch.float32)
    return random_fp32((P, D), _generator(seed, 0xA9E), -4, 1)


# ---- the spec ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Special:
    """One injected non-finite element.

    Attributes:
        tensor: ``"q"``, ``"weights"``, ``"k"`` or ``"gate"``.
        row: live row, taken modulo ``T_live`` (nothing is injected when ``T_live == 0``).
        col: element within the row, modulo its width (``k``/``gate``: ``D``; ``weights``: ``H``;
            ``q``: ``H * D``, head-major).
        kind: ``"nan"``, ``"+inf"`` or ``"-inf"``.
    """

    tensor: str
    row: int
    col: int
    kind: str


_KIND_VALUE = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf")}


@dataclass(frozen=True)
class ValueSpec:
    """How one step's inputs are generated; a ``Step.inputs`` callable (``fn(case, step, meta)``).

    Attributes:
        family: one of :data:`FAMILIES`.
        seed: stream of the bulk values (per step).
        pool_seed: ``ties`` / ``near-ties``: pool key values are a function of
            ``(pool_seed, request id, pool id)`` only, so a pool fed across several steps (chunks,
            MTP replays) keeps one value.
        weights_bf16: head weights as bf16 (kpool-algorithm.md §12 A2) instead of fp32.
        specials: :class:`Special` injections.
        range_class: ``None`` or a :data:`cases.ranges.RANGE_CLASSES` name: the live rows are
            then overwritten with that region of the finite range (before the specials).
    """

    family: str = "random"
    seed: int = 0
    pool_seed: int = 0
    weights_bf16: bool = False
    specials: Tuple[Special, ...] = ()
    range_class: Optional[str] = None

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if self.range_class is not None:
            from .ranges import RANGE_CLASSES
            if self.range_class not in RANGE_CLASSES:
                raise ValueError(f"range_class must be one of {RANGE_CLASSES}, got {self.range_class!r}")
        for s in self.specials:
            if s.tensor not in SPECIAL_TENSORS or s.kind not in SPECIAL_KINDS:
                raise ValueError(f"bad special {s}")

    def __call__(self, case, step, metadata) -> dict:
        return generate_inputs(self, case.config, metadata, step.request_ids)

    def to_json(self) -> dict:
        """JSON-able dict (:meth:`from_json` inverts it)."""
        d = dataclasses.asdict(self)
        d["specials"] = [dataclasses.asdict(s) for s in self.specials]
        if self.range_class is None:
            del d["range_class"]     # only where set: corpus entries stay small
        return d

    @staticmethod
    def from_json(d: dict) -> "ValueSpec":
        """Inverse of :meth:`to_json`."""
        d = dict(d)
        d["specials"] = tuple(Special(**s) for s in d.get("specials", ()))
        return ValueSpec(**d)


def pool_value(values: Sequence[float], pool_seed: int, rid: int, j: int) -> float:
    """The tie-family key scale of pool ``j`` of request ``rid`` (a stable hash, not a stream)."""
    digest = hashlib.blake2b(repr((int(pool_seed), int(rid), int(j))).encode(), digest_size=2).digest()
    return values[int.from_bytes(digest, "little") % len(values)]


def generate_inputs(spec: ValueSpec, config, metadata, request_ids: Sequence[int]) -> dict:
    """The ``k, gate, q, weights`` of one step (shapes as :func:`cases.values.make_inputs`).

    Args:
        spec: the :class:`ValueSpec`.
        config: :class:`kpool.config.KPoolConfig` (H, D, P).
        metadata: the step's :class:`kpool.metadata.KPoolMetadata`.
        request_ids: ``Step.request_ids`` (the ``ties`` families key pools by them).

    Returns:
        ``dict(k=fp32 [T, D], gate=fp32 [T, D], q=bf16 [T, H, D], weights=fp32|bf16 [T, H])`` (CPU).
    """
    H, D, P = config.index_n_heads, config.index_head_dim, config.index_kpool
    T, T_live = metadata.num_tokens, metadata.num_live_tokens
    g = _generator(0x6E4, spec.seed)
    if spec.family == "exact":
        k = dyadic((T, D), g, 4, -2)
        gate = torch.zeros(T, D, dtype=torch.float32)
        q = dyadic((T, H, D), g, 4, 0).to(torch.bfloat16)
        weights = dyadic((T, H), g, 4, -6)
    else:
        k = random_bf16((T, D), g).to(torch.float32)
        gate = random_fp32((T, D), g, -3, 2)
        q = random_bf16((T, H, D), g)
        weights = (random_bf16((T, H), g, -8, -5).to(torch.float32) if spec.weights_bf16
                   else random_fp32((T, H), g, -8, -5))
        if spec.family in ("ties", "near-ties"):
            values = TIE_VALUES if spec.family == "ties" else NEAR_TIE_VALUES
            req = row_requests(metadata)
            pos = metadata.positions.to("cpu", torch.int64)
            k = torch.zeros(T, D, dtype=torch.float32)
            for t in range(T_live):
                r = int(req[t])
                rid = request_ids[r] if r < len(request_ids) else r
                k[t, 0] = pool_value(values, spec.pool_seed, rid, int(pos[t]) // P)
    _fill_padding(T_live, k, gate, q, weights, g)
    if spec.weights_bf16:
        weights = weights.to(torch.bfloat16)   # exact: every weight above is bf16-valued
    if spec.range_class is not None:
        from .ranges import apply_range_class
        tensors = dict(k=k, gate=gate, q=q, weights=weights)
        apply_range_class(spec.range_class, tensors, T_live, _generator(0x6E5, spec.seed))
    for s in spec.specials:
        if T_live == 0:
            break
        t = s.row % T_live
        v = _KIND_VALUE[s.kind]
        if s.tensor == "q":
            h, d = divmod(s.col % (H * D), D)
            q[t, h, d] = v
        elif s.tensor == "weights":
            weights[t, s.col % H] = v
        elif s.tensor == "k":
            k[t, s.col % D] = v
        else:
            gate[t, s.col % D] = v
    return dict(k=k, gate=gate, q=q, weights=weights)
