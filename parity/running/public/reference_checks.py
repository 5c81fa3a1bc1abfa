"""The public cases' stated values that need the reference's numerics or the harness's own
state (public-cases.md; :mod:`cases.public` holds the cases and the checks that read only the
recorded runs).

:data:`REFERENCE_CHECKS` maps a case id to ``fn({case name: PublicRun}) -> [Check]``: canonical
pooled keys (:func:`reference.numerics.compress_pools`), ``torch.topk`` sets of the canonical
logits (:func:`reference.numerics.pool_scores`), the causal tail
(:func:`reference.numerics.tail_start`), the layout the harness hands the kernel and its
sentinels.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import torch

from cases.bits import bits
from cases.public import c01_decode_vs_prefill_writer as c01
from cases.public import c15_ragged_mtp_decode as c15
from cases.public import c23_topk_state_across_rows as c23
from cases.public import c27_determinism as c27
from cases.public.common import bits_check, pool_at, pool_row, rows, set_check, sides
from cases.public.model import Check
from reference.numerics import compress_pools, pool_scores, tail_start

from ...checking.sentinel import FP32_SENTINEL_INT32, case_caches


def compress_tokens(tokens: Sequence[dict], ape: torch.Tensor) -> torch.Tensor:
    """bf16 ``[D]``: the canonical pool of P token dicts (:func:`reference.numerics.compress_pools`)."""
    k = torch.stack([t["k"] for t in tokens])[None]
    g = torch.stack([t["gate"] for t in tokens])[None]
    return compress_pools(k, g, ape)[0]


def topk_set(call, request: int, row: int, visible: int, k: int, score_mode: str = "relu") -> List[int]:
    """The ``torch.topk`` pool set of the canonical logits of ``row`` over the first ``visible``
    pools of ``request`` as the call left them in the cache, in the case's ``score_mode``
    (kpool-algorithm.md §4.2; ``--score-mode`` sets it on every case)."""
    pools = torch.stack([pool_row(call, request, j) for j in range(visible)])
    scores = pool_scores(call.inputs["q"][row:row + 1], call.inputs["weights"][row:row + 1], pools,
                         score_mode=score_mode)[0]
    return sorted(torch.topk(scores, k).indices.tolist())


def causal_checks(run, label: str) -> List[Check]:
    """Universal row checks on every scored step (C07, C09, C13): no entry > the row's position,
    valid history is a union of whole pools, -1 everywhere else on padding rows."""
    out = []
    P = run.case.config.index_kpool
    K = run.case.config.index_topk
    for i, _ in enumerate(run.case.steps):
        call = run.call(i)
        if call.out is None:
            continue
        T_live = int(call.meta["cum_query_lens"][-1]) if call.meta["cum_query_lens"].numel() else 0
        pos = call.meta["positions"].tolist()
        bad_causal, bad_pool, bad_pad = [], [], []
        for t, row in enumerate(rows(call)):
            if t >= T_live:
                if any(v != -1 for v in row):
                    bad_pad.append(t)
                continue
            if any(v > pos[t] for v in row):
                bad_causal.append(t)
            hist = [v for v in row if 0 <= v < tail_start(pos[t], P)]
            pools = {}
            for v in hist:
                pools.setdefault(v // P, set()).add(v)
            if any(len(s) != P for s in pools.values()) or len(hist) > K:
                bad_pool.append(t)
        out.append(Check(f"{label} step {i}: no index > its row's position", not bad_causal, f"rows {bad_causal}"))
        out.append(Check(f"{label} step {i}: history is whole pools", not bad_pool, f"rows {bad_pool}"))
        if T_live < len(pos):
            out.append(Check(f"{label} step {i}: padding rows all -1", not bad_pad, f"rows {bad_pad}", "padding-leak"))
    return out


def _c01(runs) -> List[Check]:
    run = runs["decode-vs-prefill-writer"]
    inputs = run.case.steps[0].inputs
    want = compress_tokens([inputs.token(0, p) for p in range(4 * 7, 4 * 8)], run.case.ape)
    return [bits_check(f"{side}: pool 7 = canonical compress(k28..k31)", pool_at(call, c01.TABLES[1], 7), want)
            for side, call in sides(run, len(run.case.steps) - 1)]


def _c03(runs) -> List[Check]:
    """The ring the harness hands the kernel is a padded-stride view; the addresses a dense-stride
    kernel would have written for block 3 still hold the sentinel; pool 2's canonical value."""
    run = runs["padded-stride-ring"]
    inputs = run.case.steps[0].inputs
    cfg, geo = run.case.config, run.case.geometry
    D, C = cfg.index_head_dim, cfg.ring_capacity
    ring = case_caches(run.case).tail_cache
    out = [Check("the ring passed to the kernel is a non-contiguous padded-stride view",
                 not ring.is_contiguous(), f"strides {ring.stride()}")]
    # Where a dense-stride kernel would have seeded block 3 (offset 3*2*C*D + s*D): in the padded
    # layout that is another block (or padding, which the harness's sentinel check covers): it
    # must still hold the sentinel.
    stride0 = 2 * C * D + geo.ring_block_padding
    for side, call in sides(run, 1):
        ring_bits = bits(call.tail)
        hits, ok = 0, True
        for s_ in range(3):
            for d in range(D):
                blk, rem = divmod(3 * 2 * C * D + s_ * D + d, stride0)
                if rem >= 2 * C * D:
                    continue
                plane, rem = divmod(rem, C * D)
                slot, dd = divmod(rem, D)
                hits += 1
                ok &= blk != 3 and int(ring_bits[blk, plane, slot, dd]) == FP32_SENTINEL_INT32
        out.append(Check(f"{side}: the {hits} dense-address elements of block 3 still hold the sentinel", ok and hits > 0,
                         verdict="stray-write"))
        want = compress_tokens([inputs.token(0, p) for p in range(8, 12)], run.case.ape)
        out.append(bits_check(f"{side}: pool 2 = compress(k8, k9, k10, k11)", pool_row(call, 0, 2), want))
    return out


def _c15(runs) -> List[Check]:
    """Each row's tail columns are its own request's tokens; request 2's pool 7 reads its ring."""
    flat = runs["ragged-flat"]
    P = flat.case.config.index_kpool
    inputs = flat.case.steps[0].inputs
    out = []
    for side, call in sides(flat, 1):
        r = rows(call)
        for t, (p, tail) in enumerate(c15.WANT_TAILS):
            got_tail = [v for v in r[t] if v >= tail_start(p, P)]
            out.append(Check(f"{side}: row {t} (pos {p}) tail {tail}", got_tail == tail, f"got {got_tail}", "wrong-tail"))
        want = compress_tokens([inputs.token(2, p) for p in range(28, 32)], flat.case.ape)
        out.append(bits_check(f"{side}: req2 pool 7 = compress(k28_ring, k29_ring, k30, k31)", pool_row(call, 2, 7),
                              want))
    return out


def _c21(runs) -> List[Check]:
    inputs = runs["no-speculation"].case.steps[0].inputs
    out = []
    for name in ("mtp-2-drafts", "mtp-5-drafts"):
        run = runs[name]
        want = compress_tokens([inputs.token(0, p) for p in (4, 5, 6, 7)], run.case.ape)
        out += [bits_check(f"{name} {side}: pool 1 = compress(k4, k5, k6, k7')", pool_row(call, 0, 1), want)
                for side, call in sides(run, 2)]
    return out


def _c23(runs) -> List[Check]:
    run = runs["topk-state-across-rows"]
    out = []
    for side in ("kernel", "reference"):
        first = run.call(1, side)
        r = rows(first)
        for rid in (0, 2):
            n = c23.COUNTS[rid]
            out.append(set_check(f"{side}: row {rid} = torch.topk set of its {n} random logits", r[rid],
                                 topk_set(first, rid, rid, n, c23.BUMPED, run.case.config.score_mode)))
    return out


def _c27(runs) -> List[Check]:
    run = runs["determinism"]
    out = []
    for side, call in sides(run, 1):
        r = rows(call)
        for i, v in enumerate(c27.VISIBLE):
            out.append(set_check(f"{side}: row {i} ({v} visible) = torch.topk set of its logits", r[i],
                                 topk_set(call, i, i, v, min(16, v), run.case.config.score_mode)))
    return out


def _c29(runs) -> List[Check]:
    run = runs["k512"]
    out = []
    for side, call in sides(run, 1):
        top = topk_set(call, 0, 0, 600, 512, run.case.config.score_mode)
        want = sorted([j * 4 + i for j in top for i in range(4)] + [2400, 2401, 2402])
        out.append(set_check(f"{side}: 600-pool row = torch.topk set (512 pools) + tail", rows(call)[0], want))
    return out


REFERENCE_CHECKS: Dict[str, Callable] = {
    "C01": _c01,
    "C03": _c03,
    "C07": lambda runs: causal_checks(runs["short-row-in-mixed-batch"], "C07"),
    "C09": lambda runs: causal_checks(runs["own-incomplete-pool"], "C09"),
    "C13": lambda runs: causal_checks(runs["partial-pool-tie"], "C13"),
    "C15": _c15,
    "C21": _c21,
    "C23": _c23,
    "C27": _c27,
    "C29": _c29,
}
"""Case id -> the stated values of that case that need the reference or the harness."""
