"""``--oracle hf``: Hugging Face as a third implementation, step by step next to the parity run
(issue 13 point 4; docs/hf-oracle.md).

:class:`HFObserver` is a :func:`parity.running.runner.run_case` step observer. It keeps every request's
whole raw history (``{position: (k, gate)}``, latest write wins, prefix forks copied, like
:class:`reference.oracle.HistoryOracle`) and after each step compares the kernel's outputs with
HF's (:mod:`parity.oracles.hf_oracle`, classified by :mod:`parity.oracles.hf_classify`):

* every pooled key the step wrote (compressed cache, read at its slot) against ``bf16(c*)``;
* on scored steps, every live row of every request against HF's row for the same positions,
  HF being called once per request with the request's whole history.

It adds one ``hf:pooled`` and one ``hf:indices`` finding per step (``exact``; ``tie-equivalent``
or ``rounding-boundary`` when a tie or boundary is the only difference; ``wrong-index`` or
``cache-mismatch`` for a real difference) and keeps the per-class counts of every step
(:meth:`HFObserver.table`). Steps it cannot compare (bad-input steps, patched metadata,
``score_mode="merged"``, which HF does not implement) are listed with the reason.
"""
from __future__ import annotations

import bisect
import time
from typing import Dict, List, Optional

import numpy as np
import torch

from ..checking import compare as cmp
from .hf_classify import (POOL_CLASSES, ROW_CLASSES, RequestView, check_hf_pooling, check_hf_scores, classify_pools,
                          classify_row)

TABLE_COLUMNS = ("case", "size", "step", "step_name", "rows", *ROW_CLASSES, "max_tie_ratio", "pooled",
                 *(f"pooled {c}" for c in POOL_CLASSES), "hf_s", "note")
"""Columns of :meth:`HFObserver.table`: compared rows and elements per class; ``max_tie_ratio``
is the largest ``|margin| / bound`` of the step's tie rows (docs/hf-oracle.md §4 step 6)."""
HF_POOLING_BUDGET_ULPS = 32
"""fp32 budget of HF's own pooling on the CPU (torch softmax, products, a P-term sum), the
interpreter's :data:`parity.checking.certificates.ROUNDING_BUDGET_ULPS` entry (docs/hf-oracle.md §3.3)."""


class _History:
    """Raw k/gate of one request by position (latest write wins)."""

    def __init__(self, D: int):
        self.k: Dict[int, torch.Tensor] = {}
        self.gate: Dict[int, torch.Tensor] = {}
        self.D = D

    def window(self, start: int, stop: int):
        """fp32 ``([n, D], [n, D])`` for positions ``start .. stop-1``.

        Raises:
            KeyError: a position never fed.
        """
        missing = [p for p in range(start, stop) if p not in self.k]
        if missing:
            raise KeyError(f"positions {missing[:4]}... never fed" if len(missing) > 4 else f"positions {missing} never fed")
        if stop <= start:
            return torch.zeros(0, self.D), torch.zeros(0, self.D)
        return (torch.stack([self.k[p] for p in range(start, stop)]),
                torch.stack([self.gate[p] for p in range(start, stop)]))


class HFObserver:
    """The HF third opinion for one case (module docstring).

    Args:
        case: the :class:`cases.spec.Case` (its config builds the HF layer).
    """

    def __init__(self, case):
        self.case = case
        self.hf = None
        self.history: Dict[object, _History] = {}
        self.rows: List[dict] = []

    def table(self):
        """pandas DataFrame with :data:`TABLE_COLUMNS`, one row per step."""
        import pandas as pd
        return pd.DataFrame(self.rows, columns=list(TABLE_COLUMNS))

    def __call__(self, *, case, step_index, step, meta, inputs, ape, kernel_out, kernel_caches, device) -> List[dict]:
        """Compare one step (see :func:`parity.running.runner.run_case` ``step_observer``); returns findings."""
        row = dict(case=case.name, size=case.size, step=step_index, step_name=step.name, rows=0, pooled=0, hf_s=0.0,
                   note="", max_tie_ratio=0.0, **{c: 0 for c in ROW_CLASSES}, **{f"pooled {c}": 0 for c in POOL_CLASSES})
        self.rows.append(row)
        if step.expect_error is not None:
            row["note"] = "bad-input step: nothing to compare"
            return []
        t0 = time.perf_counter()
        try:
            return self._step(step, meta, inputs, ape, kernel_out, kernel_caches, device, row)
        except Exception as exc:   # a driver failure is a finding, never a traceback
            row["note"] = f"HF driver failed: {type(exc).__name__}"
            return [cmp.crash_finding("hf", exc, output="hf:indices")]
        finally:
            row["hf_s"] = round(time.perf_counter() - t0, 3)

    # ---- one step ---------------------------------------------------------------------------

    def _step(self, step, meta, inputs, ape, kernel_out, kernel_caches, device, row) -> List[dict]:
        from reference.stateful import single_threaded

        from ..checking.certificates import ROUNDING_BUDGET_ULPS
        from ..running.runner import backend_of
        cfg, B = self.case.config, self.case.geometry.page_size
        P, D = cfg.index_kpool, cfg.index_head_dim
        for src, dst, upto in getattr(step, "forks", ()):
            old = self.history.get(src) or _History(D)
            new = self.history[dst] = _History(D)
            new.k = {p: v for p, v in old.k.items() if p < upto}
            new.gate = {p: v for p, v in old.gate.items() if p < upto}
        pos = meta.positions.detach().cpu().to(torch.int64).tolist()
        slots = meta.slot_mapping.detach().cpu().tolist()
        cum = [int(c) for c in meta.cum_query_lens.detach().cpu().tolist()]
        raw = [int(c) for c in meta.raw_seq_lens.detach().cpu().tolist()]
        t_live = min(cum[-1], len(pos)) if cum else 0
        k, gate = inputs["k"].detach().cpu().to(torch.float32), inputs["gate"].detach().cpu().to(torch.float32)
        rids = list(step.request_ids)
        requests = []                                        # (r, rid, qs, end) with live rows
        for r, end in enumerate(cum):
            qs, end = (cum[r - 1] if r else 0), min(end, t_live)
            if qs < end and r < len(rids):
                requests.append((r, rids[r], qs, end))
                hist = self.history.setdefault(rids[r], _History(D))
                for t in range(qs, end):
                    if pos[t] >= 0:
                        hist.k[pos[t]], hist.gate[pos[t]] = k[t].clone(), gate[t].clone()
        if step.patch_metadata is not None:
            row["note"] = "patched metadata: not compared (HF models builder-made batches only)"
            return []
        ape = ape.detach().cpu().to(torch.float32)
        budget = ROUNDING_BUDGET_ULPS[backend_of(device)]
        findings = [self._pooled(meta, slots, pos, cum, t_live, rids, kernel_caches, ape, budget, row)]
        if not step.compute_topk:
            return findings
        if cfg.score_mode != "relu":
            row["note"] = "score_mode merged: HF implements relu only; rows not compared"
            return findings
        if kernel_out is None:
            row["note"] = "the kernel returned no rows"
            return findings
        if self.hf is None:
            from .hf_oracle import HFIndexer
            self.hf = HFIndexer(cfg, ape)
        ours = kernel_out.detach().cpu().reshape(kernel_out.shape[0], -1)
        cache = kernel_caches.compressed_cache
        first_real = None
        with single_threaded():
            for r, rid, qs, end in requests:
                S, n = raw[r], end - qs
                if pos[qs:end] != list(range(S - n, S)):
                    row["note"] = f"request id {rid!r}: positions are not the last {n} of {S}; not compared"
                    continue
                view, call, problem = self._request(rid, S, qs, end, inputs, cache, meta.block_table[r], B, ape,
                                                    budget)
                if problem:
                    row["real"] += n
                    first_real = first_real or dict(detail=f"request id {rid!r}: {problem}", row=qs, position=pos[qs],
                                                    request=r)
                    continue
                for i, t in enumerate(range(qs, end)):
                    verdict = classify_row(ours[t].tolist(), call.indices[i].tolist(), pos[t], i, view)
                    row[verdict.cls] += 1
                    if verdict.ratio is not None:
                        row["max_tie_ratio"] = max(row["max_tie_ratio"], round(verdict.ratio, 4))
                    if verdict.cls == "real" and first_real is None:
                        first_real = dict(detail=f"request id {rid!r}: {verdict.detail}", row=t, position=pos[t],
                                          request=r)
                row["rows"] += n
        findings.append(self._indices_finding(row, first_real))
        return findings

    def _request(self, rid, S, qs, end, inputs, cache, block_row, B, ape, budget):
        """``(RequestView, HFCall, problem)`` for one request's rows ``qs .. end-1``."""
        P, D = self.case.config.index_kpool, self.case.config.index_head_dim
        hk, hg = self.history[rid].window(0, S)
        q, w = inputs["q"][qs:end].detach().cpu(), inputs["weights"][qs:end].detach().cpu()
        call = self.hf.run(hk, hg, q, w)
        n_pools = S // P
        kw = hk[:n_pools * P].reshape(n_pools, P, D).numpy()
        gw = hg[:n_pools * P].reshape(n_pools, P, D).numpy()
        from ..checking.certificates import pooled_value_and_bound_f64
        exact, exact_bounds = (pooled_value_and_bound_f64(kw, gw, ape.numpy(), budget_ulps=budget)[:2] if n_pools
                               else (np.zeros((0, D)), np.zeros((0, D))))
        hf_keys = call.pool_keys.to(torch.float64).numpy()
        problem = check_hf_pooling(hf_keys, kw, gw, ape.numpy(), HF_POOLING_BUDGET_ULPS)
        view = RequestView(index_kpool=P, q=q.to(torch.float64).numpy(), w=w.to(torch.float64).numpy(),
                           ours_keys=_gather_pools(cache, block_row, n_pools, B),
                           exact_keys=exact, hf_keys=hf_keys, hf_scores=call.scores.to(torch.float64).numpy(),
                           finite_tokens=call.finite_tokens.numpy(), exact_bounds=exact_bounds,
                           finite_ape=bool(torch.isfinite(ape).all()))
        # the row that sees the most pools: every one of its HF scores must be our score's model
        problem = problem or check_hf_scores(view, end - qs - 1, S - 1)
        return view, call, problem

    def _pooled(self, meta, slots, pos, cum, t_live, rids, kernel_caches, ape, budget, row) -> dict:
        """The ``hf:pooled`` finding: every pool a live row completed this step (last writer of a
        slot wins) against ``bf16(c*)`` of its window from the whole history."""
        cfg, geo = self.case.config, self.case.geometry
        P, B = cfg.index_kpool, geo.page_size
        last: Dict[int, tuple] = {}
        for t in range(t_live):
            p, s = pos[t], int(slots[t])
            r = bisect.bisect_right(cum, t)
            if p >= 0 and (p + 1) % P == 0 and 0 <= s < geo.num_pages * B and r < len(rids):
                last[s] = (rids[r], p // P, t)
        if not last:
            return cmp.finding("hf:pooled", "exact", detail="no pool written")
        order = sorted(last)
        windows = [self.history[rid].window(j * P, j * P + P) for rid, j, _ in (last[s] for s in order)]
        cache = kernel_caches.compressed_cache
        pages = torch.tensor([s // B for s in order], device=cache.device)
        prow = torch.tensor([s % B for s in order], device=cache.device)
        bits = cache[pages, prow, 0].detach().cpu().contiguous().view(torch.int16)
        got = classify_pools(bits, torch.stack([w[0] for w in windows]), torch.stack([w[1] for w in windows]), ape,
                             budget)
        row["pooled"] = sum(got[c] for c in POOL_CLASSES)
        for c in POOL_CLASSES:
            row[f"pooled {c}"] = got[c]
        summary = ", ".join(f"{got[c]} {c}" for c in POOL_CLASSES if got[c])
        if got["real"]:
            return cmp.finding("hf:pooled", "cache-mismatch", got["real"], detail=f"{got['detail']} ({summary})")
        if got["rounding-boundary"] or got["cancellation"]:
            return cmp.finding("hf:pooled", "rounding-boundary", got["rounding-boundary"] + got["cancellation"],
                               detail=f"pooled keys vs bf16(c*): {summary}")
        return cmp.finding("hf:pooled", "exact", detail=f"{len(order)} pools vs bf16(c*): {summary}")

    @staticmethod
    def _indices_finding(row: dict, first_real: Optional[dict]) -> dict:
        summary = ", ".join(f"{row[c]} {c}" for c in ROW_CLASSES if row[c]) or "no rows"
        ties = row["exact-tie"] + row["near-tie"]
        if first_real is not None:
            first = dict(first_real)
            detail = first.pop("detail")
            return cmp.finding("hf:indices", "wrong-index", row["real"], detail=f"{detail} ({summary})", **first)
        if ties:
            return cmp.finding("hf:indices", "tie-equivalent", ties,
                               detail=f"rows vs HF: {summary}; largest margin/bound {row['max_tie_ratio']:.3g}")
        return cmp.finding("hf:indices", "exact", detail=f"rows vs HF: {summary}")


def _gather_pools(cache: torch.Tensor, block_row: torch.Tensor, n: int, B: int) -> np.ndarray:
    """float64 ``[n, D]``: pools ``0 .. n-1`` of a request read through its block table row (§3.1)."""
    if n <= 0:
        return np.zeros((0, int(cache.shape[-1])))
    table = block_row.detach().cpu().tolist()
    pages = torch.tensor([int(table[j // B]) for j in range(n)], device=cache.device)
    rows = torch.tensor([j % B for j in range(n)], device=cache.device)
    return cache[pages, rows, 0].detach().cpu().to(torch.float64).numpy()


def observer_for(case) -> Optional[HFObserver]:
    """An :class:`HFObserver` for ``case`` (``None`` when transformers is unusable; see
    :func:`parity.oracles.hf_oracle.hf_status`)."""
    from .hf_oracle import hf_status
    ok, _ = hf_status()
    return HFObserver(case) if ok else None


def hf_header() -> str:
    """The run header's line about the HF oracle: what runs, or why it is skipped."""
    from .hf_oracle import hf_status
    ok, why = hf_status()
    if ok:
        return f"oracle hf: {why} Glm5NextTextIndexer on the corpus and seed cases (docs/hf-oracle.md)"
    return f"oracle hf: SKIPPED, {why}"


def print_hf_summary(results, console, report_dir: Optional[str] = None) -> Optional[str]:
    """Print the per-case class counts of every result that carries an HF table
    (``result.hf_table``) and, with ``report_dir``, write the per-step table to
    ``report_dir/hf.csv``. Returns that path (``None`` when not written)."""
    import os

    import pandas as pd
    from rich.markup import escape
    from rich.table import Table
    tables = [r.hf_table for r in results if getattr(r, "hf_table", None) is not None]
    if not tables:
        return None
    df = pd.concat(tables, ignore_index=True)
    cols = ["rows", *ROW_CLASSES, "pooled", *(f"pooled {c}" for c in POOL_CLASSES), "hf_s"]
    per_case = df.groupby(["case", "size"], sort=False)[cols].sum().reset_index()
    worst = float(df["max_tie_ratio"].max()) if len(df) else 0.0
    table = Table(title="KPool vs Hugging Face (rows: index rows; pooled: bf16 elements)")
    for c in ["case", "size", *cols]:
        table.add_column(c, justify="left" if c in ("case", "size") else "right")
    for rec in per_case.to_dict("records"):
        table.add_row(*[escape(str(rec[c] if not isinstance(rec[c], float) else f"{rec[c]:.1f}")) for c in ["case", "size", *cols]])
    console.print(table)
    total = df[cols].sum()
    console.print(escape(f"hf: {int(total['rows'])} rows ({', '.join(f'{int(total[c])} {c}' for c in ROW_CLASSES)}); "
                         f"{int(total['pooled'])} pooled elements ("
                         + ", ".join(f"{int(total[f'pooled {c}'])} {c}" for c in POOL_CLASSES)
                         + f"); largest tie margin/bound {worst:.3g}; HF time {total['hf_s']:.1f} s"))
    for note in sorted({n for n in df["note"] if n}):
        console.print(escape(f"  hf note: {note}"))
    if not report_dir:
        return None
    os.makedirs(report_dir, exist_ok=True)
    path = os.path.join(report_dir, "hf.csv")
    df.to_csv(path, index=False)
    console.print(escape(f"hf report: {path}"))
    return path
