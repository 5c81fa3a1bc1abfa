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
* ``captured-replay``: a captured step (FULL-mode metadata buffers, input buffers and output buffer
  allocated once) rerun with the next step's metadata and inputs written in place
  (``KPoolMetadata.copy_``), against the same two steps run with fresh tensors.

The pre-step caches come from running the earlier steps of the case with the reference on the
CPU (:func:`step_states`); the relations then only run the kernel. Findings have the output name
``metamorphic:<relation>``: one ``exact`` row, or the mismatch classes of :mod:`parity.compare`
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

from cases.steps import batch_metadata, build_step, forward_kwargs

from . import compare as cmp
from . import sentinel as sen
from .forwards import accepts_keyword, torch_device

OUTPUT_PREFIX = "metamorphic:"


@dataclass
class StepState:
    """A step of a case, ready to run: its pre-step caches (CPU, sentinels laid), metadata and
    inputs (CPU) as the runner would build them.

    Attributes:
        case, index, step: the case, step index and :class:`cases.spec.Step`.
        meta: :class:`kpool.metadata.KPoolMetadata` (after ``patch_metadata``).
        inputs: ``{"k", "gate", "q", "weights"}`` CPU tensors.
        ape: fp32 ``[P, D]``.
        caches: :class:`kpool.cache.KPoolCaches` before the step.
    """

    case: object
    index: int
    step: object
    meta: object
    inputs: dict
    ape: torch.Tensor
    caches: object
    _base: dict = dataclasses.field(default_factory=dict, repr=False)

    def base_run(self, fn: Callable, device) -> "_Run":
        """The kernel run on the step as defined (no buffer, default chunking), made once per
        kernel and device and shared by the relations."""
        key = (id(fn), str(device))
        if key not in self._base:
            self._base[key] = _run(fn, self, device)
        return self._base[key]


def _build_meta(case, batch, device="cpu"):
    return batch_metadata(case, batch, device)


def step_states(case, *, reference_forward: Optional[Callable] = None) -> Iterator[StepState]:
    """Yield a :class:`StepState` for every step of ``case``, advancing one set of CPU caches with
    the reference forward (``reference.stateful.forward`` by default). Steps that expect an error
    are yielded too (they leave the caches unchanged); a step whose setup fails yields ``None``."""
    if reference_forward is None:
        from reference.stateful import forward as reference_forward
    caches = sen.sentinel_caches(case)
    for i, step in enumerate(case.steps):
        try:
            built = build_step(case, step)
        except Exception:   # a setup failure is the runner's finding, not a relation's
            yield None
            continue
        meta, inputs, ape = built.meta, built.inputs, built.ape
        yield StepState(case, i, step, meta, inputs, ape, caches.clone())
        if step.expect_error is None:
            try:
                reference_forward(**_kwargs(case, step.compute_topk, meta, inputs, ape, caches, None, "cpu"))
            except Exception:
                pass


def _kwargs(case, compute_topk, meta, inputs, ape, caches, out_buf, dev, **extra) -> dict:
    # No copy: captured-replay rewrites its device buffers in place between two calls.
    return forward_kwargs(case, meta, inputs, ape, caches, device=dev, compute_topk=compute_topk,
                          output_buffer=out_buf, **extra)


@dataclass
class _Run:
    out: Optional[torch.Tensor]       # host copy of the returned rows, [T, 1, W]
    caches: object                    # host KPoolCaches after the run
    exc: Optional[BaseException] = None


def _run(fn, state: StepState, dev, *, meta=None, inputs=None, out_buf=None, caches=None, **extra) -> _Run:
    """One kernel forward on a device copy of ``state.caches`` (or of ``caches``)."""
    work = (caches or state.caches).to(dev)
    try:
        out = fn(**_kwargs(state.case, state.step.compute_topk, meta or state.meta, inputs or state.inputs,
                           state.ape, work, out_buf, dev, **extra))
    except Exception as exc:  # reported as a crash of the relation
        return _Run(None, work.to("cpu"), exc)
    host = out.detach().cpu().clone() if isinstance(out, torch.Tensor) else None
    return _Run(host, work.to("cpu"))


def _compare(name: str, state: StepState, base: _Run, variant: _Run, *, variant_rows: Optional[torch.Tensor] = None,
             kernel_buffer=None, reference_buffer=None, what: str = "") -> List[dict]:
    """Bitwise comparison of two runs: index rows (``variant_rows[t]`` is the variant row of base
    row ``t``), compressed cache and ring whole; collapsed to one ``exact`` row when all agree."""
    output = OUTPUT_PREFIX + name
    for label, run in (("base", base), ("variant", variant)):
        if run.exc is not None:
            return [cmp.crash_finding(label, run.exc, output=output)]
    cfg, meta = state.case.config, state.meta
    rows = []
    if state.step.compute_topk:
        vout = variant.out
        if vout is not None and variant_rows is not None:
            vout = vout[variant_rows]
        rows += cmp.compare_indices(vout, base.out, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
                                    index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, pack_tail=cfg.pack_tail,
                                    compute_topk=True, kernel_buffer=kernel_buffer,
                                    reference_buffer=reference_buffer, output=output)
    rows += cmp.compare_compressed(variant.caches.compressed_cache, base.caches.compressed_cache, output=output)
    rows += cmp.compare_ring(variant.caches.tail_cache, base.caches.tail_cache, output=output)
    bad = [r for r in rows if r["verdict"] != "exact"]
    return bad or [cmp.finding(output, "exact", detail=what)]


def _plain(state: StepState) -> bool:
    """Steps a relation can transform: valid input, metadata from the batch description alone
    (a replayed bundle's recorded builder metadata counts, :class:`cases.serialize.SavedMetadata`)."""
    patch = state.step.patch_metadata
    return state.step.expect_error is None and (patch is None or getattr(patch, "from_builder", False))


# --------------------------------------------------------------------------- relations

def batch_permutation(state: StepState, *, device, kernel_forward: Callable) -> List[dict]:
    """Live requests in reverse order: every row's indices and both caches are unchanged
    (a row's result depends on its request, never on the batch order)."""
    reqs = list(state.step.batch.requests)
    if not _plain(state) or len(reqs) < 2:
        return []
    order = list(reversed(range(len(reqs))))
    batch = dataclasses.replace(state.step.batch, requests=[reqs[i] for i in order])
    meta2 = _build_meta(state.case, batch)
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
    base = state.base_run(kernel_forward, device)
    variant = _run(kernel_forward, state, device, meta=meta2, inputs=inputs2)
    return _compare("batch-permutation", state, base, variant, variant_rows=idx,
                    what=f"requests in order {order}")


PAD_VALUES = {"k": 96.0, "gate": 24.0, "q": 64.0, "weights": 1.0}
"""Values of the appended padding rows: large, bf16-exact, obviously wrong if they leak."""


def padding_rows(state: StepState, *, device, kernel_forward: Callable, extra: int = 3) -> List[dict]:
    """``extra`` more padding rows (``num_tokens = T + extra``) with garbage inputs and stale ring
    slots: the first ``T`` rows and both caches are unchanged, the new rows are all ``-1``."""
    if not _plain(state):
        return []
    T = state.meta.num_tokens
    batch = dataclasses.replace(state.step.batch, num_tokens=T + extra, stale_tail_slots=True)
    meta2 = _build_meta(state.case, batch)
    if meta2.max_pool_seq_len != state.meta.max_pool_seq_len:
        return []
    inputs2 = {}
    for k, v in state.inputs.items():
        pad = torch.full((extra, *v.shape[1:]), PAD_VALUES.get(k, 1.0), dtype=v.dtype)
        inputs2[k] = torch.cat([v, pad])
    base = state.base_run(kernel_forward, device)
    variant = _run(kernel_forward, state, device, meta=meta2, inputs=inputs2)
    rows = []
    if state.step.compute_topk and variant.out is not None and variant.exc is None:
        tail = variant.out[T:].reshape(extra, -1)
        leak = (tail != -1).nonzero()
        if leak.shape[0]:
            t, c = leak[0].tolist()
            rows.append(cmp.finding(OUTPUT_PREFIX + "padding-rows", "padding-leak", int(leak.shape[0]),
                                    detail=f"added padding row {T + t} holds {int(tail[t, c])}", row=T + t,
                                    column=c))
        variant = _Run(variant.out[:T], variant.caches)
    found = _compare("padding-rows", state, base, variant, what=f"{extra} padding rows added")
    return [r for r in found if r["verdict"] != "exact"] + rows or found


def output_width(state: StepState, *, device, kernel_forward: Callable, extra_cols: int = 5) -> List[dict]:
    """A caller buffer ``[T + 2, W + extra_cols]``: the returned ``[T, 1, W]`` rows equal the run
    without a buffer, the alignment columns are ``-1`` and rows ``>= T`` keep their sentinel."""
    from cases.spec import OutputBufferSpec
    if not _plain(state) or not state.step.compute_topk:
        return []
    cfg, T = state.case.config, state.meta.num_tokens
    buf = sen.allocate_output_buffer(OutputBufferSpec(capacity=T + 2, width=cfg.output_width + extra_cols),
                                     device=device)
    before = buf.backing.detach().cpu().clone()
    base = state.base_run(kernel_forward, device)
    variant = _run(kernel_forward, state, device, out_buf=buf.view)
    expect = torch.full((T + 2, cfg.output_width + extra_cols), -1, dtype=torch.int32)
    if base.out is not None:   # the base run's rows where they belong, -1 alignment columns
        expect[:T, :cfg.output_width] = base.out.detach().cpu().flatten(1)
    found = _compare("output-width", state, base, variant, kernel_buffer=buf.view.detach().cpu(),
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
    if not _plain(state) or not state.step.compute_topk or t_live < 2 \
            or not accepts_keyword(kernel_forward, "max_score_rows"):
        return []
    if chunk_rows is None:
        chunk_rows = sorted({1 if t_live <= 16 else 5, max(1, t_live // 2)})
    base = state.base_run(kernel_forward, device)
    found = []
    for n in chunk_rows:
        variant = _run(kernel_forward, state, device, max_score_rows=int(n))
        found += [r for r in _compare("score-chunking", state, base, variant) if r["verdict"] != "exact"]
    return found or [cmp.finding(OUTPUT_PREFIX + "score-chunking", "exact",
                                 detail=f"max_score_rows in {list(chunk_rows)}")]


def captured_replay(state: StepState, next_state: Optional[StepState], *, device,
                    kernel_forward: Callable) -> List[dict]:
    """Steps ``i`` and ``i + 1`` as a captured FULL-mode graph would run them: metadata, input and
    output buffers allocated once for step ``i`` and overwritten in place for step ``i + 1``
    (``KPoolMetadata.copy_``), against both steps run with freshly built tensors. Both use the
    same padded shapes (``T``, ``R``, ``M`` of the larger step, ``max_pool_seq_len = M * B``);
    step ``i + 1``'s rows and both caches must agree bitwise."""
    from cases.values import make_inputs
    if next_state is None or not (_plain(state) and _plain(next_state)):
        return []
    a, b = state.step.batch, next_state.step.batch
    T = max(state.meta.num_tokens, next_state.meta.num_tokens)
    R = max(len(a.requests) + a.num_padded_requests, len(b.requests) + b.num_padded_requests)
    M = max(state.meta.block_table.shape[1], next_state.meta.block_table.shape[1])
    def full(batch):
        return dataclasses.replace(batch, num_tokens=T, full_mode=True, block_table_width=M,
                                   num_padded_requests=R - len(batch.requests))
    fa, fb = full(a), full(b)
    case, cfg = state.case, state.case.config
    meta_a, meta_b = _build_meta(case, fa), _build_meta(case, fb)
    in_a = make_inputs(case, dataclasses.replace(state.step, batch=fa), meta_a)
    in_b = make_inputs(case, dataclasses.replace(next_state.step, batch=fb), meta_b)
    W = cfg.output_width
    name = "captured-replay"
    output = OUTPUT_PREFIX + name
    try:
        # Captured path: one set of device buffers, rewritten in place between the replays.
        work = state.caches.to(device)
        # (clone: on the CPU ``.to`` aliases, and the in-place copy_ must not reach meta_a / in_a)
        meta_buf = meta_a.to(device).clone()
        in_buf = {k: v.to(device).clone() for k, v in in_a.items()}
        out_buf = torch.full((T, W), -777, dtype=torch.int32, device=device)
        kernel_forward(**_kwargs(case, state.step.compute_topk, meta_buf, in_buf, state.ape, work, out_buf, device))
        meta_buf.copy_(meta_b.to(device))
        for k, v in in_b.items():
            in_buf[k].copy_(v.to(device))
        out = kernel_forward(**_kwargs(case, next_state.step.compute_topk, meta_buf, in_buf, state.ape, work,
                                       out_buf, device))
        captured = _Run(out.detach().cpu().clone() if isinstance(out, torch.Tensor) else None, work.to("cpu"))
        # Fresh path: new tensors for every call.
        work = state.caches.to(device)
        kernel_forward(**_kwargs(case, state.step.compute_topk, meta_a.clone(), in_a, state.ape, work,
                                 torch.full((T, W), -777, dtype=torch.int32, device=device), device))
        out = kernel_forward(**_kwargs(case, next_state.step.compute_topk, _build_meta(case, fb), in_b, state.ape,
                                       work, torch.full((T, W), -777, dtype=torch.int32, device=device), device))
        fresh = _Run(out.detach().cpu().clone() if isinstance(out, torch.Tensor) else None, work.to("cpu"))
    except Exception as exc:
        return [cmp.crash_finding("kernel", exc, output=output)]
    view = dataclasses.replace(next_state, meta=meta_b, step=dataclasses.replace(next_state.step, batch=fb))
    return _compare(name, view, fresh, captured, what=f"step {state.index} metadata replaced in place")


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
        A findings DataFrame (:data:`parity.compare.FINDING_COLUMNS`).

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
