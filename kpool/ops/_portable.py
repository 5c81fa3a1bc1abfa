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
* :func:`request_of_rows` — the row -> request map of kpool-algorithm.md §3.4 (binary search).
* :func:`live_rows`, :func:`visible_pools` — ``t < T_live`` with ``T_live`` read on the device
  (§5.5, FULL mode), and the causal pool count of §4.1 (the kernels' own copy; the reference and
  the oracle keep theirs, deliberately independent).
* :func:`score_key_hi` — the order-preserving int32 image of a sanitized score (§4.3, §4.4,
  parity-contract.md §2): the high word of the int64 selection key.
* :func:`bf16_bits_to_f32`, :func:`load_bf16_operand` — bf16 loaded through int16 views.
* :func:`split_bf16x3` — an fp32 value as the exact sum of three bf16 values (score mode (M)).

Importing this module imports Triton (and changes nothing in it: the interpreter compatibility
patch is ``kpool.platform.install_interpreter_compat``, applied by ``resolve_device("cpu")``);
import it only after ``kpool.platform.resolve_device()``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

LOWEST = torch.finfo(torch.float32).min
FLT_MAX = torch.finfo(torch.float32).max
LOWEST_C = tl.constexpr(LOWEST)
FLT_MAX_C = tl.constexpr(FLT_MAX)
KEY_LOWEST = -2139095040
"""``score_key_hi(LOWEST)``: the image of ``float32.min`` (bits 0xFF7FFFFF, magnitude bits 0x7F7FFFFF
flipped); a selected key whose high word is not above it is an invalid slot (-1 columns)."""
KEY_LOWEST_C = tl.constexpr(KEY_LOWEST)
INT32_MIN = -2 ** 31
"""The int32 sign bit alone: the smallest int32, and the bits of fp32 ``-0.0``."""
INT32_MIN_C = tl.constexpr(INT32_MIN)
INT32_MAX_C = tl.constexpr(2 ** 31 - 1)
"""The largest int32 (an identity of an exact int32 min)."""


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
def request_of_rows(rows, cum_query_lens_ptr, num_requests, search_steps):
    """Request id of every batch row: ``r(t) = #{i : cum_query_lens[i] <= t}`` by binary search
    (``cum_query_lens`` is non-decreasing), clamped to ``[0, num_requests - 1]`` only to keep
    addresses legal (kpool-algorithm.md §3.4: padded rows map to ``R``; zero-length requests
    are skipped).

    Args:
        rows: int32 batch row indices (a scalar or any block shape).
        cum_query_lens_ptr: pointer to int32 ``[R]`` exclusive query ends, unit stride.
        num_requests: ``R`` (runtime int, >= 1 at any launch).
        search_steps: ``R.bit_length()`` (host int): halvings until the range is empty.
    Returns:
        int32 shaped like ``rows``.
    """
    lo = rows * 0
    hi = lo + num_requests
    for _ in range(0, search_steps):
        mid = (lo + hi) // 2
        end = tl.load(cum_query_lens_ptr + mid, mask=mid < hi, other=0)
        right = (lo < hi) & (end <= rows)
        left = (lo < hi) & (end > rows)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(left, mid, hi)
    return tl.maximum(tl.minimum(lo, num_requests - 1), 0)


@triton.jit
def live_rows(rows, num_rows, cum_query_lens_ptr, num_requests):
    """``rows < T_live`` and ``rows < T``, with ``T_live = cum_query_lens[R - 1]`` read on the
    device: the host never needs it, so a captured graph replays with another ``T_live``
    (kpool-algorithm.md §5.5, FULL mode: rows ``>= T_live`` are padding). The cache-update
    kernels' guard (padding rows never write a cache)."""
    t_live = tl.load(cum_query_lens_ptr + num_requests - 1)
    return (rows < t_live) & (rows < num_rows)


@triton.jit
def visible_pools(pos, pools_of_req, P):
    """Candidate pools of a row at position ``pos`` (kpool-algorithm.md §4.1):
    ``min((p + 1) // P, seq_lens[r])``. The kernels' own copy of the formula."""
    return tl.minimum((pos + 1) // P, pools_of_req)


@triton.jit
def score_key_hi(score, invisible):
    """High word of the selection key of a raw fp32 score (kpool-algorithm.md §4.3, §4.4).

    Sanitize: invisible, NaN and ``<= LOWEST`` -> LOWEST, ``> FLT_MAX`` -> FLT_MAX, ``-0.0`` ->
    ``+0.0`` (the two must tie); then the order-preserving int32 image of the bits: ``b`` for
    ``b >= 0``, ``-1 - (b & 0x7FFFFFFF)`` for negative floats. With the low word ``-1 - pool``
    (``0xFFFFFFFF - pool`` unsigned) the int64 key sorts by descending score, ties to the lower
    pool id (parity-contract.md §2), and every key of a row is unique.

    Args: score: fp32 block; invisible: bool block of the same shape (``pool >= visible(t)``,
        computed by comparison: a bool ``~`` needs an int1 type triton-ascend 3.2's interpreter
        builder lacks).
    Returns: int32 block.
    """
    low = invisible | (score != score) | (score <= LOWEST_C)
    s = tl.where(low, LOWEST_C, tl.where(score > FLT_MAX_C, FLT_MAX_C, score))
    s = tl.where(s == 0.0, 0.0, s)
    bits = s.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, -1 - (bits & 0x7FFFFFFF), bits)


@triton.jit
def int32_of(x):
    """An int32 reduction result as a real int32 tensor. triton-ascend 3.2's interpreter sums
    int32 with numpy's default (int64) but keeps the int32 type, so storing the result writes 8
    bytes per lane (overrunning the buffer) and ``.to(tl.int32)`` is a no-op there; the round
    trip through int64 converts the data. Two no-op casts on compiled backends."""
    return x.to(tl.int64).to(tl.int32)


@triton.jit
def bf16_bits_to_f32(bits):
    """fp32 value of bf16 bit patterns loaded as int16 (exact: the bf16 bits become the high half).
    The interpreter's own bf16 -> fp32 cast mishandles subnormals (platform-numerics.md §4.2)."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def load_bf16_operand(ptrs, mask, DOT_F32: tl.constexpr):
    """A ``tl.dot`` operand from bf16 bits (int16 view), masked lanes exact zeros.

    ``DOT_F32`` (the Triton interpreter): widened to fp32 from the bits, for an IEEE fp32 dot
    (the interpreter's bf16 dot returns garbage: bf16 is uint16 there). Otherwise the bits are
    bitcast to bf16, for a bf16 x bf16 -> fp32 tensor-core dot. Both are exact products with
    fp32 accumulation in some order (parity-contract.md §3.2 certifies the order).

    ``ptrs``: int16 pointers (bf16 bits) when ``DOT_F32``, else bf16 pointers (the launchers
    pass bf16 tensors to compiled backends, so tensor-core operands go from memory to shared
    memory without a register detour). The same loads as :func:`load_f32` (bits widened, or
    the stored values as they are)."""
    return load_f32(ptrs, mask, DOT_F32)


@triton.jit
def load_f32(ptrs, mask, IS_BF16: tl.constexpr):
    """With ``IS_BF16``: bf16 bits through an int16 view, widened exactly to fp32; else the
    stored values as they are (fp32 weights; bf16 operands of :func:`load_bf16_operand`).
    Masked lanes are zeros; ``mask`` None: a full load, no mask to keep live."""
    if mask is None:
        if IS_BF16:
            return bf16_bits_to_f32(tl.load(ptrs))
        else:
            return tl.load(ptrs)
    elif IS_BF16:
        return bf16_bits_to_f32(tl.load(ptrs, mask=mask, other=0))
    else:
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def load_weight_f32(ptrs, mask, weight_words):
    """Head weights widened exactly to fp32 from an int16 view of their storage, the dtype a
    runtime int (one compiled variant for fp32 and bf16 weights: issue 20, fewer compilations):
    ``weight_words == 1``, bf16 bits at ``ptrs``; ``2``, an fp32's low half at ``ptrs`` and its high
    half at ``ptrs + 1`` (little-endian, as CUDA, Ascend and the interpreters' hosts). The fp32 bits
    come back unchanged (NaN payloads too). Masked lanes are 0.0; ``mask`` None: every lane loads.
    kpool-algorithm.md §4.2 (weights fp32 or bf16, upcast to fp32); pointers from
    ``kpool.ops.plan.word_view``."""
    wide = weight_words == 2
    if mask is None:
        low = tl.load(ptrs).to(tl.int32) & 0xFFFF
        high = tl.load(ptrs + 1, mask=wide, other=0).to(tl.int32)
    else:
        low = tl.load(ptrs, mask=mask, other=0).to(tl.int32) & 0xFFFF
        high = tl.load(ptrs + 1, mask=mask & wide, other=0).to(tl.int32)
    return tl.where(wide, (high << 16) | low, low << 16).to(tl.float32, bitcast=True)


@triton.jit
def split_bf16x3(x):
    """int16 bf16 bits ``(hi, mid, lo)`` with ``hi + mid + lo == x`` exactly for finite fp32 ``x``
    (``|x| >= 2^-110``; below, ``lo`` loses bits under 2^-133): ``hi`` is ``x`` truncated to bf16,
    ``mid`` the remainder truncated, ``lo`` the rest, which has at most 8 significant bits. Each
    remainder is exact in fp32 (Sterbenz). A non-finite ``x`` gives ``hi = x`` (NaN canonical)
    and ``mid = lo = 0``, so ``hi * c`` has the non-finite class of ``x * c``.

    Args: x: fp32 tensor. Returns: three int16 tensors of the same shape.
    """
    finite = (x - x) == 0
    bits = x.to(tl.int32, bitcast=True)
    hi_bits = bits & -65536
    r1 = x - hi_bits.to(tl.float32, bitcast=True)
    r1_bits = r1.to(tl.int32, bitcast=True)
    mid_bits = r1_bits & -65536
    r2 = r1 - mid_bits.to(tl.float32, bitcast=True)
    hi_bits = tl.where(finite, hi_bits, tl.where(x != x, BF16_QUIET_NAN_HI, bits))
    mid_bits = tl.where(finite, mid_bits, 0)
    lo_bits = tl.where(finite, r2.to(tl.int32, bitcast=True), 0)
    return (hi_bits >> 16).to(tl.int16), (mid_bits >> 16).to(tl.int16), (lo_bits >> 16).to(tl.int16)
