"""What a parity case is: a named sequence of steps over persistent caches
(parity-contract.md §1; kpool-algorithm.md §11 "Harness scenarios").

A :class:`Case` fixes the configuration, the cache geometry and the steps; every step is a
:class:`kpool.metadata.BatchSpec` plus how its inputs are made. Inputs are generated from the
step's seed (``cases.values``) or given explicitly (exact-logit public cases), so a case is fully
reproducible from its description.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Tuple

import torch

from kpool.config import KPoolConfig
from kpool.metadata import BatchSpec, KPoolMetadata


@dataclass(frozen=True)
class OutputBufferSpec:
    """A caller-provided output buffer (kpool-algorithm.md §4.6 ``output_buffer``).

    The buffer is int32 ``[capacity * row_step, width]``; the kernel sees every ``row_step``-th
    row (a strided view), so rows in between and rows ``>= T`` must stay untouched.
    """

    capacity: int
    width: int
    row_step: int = 1


@dataclass(frozen=True)
class Step:
    """One forward of a case.

    Attributes:
        name: short label shown in reports (``"prefill"``, ``"decode@17"``...).
        batch: the batch description (requests, FULL-mode padding...).
        request_ids: case-level id of each live request in ``batch.requests`` (the oracle keys
            its history by these; a finished request's pages/ring block may be reused by a new id).
        compute_topk: ``False`` = cache-only update (kpool-algorithm.md §5.5).
        output_buffer: optional caller buffer.
        seed: seed of the generated inputs of this step.
        inputs: optional ``fn(case, step, metadata) -> dict`` returning explicit inputs
            (``k``, ``gate``, ``q``, ``weights``), overriding the generator.
        patch_metadata: optional ``fn(metadata) -> metadata`` applied after the builder
            (e.g. to plant out-of-range slots); the patched metadata is what both sides see.
        expect_error: exception type both sides must raise (bad-input steps, contract §5).
        expect_rule: the :data:`kpool.rules.RULES` name the kernel's exception must carry
            (``None``: any rule of ``expect_error``'s class); a build whose check of that rule
            was removed then fails even when a later check of the same class fires.
        bad_argument: a :data:`cases.bad_arguments.CORRUPTIONS` name: both sides get the step's
            keyword arguments with that corruption (a tensor or scalar rule broken).
        forks: prefix-cache resumes that happen before this step, as ``(src_id, dst_id,
            upto_position)``: request ``dst_id`` starts from the first ``upto_position`` tokens of
            ``src_id`` (its block table shares ``src_id``'s pages; the oracle copies that prefix
            with :meth:`reference.oracle.HistoryOracle.fork`). Kernel-correct only when
            ``upto_position`` is a multiple of P (kpool-algorithm.md §5.2).
        max_score_rows: the kernel side scores at most this many token rows per chunk of its
            score scratch (``kpool.indexer.forward(max_score_rows=...)``); ``None``: the kernel's
            own chunking (256 MiB of scratch, which no interpreter-sized case reaches). Results
            must not depend on it (kpool-algorithm.md §4.6).
        layout: optional :class:`cases.layouts.InputLayout`: both sides get the step's inputs
            and metadata as those strided views (same values, same strides).
    """

    name: str
    batch: BatchSpec
    request_ids: Sequence[int]
    compute_topk: bool = True
    output_buffer: Optional[OutputBufferSpec] = None
    seed: int = 0
    inputs: Optional[Callable] = None
    patch_metadata: Optional[Callable[[KPoolMetadata], KPoolMetadata]] = None
    expect_error: Optional[type] = None
    expect_rule: Optional[str] = None
    bad_argument: Optional[str] = None
    forks: Sequence[Tuple[int, int, int]] = ()
    max_score_rows: Optional[int] = None
    layout: Optional[object] = None


@dataclass(frozen=True)
class CacheGeometry:
    """Physical layout of both caches (kpool.cache.allocate_caches arguments; ``row_padding``:
    the rows of both caches padded, a strided-layouts family field)."""

    num_pages: int
    page_size: int
    num_tail_blocks: int
    page_padding: int = 0
    ring_block_padding: int = 0
    guard: int = 64
    row_padding: int = 0


@dataclass(frozen=True)
class Case:
    """A named multi-step scenario at one size.

    Attributes:
        name: scenario name (``"prefill-tail"``...), stable: reports and the corpus use it.
        size: ``"small"`` or ``"glm5.3-flash"``.
        config: hyper-parameters.
        geometry: cache layout.
        steps: the steps, run in order over the same caches.
        ape: fp32 ``[P, D]`` or ``None`` (generated from ``seed``).
        seed: case seed (APE and default input seeds).
        values: ``"random"`` or ``"exact"`` (bf16 small integers / dyadic fractions: every
            partial sum exact; no certified exception may apply, parity-contract.md §3).
        description: one line for reports.
    """

    name: str
    size: str
    config: KPoolConfig
    geometry: CacheGeometry
    steps: Sequence[Step]
    ape: Optional[torch.Tensor] = None
    seed: int = 0
    values: str = "random"
    description: str = ""
    tags: Sequence[str] = field(default_factory=tuple)

    @property
    def case_id(self) -> str:
        """``name[size]``: the id used in reports and bundles."""
        return f"{self.name}[{self.size}]"
