"""The one serializer of a :class:`cases.spec.Case`: a JSON document plus a tensor dictionary,
used by the corpus of shrunk failures (:mod:`cases.corpus`) and by the repro bundles
(:mod:`parity.sessions.bundle`) (parity-contract.md §1: a case is a sequence of steps over persistent
caches, reproducible from what is stored).

:func:`case_to_json` materialises every step (:func:`cases.steps.build_step`) and returns
``(doc, tensors)``:

* ``doc``: ``format``, ``name``, ``size``, ``description``, ``tags``, the caller's provenance
  fields, ``config``, ``geometry``, ``values``, ``seed`` and per step ``name``, ``request_ids``,
  ``requests`` (``[cached_len, query_len, block_table, ring_block]``), the FULL-mode flags
  (``num_tokens``, ``full_mode``, ``num_padded_requests``, ``block_table_width``,
  ``stale_tail_slots``), ``compute_topk``, ``seed``, ``output_buffer``, ``patch`` (a
  :class:`cases.patches.MetadataPatch` as JSON), ``patched_metadata`` (whether the step had any
  patch), ``expect_error`` (class name), ``forks``, ``max_score_rows``, ``layout`` and ``values`` (how the
  inputs were generated, informational);
* ``tensors``: ``ape`` (fp32 ``[P, D]``), ``inputs`` (per step ``k, gate, q, weights``) and, with
  ``with_metadata=True`` (bundles), ``meta`` (per step the exact metadata tensors both sides saw,
  so a replay never depends on today's builder or on a patch that is not serialisable).

:func:`case_from_json` inverts it: every step's inputs become :class:`SavedInputs`, and its
metadata the stored tensors (:class:`SavedMetadata`) or the builder's plus its ``patch``.
"""
from __future__ import annotations

import builtins
from dataclasses import asdict
from typing import Optional, Tuple

import torch

import kpool.errors as errors
from kpool.config import KPoolConfig
from kpool.metadata import BatchSpec, KPoolMetadata, RequestSpec

from .layouts import InputLayout
from .patches import MetadataPatch
from .spec import Case, CacheGeometry, OutputBufferSpec, Step
from .steps import build_step, fp32_ape
from .values import PAD_GATE, PAD_K, PAD_Q, PAD_W

FORMAT = 1
"""Version of the document layout (the corpus files carry it)."""


class SavedInputs:
    """``Step.inputs`` callable returning stored tensors (fresh copies each call).

    A metamorphic relation may ask for the same live rows under more FULL-mode padding rows
    (``metadata.num_tokens`` above the stored row count, the live rows unchanged): the extra rows
    get the large padding garbage of :mod:`cases.values`, as a generator would give them.

    Raises (on call):
        ValueError: the metadata needs fewer rows than stored, or more live rows than stored.
    """

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def __call__(self, case, step, metadata) -> dict:
        out = {n: t.clone() for n, t in self.tensors.items()}
        stored = next(iter(out.values())).shape[0] if out else 0
        T, t_live = int(metadata.num_tokens), int(metadata.num_live_tokens)
        if T == stored or not out:
            return out
        if T < stored or t_live > stored:
            raise ValueError(f"step {step.name}: the stored inputs have {stored} rows, the metadata needs "
                             f"{T} ({t_live} live)")
        fill = {"k": PAD_K, "gate": PAD_GATE, "q": PAD_Q, "weights": PAD_W}
        return {n: torch.cat([t, torch.full((T - stored, *t.shape[1:]), fill.get(n, 0.0), dtype=t.dtype)])
                for n, t in out.items()}


class SavedMetadata:
    """``Step.patch_metadata``: the stored metadata, whatever the builder produces.

    ``from_builder`` says the stored step had no patch of its own (its metadata is the
    builder's), so the metamorphic relations, which rebuild variants with the builder, still
    apply to it on replay (:func:`parity.checking.relation_base.is_plain`)."""

    def __init__(self, saved: dict, from_builder: bool = False):
        self.saved = saved
        self.from_builder = from_builder

    def __call__(self, meta):
        tensors = {k: v.clone() for k, v in self.saved.items() if isinstance(v, torch.Tensor)}
        return KPoolMetadata(max_pool_seq_len=int(self.saved["max_pool_seq_len"]),
                             num_live_tokens=int(self.saved["num_live_tokens"]), **tensors)


def error_class(name: Optional[str]):
    """The exception class a stored ``expect_error`` names: a :mod:`kpool.errors` class or a
    builtin exception; ``None`` for ``None``.

    Raises:
        ValueError: no such exception class.
    """
    if name is None:
        return None
    cls = getattr(errors, name, None) or getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise ValueError(f"unknown exception class {name!r}")
    return cls


def _step_doc(step, *, patches_required: bool) -> dict:
    patch = step.patch_metadata
    if patch is not None and not isinstance(patch, MetadataPatch) and patches_required:
        raise ValueError(f"step {step.name}: patch {patch!r} is not serialisable")
    b = step.batch
    # bad-input fields and the layout only where set (a corpus entry stays small and human-readable)
    layout = getattr(step, "layout", None)
    extra = {k: v for k, v in (("expect_rule", getattr(step, "expect_rule", None)),
                               ("bad_argument", getattr(step, "bad_argument", None)),
                               ("layout", layout.to_json() if layout is not None else None)) if v is not None}
    return {
        **extra,
        "name": step.name,
        "request_ids": list(step.request_ids),
        "requests": [[r.cached_len, r.query_len, [int(p) for p in r.block_table], r.ring_block] for r in b.requests],
        "num_tokens": b.num_tokens, "full_mode": b.full_mode, "num_padded_requests": b.num_padded_requests,
        "block_table_width": b.block_table_width, "stale_tail_slots": b.stale_tail_slots,
        "compute_topk": step.compute_topk, "seed": step.seed,
        "output_buffer": asdict(step.output_buffer) if step.output_buffer else None,
        "patch": patch.to_json() if isinstance(patch, MetadataPatch) else None,
        "patched_metadata": patch is not None and not getattr(patch, "from_builder", False),
        "expect_error": step.expect_error.__name__ if step.expect_error else None,
        "forks": [list(f) for f in step.forks],
        "max_score_rows": step.max_score_rows,
        # how the stored tensors were generated (informational: a load reads the tensors)
        "values": step.inputs.to_json() if hasattr(step.inputs, "to_json") else None,
    }


def _step_tensors(case, step, *, with_metadata: bool) -> Tuple[Optional[dict], Optional[dict]]:
    """``(inputs, metadata)`` of one step on the CPU; ``(None, None)`` when its setup fails and
    ``with_metadata`` (a bundle: the failure is its finding, a replay rebuilds and fails alike)."""
    try:
        built = build_step(case, step)
    except Exception:
        if with_metadata:
            return None, None
        raise
    inputs = {n: t.detach().cpu().clone() for n, t in built.inputs.items() if t is not None}
    meta = {n: t.detach().cpu().clone() for n, t in built.meta.tensors().items()}
    meta.update(max_pool_seq_len=int(built.meta.max_pool_seq_len), num_live_tokens=int(built.meta.num_live_tokens))
    return inputs, meta


def case_to_json(case: Case, *, with_metadata: bool = False, **info) -> Tuple[dict, dict]:
    """Serialise ``case`` (module docstring): ``(doc, tensors)``; inputs are materialised now.

    Args:
        case: the case.
        with_metadata: also store every step's metadata tensors (bundles); then a step whose
            patch is not a :class:`cases.patches.MetadataPatch` is fine (its metadata is stored),
            and a step whose setup fails is stored without tensors.
        info: provenance fields added to the document (``found_by``, ``fault``, ``expect``...).
    Raises:
        ValueError: without ``with_metadata``, a step's patch is not serialisable.
        kpool.errors.KPoolMetadataError: without ``with_metadata``, a step's setup fails.
    """
    steps = [_step_doc(s, patches_required=not with_metadata) for s in case.steps]
    tensors = {"ape": fp32_ape(case).detach().cpu().clone(), "inputs": []}
    metas = []
    for step in case.steps:
        inputs, meta = _step_tensors(case, step, with_metadata=with_metadata)
        tensors["inputs"].append(inputs)
        metas.append(meta)
    if with_metadata:
        tensors["meta"] = metas
    doc = {"format": FORMAT, "name": case.name, "size": case.size, "description": case.description,
           "tags": list(case.tags), **info, "config": asdict(case.config), "geometry": asdict(case.geometry),
           "values": case.values, "seed": case.seed, "steps": steps}
    return doc, tensors


def case_from_json(doc: dict, tensors: dict) -> Case:
    """Inverse of :func:`case_to_json`: every step reads its stored inputs and, when stored, its
    stored metadata.

    Raises:
        KeyError / TypeError / ValueError: a damaged document (callers say which file).
    """
    metas = tensors.get("meta") or [None] * len(doc["steps"])
    steps = []
    for s, inputs, meta in zip(doc["steps"], tensors["inputs"], metas):
        batch = BatchSpec([RequestSpec(c, q, list(bt), ring) for c, q, bt, ring in s["requests"]],
                          num_tokens=s["num_tokens"], full_mode=s["full_mode"],
                          num_padded_requests=s["num_padded_requests"], block_table_width=s["block_table_width"],
                          stale_tail_slots=s["stale_tail_slots"])
        if meta is not None:
            patch = SavedMetadata(meta, from_builder=not s.get("patched_metadata", s.get("patch") is not None))
        else:
            patch = MetadataPatch.from_json(s["patch"]) if s.get("patch") else None
        steps.append(Step(
            name=s["name"], batch=batch, request_ids=list(s["request_ids"]), compute_topk=s["compute_topk"],
            output_buffer=OutputBufferSpec(**s["output_buffer"]) if s["output_buffer"] else None,
            seed=s["seed"], inputs=SavedInputs(inputs) if inputs is not None else None,
            patch_metadata=patch, expect_error=error_class(s["expect_error"]), expect_rule=s.get("expect_rule"),
            bad_argument=s.get("bad_argument"),
            forks=tuple(tuple(f) for f in s.get("forks", ())), max_score_rows=s.get("max_score_rows"),
            layout=InputLayout.from_json(s.get("layout"))))
    return Case(name=doc["name"], size=doc["size"], config=KPoolConfig(**doc["config"]),
                geometry=CacheGeometry(**doc["geometry"]), steps=steps, ape=tensors["ape"], seed=doc["seed"],
                values=doc["values"], description=doc.get("description", ""), tags=tuple(doc.get("tags", ())))
