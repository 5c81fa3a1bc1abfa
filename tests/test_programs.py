"""Program ids: which kernel and which program of its launch wrote an element (parity-contract.md
§6; :mod:`parity.checking.programs` from the launch plans, :mod:`parity.checking.localize` on findings).

Checked against the real kernels with probe mutants (:func:`parity.implementations.mutants.load_mutant` with an
explicit mutation; probes, not faults) that store their own ``tl.program_id`` instead of their
result, so every written element says which program wrote it.
"""
from __future__ import annotations

import types

import torch

from cases.spec import CacheGeometry, Case, Step
from kpool.config import SMALL
from kpool.metadata import BatchSpec, RequestSpec
from parity.checking.compare import assert_bitwise_equal, bits
from parity.findings.vocabulary import finding
from tests.certificate_cases import D, W, run
from tests.helpers import small_batch

PREFILL = 1000
"""Added to the program id by the prefill score kernel's probe (the decode kernel's is bare)."""

PROBES = {
    # each kernel stores its own program id instead of its result (probe, not a fault)
    "probe-compress": ("ops/compress.py",
                       "tl.store(cache_ptr + dst[:, None] + dims[None, :] * stride_cache_d, bf16_rne_int16(out),",
                       "tl.store(cache_ptr + dst[:, None] + dims[None, :] * stride_cache_d, "
                       "(tl.zeros_like(out) + tl.program_id(0)).to(tl.int16),",
                       None),
    "probe-ring": ("ops/compress.py",
                   "tl.store(tail_ptr + dst[:, None] + dims[None, :] * stride_tail_d, kv, mask=mask)",
                   "tl.store(tail_ptr + dst[:, None] + dims[None, :] * stride_tail_d, tl.zeros_like(kv) + pid, mask=mask)",
                   None),
    "probe-expand": ("ops/expand.py",
                     "tl.store(out_ptr + row0.to(tl.int64) * stride_out_t + out_offs, val,",
                     "tl.store(out_ptr + row0.to(tl.int64) * stride_out_t + out_offs, tl.zeros_like(val) + pid,",
                     None),
    # the key's high word: the decode kernel's program id, or PREFILL + the prefill kernel's
    "probe-score": ("ops/score.py",
                    ("_store_keys(key_row + pools, pools, score_key_hi(score, pools >= vis), pools < max_pool_seq_len)",
                     "_store_keys(key_ptrs, pools[None, :], score_key_hi(acc, pools[None, :] >= vis[:, None]),",
                     "_store_keys(key_ptrs, pools[None, :], tl.full([BLOCK_M, BLOCK_N], KEY_LOWEST_C, tl.int32),",
                     "score_key_hi(score, pools[:, None] >= vis_rows[None, :])"),
                    ("_store_keys(key_row + pools, pools, tl.zeros_like(pools) + tl.program_id(0), pools < max_pool_seq_len)",
                     f"_store_keys(key_ptrs, pools[None, :], tl.full([BLOCK_M, BLOCK_N], {PREFILL}, tl.int32) + pid,",
                     f"_store_keys(key_ptrs, pools[None, :], tl.full([BLOCK_M, BLOCK_N], {PREFILL}, tl.int32) + pid,",
                     "tl.zeros_like(pools)[:, None] + tl.zeros_like(vis_rows)[None, :] + tl.program_id(0)"),
                    None),
}

PAIRS = SMALL.with_(index_kpool=2)
"""P = 2: compression tiles of 128 rows on the interpreter, ring-write tiles of 256, so a program
id computed with the wrong kernel's plan or the wrong ``P`` names another program."""
MIXED = ((0, 150), (5, 3), (0, 110), (2, 1))
"""(cached, query) rows: prefill, MTP-sized, prefill, decode requests (both score kernels)."""


def _probe_batch(torch_device, config=SMALL, requests=((0, 150), (0, 110))):
    """Two requests of 150 and 110 rows by default: 260 live rows -> two compression tiles of 256
    rows on the interpreter (and many ring-write and expansion tiles)."""
    return small_batch(config, requests=requests, num_pages=80, seed=5, device=torch_device)


def _step_view(kw, config):
    """What :func:`parity.checking.localize.localize` reads of a case and of the step's metadata."""
    case = types.SimpleNamespace(config=config, geometry=types.SimpleNamespace(page_size=2))
    meta = types.SimpleNamespace(**{k: kw[k] for k in ("positions", "slot_mapping", "tail_slot_mapping",
                                                       "cum_query_lens", "max_pool_seq_len")})
    return case, meta


def test_program_ids_match_what_the_kernels_report(device, torch_device):
    from parity.checking import programs
    from parity.implementations.mutants import load_mutant
    from kpool.platform import resolve_device
    resolve_device(device)
    P = SMALL.index_kpool
    caches, kw = _probe_batch(torch_device)
    T = kw["positions"].shape[0]
    slots, tslots = kw["slot_mapping"].tolist(), kw["tail_slot_mapping"].tolist()
    seen = set()
    # compression: every written compressed row holds the id of the program that wrote it
    load_mutant("probe-compress", mutation=PROBES["probe-compress"]).forward(**kw)
    for t in range(T):
        if slots[t] >= 0:
            want = programs.cache_update_program(t, num_rows=T, head_dim=D, index_kpool=P, backend=device,
                                                 device=torch_device)
            got = int(bits(caches.compressed_cache.cpu())[slots[t] // 2, slots[t] % 2, 0, 0])
            assert got == want, (t, got, want)
            seen.add(want)
    assert len(seen) > 1, "the probe batch should span several programs"
    # ring write: the K plane of every written ring row
    caches, kw = _probe_batch(torch_device)
    load_mutant("probe-ring", mutation=PROBES["probe-ring"]).forward(**kw)
    C = SMALL.ring_capacity
    for t in (146, 147, 148, 149, 256, 257, 258, 259):              # the last C rows of each request
        want = programs.cache_update_program(t, num_rows=T, head_dim=D, index_kpool=P, backend=device,
                                             kernel="ring_write", device=torch_device,
                                             cum_query_lens=kw["cum_query_lens"].tolist(), ring_capacity=C)
        assert int(bits(caches.tail_cache.cpu())[tslots[t] // C, 0, tslots[t] % C, 0]) == want
    # expansion: every output element
    caches, kw = _probe_batch(torch_device)
    out = load_mutant("probe-expand", mutation=PROBES["probe-expand"]).forward(**kw)[:, 0].cpu()
    want = torch.tensor([[programs.expand_program(t, c, num_rows=T, width=W, backend=device) for c in range(W)]
                         for t in range(T)], dtype=torch.int32)
    assert_bitwise_equal(out, want)


def test_localize_names_the_kernel_and_program_that_wrote_each_cache_element(device, torch_device):
    """:func:`parity.checking.localize.localize` on a finding at every compressed row and ring row the
    probes wrote (P = 2): the kernel it names, the writing row, and the program id stored there."""
    from parity.checking.localize import localize
    from parity.implementations.mutants import load_mutant
    from kpool.platform import resolve_device
    resolve_device(device)
    P, C = PAIRS.index_kpool, PAIRS.ring_capacity
    caches, kw = _probe_batch(torch_device, PAIRS)
    case, meta = _step_view(kw, PAIRS)
    pos, slots, tslots = kw["positions"].tolist(), kw["slot_mapping"].tolist(), kw["tail_slot_mapping"].tolist()
    mutant = load_mutant("probe-compress", mutation=PROBES["probe-compress"])
    mutant.forward(**kw)
    writers = {s: t for t, s in enumerate(slots) if s >= 0 and (pos[t] + 1) % P == 0}
    rows = [finding("compressed_cache", "cache-mismatch", 1, page=s // 2, page_row=s % 2, channel=0) for s in writers]
    localize(rows, case, meta, None, mutant.forward, torch_device)
    stored = bits(caches.compressed_cache.cpu())
    got = [(r["row"], r["kernel"], r["program_id"]) for r in rows]
    assert got == [(t, "compress", int(stored[s // 2, s % 2, 0, 0])) for s, t in writers.items()]
    assert len({p for *_, p in got}) > 1, "the probe batch should span several compression programs"

    caches, kw = _probe_batch(torch_device, PAIRS)
    mutant = load_mutant("probe-ring", mutation=PROBES["probe-ring"])
    mutant.forward(**kw)
    cum = kw["cum_query_lens"].tolist()
    last = [t for end in cum for t in range(end - C, end)]          # the rows each request stashes
    rows = [finding("tail_ring", "ring-mismatch", 1, block=tslots[t] // C, plane=0, slot=tslots[t] % C, channel=0)
            for t in last]
    localize(rows, case, meta, None, mutant.forward, torch_device)
    stored = bits(caches.tail_cache.cpu())
    assert [(r["row"], r["kernel"], r["program_id"]) for r in rows] == \
        [(t, "ring_write", int(stored[tslots[t] // C, 0, tslots[t] % C, 0])) for t in last]


def test_score_programs_match_what_the_score_kernels_report(device, torch_device):
    """Scoring in chunks of 100 rows (``max_score_rows``) of prefill- and decode-sized requests:
    for every live row and pool, :func:`parity.checking.programs.score_kernel` and
    :func:`~parity.checking.programs.score_program` give the kernel, chunk and program that stored its
    key; and a localized index finding's detail names the same three for its pool."""
    from parity.checking import programs
    from parity.checking.localize import localize
    from parity.implementations.mutants import load_mutant
    from kpool.platform import resolve_device
    resolve_device(device)
    caches, kw = _probe_batch(torch_device, SMALL, MIXED)
    cum, T, mps = kw["cum_query_lens"].tolist(), kw["positions"].shape[0], kw["max_pool_seq_len"]
    chunk_rows = 100
    probe = {m: load_mutant("probe-score", mutation=PROBES["probe-score"], module=m)
             for m in ("indexer", "ops.compress", "ops.indexer")}       # localize looks for all three
    score = probe["ops.indexer"]
    stored = {}
    for chunk, row_start in enumerate(range(0, T, chunk_rows)):
        n = min(chunk_rows, T - row_start)
        keys = torch.full((n, mps), -1, dtype=torch.int64, device=torch_device)
        score.score_keys(q=kw["q"], weights=kw["weights"], compressed_cache=caches.compressed_cache,
                         positions=kw["positions"], cum_query_lens=kw["cum_query_lens"], seq_lens=kw["seq_lens"],
                         block_table=kw["block_table"], max_pool_seq_len=mps, index_kpool=SMALL.index_kpool,
                         score_mode=SMALL.score_mode, row_start=row_start, num_rows=n, keys=keys)
        for i, row in enumerate((keys.cpu() >> 32).tolist()):
            for j, high in enumerate(row):
                kernel = "_score_prefill_kernel" if high >= PREFILL else "_score_decode_kernel"
                stored[row_start + i, j] = (kernel, chunk, high % PREFILL)
    named = {(t, j): (programs.score_kernel(t, cum),
                      *programs.score_program(t, j, cum_query_lens=cum, num_rows=T, max_pool_seq_len=mps,
                                              num_heads=SMALL.index_n_heads, head_dim=D, score_mode=SMALL.score_mode,
                                              backend=device, max_score_rows=chunk_rows, device=torch_device))
             for t, j in stored}
    assert named == stored
    assert {k for k, *_ in stored.values()} == {"_score_decode_kernel", "_score_prefill_kernel"}
    assert len({(c, p) for k, c, p in stored.values() if k == "_score_prefill_kernel"}) > 2

    case, meta = _step_view(kw, SMALL)
    sample = [(t, j) for t in range(T) for j in (0, mps - 1)]
    rows = [finding("indices", "wrong-index", 1, row=t, column=0, pool_id=j) for t, j in sample]
    localize(rows, case, meta, None, probe["indexer"].forward, torch_device, max_score_rows=chunk_rows)
    for r, (t, j) in zip(rows, sample):
        kernel, chunk, program = stored[t, j]
        assert f"pool {j} scored by {kernel} in score chunk {chunk}, program {program}" in r["detail"], r


def test_findings_name_the_writing_program(device, torch_device):
    """End to end: the runner's findings for a planted compression fault name the compression
    launch's program; an index finding names the expansion program and the score kernel."""
    from parity.checking import programs
    from parity.implementations.mutants import load_mutant
    from kpool.platform import resolve_device
    resolve_device(device)
    mutant = load_mutant("ape-reversed")
    steps = [Step("prefill", BatchSpec([RequestSpec(0, 60, list(range(8)), 1), RequestSpec(0, 40, list(range(8, 13)), 2)]),
                  request_ids=[0, 1], seed=1)]
    geo = CacheGeometry(num_pages=16, page_size=2, num_tail_blocks=4, guard=8)
    res = run(Case("programs", "small", SMALL, geo, steps, seed=2), mutant.forward, check_oracle=False)
    (cache,) = res.failures[res.failures["output"] == "compressed_cache"].to_dict("records")
    assert cache["kernel"] == "compress" and cache["row"] == 3 and cache["pool_id"] == 0
    assert cache["program_id"] == programs.cache_update_program(3, num_rows=100, head_dim=D,
                                                                index_kpool=SMALL.index_kpool, backend=device,
                                                                device=torch_device)
    idx = res.failures[res.failures["output"] == "indices"].to_dict("records")
    if idx:   # reversed APE changes the pooled keys; if it changes a selection, expansion is named
        r = idx[0]
        assert r["kernel"] == "expand"
        assert r["program_id"] == programs.expand_program(r["row"], r["column"], num_rows=100, width=W, backend=device)
        assert f"scored by {programs.score_kernel(r['row'], [60, 100])}" in r["detail"]
