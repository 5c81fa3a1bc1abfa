"""What every relation shares (:mod:`parity.checking.metamorphic`, :mod:`parity.checking.captured`): the pre-step
state of a case's steps, one kernel run on a copy of it, and the bitwise comparison of two runs
(parity-contract.md §1, "kernel vs kernel": bitwise)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional

import torch

from cases.steps import batch_metadata, build_step, forward_kwargs

from . import compare as cmp
from . import sentinel as sen
from ..implementations.semantics import is_unsupported

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

    def basekernel_run(self, fn: Callable, device) -> "KernelRun":
        """The kernel run on the step as defined (no buffer, default chunking), made once per
        kernel and device and shared by the relations."""
        key = (id(fn), str(device))
        if key not in self._base:
            self._base[key] = kernel_run(fn, self, device)
        return self._base[key]


def build_meta(case, batch, device="cpu"):
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
                reference_forward(**relation_kwargs(case, step.compute_topk, meta, inputs, ape, caches, None, "cpu"))
            except Exception:
                pass


def relation_kwargs(case, compute_topk, meta, inputs, ape, caches, out_buf, dev, **extra) -> dict:
    # No copy: captured-replay rewrites its device buffers in place between two calls.
    return forward_kwargs(case, meta, inputs, ape, caches, device=dev, compute_topk=compute_topk,
                          output_buffer=out_buf, **extra)


@dataclass
class KernelRun:
    out: Optional[torch.Tensor]       # host copy of the returned rows, [T, 1, W]
    caches: object                    # host KPoolCaches after the run
    exc: Optional[BaseException] = None


def kernel_run(fn, state: StepState, dev, *, meta=None, inputs=None, out_buf=None, caches=None, **extra) -> KernelRun:
    """One kernel forward on a device copy of ``state.caches`` (or of ``caches``)."""
    work = (caches or state.caches).to(dev)
    try:
        out = fn(**relation_kwargs(state.case, state.step.compute_topk, meta or state.meta, inputs or state.inputs,
                           state.ape, work, out_buf, dev, **extra))
    except Exception as exc:  # reported as a crash of the relation
        return KernelRun(None, work.to("cpu"), exc)
    host = out.detach().cpu().clone() if isinstance(out, torch.Tensor) else None
    return KernelRun(host, work.to("cpu"))


def compare_runs(name: str, state: StepState, base: KernelRun, variant: KernelRun, *, variant_rows: Optional[torch.Tensor] = None,
             kernel_buffer=None, reference_buffer=None, what: str = "") -> List[dict]:
    """Bitwise comparison of two runs: index rows (``variant_rows[t]`` is the variant row of base
    row ``t``), compressed cache and ring whole; collapsed to one ``exact`` row when all agree."""
    output = OUTPUT_PREFIX + name
    for label, run in (("base", base), ("variant", variant)):
        if run.exc is not None:
            if is_unsupported(run.exc):   # the relation needs a mode the implementation lacks
                return [cmp.finding(output, "unsupported", 0, detail=f"{label}: {run.exc}")]
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


def is_plain(state: StepState) -> bool:
    """Steps a relation can transform: valid input, metadata from the batch description alone
    (a replayed bundle's recorded builder metadata counts, :class:`cases.serialize.SavedMetadata`)."""
    patch = state.step.patch_metadata
    return state.step.expect_error is None and (patch is None or getattr(patch, "from_builder", False))
