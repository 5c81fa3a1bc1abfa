"""Stateful engine sequences (cases.engine, cases.strategies.engine_cases, parity.running.generated,
cases.profiles).

* the engine model: admission, page and ring-block reuse through LIFO free lists, prefix resumes
  sharing full pages (and forking the oracle), MTP acceptance and replay, rejected steps;
* the ``ci`` budget of generated engine sequences passes, lockstep, reference checked against the
  whole-history oracle after every step;
* planted faults: the C01 ring stash gated on the pool slot, a padding slot -1 used as an index,
  and the C21 configuration fault (ring capacity P with MTP-2: kernels and reference agree, only
  the oracle can tell) are found within the ``ci`` fault budget and shrink to small cases;
* profiles: no wall-clock deadline (a slow example is a warning; :class:`parity.running.generated.JitClock`
  takes compile time out of it), a flaky example is an outcome, shrinking is bounded.

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_engine.py``.
"""
from __future__ import annotations

import math

import pytest

from cases.engine import Action, EngineSim, FullMode
from cases.genvalues import ValueSpec
from kpool.config import KPoolConfig
from kpool.errors import KPoolBlockIdError
from tests.helpers import (assert_generated_run_covers, assert_planted_fault_found_and_shrunk,
                           is_small_case)

CFG = KPoolConfig(index_n_heads=1, index_head_dim=4, index_kpool=4, index_topk=8, num_speculative_tokens=2)


def _sim(pages=12, blocks=3, max_pages=3, page_size=2, picks=None):
    picks = list(picks or [])
    return EngineSim(CFG, page_size=page_size, num_pages=pages, num_ring_blocks=blocks, max_pages=max_pages,
                     pick=lambda n: picks.pop(0) % n if picks else 0)


# ---- the engine model ---------------------------------------------------------------------------

def test_admit_grow_finish_and_reuse():
    sim = _sim(picks=[2, 0, 5, 1])
    a = sim.admit()                                     # ring block 2 (pick 2 of [0, 1, 2])
    step = sim.step([Action(a, 9)], name="prefill")     # 9 tokens: 2 pools -> ceil(9 / 8) = 2 pages
    req = step.batch.requests[0]
    assert (req.cached_len, req.query_len, req.ring_block) == (0, 9, 2)
    assert req.block_table == [0, 6]                    # picks 0 then 5 of the shrinking free list
    sim.finish(a)
    assert sim.free_ring[0] == 2 and sim.free_pages[:2] == [6, 0]      # LIFO: freed first
    b = sim.admit()                                     # pick 1 -> ring block... free list [2, 0, 1]
    sim.step([Action(b, 1)], name="decode")
    assert sim.requests[b].ring_block == 0
    sim2 = _sim()
    c = sim2.admit()
    sim2.finish(c)
    sim2.admit()
    assert sim2.events["reuse-ring"] == 1 and sim2.events["finish"] == 1


def test_prefix_resume_shares_full_pages_and_forks_the_oracle():
    sim = _sim()
    src = sim.admit()
    sim.step([Action(src, 13)], name="prefill")        # 3 pools, B=2: page 0 is complete
    assert sim.complete_pages(src) == 1
    dst = sim.admit(fork_from=src, shared_pages=1)
    assert sim.requests[dst].committed == 8 and sim.requests[dst].pages == sim.requests[src].pages[:1]
    step = sim.step([Action(dst, 3), Action(src, 1)], name="resume")
    assert step.forks == ((src, dst, 8),) and step.batch.requests[0].cached_len == 8
    sim.finish(src)
    assert sim.requests[dst].pages[0] not in sim.free_pages           # still referenced by dst
    with pytest.raises(ValueError):
        sim.admit(fork_from=dst, shared_pages=5)


def test_mtp_acceptance_replay_and_rejected_steps():
    sim = _sim()
    r = sim.admit()
    sim.step([Action(r, 6)], name="prefill")
    sim.step([Action(r, 3, accepted=0)], name="verify")     # rows 6, 7, 8; only 6 kept
    assert sim.requests[r].committed == 7 and sim.events["mtp-rejection"] == 1
    replay = sim.step([Action(r, 3)], name="replay")
    assert replay.batch.requests[0].cached_len == 7         # replays from the first rejected position
    with pytest.raises(ValueError):
        sim.step([Action(r, 2, accepted=2)], name="too-many")
    bad = sim.step([Action(r, 1)], name="bad", expect_error=KPoolBlockIdError)
    assert bad.expect_error is KPoolBlockIdError and sim.requests[r].committed == 10
    full = sim.step([Action(r, 1)], name="full", full=FullMode(pad_rows=2, padded_requests=1, stale=True))
    b = full.batch
    assert (b.num_tokens, b.full_mode, b.num_padded_requests, b.block_table_width, b.stale_tail_slots) == \
        (3, True, 1, 3, True)


def test_engine_case_runs_clean_through_the_harness(device):
    """A hand-driven engine sequence over one cache pair: prefill, MTP verify with rejection and
    replay, FULL replay with padding, finish + reuse of the ring block by a prefix resume."""
    from parity.running.runner import run_case
    sim = _sim(pages=14, blocks=3, max_pages=4)
    a = sim.admit()
    v = lambda i: ValueSpec(family="random", seed=i)     # noqa: E731
    sim.step([Action(a, 9)], name="prefill", inputs=v(1))
    b = sim.admit()
    sim.step([Action(b, 5), Action(a, 3, accepted=1)], name="verify+prefill", inputs=v(2))
    sim.step([Action(a, 2), Action(b, 1)], name="replay", inputs=v(3), full=FullMode(pad_rows=2, stale=True))
    c = sim.admit(fork_from=a, shared_pages=1)
    sim.finish(b)
    d = sim.admit()
    sim.step([Action(c, 4), Action(d, 2), Action(a, 0)], name="resume+reuse", inputs=v(4), compute_topk=False)
    sim.step([Action(d, 1), Action(c, 1), Action(a, 1)], name="decode", inputs=v(5))
    case = sim.build("hand-engine")
    assert sim.events["reuse-ring"] >= 1 and sim.events["fork"] == 1 and sim.events["mtp-rejection"] == 1
    res = run_case(case, device=device)
    assert res.ok, res.failures
    assert (res.findings["output"] == "reference-vs-oracle").sum() == len(case.steps)


# ---- generated engine sequences (the ci budget) -------------------------------------------------

@pytest.mark.integration
def test_generated_engine_sequences_pass_and_report_coverage(device, warm_kernels, capsys):
    assert_generated_run_covers("engine", device, capsys, min_passed=8, classes=(
        "pool-boundary decode", "padding rows", "cache-only step", "zero-length request",
        "MTP rejection + replay", "ring block reuse", "empty batch"))


@pytest.mark.integration
@pytest.mark.parametrize("name", ["ring-stash-gated-on-pool-slot", "padding-slot-minus-one"])
def test_planted_fault_found_by_engine_sequences_and_shrunk(name, device, warm_kernels, tmp_path):
    assert_planted_fault_found_and_shrunk("engine", name, device, tmp_path)


@pytest.mark.integration
def test_undersized_ring_found_only_by_the_oracle(device, warm_kernels):
    """C21 as a configuration fault: MTP-2 with a 4-slot ring. Kernels and reference agree (both
    lose the committed token), so only the whole-history oracle reports it; the shrunk case is an
    MTP rejection followed by a replay that completes the open pool. The generator and the
    shrinker find it (``guaranteed=False``, as the planted-fault searches: the fixed coverage cases
    pass on an undersized ring and only cost time)."""
    from cases.corpus import describe
    from parity.running.generated import ParityFailure, run_generated
    from cases.profiles import current_profile
    from cases.strategies import scaled

    prof = current_profile()
    bounds = scaled(prof.bounds, undersized_ring=True, kpools=(2,), max_live=1, verify_weight=6)
    out = run_generated("engine", device=device, bounds=bounds, repeat_every=0, collect_coverage=False,
                        examples=prof.fault_examples, shrink_s=math.inf,      # count-bounded only (no clock)
                        shrink_calls=prof.fault_shrink_calls, guaranteed=False)
    assert isinstance(out.error, ParityFailure), out.error
    print("\n".join(describe(out.case)))
    bad = out.result.failures
    assert set(bad["output"]) == {"reference-vs-oracle"}, bad
    assert is_small_case(out.case)
    from parity.findings.coverage import classify_case
    assert classify_case(out.case)[0]["MTP rejection + replay"] > 0


# ---- empty steps, guaranteed coverage ---------------------------------------------------------

@pytest.mark.integration
def test_generated_sequences_draw_empty_steps_and_count_them(device):
    """Every profile draws empty steps (``Bounds.empty_steps``), the ``ci`` profile included; they
    pass on both sides and the coverage report counts them."""
    from parity.running.generated import run_generated
    from cases.profiles import PROFILES, load_profile
    assert all(p.bounds.empty_steps for p in PROFILES.values())
    out = run_generated("engine", device=device, profile=load_profile("ci"), examples=4, guaranteed=False)
    assert out.ok, out.error
    assert out.coverage.classes["empty batch"] > 0


def test_guaranteed_cases_cover_empty_steps_and_every_residue(device):
    """The fixed cases every generated run checks first: empty steps, a NaN pool and a rejected
    ring block (engine) and chunk starts at every residue ``0..P-1`` and every tail length, for
    every P the bounds allow (batch)."""
    from parity.findings.coverage import Coverage
    from cases.coverage_cases import guaranteed_cases
    from cases.profiles import PROFILES
    for prof in PROFILES.values():
        for kind in ("batch", "engine"):
            cov = Coverage()
            for case in guaranteed_cases(kind, prof.bounds):
                cov.add(case)
            if kind == "engine":
                assert cov.classes["empty batch"] >= 3 and cov.classes["zero-length request"] >= 2
                for cls in ("NaN cache row", "NaN score", "bad metadata rejected"):
                    assert cov.classes[cls] >= 1, (prof.name, cls)
                continue
            assert sorted(cov.residues) == sorted(prof.bounds.kpools)
            for P in prof.bounds.kpools:
                assert cov.residues[P] == set(range(P)), (prof.name, P)
                assert cov.tails[P] == set(range(P)), (prof.name, P)


# ---- profiles -----------------------------------------------------------------------------------

def test_profiles_have_no_wall_clock_deadline():
    """No deadline anywhere (issue 9 point 4): hypothesis deadlines are off in every registered
    profile and the ci order is fixed by a seed, not by the test function's source."""
    from hypothesis import settings

    from cases.profiles import PROFILES, load_profile
    for name, prof in PROFILES.items():
        load_profile(name)
        assert settings.default.deadline is None
    assert PROFILES["ci"].seed is not None and PROFILES["ci"].derandomize
    assert PROFILES["dev"].seed is None and not PROFILES["dev"].derandomize
    assert PROFILES["device"].engine_examples > PROFILES["ci"].engine_examples
    load_profile()                                       # back to $HYPOTHESIS_PROFILE / ci
    with pytest.raises(KeyError):
        load_profile("nope")


def test_jit_clock_counts_compile_time_only():
    """The clock adds the time between a compile's two hooks and nothing else: a fake clock
    (no sleeping, no timing window) gives the exact seconds."""
    from parity.running.generated import warmup
    try:
        from triton import knobs
    except ImportError:
        pytest.skip("this Triton has no knobs")
    ticks = iter([10.0, 10.25, 11.0, 13.5])
    clock = warmup.JitClock(now=lambda: next(ticks))
    # hooks already there (the run's compile counter, parity.reporting.compiles) are chained, then restored
    before = (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook)
    with clock:
        knobs.runtime.jit_cache_hook(key=None)          # t = 10.0
        knobs.runtime.jit_post_compile_hook(key=None)   # t = 10.25: 0.25 s compiling
        knobs.runtime.jit_post_compile_hook(key=None)   # no compile started: not counted
        knobs.runtime.jit_cache_hook(key=None)          # t = 11.0
        knobs.runtime.jit_post_compile_hook(key=None)   # t = 13.5: 2.5 s
    assert clock.compiles == 2 and clock.seconds == 2.75
    assert (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) == before


@pytest.mark.integration
def test_slow_example_is_a_warning_not_a_failure(device, warm_kernels):
    from dataclasses import replace

    from parity.running.generated import run_generated
    from cases.profiles import current_profile
    prof = replace(current_profile(), slow_example_s=0.0)
    out = run_generated("batch", device=device, profile=prof, examples=2, repeat_every=0, shrink_s=1,
                        collect_coverage=False, guaranteed=False)
    assert out.ok, out.error
    assert len(out.slow) == out.examples and "net of Triton compilation" in out.slow[0]


@pytest.mark.integration
def test_flaky_failure_is_an_outcome_not_a_traceback(device):
    """A kernel that fails an example once and passes its replay makes hypothesis raise
    ``FlakyFailure`` (an ``ExceptionGroup``); the run reports it, with the case, as ``flaky``."""
    from parity.running.generated import error_summary, run_generated
    from cases.profiles import current_profile
    from kpool.indexer import forward

    calls = {"n": 0}

    def flaky(**kw):           # corrupts the first scored call only
        calls["n"] += 1
        out = forward(**kw)
        if out is not None and calls["n"] == 1:
            out.view(-1)[:1] = 12345
        return out
    out = run_generated("batch", device=device, profile=current_profile(), examples=3, repeat_every=0,
                        kernel_forward=flaky, collect_coverage=False, guaranteed=False, shrink_calls=0)
    assert out.failure_kind == "flaky", error_summary(out.error) if out.error else "passed"
    assert out.case is not None and "FlakyFailure" in error_summary(out.error)


def test_shrink_budget_is_restored():
    from hypothesis.internal.conjecture import engine

    from parity.running.generated import shrink_budget
    before = engine.MAX_SHRINKING_SECONDS
    with shrink_budget(3):
        assert engine.MAX_SHRINKING_SECONDS == 3
    assert engine.MAX_SHRINKING_SECONDS == before
