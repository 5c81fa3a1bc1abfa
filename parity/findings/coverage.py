"""Coverage accounting of generated (and any other) cases: which input classes a run exercised
(kpool-algorithm.md §9 pitfalls, §11 "Harness scenarios"; public-cases.md fault kinds).

:func:`classify_case` replays a case's metadata and inputs through a fresh
:class:`reference.oracle.HistoryOracle` (pools only, no selection) and scores every scored row
against the logical pools with :mod:`reference.numerics`, so value-dependent classes (ties at the
top-k boundary, NaN / inf scores, NaN cache rows) are counted from the real numbers, not from the
generator's intent. :class:`Coverage` sums the classes of many cases and reports, for each
required class, how often it was hit, plus the tail lengths ``0..P-1`` and chunk-start residues
``0..P-1`` seen per pool size, so a reader sees what was and was not tested.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Dict, Iterable, List, Tuple

import torch

from cases.steps import step_metadata
from cases.values import case_ape, make_inputs, row_requests
from reference.numerics import LOWEST, canonical_topk, pool_scores, sanitize_scores, visible_pools
from reference.oracle import HistoryOracle

from .coverage_families import FAMILY_REQUIRED, input_classes, score_classes
from .coverage_structure import family_lines, family_step_classes

REQUIRED: Tuple[Tuple[str, str], ...] = (
    ("pool-boundary decode", "decode row whose token completes a pool ((p+1) % P == 0)"),
    ("mid-chunk pool completion", "a pool completed by a non-last row of a multi-row chunk"),
    ("visible=0", "scored row with no complete pool (tail only)"),
    ("visible<K", "scored row with 0 < visible < K_pool (all pools selected)"),
    ("visible=K", "scored row with exactly K_pool visible pools"),
    ("visible>K", "scored row with more than K_pool visible pools (selection drops pools)"),
    ("tie at top-k boundary", "rank K_pool and K_pool+1 have bitwise-equal valid scores"),
    ("tie inside selection", "two selected pools with bitwise-equal scores (order by pool id)"),
    ("near-tie at boundary", "ranks K_pool, K_pool+1 within 2^-7 relative, not equal"),
    ("NaN score", "a visible pool's raw score is NaN (sanitized to LOWEST)"),
    ("inf score", "a visible pool's raw score is +-inf"),
    ("NaN/inf in q or weights", "non-finite query or head weight on a live row"),
    ("NaN cache row", "a compressed pool holds NaN"),
    ("padding rows", "FULL-mode rows past T_live"),
    ("stale ring slots on padding", "padding rows carry positive stale ring slots"),
    ("padded requests", "zero-length padded requests in the request metadata"),
    ("stale padded-request lengths", "padded requests carry stale seq lengths (C17)"),
    ("zero-length request", "a live request with no rows in the step"),
    ("cache-only step", "compute_topk=False"),
    ("chunk read from ring", "a chunk starting mid-pool (window read from the ring)"),
    ("MTP rejection + replay", "a request resumed before the end of its previous step's rows"),
    ("prefix resume", "a request forked from a page-aligned prefix of another (garbage ring)"),
    ("ring block reuse", "a finished request's ring block given to a new request"),
    ("page reuse", "a finished request's pages given to a new request"),
    ("output buffer wider than W", "caller buffer with alignment columns"),
    ("bad metadata rejected", "an out-of-range ring block both sides must reject (C05)"),
    ("empty batch", "T == 0 or R == 0"),
    ("merged score mode", "score_mode='merged'"),
    ("fixed tail layout", "pack_tail=False"),
    ("bf16 head weights", "weights passed as bf16"),
)
"""``(class, meaning)`` every generated budget should hit; :meth:`Coverage.missing` lists the misses
(with the issue 19 family classes of :data:`parity.findings.coverage_families.FAMILY_REQUIRED`)."""

NEAR_TIE_REL = 2.0 ** -7


def _visible_class(v: int, K: int) -> str:
    if v == 0:
        return "visible=0"
    return "visible<K" if v < K else ("visible=K" if v == K else "visible>K")


def classify_case(case) -> Tuple[Counter, Dict[int, set], Dict[int, set]]:
    """Input classes of one case.

    Args:
        case: :class:`cases.spec.Case` (inputs from ``step.inputs`` or :mod:`cases.values`).

    Returns:
        ``(classes, tails, residues)``: a ``Counter`` of class names (:data:`REQUIRED` names plus
        ``P=.``, ``B=.`` labels), and per pool size ``P`` the sets of tail lengths ``(p+1) % P`` of
        scored rows and of chunk-start residues ``cached_len % P`` of mid-sequence chunks.
    """
    cfg = case.config
    P, K = cfg.index_kpool, cfg.topk_pools
    classes: Counter = Counter({f"P={P}": 1, f"B={case.geometry.page_size}": 1})
    tails: Dict[int, set] = defaultdict(set)
    residues: Dict[int, set] = defaultdict(set)
    if cfg.score_mode == "merged":
        classes["merged score mode"] += 1
    if not cfg.pack_tail:
        classes["fixed tail layout"] += 1
    for tag in case.tags:
        for event, label in (("fork", "prefix resume"), ("reuse-ring", "ring block reuse"),
                             ("reuse-pages", "page reuse")):
            if tag.startswith(f"engine:{event}="):
                classes[label] += int(tag.split("=")[1])
    ape = case_ape(case)
    oracle = HistoryOracle(index_kpool=P)
    last_end: Dict[int, int] = {}
    family_state: dict = {}
    for step in case.steps:
        meta = step_metadata(case, step)
        if step.expect_error is None:
            classes.update(family_step_classes(case, step, meta, family_state))
        T, T_live = meta.num_tokens, meta.num_live_tokens
        if step.expect_error is not None:
            classes["bad metadata rejected"] += 1
            continue
        batch = step.batch
        if T == 0 or meta.num_requests == 0:
            classes["empty batch"] += 1
        if T > T_live:
            classes["padding rows"] += 1
            if batch.stale_tail_slots:
                classes["stale ring slots on padding"] += 1
        if batch.num_padded_requests:
            classes["padded requests"] += 1
            if step.patch_metadata is not None and "stale-padded" in repr(step.patch_metadata):
                classes["stale padded-request lengths"] += 1
        if not step.compute_topk:
            classes["cache-only step"] += 1
        if step.output_buffer is not None and step.output_buffer.width > cfg.output_width:
            classes["output buffer wider than W"] += 1
        for rid, req in zip(step.request_ids, batch.requests):
            if req.query_len == 0:
                classes["zero-length request"] += 1
                continue
            if req.cached_len > 0:
                residues[P].add(req.cached_len % P)
                if req.cached_len % P:
                    classes["chunk read from ring"] += 1
            if rid in last_end and req.cached_len < last_end[rid]:
                classes["MTP rejection + replay"] += 1
            last_end[rid] = req.cached_len + req.query_len
            for p in range(req.cached_len, req.cached_len + req.query_len - 1):
                if (p + 1) % P == 0:
                    classes["mid-chunk pool completion"] += 1
        inputs = make_inputs(case, step, meta)
        classes.update(input_classes(step, inputs, ape, meta, P, case.geometry))
        q, w = inputs["q"], inputs["weights"]
        if step.compute_topk and w.dtype == torch.bfloat16:
            classes["bf16 head weights"] += 1
        if step.compute_topk and T_live and not (torch.isfinite(q[:T_live].float()).all()
                                                 and torch.isfinite(w[:T_live].float()).all()):
            classes["NaN/inf in q or weights"] += 1
        if T_live:
            for src, dst, upto in step.forks:
                oracle.fork(src, dst, upto)
            oracle.step(request_ids=list(step.request_ids), k=inputs["k"], gate=inputs["gate"], q=q, weights=w,
                        ape=ape, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
                        raw_seq_lens=meta.raw_seq_lens, seq_lens=meta.seq_lens, slot_mapping=meta.slot_mapping,
                        max_pool_seq_len=meta.max_pool_seq_len, index_topk=cfg.index_topk, index_kpool=P,
                        compute_topk=False)
        for rid in step.request_ids:
            if any(torch.isnan(v.float()).any() for v in oracle.pools.get(rid, {}).values()):
                classes["NaN cache row"] += 1
                break
        if not step.compute_topk or not T_live:
            continue
        req_of = row_requests(meta)
        qlens = [r.query_len for r in batch.requests]
        selected = min(K, meta.max_pool_seq_len)
        for t in range(T_live):
            r = int(req_of[t])
            rid, p = step.request_ids[r], int(meta.positions[t])
            vis = visible_pools(p, int(meta.seq_lens[r]), P)
            classes[_visible_class(vis, K)] += 1
            tails[P].add((p + 1) % P)
            if qlens[r] == 1 and (p + 1) % P == 0:
                classes["pool-boundary decode"] += 1
            if vis == 0 or selected == 0:
                continue
            pools = torch.stack([oracle.pools[rid][j] for j in range(vis)])
            raw = pool_scores(q[t:t + 1], w[t:t + 1], pools, cfg.score_mode)[0]
            classes.update(score_classes(raw))
            if torch.isnan(raw).any():
                classes["NaN score"] += 1
            if torch.isinf(raw).any():
                classes["inf score"] += 1
            san = sanitize_scores(raw[None], torch.tensor([vis]))[0]
            ids, valid = canonical_topk(san[None], min(selected, vis))
            top = [float(san[j]) for j, ok in zip(ids[0].tolist(), valid[0].tolist()) if ok]
            if len(set(top)) < len(top):
                classes["tie inside selection"] += 1
            if vis > selected and top and len(top) == selected:
                rest = sorted((float(s) for s in san.tolist() if s > LOWEST), reverse=True)
                if len(rest) > selected:
                    a, b = rest[selected - 1], rest[selected]
                    if a == b:
                        classes["tie at top-k boundary"] += 1
                    elif math.isfinite(a) and abs(a - b) <= NEAR_TIE_REL * abs(a):
                        classes["near-tie at boundary"] += 1
    return classes, tails, residues


class Coverage:
    """Sum of :func:`classify_case` over a run (module docstring).

    Attributes:
        cases: cases classified. classes: summed ``Counter``. tails / residues: per ``P`` the
        union of tail lengths / chunk residues seen.
    """

    def __init__(self):
        self.cases = 0
        self.classes: Counter = Counter()
        self.tails: Dict[int, set] = defaultdict(set)
        self.residues: Dict[int, set] = defaultdict(set)

    def add(self, case) -> None:
        """Classify ``case`` and add its classes."""
        classes, tails, residues = classify_case(case)
        self.cases += 1
        self.classes.update(classes)
        for P, seen in tails.items():
            self.tails[P] |= seen
        for P, seen in residues.items():
            self.residues[P] |= seen

    @classmethod
    def from_dict(cls, data: dict) -> "Coverage":
        """Inverse of :meth:`to_dict` (``missing`` is recomputed): a shard's coverage for
        :mod:`parity.verbs.merge`."""
        out = cls()
        out.cases = int(data["cases"])
        out.classes = Counter({k: int(v) for k, v in data["classes"].items()})
        for mine, theirs in ((out.tails, data["tail_lengths"]), (out.residues, data["chunk_residues"])):
            for P, seen in theirs.items():
                mine[int(P)] = set(seen)
        return out

    def merge(self, other: "Coverage") -> "Coverage":
        """Add another run's coverage into this one; returns self."""
        self.cases += other.cases
        self.classes.update(other.classes)
        for mine, theirs in ((self.tails, other.tails), (self.residues, other.residues)):
            for P, seen in theirs.items():
                mine[P] |= seen
        return self

    def missing(self) -> List[str]:
        """Required classes (:data:`REQUIRED`) never hit, plus ``tail lengths 0..P-1`` and
        ``chunk residues 0..P-1`` of ``P = 4`` when incomplete."""
        out = [name for name, _ in REQUIRED + FAMILY_REQUIRED if not self.classes.get(name)]
        for label, seen in (("tail lengths", self.tails), ("chunk residues", self.residues)):
            if set(range(4)) - seen.get(4, set()):
                out.append(f"{label} 0..3 at P=4 (seen {sorted(seen.get(4, set()))})")
        return out

    def to_dict(self) -> dict:
        """JSON-able summary."""
        return {"cases": self.cases, "classes": dict(sorted(self.classes.items())),
                "tail_lengths": {str(P): sorted(s) for P, s in sorted(self.tails.items())},
                "chunk_residues": {str(P): sorted(s) for P, s in sorted(self.residues.items())},
                "missing": self.missing()}

    def lines(self) -> List[str]:
        """A plain-text report: one line per required class (count, or ``NOT EXERCISED``), the
        tail lengths and chunk residues per P, and the P / B values seen."""
        out = [f"coverage over {self.cases} generated cases:"]
        width = max(len(n) for n, _ in REQUIRED + FAMILY_REQUIRED)
        for name, meaning in REQUIRED + FAMILY_REQUIRED:
            n = self.classes.get(name, 0)
            out.append(f"  {name:<{width}}  {n if n else 'NOT EXERCISED':>13}  {meaning}")
        for label, per_p in (("tail lengths (p+1)%P", self.tails), ("chunk residues cached%P", self.residues)):
            for P in sorted(per_p):
                seen = per_p[P]
                miss = sorted(set(range(P)) - seen)
                out.append(f"  {label} at P={P}: {len(seen)}/{P} seen"
                           + (f", missing {_ranges(miss)}" if miss else " (complete)"))
        out += family_lines(self.classes)
        for prefix in ("P=", "B="):
            seen = sorted((k for k in self.classes if k.startswith(prefix)), key=lambda k: int(k[2:]))
            out.append(f"  {prefix[0]} values: " + ", ".join(f"{k[2:]} (x{self.classes[k]})" for k in seen))
        return out


def _ranges(values: Iterable[int]) -> str:
    values = sorted(values)
    parts, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def _row_visible_pools(metadata, index_kpool: int) -> torch.Tensor:
    """int64 ``[T_live]``: :func:`reference.numerics.visible_pools` of every live row."""
    T_live = metadata.num_live_tokens
    req = row_requests(metadata)[:T_live]
    seq = metadata.seq_lens.to("cpu", torch.int64)
    return visible_pools(metadata.positions[:T_live].cpu(), seq[req], index_kpool)


def case_stats(case) -> dict:
    """Cost figures of a case, for budgeting interpreter runs.

    Returns:
        dict with ``rows`` (all rows, padding included), ``live_rows``, ``scored_rows``
        (live rows of ``compute_topk`` steps), ``scored_pairs`` (sum of visible pools over scored
        rows: the reference's scoring work), ``kernel_cells`` (``T * max_pool_seq_len`` summed over
        scored steps: the score scratch the kernel fills), ``compressed_pools`` (rows completing a
        pool), ``max_visible`` and ``rows_above_kpool`` (scored rows with visible > K_pool).
    """
    P, K = case.config.index_kpool, case.config.topk_pools
    out = dict(rows=0, live_rows=0, scored_rows=0, scored_pairs=0, kernel_cells=0, compressed_pools=0,
               max_visible=0, rows_above_kpool=0)
    for step in case.steps:
        meta = step_metadata(case, step)
        vis = _row_visible_pools(meta, P)
        out["rows"] += meta.num_tokens
        out["live_rows"] += meta.num_live_tokens
        out["compressed_pools"] += int((meta.slot_mapping >= 0).sum())
        if step.compute_topk:
            out["scored_rows"] += meta.num_live_tokens
            out["scored_pairs"] += int(vis.sum())
            out["kernel_cells"] += meta.num_tokens * meta.max_pool_seq_len
            if vis.numel():
                out["max_visible"] = max(out["max_visible"], int(vis.max()))
                out["rows_above_kpool"] += int((vis > K).sum())
    return out
