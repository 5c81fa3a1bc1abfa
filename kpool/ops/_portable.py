"""Shared ``@triton.jit`` device helpers of the KPool kernels (portable subset,
platform-numerics.md §6.1).

Every helper is a fixed sequence of IEEE fp32 / int32 operations, so a kernel that uses it
agrees bit for bit with ``reference.numerics`` on every backend that does fp32 ``+ - *``
without contraction (CUDA launched with ``enable_fp_fusion=False``, the CPU interpreter;
NPU: to verify, platform-numerics.md §6.4):

* :func:`exp_fp32` — port of ``reference.numerics.exp_fp32`` (same constants, same op order).
* :func:`bf16_rne_hi_bits`, :func:`round_to_bf16_bits`, :func:`bf16_rne_int16` — fp32 -> bf16
  round-to-nearest-even done on the int32 bit pattern (the interpreter truncates on
  ``.to(tl.bfloat16)``, platform-numerics.md §4.1).
* :func:`request_of_rows` — the row -> request map of kpool-algorithm.md §3.4.

The names and signatures are stable: ``kpool.ops.indexer`` imports them.

Importing this module imports Triton; import it only after ``kpool.platform.resolve_device()``.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl


def _install_interpreter_compat() -> None:
    """Make runtime loop bounds work in the Triton interpreter under NumPy >= 2.3.

    Why: the interpreter wraps every scalar kernel argument and ``tl.program_id`` in a
    1-element 1-D array and converts it for ``range(...)`` with ``int(array)``, which NumPy >= 2.3
    rejects ("only 0-dimensional arrays can be converted to Python scalars"). Any
    ``for i in range(0, n)`` with a runtime ``n`` then fails. We re-register
    ``tensor.__index__`` to read the single element, wrapping the interpreter's
    ``_patch_lang_tensor`` in both shapes it has:

    * triton >= 3.4 (3.6 here): ``_patch_lang_tensor(tensor, scope)``; attributes go through
      ``scope.set_attr`` and are restored LIFO when the launch ends, so ours is undone first.
    * triton-ascend 3.2 (Triton 3.2 base): ``_patch_lang_tensor(tensor)`` assigns the attributes
      directly and never restores them; ours is assigned right after and stays.

    Only in interpreter mode, only when NumPy rejects (>= 2.3) or deprecates (1.25-2.2) the
    conversion; compiled kernels are unaffected. An interpreter of yet another shape is left
    alone (the kernels then fail loudly at the first runtime loop, as without the patch).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import warnings

    import numpy as np
    with warnings.catch_warnings():
        # NumPy 1.25-2.2 only warn (DeprecationWarning, once per runtime loop of every launch);
        # patch there too, which also silences that flood.
        warnings.simplefilter("error", DeprecationWarning)
        try:
            int(np.array([1]))
            return              # NumPy < 1.25: plain int() works, nothing to fix
        except (TypeError, DeprecationWarning):
            pass
    try:
        from triton.runtime import interpreter as _interp
    except ImportError:  # pragma: no cover - a Triton build without the interpreter module
        return
    original = getattr(_interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_kpool_compat", False):
        return
    _interp._patch_lang_tensor = _compat_patch_lang_tensor(original)


def _scalar_index(self) -> int:
    """``tensor.__index__`` for the interpreter: the single element of the 1-element array."""
    return int(self.handle.data.reshape(-1)[0])


def _compat_patch_lang_tensor(original):
    """Wrap the interpreter's ``_patch_lang_tensor`` (one- or two-argument form, see
    :func:`_install_interpreter_compat`) so that ``tensor.__index__`` is :func:`_scalar_index`."""
    import inspect
    try:
        n_params = len(inspect.signature(original).parameters)
    except (TypeError, ValueError):  # pragma: no cover - builtins have no signature
        return original
    if n_params == 1:
        def _patch_lang_tensor(tensor):
            original(tensor)
            tensor.__index__ = _scalar_index
    elif n_params == 2:
        def _patch_lang_tensor(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", _scalar_index)
    else:
        return original
    _patch_lang_tensor._kpool_compat = True
    return _patch_lang_tensor


_install_interpreter_compat()

# exp_fp32 constants: the same Python doubles as reference/numerics.py, each rounded to fp32
# (RNE) when combined with an fp32 tensor, exactly as ``torch.tensor(v, dtype=float32)`` does.
EXP_LOG2E = tl.constexpr(1.44269504088896341)
EXP_LN2_HI = tl.constexpr(0.693359375)
EXP_LN2_LO = tl.constexpr(-2.12194440e-4)
EXP_ROUND_MAGIC = tl.constexpr(12582912.0)
EXP_X_MIN = tl.constexpr(-104.0)
EXP_X_MAX = tl.constexpr(89.0)
EXP_C2 = tl.constexpr(0.5)
EXP_C3 = tl.constexpr(1.0 / 6.0)
EXP_C4 = tl.constexpr(1.0 / 24.0)
EXP_C5 = tl.constexpr(1.0 / 120.0)
EXP_C6 = tl.constexpr(1.0 / 720.0)
EXP_C7 = tl.constexpr(1.0 / 5040.0)
EXP_SUBNORMAL_SHIFT = tl.constexpr(64)
EXP_TWO_M64 = tl.constexpr(2.0 ** -64)
BF16_QUIET_NAN_HI = tl.constexpr(0x7FC00000)
"""The canonical NaN torch (CPU) produces for fp32 -> bf16, as fp32 high bits."""


@triton.jit
def exp_fp32(x):
    """``exp(x)`` of an fp32 tensor by the fixed fp32 sequence of ``reference.numerics.exp_fp32``.

    Steps (one IEEE fp32 op each, no FMA): clamp to [-104, 89]; ``n = rne(x * LOG2E)`` by the
    1.5*2^23 trick; ``r = (x - n*LN2_HI) - n*LN2_LO``; Horner from 1/7! down to 1;
    ``p * 2^n`` with ``2^n`` from exponent bits (``n < -126``: scaled by 2^64 then 2^-64;
    ``n = 128``: 2^127 * 2). NaN in -> the same NaN out.

    Args: x: fp32 tensor (any block shape). Returns: fp32 tensor of the same shape.
    Math: kpool-algorithm.md §5.3 step 3; why software exp: platform-numerics.md §4.3.
    """
    x = x.to(tl.float32)
    is_nan = x != x
    # NaN lanes compute on 0.0 (never cast NaN to int) and are replaced at the end.
    xs = tl.where(is_nan, 0.0, x)
    # Same as torch.clamp for every non-NaN input, infinities included.
    xc = tl.minimum(tl.maximum(xs, EXP_X_MIN), EXP_X_MAX)
    t = xc * EXP_LOG2E
    n = (t + EXP_ROUND_MAGIC) - EXP_ROUND_MAGIC
    r = (xc - n * EXP_LN2_HI) - n * EXP_LN2_LO
    p = EXP_C7 * r + EXP_C6          # == full(C7) * r + C6 of the reference (mul commutes)
    p = p * r + EXP_C5
    p = p * r + EXP_C4
    p = p * r + EXP_C3
    p = p * r + EXP_C2
    p = p * r + 1.0
    p = p * r + 1.0
    ni = n.to(tl.int32)
    tiny = ni < -126
    ni = tl.where(tiny, ni + EXP_SUBNORMAL_SHIFT, ni)
    big = ni > 127
    ni = tl.where(big, ni - 1, ni)
    scale = ((ni + 127) << 23).to(tl.float32, bitcast=True)
    y = p * scale
    y = tl.where(big, y * 2.0, y)
    y = tl.where(tiny, y * EXP_TWO_M64, y)
    return tl.where(is_nan, x, y)


@triton.jit
def bf16_rne_hi_bits(x):
    """int32 bit pattern of ``bf16(x)`` widened to fp32 (RNE; low 16 bits zero).

    ``(bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000``; NaN -> canonical quiet NaN
    ``0x7FC00000`` (what torch's CPU fp32 -> bf16 conversion gives). NaN lanes are zeroed
    before the add so the int32 sum never overflows (finite and infinite inputs cannot).

    Args: x: fp32 tensor. Returns: int32 tensor of the same shape.
    """
    x = x.to(tl.float32)
    is_nan = x != x
    bits = tl.where(is_nan, 0, x.to(tl.int32, bitcast=True))
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(is_nan, BF16_QUIET_NAN_HI, rounded)


@triton.jit
def round_to_bf16_bits(x):
    """fp32 tensor holding exactly the RNE-rounded bf16 value of ``x`` (kpool-algorithm.md §5.3
    step 6). A following ``.to(tl.bfloat16)`` is exact for every non-NaN value (NaN
    conversion is backend-specific: store :func:`bf16_rne_int16` through an int16 view of the
    bf16 tensor when NaN bits must match too).

    Args: x: fp32 tensor. Returns: fp32 tensor of the same shape.
    """
    return bf16_rne_hi_bits(x).to(tl.float32, bitcast=True)


@triton.jit
def bf16_rne_int16(x):
    """int16 bit pattern of ``bf16(x)`` (RNE, canonical NaN 0x7FC0), for a store through an
    int16 view of a bf16 tensor: bit-exact on every backend, NaN included.

    Args: x: fp32 tensor. Returns: int16 tensor of the same shape.
    """
    return (bf16_rne_hi_bits(x) >> 16).to(tl.int16)


@triton.jit
def request_of_rows(rows, cum_query_lens_ptr, num_requests):
    """Request id of every batch row: ``r(t) = #{i : cum_query_lens[i] <= t}``, clamped to
    ``[0, num_requests - 1]`` only to keep addresses legal (kpool-algorithm.md §3.4: padded
    rows map to ``R``; zero-length requests are skipped).

    Args:
        rows: int32 tensor of batch row indices (any block shape).
        cum_query_lens_ptr: pointer to int32 ``[R]`` exclusive query ends, unit stride.
        num_requests: ``R`` (runtime int, >= 1 at any launch).
    Returns:
        int32 tensor shaped like ``rows``.
    """
    r = tl.zeros_like(rows)
    for i in range(0, num_requests):
        end = tl.load(cum_query_lens_ptr + i)
        r += (end <= rows).to(tl.int32)
    return tl.maximum(tl.minimum(r, num_requests - 1), 0)
