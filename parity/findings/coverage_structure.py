"""Coverage classes of issue 19's families 3-5 (structure, unvalidated path, exactness inputs),
counted from each step's metadata by :func:`parity.findings.coverage.classify_case` and reported in their
own section of the coverage report (:data:`FAMILY_CLASSES`), so a reader sees that every
generated run (the ``ci`` profile too) exercised them and how often. The size family runs on
devices only and reports itself (:mod:`parity.running.size_cases`).
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, Tuple

import torch

from cases.unvalidated import runs_unvalidated

INTERP_POOL_BLOCK = 4096
"""The interpreter's largest pool block (``kpool.ops.plan._INTERP_MAX_POOLS``)."""
DECODE_ROWS = 8
"""Requests of at most this many rows are decode-sized (``kpool.ops.plan.DECODE_ROWS``)."""

FAMILY_CLASSES: Tuple[Tuple[str, str], ...] = (
    ("chunk starts at a decode/MTP row", "a score chunk past row 0 starts on a row of a <= 8-row request"),
    ("decode/MTP request across chunks", "a <= 8-row request whose rows span two score chunks"),
    ("same counts, new arrangement", "a step with an earlier step's (R, T) and another order of query lengths"),
    ("row wider than 4096 pools", "a scored row seeing more pools than the interpreter's pool block"),
    ("shared prefix pages", "two requests of one step read the same physical page"),
    ("logical pools > physical rows", "max_pool_seq_len or the step's pools beyond N * B"),
    ("unvalidated stale metadata", "stale slots / positions run through validate=False"),
    ("pooled values on rounding midpoints", "a step whose pooled elements sit on bf16 midpoints"),
    ("merged pools on iso-score lines", "a scored step whose top-k boundary only exact qbar products keep"),
)
"""``(class, meaning)`` of the families' section of the coverage report."""


def family_step_classes(case, step, meta, state: Dict) -> Counter:
    """Family classes of one step (``meta``: its built metadata; ``state``: a dict kept across
    the case's steps, for the arrangements seen)."""
    out: Counter = Counter()
    P, B, N = case.config.index_kpool, case.geometry.page_size, case.geometry.num_pages
    cum = [int(c) for c in meta.cum_query_lens.tolist()]
    starts = [0] + cum[:-1]
    qlens = tuple(e - s for s, e in zip(starts, cum))
    t_live = cum[-1] if cum else 0
    rows = step.max_score_rows
    if step.compute_topk and rows and rows < t_live:
        for c in range(rows, t_live, rows):
            r = next(i for i, e in enumerate(cum) if e > c)
            if qlens[r] <= DECODE_ROWS:
                out["chunk starts at a decode/MTP row"] += 1
                if starts[r] < c:
                    out["decode/MTP request across chunks"] += 1
    key = (len(qlens), int(meta.positions.shape[0]))
    seen = state.setdefault("arrangements", {})
    if any(q != qlens and sorted(q) == sorted(qlens) for q in seen.get(key, ())):
        out["same counts, new arrangement"] += 1
    seen.setdefault(key, set()).add(qlens)
    pools = meta.seq_lens.to(torch.int64)
    if step.compute_topk and t_live and int(pools.max()) > INTERP_POOL_BLOCK:
        out["row wider than 4096 pools"] += 1
    reads = [set(meta.block_table[r, :-(-int(pools[r]) // B)].tolist()) for r in range(len(cum)) if qlens[r]]
    if any(a & b for i, a in enumerate(reads) for b in reads[i + 1:]):
        out["shared prefix pages"] += 1
    if meta.max_pool_seq_len > N * B or int(pools.sum()) > N * B:
        out["logical pools > physical rows"] += 1
    if runs_unvalidated(step):
        out["unvalidated stale metadata"] += 1
    if "exactness:midpoints" in case.tags:
        out["pooled values on rounding midpoints"] += 1
    if "exactness:iso-scores" in case.tags and step.compute_topk:
        out["merged pools on iso-score lines"] += 1
    return out


def family_lines(classes: Counter) -> list:
    """The report section: one line per :data:`FAMILY_CLASSES` entry, count or NOT EXERCISED."""
    width = max(len(n) for n, _ in FAMILY_CLASSES)
    out = ["  issue 19 families (structure, unvalidated path, exactness inputs):"]
    for name, meaning in FAMILY_CLASSES:
        n = classes.get(name, 0)
        out.append(f"    {name:<{width}}  {n if n else 'NOT EXERCISED':>13}  {meaning}")
    return out
