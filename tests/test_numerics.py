"""The canonical fp32 primitives of reference/numerics.py against float64 and hand-computed
values (kpool-algorithm.md §4.2-§4.5, §5.3, §11)."""
import math

import numpy as np
import torch

from reference.numerics import (LOWEST, FLT_MAX, canonical_topk, compress_pools, exp_fp32, expand_row,
                                pool_scores, sanitize_scores)
from parity.checking.compare import assert_bitwise_equal


def _ulps(y: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    spacing = torch.from_numpy(np.spacing(np.abs(exact.float().numpy())).astype(np.float64))
    return (y.double() - exact).abs() / spacing


def test_exp_within_two_ulp_of_float64_on_the_normal_range():
    x = torch.cat([torch.linspace(-87.3, 88.7, 400_001), torch.randn(200_000) * 4]).float()
    exact = torch.exp(x.double())
    assert float(_ulps(exp_fp32(x), exact).max()) <= 2.0


def test_exp_special_values_and_subnormals():
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 89.0, -104.0, -95.0, -100.0])
    y = exp_fp32(x)
    assert y[0] == 1 and y[1] == 1 and y[2] == float("inf") and y[3] == 0 and torch.isnan(y[4])
    assert y[5] == float("inf")  # e^89 > FLT_MAX
    sub = x[6:].double()
    assert float((y[6:].double() - torch.exp(sub)).abs().max()) <= 2 * 1.4e-45  # within 2 subnormal steps


def test_compress_zero_gate_is_exact_mean_of_small_integers():
    """kpool-algorithm.md §5.3: zero gates, zero APE, small-integer keys -> bf16(mean(K)) exactly."""
    for P in (4, 8):
        k = torch.randint(-8, 9, (5, P, 16)).float()
        got = compress_pools(k, torch.zeros_like(k), torch.zeros(P, 16))
        assert_bitwise_equal(got, k.mean(dim=1).bfloat16())


def test_compress_public_case_c31_per_channel_softmax():
    """C31: per-dimension softmax over slots, APE added before the softmax, one bf16 rounding."""
    P, D = 4, 8
    k = torch.zeros(1, P, D)
    gate = torch.zeros(1, P, D)
    for s in range(P):
        k[0, s, :3] = torch.tensor([s + 1.0, -(s + 1.0), 10.0 * s])
    gate[0, :, 0] = torch.tensor([0, 0, 0, 5.0])
    gate[0, :, 1] = torch.tensor([5.0, 0, 0, 0])
    e5 = math.exp(5)
    expected = [(1 + 2 + 3 + 4 * e5) / (3 + e5), (-e5 - 2 - 3 - 4) / (e5 + 3), 15.0]
    got = compress_pools(k, gate, torch.zeros(P, D))[0, :3]
    assert_bitwise_equal(got, torch.tensor(expected).bfloat16())
    ape = torch.zeros(P, D)
    ape[3, 2] = math.log(3)
    got_b = compress_pools(k, gate, ape)[0, 2]
    assert got_b == torch.tensor(20.0).bfloat16()


def test_relu_scores_match_float64_on_exact_data_and_nan_propagates():
    q = torch.randint(-3, 4, (3, 2, 8)).bfloat16()
    w = torch.randint(-2, 3, (3, 2)).float()
    c = torch.randint(-3, 4, (5, 8)).bfloat16()
    dots = torch.einsum("rhd,nd->rnh", q.double(), c.double())
    exact = (dots.clamp(min=0) * w.double()[:, None, :]).sum(-1)
    assert_bitwise_equal(pool_scores(q, w, c, "relu").double(), exact)
    merged = torch.einsum("rhd,nd,rh->rn", q.double(), c.double(), w.double())
    assert_bitwise_equal(pool_scores(q, w, c, "merged").double(), merged)
    c_nan = c.clone()
    c_nan[1, 0] = float("nan")
    assert torch.isnan(pool_scores(q, w.abs() + 1, c_nan, "relu")[:, 1]).all()


def test_sanitize():
    s = torch.tensor([[1.0, float("nan"), -float("inf"), float("inf"), LOWEST, 2.0]])
    out = sanitize_scores(s, torch.tensor([5]))
    assert out.tolist() == [[1.0, LOWEST, LOWEST, FLT_MAX, LOWEST, LOWEST]]


def test_canonical_topk_ties_go_to_lower_pool_id():
    s = torch.tensor([[3.0, 2.0, 2.0, 5.0, -0.0, 0.0, LOWEST]])
    ids, valid = canonical_topk(s, 7)
    assert ids.tolist() == [[3, 0, 1, 2, 4, 5, 6]]
    assert valid.tolist() == [[True] * 6 + [False]]


def test_expand_row_fixed_tail_and_alignment_columns():
    row = expand_row([], [], 2, index_topk=8, index_kpool=4, pack_tail=False, width=14)
    assert row == [-1] * 8 + [0, 1, 2] + [-1] * 3
