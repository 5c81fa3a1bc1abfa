"""Issue 19 families 1 (values from the whole finite range, cases.ranges) and 2 (strided input
layouts, cases.layouts): the generators make what they claim, both sides get identical strided
views, the families ride on the drawn seeds without shifting the ci draws, the switch turns them
off, and (integration) each family's self-test faults are caught by its seed scenario and not by
the other's."""
import dataclasses

import pytest
import torch

from cases import families, layouts, ranges
from cases.genvalues import ValueSpec
from cases.layouts import InputLayout, apply_layout, layout_for
from cases.ranges import RANGE_CLASSES, apply_range_class


def _inputs(T=6, H=2, D=8, w_bf16=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(T, H, generator=g)
    return dict(k=torch.randn(T, D, generator=g), gate=torch.randn(T, D, generator=g),
                q=torch.randn(T, H, D, generator=g).to(torch.bfloat16),
                weights=w.to(torch.bfloat16) if w_bf16 else w)


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


# ---- family 1: value classes -------------------------------------------------------------------

def _f(t):
    return t.float()


CLAIMS = {
    "fp16-overflow": lambda i: (_f(i["q"]).abs() > 65504).any() and (i["k"].abs() > 65504).any(),
    "fp16-underflow": lambda i: (_f(i["q"]).abs() < 2.0 ** -14).all() and (_f(i["q"]).abs() < 2.0 ** -24).any(),
    "subnormal": lambda i: ((i["k"] != 0) & (i["k"].abs() < torch.finfo(torch.float32).tiny)).any()
    and ((_f(i["q"]) != 0) & (_f(i["q"]).abs() < torch.finfo(torch.float32).tiny)).any(),
    "far-below": lambda i: (_f(i["weights"]).abs() >= 2.0 ** 96).all() and (_f(i["weights"]) < 0).any(),
    "gate-spread": lambda i: (i["gate"].abs() >= 32).all() and (i["gate"].amax(1) - i["gate"].amin(1) >= 100).any(),
    "range-ends": lambda i: (i["gate"].abs() >= 2.0 ** 120).any() and (i["k"].abs() >= 2.0 ** 100).all()
    and (_f(i["q"]).abs() <= 2.0 ** -99).all(),
    "neg-zero": lambda i: all(((t == 0) & torch.signbit(_f(t))).any() for t in i.values()),
}


@pytest.mark.parametrize("name", RANGE_CLASSES)
@pytest.mark.parametrize("w_bf16", [False, True])
def test_range_class_makes_its_region_on_live_rows_only(name, w_bf16):
    """Each class puts finite values of its region in the live rows (the claim a kernel fault
    needs), leaves padding rows alone, keeps dtypes, is a function of the generator seed, and
    never rounds bf16 weights (every value drawn bf16-exact)."""
    base = _inputs(T=40, D=16, w_bf16=w_bf16)
    a = {n: t.clone() for n, t in base.items()}
    apply_range_class(name, a, 32, torch.Generator().manual_seed(5))
    live = {n: t[:32] for n, t in a.items()}
    assert CLAIMS[name](live), name
    for n in a:
        assert a[n].dtype == base[n].dtype
        assert torch.equal(_bits(a[n][32:]), _bits(base[n][32:])), f"{name} touched padding rows of {n}"
        assert torch.isfinite(_f(a[n])).all()
    b = {n: t.clone() for n, t in base.items()}
    apply_range_class(name, b, 32, torch.Generator().manual_seed(5))
    assert all(torch.equal(_bits(a[n]), _bits(b[n])) for n in a)


def test_value_spec_applies_its_range_class_and_rejects_unknown():
    from cases.scenarios import SCENARIOS
    from cases.steps import build_step
    case = SCENARIOS["decode-tail"]("small")
    step = dataclasses.replace(case.steps[1], inputs=ValueSpec(seed=3, range_class="far-below"))
    w = build_step(case, step).inputs["weights"]
    assert (w.abs() >= 2.0 ** 96).all()
    with pytest.raises(ValueError):
        ValueSpec(range_class="huge")
    assert ValueSpec.from_json(ValueSpec(range_class="neg-zero").to_json()).range_class == "neg-zero"


# ---- family 2: layouts -------------------------------------------------------------------------

def test_apply_layout_relays_every_input_with_the_same_values():
    """Same values bit for bit, the declared strides, NaN / -777777 poison in every padding
    element, caches and output buffer untouched, the given tensors unmodified."""
    from cases.scenarios import SCENARIOS
    from cases.steps import build_step
    from parity.checking.sentinel import sentinel_caches
    case = SCENARIOS["decode-tail"]("small")
    built = build_step(case, case.steps[2])
    caches = sentinel_caches(case)
    lay = InputLayout(weights="transposed-padded", weights_pad=2, q_head_pad=3, q_row_pad=5, q_dim_stride=2,
                      gate_row_pad=1, k_transposed=True, ape_transposed=True, metadata_step=3)
    plain = built.forward_kwargs(case, case.steps[2], caches, device="cpu", copy=True)
    strided = apply_layout(lay, plain)
    T, H, D = plain["q"].shape
    assert strided["weights"].stride() == (1, T + 2)
    assert strided["q"].stride() == (H * (2 * D + 3) + 5, 2 * D + 3, 2)
    assert strided["k"].stride() == (1, T) and strided["gate"].stride() == (D + 1, 1)
    assert strided["ape"].stride()[0] == 1 and strided["positions"].stride() == (3,)
    assert strided["block_table"].stride()[0] == 1
    for name, t in plain.items():
        if isinstance(t, torch.Tensor) and name not in ("compressed_cache", "tail_cache"):
            assert strided[name].shape == t.shape and torch.equal(_bits(strided[name]), _bits(t)), name
    assert strided["compressed_cache"] is plain["compressed_cache"]
    q = strided["q"]
    backing = q.as_strided((q.untyped_storage().nbytes() // 2,), (1,), 0).view(torch.int16)
    assert int((backing == layouts.POISON_BF16_BITS).sum()) == backing.numel() - q.numel()
    pos = strided["positions"].as_strided((3 * T,), (1,), 0)
    assert int((pos == layouts.POISON_INT).sum()) == 2 * T
    assert apply_layout(InputLayout(), plain) is plain and apply_layout(None, plain) is plain


def test_layout_for_is_a_pure_function_never_contiguous():
    seen = set()
    for seed in range(60):
        a, b = layout_for(seed, heads=2, head_dim=4), layout_for(seed, heads=2, head_dim=4)
        assert a == b and not a.is_contiguous
        seen.update(a.classes())
    assert seen == set(layouts.LAYOUT_CLASSES)
    assert InputLayout.from_json(layout_for(7, heads=2, head_dim=4).to_json()) == layout_for(7, heads=2, head_dim=4)


def test_layout_survives_the_case_serializer():
    from cases.scenarios import SCENARIOS
    from cases.serialize import case_from_json, case_to_json
    case = SCENARIOS["strided-layouts"]("small")
    doc, tensors = case_to_json(case)
    back = case_from_json(doc, tensors)
    assert [s.layout for s in back.steps] == [s.layout for s in case.steps]


# ---- generated cases and the switch -----------------------------------------------------------

def _drawn(monkeypatch, off: str, n: int = 12):
    from hypothesis import HealthCheck, given, seed, settings

    from cases.strategies import TINY, batch_cases
    monkeypatch.setenv(families.FAMILIES_OFF_ENV, off)
    out = []

    @seed(1)
    @settings(max_examples=n, database=None, derandomize=False, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(batch_cases(TINY))
    def collect(case):
        out.append(case)
    collect()
    return out


def test_families_ride_on_drawn_seeds_without_shifting_draws(monkeypatch):
    """With the families on, the same hypothesis seed draws the same configurations and batches
    as with them off (the ci budget's pinned searches stay valid); some cases get a range class
    and strided layouts, none with the families off."""
    on, off = _drawn(monkeypatch, ""), _drawn(monkeypatch, "values,layouts")
    strip = lambda c: (c.name, c.config, dataclasses.replace(c.geometry, row_padding=0, guard=0),   # noqa: E731
                       [(s.batch, s.seed) for s in c.steps])
    assert [strip(c) for c in on] == [strip(c) for c in off]
    tags = [t for c in on for t in c.tags]
    assert any(t.startswith("range:") for t in tags) and "layouts:strided" in tags
    assert not any(t.startswith("range:") or t == "layouts:strided" for c in off for t in c.tags)
    assert all(s.layout is None and s.inputs.range_class is None for c in off for s in c.steps)


def test_switch_drops_the_seed_scenarios_and_rejects_unknown_names(monkeypatch):
    from cases.scenarios import seed_cases
    names = lambda: {c.name for c in seed_cases(["small"])}   # noqa: E731
    assert {"value-range", "strided-layouts"} <= names()
    monkeypatch.setenv(families.FAMILIES_OFF_ENV, "layouts")
    assert "strided-layouts" not in names() and "value-range" in names()
    monkeypatch.setenv(families.FAMILIES_OFF_ENV, "value")
    with pytest.raises(ValueError):
        families.enabled("values")


def test_coverage_counts_every_family_class():
    """The coverage report counts each value class and layout of the two seed scenarios."""
    from cases.scenarios import SCENARIOS
    from parity.findings.coverage import Coverage
    from parity.findings.coverage_families import FAMILY_REQUIRED
    cov = Coverage()
    for name in ("value-range", "strided-layouts"):
        cov.add(SCENARIOS[name]("small"))
    assert all(cov.classes[n] > 0 for n, _ in FAMILY_REQUIRED), [n for n, _ in FAMILY_REQUIRED if not cov.classes[n]]
    text = "\n".join(cov.lines())
    assert "FLT_MAX and +inf scores in a row" in text and "weights [H,T] viewed [T,H]" in text


# ---- end to end: kpool passes, each family's faults are caught by its scenario only ---------------

@pytest.mark.integration
@pytest.mark.parametrize("scenario", ["value-range", "strided-layouts"])
def test_family_scenarios_pass_on_kpool(scenario, device):
    from cases.scenarios import SCENARIOS
    from parity.running.runner import run_case
    res = run_case(SCENARIOS[scenario]("small"), device=device)
    assert res.ok, res.failures.head().to_string()


@pytest.mark.integration
@pytest.mark.parametrize("fault", ["dot-operands-fp16", "softmax-max-skips-slot", "lowest-threshold-1e30",
                                   "weights-head-stride-ignored", "q-rows-assumed-packed", "compress-k-contiguous",
                                   "cache-rows-assumed-packed"])
def test_family_fault_caught_by_its_scenario_only(fault, device):
    """The fault's family scenario fails on it; the other family's scenario passes on it. (The
    failing run stops at its first failing step: failing is the claim, the later steps only cost.)"""
    from cases.scenarios import SCENARIOS
    from parity.verbs.faults import FAULTS
    from parity.verbs.faults.families import FAMILY_OF
    from parity.implementations.mutants import load_mutant
    from parity.running.runner import run_case
    forward = load_mutant(fault, mutation=FAULTS[fault].mutation).forward
    mine = {"values": "value-range", "layouts": "strided-layouts"}[FAMILY_OF[fault]]
    other = ({"value-range", "strided-layouts"} - {mine}).pop()
    assert not run_case(SCENARIOS[mine]("small"), device=device, kernel_forward=forward, check_oracle=False,
                        stop_on_failure=True).ok
    assert run_case(SCENARIOS[other]("small"), device=device, kernel_forward=forward, check_oracle=False).ok


def test_pooled_bound_covers_underflow_of_far_apart_logits():
    """A window whose logits are hundreds apart and whose keys are tiny: the exact pooled value
    is ~1e-270, which fp32 can only give as 0 (or a subnormal); the rounding bound must cover
    that (it was purely relative: the HF oracle called the fp32 0 real on value-range)."""
    import numpy as np

    from parity.checking.certificates.rounding import pooled_value_and_bound_f64
    gate = np.array([[0.0], [-600.0], [-600.0], [-600.0]])
    k = np.array([[0.0], [2.0 ** -40], [-(2.0 ** -40)], [2.0 ** -41]])
    y, bound, _ = pooled_value_and_bound_f64(k, gate, np.zeros((4, 1)), budget_ulps=8.0)
    assert 0.0 < abs(float(y[0])) < 1e-250
    assert float(bound[0]) >= abs(float(y[0]))     # fp32's 0 lies within the bound
    assert float(bound[0]) < 2.0 ** -120           # and the bound stays an underflow-sized one


def test_selftest_without_family_rejects_an_unknown_family():
    """``--without-family`` names families of cases.families; a typo is a usage error (exit 2),
    never a run with every family silently on."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "parity", "selftest", "--device", "cpu", "--without-family", "value",
                          "--fault", "dot-operands-fp16"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "unknown families" in out.stderr, out.stderr[-500:]
    from parity.verbs.faults import FAULTS
    from parity.verbs.faults.families import FAMILY_FAULTS, FAMILY_OF
    assert set(FAMILY_FAULTS) == set(FAMILY_OF) <= set(FAULTS)
    assert set(FAMILY_OF.values()) == {"values", "layouts"} and set(FAMILY_OF.values()) <= set(families.SWITCHABLE)


def test_padded_cache_rows_keep_the_view_and_sentinels():
    """``row_padding`` pads the rows of both caches (row strides ``D + pad``) and the padding
    holds the sentinel like page padding; a step writes only view elements."""
    from cases.scenarios import SCENARIOS
    from parity.checking.sentinel import sentinel_caches
    case = SCENARIOS["strided-layouts"]("small")
    D, C = case.config.index_head_dim, case.config.ring_capacity
    caches = sentinel_caches(case)
    assert case.geometry.row_padding == 3
    assert caches.compressed_cache.stride()[1] == D + 3 and caches.tail_cache.stride()[1:3] == (C * (D + 3), D + 3)
