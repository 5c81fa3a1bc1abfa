"""The reference against the whole-history oracle (parity-contract.md §7): after every step the
stateful reference's index rows and every pool the step wrote must equal what
:class:`reference.oracle.HistoryOracle` computes from each request's whole history, bitwise."""
from __future__ import annotations

from typing import List

from cases.bits import bits

from . import compare as cmp

ORACLE_OUTPUT = "reference-vs-oracle"


def oracle_findings(oracle, case, step, meta, inputs, ape, ref_out, ref_caches) -> List[dict]:
    """parity-contract.md §7: the stateful reference must equal the whole-history oracle bitwise
    (index rows, and every pool the step wrote, read back from the reference's cache)."""
    cfg, B = case.config, case.geometry.page_size
    try:
        for src, dst, upto in getattr(step, "forks", ()):   # prefix-cache resumes (cases.spec.Step.forks)
            oracle.fork(src, dst, upto)
        expect = oracle.step(
            request_ids=list(step.request_ids), k=inputs["k"], gate=inputs["gate"], q=inputs.get("q"),
            weights=inputs.get("weights"), ape=ape, positions=meta.positions,
            cum_query_lens=meta.cum_query_lens, raw_seq_lens=meta.raw_seq_lens, seq_lens=meta.seq_lens,
            slot_mapping=meta.slot_mapping, max_pool_seq_len=meta.max_pool_seq_len,
            index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, score_mode=cfg.score_mode,
            pack_tail=cfg.pack_tail, compute_topk=step.compute_topk,
            num_cache_slots=case.geometry.num_pages * B, always_select_tail=cfg.always_select_tail)
    except Exception as exc:
        return [cmp.crash_finding("oracle", exc, output=ORACLE_OUTPUT)]
    rows = [r for r in cmp.compare_indices(
        ref_out, expect.indices, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
        index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, pack_tail=cfg.pack_tail,
        compute_topk=step.compute_topk, output=ORACLE_OUTPUT)]
    # Pool writes: the last write of each slot wins (row order), as in the cache.
    last = {}
    for rid, j, slot, value in expect.pool_writes:
        last[int(slot)] = (rid, j, value)
    bad, first = 0, None
    cache = ref_caches.compressed_cache
    for slot, (rid, j, value) in last.items():
        diff = (bits(cache[slot // B, slot % B, 0]) != bits(value)).nonzero().flatten()
        if diff.numel():
            bad += int(diff.numel())
            if first is None:
                first = dict(page=slot // B, page_row=slot % B, channel=int(diff[0]), pool_id=j,
                             detail=f"request {rid!r} pool {j}: reference cache differs from the oracle")
    if bad:
        detail = first.pop("detail")
        rows = [r for r in rows if r["verdict"] != "exact"]
        rows.append(cmp.finding(ORACLE_OUTPUT, "cache-mismatch", bad, detail=detail, **first))
    elif rows[0]["verdict"] == "exact":
        rows[0]["detail"] = f"indices and {len(last)} pool writes"
    return rows
