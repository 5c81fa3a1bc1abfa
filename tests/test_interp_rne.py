"""``--interp-rne`` (issue 11 point 3; docs/interpreter-rne.md): under the Triton interpreter an
fp32 -> bf16 store or ``.to(tl.bfloat16)`` truncates; :func:`parity.implementations.interp_rne.round_to_nearest_even`
makes both round to nearest even, as the hardware does, only inside its block."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from parity.implementations.interp_rne import rne_bf16_bits, round_to_nearest_even

pytestmark = [pytest.mark.cpu, pytest.mark.interpreter_ok]

ABOVE_HALF = 1.0 + 2 ** -8 + 2 ** -9
"""1 + 0.75 bf16 ulp: RNE rounds up (0x3F81), truncation keeps 0x3F80."""
TIE_TO_EVEN = 1.0 + 2 ** -7 + 2 ** -8
"""An odd bf16 mantissa plus half an ulp: RNE goes up to even (0x3F82), truncation keeps 0x3F81."""
TIE_STAYS_EVEN = 1.0 + 2 ** -8
"""An even bf16 mantissa plus half an ulp: RNE stays (0x3F80); round-half-up would give 0x3F81."""


@triton.jit
def _store_kernel(x_ptr, stored_ptr, cast_ptr, rtne_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(stored_ptr + offs, x, mask=mask)                       # implicit cast of tl.store
    tl.store(cast_ptr + offs, x.to(tl.bfloat16), mask=mask)         # explicit .to
    tl.store(rtne_ptr + offs, x.to(tl.bfloat16, fp_downcast_rounding="rtne"), mask=mask)


def _values() -> torch.Tensor:
    rng = np.random.default_rng(3)
    edge = [ABOVE_HALF, TIE_TO_EVEN, TIE_STAYS_EVEN, -ABOVE_HALF, 1.0, 0.0, -0.0, 3.0e38, 1e-40,
            float("inf"), -float("inf")]
    return torch.tensor(np.concatenate([edge, rng.standard_normal(53) * 10.0 ** rng.integers(-30, 30, 53)]),
                        dtype=torch.float32)


def _launch(x: torch.Tensor):
    outs = [torch.empty(x.shape, dtype=torch.bfloat16) for _ in range(3)]
    _store_kernel[(1,)](x, *outs, x.numel(), BLOCK=64)
    return [o.view(torch.int16) for o in outs]


def test_rne_bits_equal_torch_rounding():
    x = _values()
    want = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(rne_bf16_bits(x.numpy()), want)


def test_interpreter_truncates_and_the_option_rounds_to_nearest_even():
    x = _values()
    want = x.to(torch.bfloat16).view(torch.int16)
    stored, cast, _ = _launch(x)
    assert not torch.equal(stored, want) and not torch.equal(cast, want)   # the interpreter truncates
    assert stored[0].item() == 0x3F80 and stored[1].item() == 0x3F81
    with round_to_nearest_even() as patched:
        assert patched
        inside = _launch(x)
    for got in inside:
        assert torch.equal(got, want)
    assert torch.equal(_launch(x)[0], stored)                              # restored after the block

