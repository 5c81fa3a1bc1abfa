"""One step of a case made concrete: metadata, inputs and the forward's keyword arguments
(docs/design.md "The one forward signature"; kpool-algorithm.md §3, §6).

The one builder every caller uses (the runner, the metamorphic relations, the repro bundles, the
corpus serializer, the public cases' direct kernel runs, the coverage account, the benchmarks):

* :func:`step_metadata`: the step's :class:`kpool.metadata.KPoolMetadata` with the case's cache
  geometry, then ``step.patch_metadata`` if set;
* :func:`build_step`: that metadata, the step's inputs (:func:`cases.values.make_inputs`: the
  step's explicit inputs or the case's generators) and the case's APE, as a :class:`StepInputs`;
* :meth:`StepInputs.forward_kwargs`: every keyword argument of ``forward`` for one side's caches
  on one device.

Data only: building a step runs no kernel and no reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from kpool.metadata import BatchSpec, KPoolMetadata, build_metadata

from .values import case_ape, make_inputs


def batch_metadata(case, batch: BatchSpec, device="cpu") -> KPoolMetadata:
    """The builder's metadata of ``batch`` with ``case``'s pool size, ring capacity and page size
    (no patch: metamorphic variants rebuild transformed batches with it).

    Raises:
        kpool.errors.KPoolMetadataError: from :func:`kpool.metadata.build_metadata`.
    """
    cfg = case.config
    return build_metadata(batch, index_kpool=cfg.index_kpool, ring_capacity=cfg.ring_capacity,
                          page_size=case.geometry.page_size, device=device)


def step_metadata(case, step, device="cpu") -> KPoolMetadata:
    """A step's metadata: :func:`batch_metadata` of ``step.batch``, then ``step.patch_metadata``
    when set (the patched metadata is what both sides see).

    Raises:
        kpool.errors.KPoolMetadataError: from the builder.
    """
    meta = batch_metadata(case, step.batch, device)
    if step.patch_metadata is not None:
        meta = step.patch_metadata(meta)
    return meta


def _move(x, device, copy: bool):
    return x.to(device, copy=copy) if isinstance(x, torch.Tensor) else x


def forward_kwargs(case, meta: KPoolMetadata, inputs: dict, ape: torch.Tensor, caches, *, device,
                   compute_topk: bool, output_buffer: Optional[torch.Tensor] = None, copy: bool = False,
                   layout=None, **extra) -> dict:
    """The keyword arguments of ``forward`` (docs/design.md) for one side.

    Args:
        case: gives ``index_topk``, ``index_kpool``, ``score_mode``, ``pack_tail``.
        meta / inputs / ape: the step's metadata, ``k, gate, q, weights`` and fp32 ``[P, D]`` APE.
        caches: a :class:`kpool.cache.KPoolCaches` (its views are passed, updated in place).
        device: where inputs and metadata are moved.
        compute_topk: the step's (or a variant's) flag.
        output_buffer: int32 caller buffer view or ``None``.
        copy: copy every tensor even when it is already on ``device`` (the runner's sides must
            not share one tensor: an in-place write by one side would reach the other). Without
            it a tensor already on ``device`` is passed as is (a captured-replay relation
            rewrites those buffers in place between two calls).
        extra: further keyword arguments (``max_score_rows``, ``validate``...).
        layout: a :class:`cases.layouts.InputLayout` (:attr:`cases.spec.Step.layout`): the inputs
            and metadata are passed as its strided views, fresh buffers on ``device``.
    """
    cfg = case.config
    # No tail (HF's second mode, kpool-algorithm.md §10): only a case that needs it passes
    # always_select_tail=False; every forward's default is True, and a forward without the
    # keyword then fails loudly (a TypeError crash finding naming it).
    if not cfg.always_select_tail:
        extra.setdefault("always_select_tail", False)
    kwargs = dict({n: _move(v, device, copy) for n, v in inputs.items()},
                  ape=_move(ape, device, copy), compressed_cache=caches.compressed_cache,
                  tail_cache=caches.tail_cache,
                  **{n: _move(v, device, copy) for n, v in meta.forward_kwargs().items()},
                  index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, score_mode=cfg.score_mode,
                  pack_tail=cfg.pack_tail, compute_topk=compute_topk, output_buffer=output_buffer, **extra)
    if layout is None:
        return kwargs
    from .layouts import apply_layout
    return apply_layout(layout, kwargs)


@dataclass
class StepInputs:
    """What one step feeds a forward, on the CPU.

    Attributes:
        meta: :class:`kpool.metadata.KPoolMetadata` (after ``patch_metadata``).
        inputs: ``{"k": fp32 [T, D], "gate": fp32 [T, D], "q": bf16 [T, H, D], "weights": fp32|bf16 [T, H]}``.
        ape: fp32 ``[P, D]``.
    """

    meta: KPoolMetadata
    inputs: dict
    ape: torch.Tensor

    def forward_kwargs(self, case, step, caches, *, device, output_buffer=None, copy: bool = False,
                       **extra) -> dict:
        """:func:`forward_kwargs` of this step with ``step.compute_topk`` and ``step.layout``."""
        return forward_kwargs(case, self.meta, self.inputs, self.ape, caches, device=device,
                              compute_topk=step.compute_topk, output_buffer=output_buffer, copy=copy,
                              layout=getattr(step, "layout", None), **extra)


def fp32_ape(case) -> torch.Tensor:
    """The case's APE (:func:`cases.values.case_ape`) as fp32 ``[P, D]``."""
    ape = case_ape(case)
    return ape if ape.dtype == torch.float32 else ape.to(torch.float32)


def build_step(case, step, *, ape: Optional[torch.Tensor] = None) -> StepInputs:
    """The metadata (:func:`step_metadata`), inputs (:func:`cases.values.make_inputs`) and APE
    (default :func:`fp32_ape`) of one step, on the CPU.

    Raises:
        kpool.errors.KPoolMetadataError: the builder rejects the batch. ValueError: unknown value
        family, or stored inputs that do not fit the metadata.
    """
    meta = step_metadata(case, step)
    return StepInputs(meta, make_inputs(case, step, meta), fp32_ape(case) if ape is None else ape)
