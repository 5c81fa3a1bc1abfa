"""Coverage classes of issue 19 families 1 (whole finite range) and 2 (strided layouts), counted
by :func:`parity.findings.coverage.classify_case` from the real inputs and scores (not from the
generator's intent) and reported with counts by :class:`parity.findings.coverage.Coverage`.

Value classes count steps (inputs) or scored rows (scores); layout classes count steps whose
:attr:`cases.spec.Step.layout` uses that kind of stride (:meth:`cases.layouts.InputLayout.classes`).
"""
from __future__ import annotations

from collections import Counter
from typing import Tuple

import torch

from cases.layouts import LAYOUT_CLASSES

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0 ** -14
FP32_TINY = torch.finfo(torch.float32).tiny
FLT_MAX = torch.finfo(torch.float32).max
RANGE_ENDS = 2.0 ** 100

FAMILY_REQUIRED: Tuple[Tuple[str, str], ...] = (
    ("range ends |x| >= 2^100", "a live finite input (q, k, gate, weights, APE) at or beyond 2^100 (steps)"),
    ("beyond fp16 range", "a live finite q, k or weight above 65504 (steps)"),
    ("below fp16 normal range", "a live nonzero q, k or weight below 2^-14 (steps)"),
    ("subnormal input", "a live fp32 / bf16 subnormal in q, k, gate, weights or APE (steps)"),
    ("-0.0 input", "a live -0.0 in q, k, gate, weights or APE (steps)"),
    ("gate spread >= 100 in a pool", "slots of one pool whose gate + APE logits are >= 100 apart (steps)"),
    ("score below -1e30", "a scored row with a finite visible score below -1e30 (rows)"),
    ("FLT_MAX and +inf scores in a row", "a scored row with a raw +inf score and a raw FLT_MAX one (rows)"),
) + tuple((name, "steps with inputs laid out so") for name in LAYOUT_CLASSES) + (
    ("cache rows padded", "steps over caches whose page rows and ring rows are padded"),)
"""``(class, meaning)`` of the two families; :class:`parity.findings.coverage.Coverage` reports each with its count."""


def _any(t: torch.Tensor, pred) -> bool:
    return t.numel() > 0 and bool(pred(t.float()).any())


def input_classes(step, inputs: dict, ape: torch.Tensor, meta, index_kpool: int, case_geometry=None) -> Counter:
    """Value and layout classes of one step's live inputs (module docstring).

    Args:
        step: the :class:`cases.spec.Step`; inputs: its ``k, gate, q, weights``; ape: fp32 ``[P, D]``;
        meta: its metadata; index_kpool: ``P``; case_geometry: the case's
        :class:`cases.spec.CacheGeometry` (padded cache rows).
    """
    out: Counter = Counter()
    layout = getattr(step, "layout", None)
    if layout is not None:
        out.update(layout.classes())
    if getattr(case_geometry, "row_padding", 0):
        out["cache rows padded"] += 1
    T_live = meta.num_live_tokens
    if T_live == 0:
        return out
    live = {n: inputs[n][:T_live] for n in ("k", "gate", "q", "weights") if inputs.get(n) is not None}
    if not step.compute_topk:
        live.pop("q", None), live.pop("weights", None)
    every = list(live.values()) + [ape]
    finite = lambda x: torch.isfinite(x)   # noqa: E731
    if any(_any(t, lambda x: finite(x) & (x.abs() >= RANGE_ENDS)) for t in every):
        out["range ends |x| >= 2^100"] += 1
    fp16_kinds = [t for n, t in live.items() if n in ("q", "k", "weights")]
    if any(_any(t, lambda x: finite(x) & (x.abs() > FP16_MAX)) for t in fp16_kinds):
        out["beyond fp16 range"] += 1
    if any(_any(t, lambda x: (x != 0) & (x.abs() < FP16_MIN_NORMAL)) for t in fp16_kinds):
        out["below fp16 normal range"] += 1
    if any(_any(t, lambda x: (x != 0) & (x.abs() < FP32_TINY)) for t in every):
        out["subnormal input"] += 1
    if any(_any(t, lambda x: (x == 0) & torch.signbit(x)) for t in every):
        out["-0.0 input"] += 1
    if _gate_spread(live["gate"], ape, meta, index_kpool) >= 100:
        out["gate spread >= 100 in a pool"] += 1
    return out


def _gate_spread(gate: torch.Tensor, ape: torch.Tensor, meta, P: int) -> float:
    """The largest finite ``max - min`` of ``gate + ape[p % P]`` over the rows of one pool
    (same request, same ``p // P``) within this step."""
    from cases.values import row_requests
    T_live = gate.shape[0]
    pos = meta.positions[:T_live].to("cpu", torch.int64)
    logits = gate.float() + ape.float()[pos % P]
    key = row_requests(meta)[:T_live] * (2 ** 40) + pos // P
    best = 0.0
    for k in torch.unique(key).tolist():
        rows = logits[key == k]
        rows = torch.where(torch.isfinite(rows), rows, torch.nan)
        spread = (rows.nan_to_num(nan=-torch.inf).amax(0) - rows.nan_to_num(nan=torch.inf).amin(0))
        spread = spread[torch.isfinite(spread)]
        if spread.numel():
            best = max(best, float(spread.max()))
    return best


def score_classes(raw: torch.Tensor) -> Counter:
    """Classes of one scored row's raw fp32 scores of its visible pools (``[visible]``)."""
    out: Counter = Counter()
    if bool((torch.isfinite(raw) & (raw < -1e30)).any()):
        out["score below -1e30"] += 1
    if bool((raw == torch.inf).any()) and bool((raw == FLT_MAX).any()):
        out["FLT_MAX and +inf scores in a row"] += 1
    return out
