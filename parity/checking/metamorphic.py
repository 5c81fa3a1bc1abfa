"""Metamorphic checks: relations the kernels claim between two of their own runs, asserted bitwise
(parity-contract.md §1, "kernel vs kernel": bitwise; kpool-algorithm.md §4.6, §6, §9).

Each relation runs the kernel forward twice from byte copies of the same pre-step caches, once
on a step as the case defines it and once on a transformed but equivalent step, and compares the
two runs bitwise (index rows mapped back where rows move, both caches whole):

* ``batch-permutation``: the live requests in another order (rows move with their request);
* ``padding-rows``: extra FULL-mode padding rows after the live rows (they must come out ``-1`` and
  write nothing);
* ``output-width``: a caller output buffer wider than ``W`` (alignment columns ``-1``, rows ``>= T``
  untouched);
* ``score-chunking``: the score scratch split into chunks of fewer rows (``max_score_rows``);
* ``captured-replay``: a FULL-mode step captured in a CUDA/NPU graph (metadata, input and output
  buffers allocated once) and replayed with the next step's metadata and inputs written in place
  (``KPoolMetadata.copy_``), against the same two steps run with fresh tensors and against the
  reference (:mod:`parity.checking.captured`; the CPU interpreter imitates the capture).

The pre-step caches come from running the earlier steps of the case with the reference on the
CPU (:func:`step_states`); the relations then only run the kernel. Findings have the output name
``metamorphic:<relation>``: one ``exact`` row, or the mismatch classes of :mod:`parity.checking.compare`
(``wrong-index``, ``padding-leak``, ``cache-mismatch``, ``ring-mismatch``, ``stray-write``...), or
``crash``. A relation that does not apply to a step (one request, no top-k, a patched metadata...)
returns no finding.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import pandas as pd
import torch

from . import compare as cmp
from . import sentinel as sen
from ..implementations.forwards import accepts_keyword, torch_device
from .relation_base import (OUTPUT_PREFIX, KernelRun, StepState, build_meta, compare_runs, is_plain,
                            kernel_run, relation_kwargs, step_states)

# --------------------------------------------------------------------------- relations

def batch_permutation(state: StepState, *, device, kernel_forward: Callable) -> List[dict]:
    """Live requests in reverse order: every row's indices and both caches are unchanged
    (a row's result depends on its request, never on the batch order)."""
    reqs = list(state.step.batch.requests)
    if not is_plain(state) or len(reqs) < 2:
        return []
    order = list(reversed(range(len(reqs))))
    batch = dataclasses.replace(state.step.batch, requests=[reqs[i] for i in order])
    meta2 = build_meta(state.case, batch)
    bounds, start = [], 0
    for r in reqs:
        bounds.append((start, start + r.query_len))
        start += r.query_len
    T, t_live = state.meta.num_tokens, start
    new_row = list(range(T))          # padding rows keep their place
    nxt = 0
    for i in order:
        s, e = bounds[i]
        for t in range(s, e):
            new_row[t] = nxt + (t - s)
        nxt += e - s
    idx = torch.tensor(new_row, dtype=torch.int64)
    inputs2 = {}
    for k, v in state.inputs.items():
        w = v.clone()
        w[idx[:t_live]] = v[:t_live]
        inputs2[k] = w
    base = state.basekernel_run(kernel_forward, device)
    variant = kernel_run(kernel_forward, state, device, meta=meta2, inputs=inputs2)
    return compare_runs("batch-permutation", state, base, variant, variant_rows=idx,
                    what=f"requests in order {order}")


PAD_VALUES = {"k": 96.0, "gate": 24.0, "q": 64.0, "weights": 1.0}
"""Values of the appended padding rows: large, bf16-exact, obviously wrong if they leak."""


def padding_rows(state: StepState, *, device, kernel_forward: Callable, extra: int = 3) -> List[dict]:
    """``extra`` more padding rows (``num_tokens = T + extra``) with garbage inputs and stale ring
    slots: the first ``T`` rows and both caches are unchanged, the new rows are all ``-1``."""
    if not is_plain(state):
        return []
    T = state.meta.num_tokens
    batch = dataclasses.replace(state.step.batch, num_tokens=T + extra, stale_tail_slots=True)
    meta2 = build_meta(state.case, batch)
    if meta2.max_pool_seq_len != state.meta.max_pool_seq_len:
        return []
    inputs2 = {}
    for k, v in state.inputs.items():
        pad = torch.full((extra, *v.shape[1:]), PAD_VALUES.get(k, 1.0), dtype=v.dtype)
        inputs2[k] = torch.cat([v, pad])
    base = state.basekernel_run(kernel_forward, device)
    variant = kernel_run(kernel_forward, state, device, meta=meta2, inputs=inputs2)
    rows = []
    if state.step.compute_topk and variant.out is not None and variant.exc is None:
        tail = variant.out[T:].reshape(extra, -1)
        leak = (tail != -1).nonzero()
        if leak.shape[0]:
            t, c = leak[0].tolist()
            rows.append(cmp.finding(OUTPUT_PREFIX + "padding-rows", "padding-leak", int(leak.shape[0]),
                                    detail=f"added padding row {T + t} holds {int(tail[t, c])}", row=T + t,
                                    column=c))
        variant = KernelRun(variant.out[:T], variant.caches)
    found = compare_runs("padding-rows", state, base, variant, what=f"{extra} padding rows added")
    return [r for r in found if r["verdict"] != "exact"] + rows or found


def output_width(state: StepState, *, device, kernel_forward: Callable, extra_cols: int = 5) -> List[dict]:
    """A caller buffer ``[T + 2, W + extra_cols]``: the returned ``[T, 1, W]`` rows equal the run
    without a buffer, the alignment columns are ``-1`` and rows ``>= T`` keep their sentinel."""
    from cases.spec import OutputBufferSpec
    if not is_plain(state) or not state.step.compute_topk:
        return []
    cfg, T = state.case.config, state.meta.num_tokens
    buf = sen.allocate_output_buffer(OutputBufferSpec(capacity=T + 2, width=cfg.output_width + extra_cols),
                                     device=device)
    before = buf.backing.detach().cpu().clone()
    base = state.basekernel_run(kernel_forward, device)
    variant = kernel_run(kernel_forward, state, device, out_buf=buf.view)
    expect = torch.full((T + 2, cfg.output_width + extra_cols), -1, dtype=torch.int32)
    if base.out is not None:   # the base run's rows where they belong, -1 alignment columns
        expect[:T, :cfg.output_width] = base.out.detach().cpu().flatten(1)
    found = compare_runs("output-width", state, base, variant, kernel_buffer=buf.view.detach().cpu(),
                     reference_buffer=expect, what=f"buffer width W+{extra_cols}")
    chk = buf.check(before, T)
    extra = cmp.sentinel_findings([dataclasses.replace(chk, missing=0, first_missing=None)], "kernel")
    bad = [r for r in extra if r["verdict"] != "exact"]
    for r in bad:
        r["output"] = OUTPUT_PREFIX + "output-width"
    return [r for r in found if r["verdict"] != "exact"] + bad or found


def score_chunking(state: StepState, *, device, kernel_forward: Callable,
                   chunk_rows: Optional[Sequence[int]] = None) -> List[dict]:
    """The indexer score scratch split into chunks of ``chunk_rows`` token rows
    (``max_score_rows``): identical rows and caches. Default chunks: 1 row (up to 16 live rows,
    else 5) and half the live rows."""
    t_live = state.meta.num_live_tokens
    if not is_plain(state) or not state.step.compute_topk or t_live < 2 \
            or not accepts_keyword(kernel_forward, "max_score_rows"):
        return []
    if chunk_rows is None:
        chunk_rows = sorted({1 if t_live <= 16 else 5, max(1, t_live // 2)})
    base = state.basekernel_run(kernel_forward, device)
    found = []
    for n in chunk_rows:
        variant = kernel_run(kernel_forward, state, device, max_score_rows=int(n))
        found += [r for r in compare_runs("score-chunking", state, base, variant) if r["verdict"] != "exact"]
    return found or [cmp.finding(OUTPUT_PREFIX + "score-chunking", "exact",
                                 detail=f"max_score_rows in {list(chunk_rows)}")]


def captured_replay(state: StepState, next_state: Optional[StepState], *, device,
                    kernel_forward: Callable) -> List[dict]:
    """Steps ``i`` and ``i + 1`` as a captured FULL-mode graph replays them: a real
    ``torch.cuda.CUDAGraph`` / ``torch.npu.NPUGraph`` on devices, an imitation on the CPU
    interpreter (:mod:`parity.checking.captured`)."""
    from .captured import captured_replay as relation
    return relation(state, next_state, device=device, kernel_forward=kernel_forward)


RELATIONS: Dict[str, Callable] = {
    "batch-permutation": batch_permutation,
    "padding-rows": padding_rows,
    "output-width": output_width,
    "score-chunking": score_chunking,
    "captured-replay": captured_replay,
}
"""Relation name -> function. ``captured-replay`` also takes the next step's state."""


def run_relations(case, names: Optional[Sequence[str]] = None, *, device, kernel_forward: Optional[Callable] = None,
                  steps: Optional[Sequence[int]] = None) -> pd.DataFrame:
    """Check ``names`` (default all of :data:`RELATIONS`) on every step of ``case`` (or ``steps``).

    Args:
        case: :class:`cases.spec.Case`.
        names: relation names.
        device: kernel device (name or torch device).
        kernel_forward: default ``kpool.indexer.forward``.
        steps: step indices to check (default all); ``captured-replay`` pairs step ``i`` with ``i + 1``
            and is reported at step ``i + 1``.

    Returns:
        A findings DataFrame (:data:`parity.checking.compare.FINDING_COLUMNS`).

    Raises:
        ValueError: an unknown relation name.
    """
    names = list(RELATIONS) if not names else list(names)
    unknown = [n for n in names if n not in RELATIONS]
    if unknown:
        raise ValueError(f"unknown metamorphic relation(s) {unknown}; known: {list(RELATIONS)}")
    dev = torch_device(device)
    if kernel_forward is None:
        from kpool.indexer import forward as kernel_forward
    wanted = set(range(len(case.steps)) if steps is None else steps)
    frames = []
    states = list(step_states(case))
    for i, state in enumerate(states):
        if state is None:
            continue
        rows_by_step: Dict[int, List[dict]] = {}
        for name in names:
            if name == "captured-replay":
                if i + 1 < len(states) and (i + 1) in wanted:
                    rows_by_step.setdefault(i + 1, []).extend(
                        captured_replay(state, states[i + 1], device=dev, kernel_forward=kernel_forward))
            elif i in wanted:
                rows_by_step.setdefault(i, []).extend(RELATIONS[name](state, device=dev, kernel_forward=kernel_forward))
        for s, rows in rows_by_step.items():
            if rows:
                frames.append(cmp.findings_frame(rows, case=case.name, size=case.size, step=s,
                                                 step_name=case.steps[s].name))
    return pd.concat(frames, ignore_index=True) if frames else cmp.findings_frame([])
