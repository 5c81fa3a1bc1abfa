"""``--interp-rne``: hardware round-to-nearest-even for fp32 -> bf16 casts and stores under the
Triton interpreter (platform-numerics.md §5; why and how: docs/interpreter-rne.md).

The interpreter (upstream Triton 3.6 and triton-ascend 3.2 alike) lowers ``x.to(tl.bfloat16)``
and the implicit cast of ``tl.store(bf16_ptr, fp32_value)`` to ``InterpreterBuilder.create_fp_trunc``
-> ``cast_impl`` -> ``_convert_float(..., rounding_mode=None)``, which keeps the top 7 mantissa
bits: it truncates, where CUDA's and the NPU's ``fptrunc`` round to nearest even. Its RTNE branch
(``create_fp_to_fp`` with an explicit rounding mode) adds the cut-off bit (round half up, no tie
to even, no carry into the exponent). :func:`round_to_nearest_even` replaces both, for fp32 ->
bf16 only, with :func:`rne_bf16_bits` for the duration of a ``with`` block, and restores the
interpreter's methods afterwards. Our own kernels never rely on the interpreter's rounding
(``kpool.ops._portable.bf16_rne_int16`` rounds in integer arithmetic), so the patch changes
nothing they compute; it exists for kernels that do (``--kernel vllm-ascend:PATH``).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np


def rne_bf16_bits(values: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns of fp32 ``values`` rounded to nearest, ties to even (IEEE 754
    §4.3.1; platform-numerics.md §2): add ``0x7FFF`` plus the kept LSB and drop the low 16 bits.
    NaN keeps its sign and top payload and is made quiet; overflow rounds to infinity.
    Same shape as ``values``."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    quiet_nan = ((bits >> 16) | 0x0040) & 0xFFFF
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def _interpreter_builder():
    """The interpreter's builder class, or ``None`` when this Triton has none of that shape."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - a Triton build without the interpreter
        return None
    builder = getattr(interpreter, "InterpreterBuilder", None)
    if builder is None or not hasattr(builder, "cast_impl") or not hasattr(builder, "create_fp_to_fp"):
        return None
    return builder


def _is_f32_to_bf16(src, dst_type) -> bool:
    import triton.language as tl
    return src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16


@contextlib.contextmanager
def round_to_nearest_even() -> Iterator[bool]:
    """Within the block, the interpreter casts fp32 -> bf16 (``.to``, ``tl.store`` into bf16,
    explicit ``fp_downcast_rounding="rtne"``) with :func:`rne_bf16_bits`; yields whether a patch
    was installed (``False``: no interpreter builder of the known shape, nothing changed). Other
    casts and rounding modes (``"rtz"``) keep the interpreter's code. Re-entrant: a nested block
    leaves the outer one's patch in place.
    """
    builder = _interpreter_builder()
    if builder is None or getattr(builder.cast_impl, "_parity_rne", False):
        yield builder is not None
        return
    from triton.runtime.interpreter import TensorHandle
    cast_impl, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def rne_cast(self, src, dst_type):
        if _is_f32_to_bf16(src, dst_type):
            return TensorHandle(rne_bf16_bits(src.data), dst_type.scalar)
        return cast_impl(self, src, dst_type)

    def rne_fp_to_fp(self, src, dst_type, rounding_mode):
        from triton._C.libtriton import ir
        if _is_f32_to_bf16(src, dst_type) and rounding_mode in (None, ir.ROUNDING_MODE.RTNE):
            return TensorHandle(rne_bf16_bits(src.data), dst_type.scalar)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    rne_cast._parity_rne = True
    builder.cast_impl, builder.create_fp_to_fp = rne_cast, rne_fp_to_fp
    try:
        yield True
    finally:
        builder.cast_impl, builder.create_fp_to_fp = cast_impl, fp_to_fp
