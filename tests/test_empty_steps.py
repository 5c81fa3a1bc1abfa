"""Empty steps through every harness path (kpool-algorithm.md §9 item 3; issue 9 point 1).

On an H200 the generated suite crashed in the harness, not in a kernel: the input-write check
viewed an empty ``(0, 1)`` fp32 tensor with strides ``(1, 0)`` as bytes (``self.stride(-1) must be
1``). A tensor with a size-0 or size-1 dimension counts as contiguous whatever that dimension's
stride, so the CPU run never saw it. Here the inputs of every step are handed to the harness
with exactly such strides (stride 0 on every dimension of size 0 or 1), and a case of
``T == 0``, ``R == 0`` (with and without padding rows) and zero-length-request steps runs
through the runner (input-write check, sentinels, certificates, oracle), every metamorphic
relation, a repro bundle (write, load, replay) and the corpus (save, load, replay).
"""
from __future__ import annotations

import pytest
import torch

from cases.genvalues import ValueSpec
from kpool.config import KPoolConfig

# H = 1 and D = 1: weights [T, 1], k and gate [T, 1] -- the shape of the H200 crash.
CFG = KPoolConfig(index_n_heads=1, index_head_dim=1, index_kpool=4, index_topk=8, num_speculative_tokens=1)


def zero_strides(t: torch.Tensor) -> torch.Tensor:
    """``t`` (same values) with stride 0 on every dimension of size 0 or 1."""
    strides = [0 if n <= 1 else s for n, s in zip(t.shape, t.contiguous().stride())]
    return t.contiguous().as_strided(t.shape, strides)


class OddStrides:
    """``Step.inputs``: the :class:`ValueSpec` inputs re-laid with :func:`zero_strides`."""

    def __init__(self, spec: ValueSpec):
        self.spec = spec

    def __call__(self, case, step, metadata) -> dict:
        return {name: zero_strides(t) for name, t in self.spec(case, step, metadata).items()}


def empty_case():
    """:func:`cases.coverage_cases.empty_steps_case` (prefill, ``T == 0``, ``R == 0`` with and
    without padding rows, cache-only ``T == 0``, zero-length request beside a decode, decode) at
    H = D = 1, its inputs in zero-stride layouts."""
    from cases.coverage_cases import empty_steps_case
    return empty_steps_case(CFG, inputs=lambda i: OddStrides(ValueSpec(family="random", seed=i)),
                            name="empty-steps")


def test_odd_strides_reach_the_forward():
    """The planted layout survives the harness's copy to the device (else this file tests nothing)."""
    from cases.steps import build_step, forward_kwargs
    from parity.checking.sentinel import sentinel_caches
    w = zero_strides(torch.zeros(0, 1))
    case = empty_case()
    built = build_step(case, case.steps[1])                       # T == 0: zero-row inputs
    inputs = dict(built.inputs, weights=w)
    kw = forward_kwargs(case, built.meta, inputs, built.ape, sentinel_caches(case), device=torch.device("cpu"),
                        compute_topk=True, copy=True)              # the runner's per-side copy
    assert w.stride() == (0, 0) and kw["weights"].stride() == (0, 0) and kw["weights"] is not w
    with pytest.raises(RuntimeError, match="stride"):
        w.contiguous().view(torch.uint8)


def test_empty_steps_pass_the_runner_and_every_check(device):
    from parity.findings.coverage import classify_case
    from parity.running.runner import run_case
    case = empty_case()
    res = run_case(case, device=device, certificates=True, repeat=2)   # repeat: the determinism check
    assert res.ok, res.failures
    assert res.steps_run == len(case.steps)
    outputs = set(res.findings["output"])
    assert {"indices", "compressed_cache", "tail_ring", "reference-vs-oracle", "determinism"} <= outputs
    assert any(o.startswith("sentinel:") for o in outputs)
    classes = classify_case(case)[0]
    assert classes["empty batch"] >= 3 and classes["zero-length request"] >= 2


def test_input_write_check_sees_writes_into_odd_stride_inputs(device):
    """The input-write check still catches a forward that writes its inputs on these layouts."""
    from kpool.indexer import forward
    from parity.running.runner import run_case

    def scribbler(**kw):
        out = forward(**kw)
        if kw["k"].numel():
            kw["k"].view(-1)[:1] += 1.0
        return out
    res = run_case(empty_case(), device=device, kernel_forward=scribbler)
    bad = res.failures
    assert set(bad["output"]) == {"inputs[kernel]"} and set(bad["region"]) == {"k"}


def test_every_metamorphic_relation_handles_empty_steps(device):
    from parity.checking.metamorphic import RELATIONS, run_relations
    df = run_relations(empty_case(), list(RELATIONS), device=device)
    assert len(df) and set(df["verdict"]) == {"exact"}, df[df["verdict"] != "exact"]


def test_bundle_and_corpus_round_trip_of_empty_steps(tmp_path, device):
    from cases.corpus import load_case, save_case
    from parity.sessions import bundle
    from parity.verbs.replay import replay
    from parity.running.runner import run_case
    from parity.sessions.session import RunOptions, run_cases
    case = empty_case()
    options = RunOptions(device=device, metamorphic=["padding-rows", "captured-replay"])
    (res,) = run_cases([case], options)
    assert res.ok, res.failures
    path = bundle.write_bundle(res, case, str(tmp_path / "b"), options=options)
    done = replay(path, device=device)
    assert done.result.ok and done.identical, done.diff
    assert len(done.bundle.case.steps) == len(case.steps)
    saved, _ = load_case(save_case(case, tmp_path / "corpus"))
    assert run_case(saved, device=device).ok
