"""Bit-exact tests of the device numerics helpers the cache-update kernels share
(kpool/ops/_portable.py: ``exp_fp32``, the bf16 round-to-nearest-even), elementwise over large
grids of inputs against ``reference.numerics`` and torch (kpool-algorithm.md §5; split from
tests/test_compress_kernel.py, which tests the kernels themselves)."""
from __future__ import annotations

import os

# The device the repo conftest resolved (``--device`` / KPOOL_DEVICE); the CPU interpreter when
# the file runs on its own.
os.environ.setdefault("KPOOL_DEVICE", os.environ.get("KPOOL_COMPRESS_TEST_DEVICE", "cpu"))

import kpool.platform  # noqa: E402

BACKEND = kpool.platform.resolve_device()

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kpool.ops._portable import bf16_rne_int16, exp_fp32, round_to_bf16_bits  # noqa: E402
from reference.numerics import exp_fp32 as ref_exp_fp32  # noqa: E402

I16, I32, F32 = torch.int16, torch.int32, torch.float32
DEV = kpool.platform.torch_device(BACKEND)
# interpreter_ok: also run by `make test-ascend-interp` (triton-ascend 3.2's interpreter).
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.interpreter_ok]

BF16_NAN = 0x7FC0          # the kernel's canonical bf16 NaN


def _bits_to_f32(bits) -> torch.Tensor:
    t = torch.as_tensor(bits, dtype=torch.int64)
    t = torch.where(t >= 2 ** 31, t - 2 ** 32, t)
    return t.to(I32).view(F32)


# ----------------------------------------------------------------------------------------------
# Device helpers: exp_fp32 and the bf16 rounding, elementwise over large grids.

@triton.jit
def _unary_kernel(x_ptr, y_ptr, z_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if MODE == 0:
        tl.store(y_ptr + offs, exp_fp32(x), mask=mask)
    else:
        tl.store(y_ptr + offs, round_to_bf16_bits(x), mask=mask)
        tl.store(z_ptr + offs, bf16_rne_int16(x), mask=mask)


def _run_unary(x: torch.Tensor, mode: int):
    n = x.numel()
    xd = x.to(DEV)
    y = torch.empty_like(xd)
    z = torch.empty(n, dtype=I16, device=DEV)
    block = 65536
    _unary_kernel[(triton.cdiv(n, block),)](xd, y, z, n, MODE=mode, BLOCK=block,
                                            **kpool.platform.launch_options(BACKEND))
    return y.cpu(), z.cpu()


def _neighbours(values, radius: int) -> torch.Tensor:
    bits = torch.tensor(values, dtype=F32).view(I32).to(torch.int64)
    steps = torch.arange(-radius, radius + 1, dtype=torch.int64)
    return (bits[:, None] + steps[None, :]).reshape(-1).to(I32).view(F32)


def _first_diff(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> str:
    bad = (a != b).nonzero().flatten()
    i = int(bad[0])
    return (f"{bad.numel()} differ; first x={float(x[i])!r} (bits {int(x.view(I32)[i]) & 0xFFFFFFFF:#010x}): "
            f"{int(a[i]) & 0xFFFFFFFF:#010x} vs {int(b[i]) & 0xFFFFFFFF:#010x}")


def test_exp_fp32_matches_reference_bitwise():
    """_portable.exp_fp32 == reference.numerics.exp_fp32 bit for bit: a strided sweep of all
    fp32 bit patterns of both signs, a dense grid over [-110, 95], +-200 ulps around the clamp
    edges, the subnormal-result and 2^128 split regions, subnormal inputs, +-0, +-inf and
    NaNs with payloads (passed through unchanged)."""
    g = torch.Generator().manual_seed(1)
    sweep = torch.arange(0, 0x7F800001, 2039, dtype=torch.int64)
    parts = [
        sweep.to(I32).view(F32), (sweep | -2 ** 31).to(I32).view(F32),
        torch.linspace(-110.0, 95.0, 400001, dtype=F32),
        (torch.rand(200000, generator=g) * 210 - 110).to(F32),
        _neighbours([-104.0, 89.0, -87.33654, -103.972, 88.72283, 88.0, -88.0, -0.5, 0.5,
                     0.3465736, -0.3465736, 1.0, -1.0, 20.0, -20.0], 200),
        torch.randint(1, 0x800000, (20000,), generator=g, dtype=I32).view(F32),   # subnormal x
        _bits_to_f32([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                      0x7FC01234, 0x7F800001, 0xFF812345, 0x7F7FFFFF, 0xFF7FFFFF, 1, 0x80000001]),
    ]
    x = torch.cat(parts)
    y, _ = _run_unary(x, mode=0)
    ref = ref_exp_fp32(x)
    yb, rb = y.view(I32), ref.view(I32)
    assert torch.equal(yb, rb), _first_diff(yb, rb, x)
    assert torch.isnan(y[torch.isnan(x)]).all()
    assert float(y[x == float("-inf")][0]) == 0.0 and y[x == float("inf")][0] == float("inf")


def test_round_to_bf16_bits_matches_torch_bitwise():
    """round_to_bf16_bits == torch fp32 -> bf16 (RNE) widened back, and bf16_rne_int16 == the
    bf16 bit pattern, over random bit patterns of the whole fp32 space and hand-checked
    ties, negatives, infinities, max finite, subnormals; every NaN -> canonical quiet NaN 0x7FC0
    (torch's NaN bits differ by platform: 0xFFFF on CPU torch 2.13, 0x7FFF on CUDA)."""
    g = torch.Generator().manual_seed(2)
    rand_bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (1000000,), generator=g, dtype=torch.int64).to(I32)
    hi = torch.randint(0, 0x10000, (20000,), generator=g, dtype=I32)
    ties = (hi << 16) | 0x8000                     # exact ties, both lsb parities, both signs
    near = torch.cat([ties - 1, ties + 1])
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF,
               0x7F7F8000, 0x7F7E8000, 1, 0x8000, 0x18000, 0x807FFFFF, 0x3F808000, 0x3F818000,
               0xBF808000, 0xBF818000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF,
               0xFFFFFFFF, 0x7FBFFFFF]
    x = torch.cat([rand_bits, ties, near]).view(F32)
    x = torch.cat([x, _bits_to_f32(special)])
    y, z = _run_unary(x, mode=1)
    nan = torch.isnan(x)
    assert 0 < int(nan.sum()) < x.numel()
    ref = x[~nan].to(torch.bfloat16)
    assert torch.equal(z[~nan], ref.view(I16)), _first_diff(z[~nan].to(I32), ref.view(I16).to(I32), x[~nan])
    yb, rb = y[~nan].view(I32), ref.to(F32).view(I32)
    assert torch.equal(yb, rb), _first_diff(yb, rb, x[~nan])
    # NaN -> the canonical quiet NaN (torch's NaN bits are platform-specific).
    assert (z[nan] == BF16_NAN).all() and (y[nan].view(I32) == BF16_NAN << 16).all()
    # Hand-checked cases (independent of torch's conversion).
    got = {int(b) & 0xFFFFFFFF: int(h) & 0xFFFF for b, h in zip(x.view(I32)[-len(special):], z[-len(special):])}
    assert got[0x3F808000] == 0x3F80 and got[0x3F818000] == 0x3F82      # ties to even
    assert got[0xBF808000] == 0xBF80 and got[0xBF818000] == 0xBF82      # negative ties
    assert got[0x7F7FFFFF] == 0x7F80 and got[0xFF7FFFFF] == 0xFF80      # max finite -> inf
    assert got[0x7F7F7FFF] == 0x7F7F and got[0x7F7F8000] == 0x7F80 and got[0x7F7E8000] == 0x7F7E
    assert got[0x7F800000] == 0x7F80 and got[0xFF800000] == 0xFF80
    assert got[0x18000] == 0x0002 and got[0x8000] == 0x0000             # subnormal ties
    for nan in (0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF):
        assert got[nan] == 0x7FC0
