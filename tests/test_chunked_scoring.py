"""The chunked score path is exercised by the default run (issue 9 point 5).

The kernel splits its score scratch into token-row chunks (``kpool/indexer.py``,
``max_score_rows``, 256 MiB by default, which no seed case reaches). ``prefill-topk``'s
``chunk-2`` step carries ``max_score_rows`` (:data:`cases.scenarios.CHUNK_ROWS`) through the case
model, so the seed suite scores it in three chunks; the planted fault ``chunk-offset`` (every
chunk's top-k written at rows ``[:n]``) is caught there and nowhere without it.
"""
from __future__ import annotations

import dataclasses

import pytest

from cases.scenarios import CHUNK_ROWS, prefill_topk
from parity.running.runner import run_case


def _chunked_step(case):
    (i,) = [i for i, s in enumerate(case.steps) if s.max_score_rows is not None]
    return i, case.steps[i]


@pytest.mark.parametrize("size", list(CHUNK_ROWS))
def test_seed_case_really_chunks(size):
    """More live rows than ``max_score_rows``, and not a multiple of it (a partial last chunk)."""
    from cases.steps import step_metadata
    case = prefill_topk(size)
    i, step = _chunked_step(case)
    live = step_metadata(case, step).num_live_tokens
    assert step.compute_topk and live > 2 * step.max_score_rows and live % step.max_score_rows


def test_chunk_offset_fault_is_caught_by_the_seed_case_only_when_it_chunks(device):
    from parity.implementations.mutants import expected_verdict, load_mutant
    mutant = load_mutant("chunk-offset").forward
    case = prefill_topk("small")
    i, step = _chunked_step(case)
    res = run_case(case, device=device, kernel_forward=mutant)
    bad = res.failures
    assert expected_verdict("chunk-offset") in set(bad["verdict"]) and set(bad["step"]) == {i}, bad
    # the same case scored in one chunk: the fault is invisible (so the chunking is what catches it)
    steps = list(case.steps)
    steps[i] = dataclasses.replace(step, max_score_rows=None)
    assert run_case(dataclasses.replace(case, steps=steps), device=device, kernel_forward=mutant).ok
    assert run_case(case, device=device).ok


def test_max_score_rows_survives_corpus_and_bundle(tmp_path, device):
    from cases.corpus import load_case, save_case
    from parity.sessions import bundle
    from parity.verbs.replay import replay
    from parity.sessions.session import RunOptions, run_cases
    case = prefill_topk("small")
    i, step = _chunked_step(case)
    back, _ = load_case(save_case(case, tmp_path / "corpus"))
    assert back.steps[i].max_score_rows == step.max_score_rows
    options = RunOptions(device=device, kernel="mutant:chunk-offset")
    (res,) = run_cases([case], options)
    path = bundle.write_bundle(res, case, str(tmp_path / "b"), options=options)
    b = bundle.load_bundle(path)
    assert b.case.steps[i].max_score_rows == step.max_score_rows
    done = replay(path, device=device)
    # the fault reads uninitialized rows: the counts may move, the verdict must not
    assert not done.result.ok and done.verdict_reproduced, done.diff
