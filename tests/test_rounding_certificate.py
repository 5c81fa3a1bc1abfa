"""parity-contract.md §3.1, the term-scaled rounding-boundary certificate (docs/certificates.md §3).

The kernels are bitwise-exact, so these tests *construct* what a kernel with another ``exp`` or
operation order stores: the adjacent bf16 value where the exact pooled value ``y64`` sits near
the rounding midpoint. The bound is ``B = (1 + 2^-10) u [beta A + sum_j |a_j K_j| xi_j +
A sum_j a_j xi_j]`` (``A = sum_j |a_j K_j|``, ``xi_j = |s_j| + 2 |s_j - m|``): tests pin the
formula by hand, show a heavy-cancellation element computed with a 13-ulp hardware ``exp``
certified (the old ``32 ulps of y`` budget failed it) and a 1-ulp fault on a well-conditioned
element not certified.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from parity.checking import certificates as certs
from parity.checking import compare as cmp
from parity.checking.compare import bits
from reference.numerics import compress_pools, exp_fp32, round_bf16
from tests.certificate_cases import D, P

MID = 1.0 + 2.0 ** -8            # midpoint of bf16 1.0 (0x3F80) and 1.0078125 (0x3F81)
ULP1 = 2.0 ** -23                # fp32 ulp at 1.0..2.0, = u


def _window_case(k_value: float, budget=32, zero_gates=False):
    """A compressed cache [2, 2, 1, D] whose row (1, 0) was written from a window whose channel 0
    keys all equal ``k_value`` (so y64[0] == k_value up to float64 rounding) and channel 1 keys
    all 0.5 (y64 = 0.5, exactly a bf16 value); random gates and APE (non-trivial softmax) unless
    ``zero_gates`` (every exp argument 0: the bound is ``beta u A`` alone)."""
    g = torch.Generator().manual_seed(3)
    kw = torch.randn(P, D, generator=g)
    kw[:, 0] = k_value
    kw[:, 1] = 0.5
    gate = torch.randn(P, D, generator=g) * 2
    ape = torch.randn(P, D, generator=g)
    if zero_gates:
        gate, ape = torch.zeros(P, D), torch.zeros(P, D)
    win = certs.PoolWindow(row=7, position=7, request=0, k=kw, gate=gate)
    y = torch.tensor(certs.pooled_value_f64(kw.numpy(), gate.numpy(), ape.numpy()), dtype=torch.float32)
    ref = torch.zeros(2, 2, 1, D, dtype=torch.bfloat16)
    ref[1, 0, 0] = y.to(torch.bfloat16)
    ctx = certs.RoundingContext(windows={(1, 0): win}, ape=ape, budget_ulps=budget)
    return ref, ctx


def _flip(cache, where, delta):
    out = cache.clone()
    bits(out)[where] += delta
    return out


def _other_side(ref, where=(1, 0, 0, 0)):
    return _flip(ref, where, 1 if int(bits(ref)[where]) in (0x3F80,) else -1)


def test_near_midpoint_element_is_certified():
    ref, ctx = _window_case(MID)
    ref_bits = int(bits(ref)[1, 0, 0, 0])
    assert ref_bits in (0x3F80, 0x3F81)
    kern = _other_side(ref)
    rows = cmp.compare_compressed(kern, ref, context=ctx)
    assert [(r["verdict"], r["mismatches"], r["page"], r["page_row"], r["channel"]) for r in rows] == \
        [("rounding-boundary", 1, 1, 0, 0)]
    assert ctx.carried == {(1, 0, 0): (int(bits(kern)[1, 0, 0, 0]), ref_bits)}


def test_two_ulp_difference_fails_with_location():
    ref, ctx = _window_case(MID)
    kern = _flip(ref, (1, 0, 0, 0), 2)
    (row,) = cmp.compare_compressed(kern, ref, context=ctx)
    assert (row["verdict"], row["mismatches"], row["page"], row["page_row"], row["channel"]) == \
        ("cache-mismatch", 1, 1, 0, 0)
    assert "2 bf16 ulps apart" in row["detail"]
    # where the exact value is, so an engineer sees which side moved: the reference's value is the
    # rounding of y64 (half an ulp from it), the kernel two ulps further
    y = certs.pooled_value_f64(ctx.window(1, 0).k.numpy(), ctx.window(1, 0).gate.numpy(), ctx.ape.numpy())[0]
    assert f"exact y64={float(y)!r}" in row["detail"] and "fp32 error bound" in row["detail"]
    kernel_off = float(row["detail"].split("kernel ")[1].split(" ")[0])
    reference_off = float(row["detail"].split("reference ")[1].split(" ")[0])
    assert kernel_off > 2 * reference_off


@pytest.mark.parametrize("budget", [32, 64])
def test_one_ulp_fault_on_a_well_conditioned_element_fails(budget):
    """Channel 1: four equal keys 0.5 (no cancellation, y64 = 0.5 exactly a bf16 value); a kernel
    storing the adjacent bf16 value is a 1-ulp fault, thousands of times its error bound away."""
    ref, ctx = _window_case(MID, budget=budget)
    assert float(ref[1, 0, 0, 1]) == 0.5
    y, bound, terms = (float(v[1]) for v in certs.pooled_value_and_bound_f64(
        ctx.windows[(1, 0)].k.numpy(), ctx.windows[(1, 0)].gate.numpy(), ctx.ape.numpy(), budget_ulps=budget))
    assert terms == y == 0.5 and abs(y - (0.5 + 2.0 ** -9)) > 400 * bound
    (row,) = cmp.compare_compressed(_flip(ref, (1, 0, 0, 1), 1), ref, context=ctx)
    assert (row["verdict"], row["channel"]) == ("cache-mismatch", 1)
    assert "beyond the fp32 error bound" in row["detail"] and f"budget {budget} ulps of the terms" in row["detail"]


@pytest.mark.parametrize("offset_ulps, certified", [(0, True), (30, True), (-30, True), (34, False), (-34, False)])
def test_budget_is_the_boundary_without_exp_arguments(offset_ulps, certified):
    """Zero gates and APE (every exp argument 0): B = (1 + 2^-10) * 32 u A with A = y64 ~ MID, so
    y64 = MID + offset * ulp is certified iff |offset| <= 32.1."""
    ref, ctx = _window_case(MID + offset_ulps * ULP1, zero_gates=True)
    (row,) = cmp.compare_compressed(_other_side(ref), ref, context=ctx)
    assert row["verdict"] == ("rounding-boundary" if certified else "cache-mismatch")


def test_exp_arguments_widen_the_bound_by_their_terms():
    """Random gates: B = (1 + 2^-10) u MID (32 + 2 sum_j a_j xi_j) for four equal keys MID, by
    hand; an offset just inside is certified, just outside is not."""
    ref, ctx = _window_case(MID)
    win = ctx.windows[(1, 0)]
    s = win.gate[:, 0].double().numpy() + ctx.ape[:, 0].double().numpy()
    x = s - s.max()
    a = np.exp(x) / np.exp(x).sum()
    xi = np.abs(s) + 2 * np.abs(x)
    ulps = (32 + 2 * float((a * xi).sum())) * (1 + 2.0 ** -10)
    _, bound, _ = certs.pooled_value_and_bound_f64(win.k.numpy(), win.gate.numpy(), ctx.ape.numpy(), budget_ulps=32)
    assert float(bound[0]) == pytest.approx(ulps * ULP1 * MID, rel=1e-9)
    assert 0.99 * ulps > 32 * (1 + 2.0 ** -10) * MID + 1            # beyond the zero-argument bound
    for offset, verdict in ((0.99 * ulps, "rounding-boundary"), (1.01 * ulps, "cache-mismatch")):
        shifted, sctx = _window_case(MID + offset * ULP1)
        (row,) = cmp.compare_compressed(_other_side(shifted), shifted, context=sctx)
        assert row["verdict"] == verdict, (offset, row["detail"])


def _hardware_pooled(k_window, gate_window, ape, exp_ulps=13):
    """fp32 compression as a fast kernel may do it: ``tl.exp``-like exp off by up to ``exp_ulps``
    ulps (alternating sign per slot, so the error does not cancel in the softmax), then
    ``sum_j e_j K_j`` divided once by ``Z`` (the order of kpool-algorithm.md §5.3's CUDA note)."""
    s = gate_window.float() + ape.float()
    m = s.max(dim=1, keepdim=True).values
    sign = torch.tensor([1.0, -1.0] * (P // 2)).view(1, P, 1)
    e = (exp_fp32(s - m) * (1 + sign * exp_ulps * ULP1)).float()
    z = e[:, 0]
    acc = e[:, 0] * k_window[:, 0]
    for j in range(1, P):
        z = z + e[:, j]
        acc = acc + e[:, j] * k_window[:, j]
    return acc / z


def _cancelling_windows(n=256, seed=11):
    """``n`` windows whose weighted sum nearly cancels: K_j = +-100 plus N(0, 1) (bf16 values),
    gates and APE ~ N(0, 0.1^2), so a_j ~ 1/4 and |y| ~ 10 << A ~ 100."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0]).view(1, P, 1)
    k = (100 * sign + torch.randn(n, P, D, generator=g)).to(torch.bfloat16).float()
    gate = torch.randn(n, P, D, generator=g) * 0.1
    ape = torch.randn(P, D, generator=g) * 0.1
    return k, gate, ape


def test_hardware_exp_on_heavy_cancellation_stays_inside_the_bound():
    """A 13-ulp exp on elements with |y| << sum |a_j K_j|: the fp32 error of every element is inside
    the CUDA bound (budget 64), and nearly all of them beyond the old budget of 64 ulps of y."""
    k, gate, ape = _cancelling_windows()
    y32 = _hardware_pooled(k, gate, ape).double().numpy()
    y64, bound, terms = certs.pooled_value_and_bound_f64(k.numpy(), gate.numpy(), ape.numpy(),
                                                          budget_ulps=certs.ROUNDING_BUDGET_ULPS["cuda"])
    err = np.abs(y32 - y64)
    assert (err <= bound).all(), float((err / bound).max())
    old = 64 * certs.fp32_ulp(y64)
    assert (err > old).mean() > 0.9 and np.median(terms / np.abs(y64)) > 10


def test_heavy_cancellation_element_is_certified_and_the_old_budget_failed_it():
    k, gate, ape = _cancelling_windows()
    ours = round_bf16(_hardware_pooled(k, gate, ape))
    ref = compress_pools(k, gate, ape)                                # the canonical reference value
    y64, bound, terms = certs.pooled_value_and_bound_f64(k.numpy(), gate.numpy(), ape.numpy(), budget_ulps=64)
    key = lambda b: certs.bf16_order_key(bits(b))                      # noqa: E731
    adjacent = ((key(ours) - key(ref)).abs() == 1).nonzero().tolist()
    assert len(adjacent) > 10                                        # a fast exp flips many of them
    # the adjacent pair farthest from its midpoint in ulps of y: the old budget (64 ulps of y) fails it
    def old_ulps(e):
        mid = 0.5 * (float(ours[e[0], e[1]]) + float(ref[e[0], e[1]]))
        return abs(y64[e[0], e[1]] - mid) / float(certs.fp32_ulp(y64[e[0], e[1]]))
    n, ch = max(adjacent, key=old_ulps)
    assert old_ulps((n, ch)) > 64
    kcache, rcache = (torch.zeros(1, 1, 1, D, dtype=torch.bfloat16) for _ in range(2))
    kcache[0, 0, 0], rcache[0, 0, 0] = ours[n], ref[n]
    win = certs.PoolWindow(row=3, position=3, request=0, k=k[n], gate=gate[n])
    ctx = certs.RoundingContext(windows={(0, 0): win}, ape=ape, budget_ulps=certs.ROUNDING_BUDGET_ULPS["cuda"])
    rows = cmp.compare_compressed(kcache, rcache, context=ctx)
    assert (0, 0, ch) in ctx.carried and any(r["verdict"] == "rounding-boundary" for r in rows)
    # every adjacent pair of the row is certified; only non-adjacent ones (parity-contract.md
    # §3.1 demands adjacency) may remain
    row_adjacent = {c for m, c in adjacent if m == n}
    assert {c for (_, _, c) in ctx.carried} == row_adjacent


def test_no_certificate_without_context_or_window():
    ref, ctx = _window_case(MID)
    kern = _other_side(ref)
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref)] == ["cache-mismatch"]   # exact data
    # a row the step did not write has no window: not certified (unless carried, below)
    moved_ref, moved_kern = torch.roll(ref, 1, 0), torch.roll(kern, 1, 0)
    (row,) = cmp.compare_compressed(moved_kern, moved_ref, context=ctx)
    assert row["verdict"] == "cache-mismatch" and "no window" in row["detail"]
    # carried: certified in an earlier step with the same bits; any other bits are judged afresh
    cmp.compare_compressed(kern, ref, context=ctx)
    later = certs.RoundingContext(windows={}, ape=ctx.ape, budget_ulps=32, carried=ctx.carried)
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref, context=later)] == ["rounding-boundary"]
    assert [r["verdict"] for r in cmp.compare_compressed(_flip(kern, (1, 0, 0, 0), 2), ref, context=later)] == \
        ["cache-mismatch"]


def test_nan_and_a_zero_away_from_the_exact_value_are_not_certified():
    ref, ctx = _window_case(MID)
    kern = ref.clone()
    kern[1, 0, 0, 0] = float("nan")
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref, context=ctx)] == ["nan-introduced"]
    # +0 against -0 where the exact pooled value is far from 0: both sides wrong, not a certificate
    zero_r, zero_k = ref.clone(), ref.clone()
    zero_r[1, 0, 0, 2], zero_k[1, 0, 0, 2] = 0.0, -0.0
    (row,) = cmp.compare_compressed(zero_k, zero_r, context=ctx)
    assert row["verdict"] == "cache-mismatch" and "beyond the fp32 error bound" in row["detail"]


def test_a_zero_of_the_other_sign_is_certified_where_the_exact_value_is_zero():
    """vLLM-Ascend pools with tl.sum, which starts from +0: a window of zero keys pools to +0 where
    the reference's sum may be -0. The exact value is 0, so either sign conforms (docs/
    certificates.md §2.4 "Signed zeros"); claimed bitwise or exact data, it stays a mismatch."""
    ref, ctx = _window_case(0.0)
    assert int(bits(ref)[1, 0, 0, 0]) in (0x0000, -0x8000)
    kern = _flip(ref, (1, 0, 0, 0), -0x8000 if int(bits(ref)[1, 0, 0, 0]) == 0 else 0x8000)
    assert float(kern[1, 0, 0, 0]) == 0.0 and not torch.equal(bits(kern), bits(ref))
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref, context=ctx)] == ["rounding-boundary"]
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref, context=ctx, claimed_bitwise=True)] == \
        ["cache-mismatch"]
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref)] == ["cache-mismatch"]


def test_huge_exp_arguments_get_no_certificate():
    """Gate logits of 1e5: the first-order bound would exceed 2^-11 of the terms; no certificate."""
    ref, ctx = _window_case(MID)
    win = ctx.windows[(1, 0)]
    ctx.windows[(1, 0)] = certs.PoolWindow(win.row, win.position, win.request, win.k, win.gate * 1e5)
    (row,) = cmp.compare_compressed(_other_side(ref), ref, context=ctx)
    assert row["verdict"] == "cache-mismatch" and "too large for the first-order" in row["detail"]


def test_budgets_are_declared_per_backend_and_cover_the_derived_operation_count():
    assert certs.ROUNDING_BUDGET_ULPS == {"cpu": 32, "cuda": 64, "npu": 64}           # unchanged
    for backend, budget in certs.ROUNDING_BUDGET_ULPS.items():
        for pool_size in (1, 2, 4, 8):
            assert certs.operation_ulps(pool_size, backend) <= budget, (backend, pool_size)
    assert certs.operation_ulps(4, "cpu") == 2 * 3 + 1 + 1 + 2 * 1.25 * 3
    import inspect
    doc = inspect.getsource(certs.rounding)
    doc = doc[doc.index("ROUNDING_BUDGET_ULPS: Dict"):doc.index("EXP_DIV_ULPS: Dict")]
    assert "platform-numerics.md §4.1" in doc and "tl.exp" in doc and "docs/certificates.md §3" in doc
    assert float(certs.fp32_ulp(np.array([1.0]))[0]) == ULP1
