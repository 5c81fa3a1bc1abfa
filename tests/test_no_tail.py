"""``always_select_tail=False`` (HF's ``index_kpool_always_select_tail=False``, kpool-algorithm.md
§10): the config field, the stateful reference and the whole-history oracle (rows of width
``K_tok`` without the causal tail), and how the runner hands the flag to a kernel."""
from __future__ import annotations

import inspect

import pytest
import torch

from kpool.config import SMALL, KPoolConfig
from kpool.errors import KPoolTypeError
from reference.stateful import forward as reference_forward

from .helpers import small_batch


def test_config_field_validates_and_sets_the_width():
    assert SMALL.always_select_tail is True and SMALL.output_width == SMALL.index_topk + SMALL.index_kpool - 1
    cfg = SMALL.with_(always_select_tail=False)
    assert cfg.output_width == SMALL.index_topk
    for bad in ("no", 0, None, 1):
        with pytest.raises(KPoolTypeError, match="always_select_tail"):
            KPoolConfig(always_select_tail=bad)


def _rows(cfg, *, pack_tail=True, always_select_tail=True, seed=3):
    # positions 6..16 of the middle request cover every tail length; 3 pools selected of up to 4
    caches, kwargs = small_batch(cfg, seed=seed, requests=((0, 7), (6, 11), (3, 6)))
    extra = {} if always_select_tail else {"always_select_tail": False}
    out = reference_forward(pack_tail=pack_tail, **kwargs, **extra)
    return out[:, 0], kwargs


@pytest.mark.parametrize("pack_tail", [True, False])
def test_reference_without_tail_is_the_history_columns_only(pack_tail):
    cfg = SMALL.with_(index_topk=12)
    K, P = cfg.index_topk, cfg.index_kpool
    no_tail, kwargs = _rows(cfg, pack_tail=pack_tail, always_select_tail=False)
    fixed, _ = _rows(cfg, pack_tail=False)
    assert no_tail.shape[1] == K
    # the fixed tail sits at columns >= K_tok: its first K_tok columns are the selection
    assert torch.equal(no_tail, fixed[:, :K])
    pos = kwargs["positions"]
    T_live = int(kwargs["cum_query_lens"][-1])
    tails = 0
    for t in range(T_live):
        tail_start = (int(pos[t]) + 1) // P * P
        got = [x for x in no_tail[t].tolist() if x >= 0]
        assert all(x < tail_start for x in got), (t, got)          # no tail token in any row
        tails += int(pos[t]) + 1 > tail_start
    assert tails >= 3                                             # rows that had a tail to drop


def test_oracle_without_tail_matches_the_reference_on_every_small_seed_case(device):
    from cases.scenarios import seed_cases, without_tail
    from parity.running.runner import run_case
    for case in seed_cases(["small"]):
        if any(s.expect_error for s in case.steps):
            continue        # bad-input steps test validation; the reference stand-in has none
        nt = without_tail(case)
        assert nt.config.output_width == nt.config.index_topk
        # the reference stands in for the kernel: what is checked is reference vs oracle
        res = run_case(nt, device=device, kernel_forward=reference_forward)
        oracle = res.findings[res.findings["output"] == "reference-vs-oracle"]
        assert res.ok and len(oracle) and set(oracle["verdict"]) == {"exact"}, res.failures


def test_an_oracle_that_keeps_the_tail_is_caught(monkeypatch, device):
    """Broken on purpose: the oracle ignores always_select_tail -> reference-vs-oracle fails."""
    from cases.scenarios import decode_tail, without_tail
    from parity.running.runner import run_case
    from reference import oracle as oracle_mod
    step = oracle_mod.HistoryOracle.step

    def keeps_tail(self, **kwargs):
        kwargs["always_select_tail"] = True
        out = step(self, **kwargs)
        if out.indices is not None:          # width K_tok + P - 1 rows, tail included
            out.indices = out.indices[..., :kwargs["index_topk"]]
        return out
    monkeypatch.setattr(oracle_mod.HistoryOracle, "step", keeps_tail)
    res = run_case(without_tail(decode_tail("small")), device=device, kernel_forward=reference_forward)
    assert "reference-vs-oracle" in set(res.failures["output"])


def test_runner_passes_the_flag_to_the_kernel_only_for_a_no_tail_case(device):
    """A tail case never passes the keyword; a no-tail case does, so a kernel forward without it
    fails loudly (a crash naming the keyword) instead of returning tail rows of the wrong width."""
    from cases.scenarios import prefill_topk, without_tail
    from kpool.indexer import forward as kernel_forward
    from parity.running.runner import run_case
    seen = []

    def spy(**kwargs):
        seen.append(kwargs.get("always_select_tail", "absent"))
        kwargs.pop("max_score_rows", None)             # a kernel-only knob (chunked scoring)
        return reference_forward(**kwargs)
    assert run_case(prefill_topk("small"), device=device, kernel_forward=spy).ok
    assert set(seen) == {"absent"}
    seen.clear()
    assert run_case(without_tail(prefill_topk("small")), device=device, kernel_forward=spy).ok
    assert set(seen) == {False}
    res = run_case(without_tail(prefill_topk("small")), device=device, kernel_forward=kernel_forward)
    if "always_select_tail" in inspect.signature(kernel_forward).parameters:
        assert res.ok, res.failures                            # the kernel-side work has landed
    else:
        crash = res.failures[res.failures["verdict"] == "crash"]
        assert len(crash) and crash["detail"].str.contains("always_select_tail").any(), res.failures
