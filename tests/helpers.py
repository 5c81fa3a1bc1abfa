"""Small builders shared by the unit tests (not a public API)."""
from __future__ import annotations

import math

import torch

from kpool.cache import allocate_caches
from kpool.config import SMALL, KPoolConfig
from kpool.metadata import BatchSpec, RequestSpec, build_metadata


def small_batch(config: KPoolConfig, *, device="cpu", seed=0, page_size=2, num_pages=16,
                requests=((0, 7), (0, 10), (3, 6)), num_tokens=None):
    """A valid multi-request batch with permuted pages: returns ``(caches, kwargs)`` where
    ``kwargs`` is a complete keyword set for ``forward`` (inputs + metadata + config)."""
    g = torch.Generator().manual_seed(seed)
    P = config.index_kpool
    pages = torch.randperm(num_pages, generator=g).tolist()
    specs = []
    for i, (cached, qlen) in enumerate(requests):
        need = -(-((cached + qlen) // P) // page_size)
        specs.append(RequestSpec(cached, qlen, pages[:need] or [pages[0]], ring_block=len(requests) - 1 - i))
        pages = pages[need:]
    meta = build_metadata(BatchSpec(specs, num_tokens=num_tokens), index_kpool=P,
                          ring_capacity=config.ring_capacity, page_size=page_size, device=device)
    caches = allocate_caches(config, num_pages=num_pages, page_size=page_size,
                             num_tail_blocks=len(requests) + 1, guard=8, device=device)
    return caches, random_forward_kwargs(config, meta, caches, g, device)


def random_forward_kwargs(config: KPoolConfig, meta, caches, g: torch.Generator, device="cpu") -> dict:
    """A complete keyword set for ``forward``: random ``k, gate, q, weights, ape`` drawn from
    ``g`` in that order, the caches' views, the metadata and the config."""
    D, H, P = config.index_head_dim, config.index_n_heads, config.index_kpool
    T = meta.num_tokens
    return dict(
        k=torch.randn(T, D, generator=g).to(device), gate=torch.randn(T, D, generator=g).to(device),
        q=torch.randn(T, H, D, generator=g).bfloat16().to(device),
        weights=torch.randn(T, H, generator=g).to(device), ape=torch.randn(P, D, generator=g).to(device),
        compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
        index_topk=config.index_topk, index_kpool=P, **meta.forward_kwargs())


def padded_batch(num_tokens=12, stale=True):
    """Request 0: positions 0..6 (pages [3, 5], ring block 1); request 1: positions 2..4 (page
    [1], ring block 0); FULL-mode padding rows 10, 11 with stale positive ring slots."""
    return BatchSpec([RequestSpec(0, 7, [3, 5], ring_block=1), RequestSpec(2, 3, [1], ring_block=0)],
                     num_tokens=num_tokens, full_mode=True, stale_tail_slots=stale)


def index_rows():
    """SMALL rows of one 7-token request (positions 0..6) and 2 padding rows, arbitrary values:
    ``(metadata, int32 [9, 1, W])``."""
    P, C, W = SMALL.index_kpool, SMALL.ring_capacity, SMALL.output_width
    meta = build_metadata(BatchSpec([RequestSpec(0, 7, [0, 1], 0)], num_tokens=9),
                          index_kpool=P, ring_capacity=C, page_size=2)
    ref = torch.arange(9 * W, dtype=torch.int32).reshape(9, 1, W) % 50
    ref[7:] = -1
    return meta, ref


def compare_rows(kernel, ref, meta, pack_tail=True, **kw):
    """:func:`parity.checking.compare.compare_indices` of SMALL rows (:func:`index_rows`)."""
    from parity.checking import compare as cmp
    return cmp.compare_indices(kernel, ref, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
                               index_topk=SMALL.index_topk, index_kpool=SMALL.index_kpool, pack_tail=pack_tail,
                               compute_topk=True, **kw)


def is_small_case(case, *, steps=3, rows=24, requests=3) -> bool:
    """Whether a shrunk case is small: at most ``steps`` steps, ``requests`` requests and
    ``rows`` live rows per step."""
    return (len(case.steps) <= steps and all(len(s.batch.requests) <= requests for s in case.steps)
            and all(sum(r.query_len for r in s.batch.requests) <= rows for s in case.steps))


def assert_planted_fault_found_and_shrunk(kind: str, name: str, device, corpus_dir) -> None:
    """The current profile's budget of generated ``kind`` cases ("batch" or "engine") finds the
    planted fault ``name`` (:mod:`parity.implementations.mutants`) with its expected verdict and shrinks it to a
    small case; the saved corpus entry fails on the mutant and passes on the real kernels."""
    from cases.corpus import describe, load_case
    from cases.profiles import current_profile
    from parity.running.generated import ParityFailure, run_generated
    from parity.implementations.mutants import expected_verdict, load_mutant
    from parity.running.runner import run_case

    mutant = load_mutant(name)
    prof = current_profile()
    examples = prof.batch_examples if kind == "batch" else prof.engine_examples
    # within the profile's budget: the same example count as the passing run
    # guaranteed=False: the fixed coverage cases would catch it before the generator and the
    # shrinker, which are what this search tests. Shrinking is bounded by the count alone
    # (shrink_s=inf): the time safety net would make the shrunk size depend on the machine's load
    out = run_generated(kind, device=device, kernel_forward=mutant.forward, repeat_every=0,
                        collect_coverage=False, examples=examples, shrink_s=math.inf,
                        shrink_calls=prof.fault_shrink_calls, corpus_dir=corpus_dir,
                        corpus_info={"expect": f"fail:{name}"}, guaranteed=False)
    assert isinstance(out.error, ParityFailure), out.error
    print("\n".join(describe(out.case)))
    assert expected_verdict(name) in set(out.result.failures["verdict"])
    assert is_small_case(out.case), describe(out.case)
    case, info = load_case(out.saved)
    assert info["expect"] == f"fail:{name}"
    assert not run_case(case, device=device, kernel_forward=mutant.forward).ok
    assert run_case(case, device=device).ok


def assert_generated_run_covers(kind: str, device, capsys, *, min_passed: int, classes,
                                complete_residues: bool = False) -> None:
    """The current profile's budget of generated ``kind`` cases ("batch" or "engine") passes,
    prints its coverage, runs at least ``min_passed`` examples and exercises every one of
    ``classes`` (:mod:`parity.findings.coverage` class names). ``complete_residues``: the
    report also says every chunk residue ``0..P-1`` of every P the run drew was seen (the
    guaranteed-coverage cases' job; it said otherwise before them)."""
    from parity.running.generated import run_generated
    out = run_generated(kind, device=device)
    text = "\n".join(out.coverage.lines())
    with capsys.disabled():
        print("\n" + text)
    assert out.ok, out.error
    assert out.passed_examples >= min_passed
    for cls in classes:
        assert out.coverage.classes[cls] > 0, cls
    if complete_residues:
        assert out.coverage.residues, text
        for P, seen in out.coverage.residues.items():
            assert seen == set(range(P)), (P, text)
            assert f"chunk residues cached%P at P={P}: {P}/{P} seen (complete)" in text


def parity_cli(*args, timeout=600):
    """``python -m parity ARGS`` in a fresh process on the CPU interpreter, from the repository
    root (this checkout's packages first); the :class:`subprocess.CompletedProcess` with text."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), KPOOL_DEVICE="cpu")
    return subprocess.run([sys.executable, "-m", "parity", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
