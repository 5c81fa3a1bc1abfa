"""Hugging Face as a third implementation (``--oracle hf``; docs/hf-oracle.md): the driver's
recipe, the classification of differences, the seed suite, planted faults, no-tail mode."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

from parity.oracles.hf_classify import RequestView, bf16_rne_bits, classify_pools, classify_row
from parity.oracles.hf_oracle import HF_VERSION, hf_status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_OK, HF_WHY = hf_status()
needs_hf = pytest.mark.skipif(not HF_OK, reason=f"--oracle hf unavailable: {HF_WHY}")


# ---- pieces that need no transformers -------------------------------------------------------

def test_the_pin_is_the_same_in_pyproject_bootstrap_and_the_driver():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pyproject = f.read()
    with open(os.path.join(ROOT, "scripts", "bootstrap.sh")) as f:
        bootstrap = f.read()
    assert re.search(r'^hf = \["transformers==([0-9.]+)"\]', pyproject, re.M).group(1) == HF_VERSION
    assert re.search(r'^HF_VERSION="([0-9.]+)"', bootstrap, re.M).group(1) == HF_VERSION
    assert '"transformers==$HF_VERSION"' in bootstrap


def test_hf_status_states_why_it_is_unusable(monkeypatch):
    from importlib import metadata
    monkeypatch.setattr(metadata, "version", lambda name: (_ for _ in ()).throw(metadata.PackageNotFoundError(name)))
    assert hf_status() == (False, "transformers not installed (pip install '.[hf]')")
    monkeypatch.setattr(metadata, "version", lambda name: "4.57.1")
    ok, why = hf_status()
    assert not ok and "too old" in why and HF_VERSION in why


def test_bf16_rounding_is_one_rounding_of_the_float64_value():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-20, 20, (4096,), generator=g).float())
    mid = torch.tensor([1.0 + 2 ** -8, -(1.0 + 3 * 2 ** -8), 0.0, -0.0, 3.0])       # bf16 midpoints, zeros
    for v in (x, mid):               # fp32 values: torch's own fp32 -> bf16 RNE is the truth
        want = v.to(torch.bfloat16).view(torch.int16).numpy()
        assert np.array_equal(bf16_rne_bits(v.double().numpy()), want)
    # just above a midpoint: fp32 rounding would land on the midpoint and then round to even
    above = np.array([1.0 + 2 ** -8 + 2 ** -40])
    assert float(np.float32(above[0])) == 1.0 + 2 ** -8
    assert bf16_rne_bits(above)[0] == torch.tensor(1.0 + 2 ** -7).bfloat16().view(torch.int16).item()


def _view(keys, hf_scores, *, hf_keys=None, q=1.0, w=1.0):
    keys = np.asarray(keys, np.float64).reshape(-1, 1)
    return RequestView(index_kpool=4, q=np.full((1, 1, 1), q), w=np.full((1, 1), w), ours_keys=keys, exact_keys=keys,
                       hf_keys=keys if hf_keys is None else np.asarray(hf_keys, np.float64).reshape(-1, 1),
                       hf_scores=np.asarray(hf_scores, np.float64).reshape(1, -1),
                       finite_tokens=np.ones(64, bool), finite_ape=True)


def _row(pools, tail=()):
    return [j * 4 + lane for j in pools for lane in range(4)] + list(tail) + [-1] * 3


def test_row_classes():
    p = 13                                          # 3 visible pools, tail 12, 13
    tied = _view([1.0, 0.5, 0.5], [1.0, 0.5, 0.5])
    assert classify_row(_row([0, 1], (12, 13)), _row([0, 1], (12, 13)), p, 0, tied).cls == "agree"
    assert classify_row(_row([0, 1], (12, 13)), _row([2, 0], (12, 13)), p, 0, tied).cls == "exact-tie"
    # HF's fp32 scores differ by one ulp where the exact scores tie: a near tie
    near = _view([1.0, 0.5, 0.5], [1.0, 0.5, float(np.nextafter(np.float32(0.5), np.float32(1)))])
    assert classify_row(_row([0, 1], (12, 13)), _row([0, 2], (12, 13)), p, 0, near).cls == "near-tie"
    # ours keeps pool 1 (0.4) over pool 2 (0.5): far beyond any rounding
    wrong = _view([1.0, 0.4, 0.5], [1.0, 0.4, 0.5])
    v = classify_row(_row([0, 1], (12, 13)), _row([0, 2], (12, 13)), p, 0, wrong)
    assert v.cls == "real" and "ours selects pool 1 over pool 2" in v.detail
    for ours, why in ((_row([0, 1], (12,)), "tail"), (_row([0, 3], (12, 13)), "after the row's position"),
                      (_row([0, 1, 1], (12, 13)), "multiplicities"),
                      ([0, 1, 2, 3, 4, 5, 6, 8, 12, 13], "lanes"), (_row([0], (12, 13)), "selects 1 pools")):
        v = classify_row(ours, _row([0, 1], (12, 13)), p, 0, tied)
        assert v.cls == "real" and why in v.detail, (ours, v)
    # ours ranks pool 1 first because our key of pool 1 is wrong (0.625, not 0.375): consistent
    # with our own keys, but no rounding of c*, so real and not a near tie
    bad_key = _view([1.0, 0.375, 0.5], [1.0, 0.375, 0.5])
    bad_key.ours_keys = np.array([[1.0], [0.625], [0.5]])
    bad_key.exact_bounds = np.full((3, 1), 1e-6)
    v = classify_row(_row([0, 1], (12, 13)), _row([0, 2], (12, 13)), p, 0, bad_key)
    assert v.cls == "real" and "no rounding of c*" in v.detail
    bad_key.exact_bounds = None                      # without the key check it would pass
    assert classify_row(_row([0, 1], (12, 13)), _row([0, 2], (12, 13)), p, 0, bad_key).cls == "near-tie"
    nan_q = _view([1.0, 0.4, 0.5], [1.0, 0.4, 0.5], q=float("nan"))
    assert classify_row(_row([0, 1], (12, 13)), _row([0, 2], (12, 13)), p, 0, nan_q).cls == "non-finite"


def test_pooled_key_classes():
    P, D = 4, 2
    k = torch.ones(1, P, D)
    k[0, 3, 0] = 1.0 + 2 ** -6                      # mean of channel 0 = 1 + 2^-8: a bf16 midpoint
    gate, ape = torch.zeros(1, P, D), torch.zeros(P, D)
    even = torch.tensor([[1.0, 1.0]]).bfloat16().view(torch.int16)
    got = classify_pools(even, k, gate, ape, 32)
    assert got["exact"] == 2 and got["real"] == 0
    up = torch.tensor([[1.0 + 2 ** -7, 1.0]]).bfloat16().view(torch.int16)
    got = classify_pools(up, k, gate, ape, 32)
    assert got["rounding-boundary"] == 1 and got["exact"] == 1 and got["real"] == 0
    off = torch.tensor([[1.0, 1.0 + 2 ** -7]]).bfloat16().view(torch.int16)  # channel 1 is exactly 1
    got = classify_pools(off, k, gate, ape, 32)
    assert got["real"] == 1 and got["detail"]
    # heavy cancellation: c* = 2^-22 from terms of magnitude 3/4; fp32 may miss it by ~1e-6
    k = torch.tensor([1.0, -1.0, 0.5, -0.5 + 2 ** -20]).reshape(1, P, 1).expand(1, P, D).contiguous()
    for value, cls in ((2 ** -22, "exact"), (2 ** -21, "cancellation"), (-(2 ** -21), "cancellation"),
                       (2 ** -10, "real")):
        bits = torch.full((1, D), value).bfloat16().view(torch.int16)
        assert classify_pools(bits, k, gate, ape, 32)[cls] == D, (value, cls)


# ---- the HF driver ------------------------------------------------------------------------

@needs_hf
def test_recipe_reproduces_our_inputs_and_a_broken_selector_is_refused():
    from kpool.config import SMALL
    from parity.oracles.hf_oracle import HFIndexer, HFRecipeError
    g = torch.Generator().manual_seed(1)
    H, D, P = SMALL.index_n_heads, SMALL.index_head_dim, SMALL.index_kpool
    S, n = 19, 5
    k = torch.randn(S, D, generator=g).bfloat16().float()
    gate = torch.randn(S, D, generator=g) * 2
    q, w = torch.randn(n, H, D, generator=g).bfloat16(), torch.randn(n, H, generator=g) / 64
    hf = HFIndexer(SMALL, torch.randn(P, D, generator=g))
    call = hf.run(k, gate, q, w)
    assert call.indices.shape == (n, SMALL.output_width) and call.scores.shape == (n, S // P)
    # row p = S-1 = 18: 4 visible pools, the best 2, then the tail 16, 17, 18
    assert sorted(x for x in call.indices[-1].tolist() if x >= 16) == [16, 17, 18]
    with torch.no_grad():
        hf.indexer.wk.weight[0, 0] = 2.0            # broken on purpose: k channel 0 doubled
    with pytest.raises(HFRecipeError, match="another k"):
        hf.run(k, gate, q, w)


def _run_with_hf(case, kernel_forward=None):
    from parity.oracles.hf_run import HFObserver
    from parity.running.runner import run_case
    obs = HFObserver(case)
    res = run_case(case, device="cpu", kernel_forward=kernel_forward, step_observer=obs)
    return res, obs.table()


@needs_hf
def test_a_selection_fault_is_real_and_a_pooling_fault_is_real():
    from cases.scenarios import prefill_topk
    from parity.implementations.mutants import load_mutant
    res, table = _run_with_hf(prefill_topk("small"))
    assert res.ok and table["real"].sum() == 0 and table["rows"].sum() > 0
    res, table = _run_with_hf(prefill_topk("small"), load_mutant("visible-off-by-one").forward)
    assert table["real"].sum() > 0
    hf = res.failures[res.failures["output"] == "hf:indices"]
    assert len(hf) and set(hf["verdict"]) == {"wrong-index"}
    res, table = _run_with_hf(prefill_topk("small"), load_mutant("ape-reversed").forward)
    # the wrong keys are real, and so are the rows they reorder (never near ties)
    assert table["pooled real"].sum() > 0 and table["real"].sum() > 0 and table["near-tie"].sum() == 0
    assert "cache-mismatch" in set(res.failures[res.failures["output"] == "hf:pooled"]["verdict"])


@needs_hf
def test_no_tail_mode_agrees_with_hf_and_a_tail_left_in_is_real():
    """always_select_tail=False: the reference (standing in for the kernel until the kernels take
    the flag) against HF's second mode; HF in the first mode against the same rows must fail."""
    import dataclasses

    from cases.scenarios import seed_cases, without_tail
    from parity.oracles.hf_run import HFObserver
    from parity.running.runner import run_case
    from reference.stateful import forward as reference_forward
    for case in seed_cases(["small"]):
        if any(s.expect_error for s in case.steps):
            continue        # bad-input steps test validation; the reference stand-in has none
        res, table = _run_with_hf(without_tail(case), reference_forward)
        assert res.ok and table["real"].sum() == 0 and table["rows"].sum() > 0, (case.name, res.failures)
    nt = without_tail(seed_cases(["small"])[1])
    obs = HFObserver(dataclasses.replace(nt, config=nt.config.with_(always_select_tail=True)))
    run_case(nt, device="cpu", kernel_forward=reference_forward, step_observer=obs)
    assert obs.table()["real"].sum() > 0


@needs_hf
def test_non_finite_inputs_are_a_semantic_difference_never_a_crash():
    """HF does not sanitize NaN/inf scores (kpool-algorithm.md §4.3, §10), and a non-finite hidden
    value reaches all of a token's HF inputs through the selector matmuls: such rows are counted
    as non-finite, the rest still compared."""
    import dataclasses

    from cases.scenarios import decode_tail
    from cases.values import make_inputs

    def poisoned(c, step, meta):
        d = make_inputs(c, dataclasses.replace(step, inputs=None), meta)
        T = d["k"].shape[0]
        if T > 6:
            d["k"][5, 3] = float("nan")
            d["gate"][2, 1] = float("inf")
            d["q"][T - 1, 0, 0] = float("inf")
            d["weights"][T - 2, 1] = float("nan")
        return d
    case = decode_tail("small")
    case = dataclasses.replace(case, steps=[dataclasses.replace(s, inputs=poisoned) for s in case.steps])
    with np.errstate(invalid="ignore"):
        res, table = _run_with_hf(case)
    assert res.ok, res.failures
    assert table["non-finite"].sum() > 0 and table["pooled non-finite"].sum() > 0 and table["agree"].sum() > 0
    assert table["real"].sum() == 0 and not table["note"].str.contains("failed").any()


HF_CASES = ("prefill-tail", "decode-tail", "pool-boundary-decode", "prefill-topk", "full-padding", "cache-only",
            "prefill-topk-no-tail", "non-finite")
"""The small seed cases the CLI test runs with ``--oracle hf``: every kind of row HF classifies
(agree, exact ties, non-finite) from prefill, decode, padding, cache-only and no-tail steps. The
rest of the suite costs a third more and adds no row class: ``bad-metadata`` / ``bad-arguments``
(their valid prefill only), ``value-range`` / ``strided-layouts`` (HF against the reference on them:
``test_no_tail_mode_agrees_with_hf_and_a_tail_left_in_is_real``)."""


@needs_hf
@pytest.mark.integration
def test_oracle_hf_on_the_small_seed_suite(tmp_path, capsys, device):
    """What CI runs, python -m parity run --suite seed --size small --oracle hf, on :data:`HF_CASES`
    (in process: the same ``parity.cli.main``): exit 0, 0 real differences."""
    from parity import cli
    rc = cli.main(["run", "--suite", "seed", "--size", "small", "--case", *HF_CASES, "--oracle", "hf",
                   "--device", device, "--report", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    import pandas as pd
    table = pd.read_csv(tmp_path / "hf.csv")
    assert set(table["case"]) == set(HF_CASES)
    rows = table.groupby("case")["rows"].sum()
    assert (rows > 0).all(), rows                    # every case's steps were compared with HF
    assert table["real"].sum() == 0 and table["pooled real"].sum() == 0
    assert table["rows"].sum() == table[["agree", "exact-tie", "near-tie", "non-finite"]].sum().sum() > 400
    assert table["exact-tie"].sum() > 0 and table["non-finite"].sum() > 0
    assert "hf: " in out and "0 real" in out
    with open(tmp_path / "results.json") as f:
        assert json.load(f)


def test_oracle_hf_without_transformers_is_skipped_with_the_reason(monkeypatch, capsys, device):
    from parity import cli
    from parity.oracles import hf_oracle
    monkeypatch.setattr(hf_oracle, "hf_status", lambda: (False, "transformers not installed (pip install '.[hf]')"))
    rc = cli.main(["run", "--suite", "seed", "--size", "small", "--case", "prefill-topk", "--device", device,
                   "--oracle", "hf", "--no-bundles"])
    out = capsys.readouterr().out
    assert rc == 0 and "oracle hf: SKIPPED, transformers not installed" in out
