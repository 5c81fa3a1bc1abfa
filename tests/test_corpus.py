"""The corpus of shrunk failures (cases.corpus): format round trip and replay of every entry.

* a case saved as ``<name>.json`` + ``<name>.pt`` loads back to the same steps, metadata and
  exact input bits, and replays identically;
* every entry in ``cases/corpus`` passes on the production kernels, and an entry that documents a
  planted fault (``"expect": "fail:<mutant>"``) still fails with that mutant.

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_corpus.py``.
"""
from __future__ import annotations

import json

import pytest
import torch

from cases import corpus
from cases.engine import Action, EngineSim, FullMode
from cases.genvalues import Special, ValueSpec
from cases.patches import MetadataPatch
from cases.steps import step_metadata
from cases.spec import OutputBufferSpec
from cases.values import make_inputs
from kpool.config import KPoolConfig
from kpool.errors import KPoolBlockIdError
from parity.checking.compare import assert_bitwise_equal, same_bits


def _case():
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=4, index_kpool=2, index_topk=4, num_speculative_tokens=1,
                      score_mode="merged", pack_tail=False)
    sim = EngineSim(cfg, page_size=2, num_pages=10, num_ring_blocks=3, max_pages=4, pick=lambda n: n // 2)
    a = sim.admit()
    sim.step([Action(a, 7)], name="prefill", inputs=ValueSpec("ties", seed=1, pool_seed=3))
    b = sim.admit(fork_from=a, shared_pages=1)
    sim.step([Action(b, 2), Action(a, 2, accepted=0)], name="resume+verify",
             inputs=ValueSpec("random", seed=2, weights_bf16=True, specials=(Special("q", 1, 3, "nan"),)),
             output_buffer=OutputBufferSpec(capacity=6, width=7, row_step=2))
    sim.step([Action(a, 1)], name="bad", inputs=ValueSpec(seed=3), expect_error=KPoolBlockIdError,
             patch=MetadataPatch("ring-block-out-of-range", (0, 99, 3)))
    sim.step([Action(a, 1), Action(b, 1)], name="full", inputs=ValueSpec("exact", seed=4),
             full=FullMode(pad_rows=2, padded_requests=1, stale=True),
             patch=MetadataPatch("stale-padded-lengths", (2, 9, 2)))
    return sim.build("corpus-roundtrip", ape=torch.randn(2, 4, generator=torch.Generator().manual_seed(0)))


def test_round_trip_keeps_steps_metadata_and_input_bits(tmp_path):
    case = _case()
    path = corpus.save_case(case, tmp_path, found_by="test", fault="none", note="round trip")
    assert path.name == "corpus-roundtrip.json" and path.with_suffix(".pt").exists()
    doc = json.loads(path.read_text())
    assert doc["expect"] == "pass" and doc["found_by"] == "test" and doc["format"] == corpus.FORMAT
    assert len(path.read_text().splitlines()) < 120           # small and human-readable
    back, info = corpus.load_case(path)
    assert info["note"] == "round trip" and corpus.mutant_of(info) is None
    assert back.config == case.config and back.geometry == case.geometry and same_bits(back.ape, case.ape)
    assert corpus.describe(back)[1:] != [] and len(back.steps) == len(case.steps)
    for s0, s1 in zip(case.steps, back.steps):
        assert (s0.name, s0.batch, list(s0.request_ids), s0.compute_topk, s0.output_buffer, s0.patch_metadata,
                s0.expect_error, tuple(s0.forks)) == \
               (s1.name, s1.batch, list(s1.request_ids), s1.compute_topk, s1.output_buffer, s1.patch_metadata,
                s1.expect_error, tuple(s1.forks))
        m0, m1 = step_metadata(case, s0), step_metadata(back, s1)
        for name, t in m0.tensors().items():
            assert_bitwise_equal(t, getattr(m1, name), name=str(name))
        i0, i1 = make_inputs(case, s0, m0), make_inputs(back, s1, m1)
        for name in i0:
            w = torch.int16 if i0[name].element_size() == 2 else torch.int32
            assert_bitwise_equal(i0[name].view(w), i1[name].view(w), name=str(name))
    assert corpus.mutant_of({"expect": "fail:ape-reversed"}) == "ape-reversed"


def test_round_trip_replays_identically(tmp_path, device):
    from parity.running.runner import run_case
    case = _case()
    back, _ = corpus.load_case(corpus.save_case(case, tmp_path))
    a, b = run_case(case, device=device), run_case(back, device=device)
    assert a.ok, a.failures
    cols = ["step", "output", "verdict", "mismatches"]
    assert a.findings[cols].astype(str).equals(b.findings[cols].astype(str))


def test_unserialisable_patch_is_refused(tmp_path):
    import dataclasses
    case = _case()
    steps = list(case.steps)
    steps[0] = dataclasses.replace(steps[0], patch_metadata=lambda m: m)
    with pytest.raises(ValueError, match="not serialisable"):
        corpus.save_case(dataclasses.replace(case, steps=steps), tmp_path)


ENTRIES = corpus.entries()


@pytest.mark.parametrize("path", ENTRIES, ids=[p.stem for p in ENTRIES])
def test_corpus_entry_replays(path, device):
    """Every kept case passes on the production kernels, and a planted-fault entry still catches
    its mutant (``make test`` runs this file before the rest of tests/, ``make parity`` runs the
    corpus suite first)."""
    from parity.implementations.mutants import load_mutant
    from parity.running.runner import run_case
    case, info = corpus.load_case(path)
    res = run_case(case, device=device)
    assert res.ok, res.failures[["step", "output", "verdict", "detail"]].to_string()
    mutant = corpus.mutant_of(info)
    if mutant:
        assert not run_case(case, device=device, kernel_forward=load_mutant(mutant).forward).ok


def test_corpus_directory_is_not_empty():
    assert ENTRIES, "cases/corpus holds the shrunk planted-fault cases; regenerate with python -m parity.verbs.grow"
