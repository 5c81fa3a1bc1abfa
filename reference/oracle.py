"""Whole-history oracle of the KPool indexer (parity-contract.md §7, kpool-algorithm.md §4-§5).

The model's own definition, with no ring and no cache pages: per request it keeps every raw
token ever fed (``{position: (k, gate)}``, latest write wins) and the logical pool values
(``{pool id: bf16 [D]}``). A pool completed in a step is recomputed from the full history; rows
are scored against the request's logical pools. Because it shares :mod:`reference.numerics`
with the stateful reference, the two must agree bit for bit on every step whenever the
kernels' ring/cache machinery is correct, e.g. a ring capacity below ``P + spec`` shows up here
as a disagreement (public case C21).

This module never imports :mod:`kpool`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, List, Optional, Tuple

import torch

from .numerics import compress_pools, index_rows, pool_scores
from .stateful import single_threaded  # thread control only; no semantics are shared

# Deliberately independent of reference.stateful (no shared helpers): the oracle checks it.
SCORE_CHUNK_ELEMENTS = 1 << 18
"""Rows are scored in chunks of about this many ``rows * pools * H`` elements (no effect on any bit)."""


@dataclass
class OracleStep:
    """What the oracle expects from one step.

    Attributes:
        indices: int32 ``[T, 1, W]`` canonical index rows (``None`` when ``compute_topk=False``).
        pool_writes: ``(request_id, pool_id, slot, value)`` for every pool completed in the step,
            in row order; ``slot`` is the compressed slot (``page * B + row``) the row carried and
            ``value`` the bf16 ``[D]`` pooled key (§5.3).
    """

    indices: Optional[torch.Tensor]
    pool_writes: List[Tuple[Hashable, int, int, torch.Tensor]] = field(default_factory=list)


class HistoryOracle:
    """Per-request raw history and logical pools (parity-contract.md §7).

    Args:
        index_kpool: ``P``; optional, learnt from the first :meth:`step` otherwise (needed by
            :meth:`fork` before any step).

    Attributes:
        history: ``{request_id: {position: (k fp32 [D], gate fp32 [D])}}``.
        pools: ``{request_id: {pool_id: bf16 [D]}}``.
    """

    def __init__(self, index_kpool: Optional[int] = None):
        self.index_kpool = index_kpool
        self.history: dict = {}
        self.pools: dict = {}

    def fork(self, src_id: Hashable, dst_id: Hashable, upto_position: int) -> None:
        """Start request ``dst_id`` from the prefix ``[0, upto_position)`` of ``src_id``
        (prefix-cache resume): copies the raw tokens below ``upto_position`` and the pools whose
        last token is below it. A kernel resume is only correct when ``upto_position`` is a
        multiple of P (the ring is not restored, §5.2); the oracle does not need that, so a
        non-aligned resume shows up as a disagreement.

        Raises:
            ValueError: P unknown (no constructor argument and no step yet).
            KeyError: unknown ``src_id``.
        """
        if self.index_kpool is None:
            raise ValueError("HistoryOracle.fork needs index_kpool (constructor or a previous step)")
        P = self.index_kpool
        self.history[dst_id] = {pos: kv for pos, kv in self.history[src_id].items() if pos < upto_position}
        self.pools[dst_id] = {j: v for j, v in self.pools.get(src_id, {}).items() if (j + 1) * P <= upto_position}

    @single_threaded()
    def step(self, *, request_ids, k, gate, q, weights, ape, positions, cum_query_lens, raw_seq_lens,
             seq_lens, slot_mapping, max_pool_seq_len, index_topk, index_kpool, score_mode="relu",
             pack_tail=True, compute_topk=True, num_tokens=None, num_cache_slots=None,
             always_select_tail=True) -> OracleStep:
        """Feed one step and return what the kernels must produce (§4, §5).

        Args:
            request_ids: one hashable id per live request, in metadata order (trailing
                zero-length padded requests of the metadata may be left out).
            k, gate: fp32 ``[T, D]``; q: bf16 ``[T, H, D]``; weights: fp32/bf16 ``[T, H]``;
                ape: fp32 ``[P, D]`` (q/weights may be None when ``compute_topk=False``).
            positions, cum_query_lens, raw_seq_lens, seq_lens, slot_mapping, max_pool_seq_len:
                as in :func:`reference.stateful.forward` (no block tables: pools are logical).
                ``raw_seq_lens`` is accepted for signature symmetry; the oracle does not need it.
            index_topk, index_kpool, score_mode, pack_tail, compute_topk: as in ``forward``.
            num_tokens: ``T`` (defaults to ``positions.shape[0]``).
            num_cache_slots: optional ``N * B``; slots ``>= num_cache_slots`` write nothing.
            always_select_tail: ``False``: no tail, rows of width ``K_tok`` (as in ``forward``).

        Returns:
            :class:`OracleStep`. ``T == 0`` or ``R == 0``: indices ``[T, 1, W]`` of -1 (or None),
            no pool writes, no history change.

        Raises:
            ValueError: inconsistent P, or a live row belonging to a request without an id.
            KeyError: a pool or window needs a position / pool the history does not hold.
        """
        P, K_tok = int(index_kpool), int(index_topk)
        if self.index_kpool is None:
            self.index_kpool = P
        if self.index_kpool != P:
            raise ValueError(f"index_kpool changed from {self.index_kpool} to {P}")
        W = K_tok + P - 1 if always_select_tail else K_tok
        T = int(positions.shape[0]) if num_tokens is None else int(num_tokens)
        R = int(cum_query_lens.shape[0])
        if T == 0 or R == 0:
            # Nothing to record; every one of the T rows is a padding row: all -1 (§4.5 step 4).
            return OracleStep(indices=torch.full((T, 1, W), -1, dtype=torch.int32) if compute_topk else None)

        ends = [int(e) for e in cum_query_lens.tolist()]
        bounds = list(zip([0] + ends[:-1], ends))  # (qs_r, end_r), kpool-algorithm.md §3.4
        T_live = min(bounds[-1][1], T)
        live = [(r, qs, min(end, T_live)) for r, (qs, end) in enumerate(bounds) if qs < min(end, T_live)]
        for r, _, _ in live:
            if r >= len(request_ids):
                raise ValueError(f"request {r} has live rows but no request id")
            self.history.setdefault(request_ids[r], {})
            self.pools.setdefault(request_ids[r], {})

        # 1. History: every live row, in row order (latest write wins).
        for r, qs, end in live:
            hist = self.history[request_ids[r]]
            for t in range(qs, end):
                p = int(positions[t])
                if p >= 0:
                    hist[p] = (k[t].to(torch.float32).clone(), gate[t].to(torch.float32).clone())

        # 2. Pools completed in this step, recomputed from the full history (§5.1, §5.3).
        done = []
        for r, qs, end in live:
            for t in range(qs, end):
                p, slot = int(positions[t]), int(slot_mapping[t])
                valid_slot = slot >= 0 and (num_cache_slots is None or slot < num_cache_slots)
                if valid_slot and p >= 0 and (p + 1) % P == 0:
                    done.append((request_ids[r], p // P, slot))
        pool_writes = []
        if done:
            k_windows, gate_windows = [], []
            for rid, j, _ in done:
                hist = self.history[rid]
                missing = [w for w in range(j * P, j * P + P) if w not in hist]
                if missing:
                    raise KeyError(f"request {rid!r}: pool {j} needs positions {missing} never fed")
                k_windows.append(torch.stack([hist[w][0] for w in range(j * P, j * P + P)]))
                gate_windows.append(torch.stack([hist[w][1] for w in range(j * P, j * P + P)]))
            pooled = compress_pools(torch.stack(k_windows), torch.stack(gate_windows), ape)
            for (rid, j, slot), value in zip(done, pooled):
                self.pools[rid][j] = value.clone()
                pool_writes.append((rid, j, slot, value.clone()))

        if not compute_topk:
            return OracleStep(indices=None, pool_writes=pool_writes)

        # 3. Selection against the logical pools (§4.1-§4.5).
        n_max = int(max_pool_seq_len)
        selected = min(K_tok // P, n_max)
        H = int(q.shape[1])
        out = torch.full((T, W), -1, dtype=torch.int32)
        for r, qs, end in live:
            rid = request_ids[r]
            rows = list(range(qs, end))
            # Visibility restated on purpose, not reference.numerics.visible_pools: the oracle is
            # the stateful reference's independent check (parity-contract.md §7).
            visible = [min(max(0, min((int(positions[t]) + 1) // P, int(seq_lens[r]))), n_max) for t in rows]
            chunk = max(1, SCORE_CHUNK_ELEMENTS // max(1, n_max * H))
            for c0 in range(0, len(rows), chunk):
                chunk_rows = rows[c0:c0 + chunk]
                chunk_visible = visible[c0:c0 + chunk]
                n_scored = max(chunk_visible)
                scores = torch.zeros((len(chunk_rows), n_max), dtype=torch.float32)
                if n_scored > 0:
                    pools = torch.stack([self._pool(rid, j) for j in range(n_scored)])
                    scores[:, :n_scored] = pool_scores(q[chunk_rows], weights[chunk_rows], pools, score_mode)
                out[chunk_rows] = index_rows(scores, torch.tensor(chunk_visible, dtype=torch.int64),
                                             positions[chunk_rows], selected=selected, index_topk=K_tok,
                                             index_kpool=P, pack_tail=pack_tail, width=W,
                                             always_select_tail=always_select_tail)
        return OracleStep(indices=out.unsqueeze(1), pool_writes=pool_writes)

    def _pool(self, rid: Hashable, j: int) -> torch.Tensor:
        try:
            return self.pools[rid][j]
        except KeyError:
            raise KeyError(f"request {rid!r}: pool {j} is visible but was never computed") from None
