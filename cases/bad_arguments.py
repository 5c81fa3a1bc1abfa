"""Forward arguments that break exactly one tensor or scalar rejection rule of
``validate_forward`` (parity-contract.md §5; kpool-algorithm.md §2, §3, §4.6; the rules of
:data:`kpool.rules.RULES`).

A step with ``Step.bad_argument = NAME`` (the seed scenario ``bad-arguments``) hands both sides
:func:`corrupt` ``(NAME, kwargs)`` instead of its valid keyword arguments: the kernel must raise
the rule's class with the rule's name before any launch, the reference side's harness check
(:func:`parity.checking.checked_reference.check_arguments`) must raise too, and nothing may be written.
Every corruption builds new tensors or views; it never writes the valid ones.
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np
import torch

from kpool import errors as E


def _replace(**changes) -> Callable[[dict], dict]:
    return lambda kw: dict(kw, **{n: f(kw) for n, f in changes.items()})


def _out_buffer(width_delta: int = 0, column_step: int = 1, row_stride_delta: int = 0):
    def make(kw):
        T, P = kw["k"].shape[0], kw["index_kpool"]
        W = kw["index_topk"] + P - 1
        if row_stride_delta:
            base = torch.full((T * W + W,), -7, dtype=torch.int32, device=kw["k"].device)
            return base.as_strided((T, W), (W + row_stride_delta, 1))
        buf = torch.full((T, (W + width_delta) * column_step), -7, dtype=torch.int32, device=kw["k"].device)
        return buf[:, ::column_step]
    return make


def _self_overlap(kw):
    c = kw["compressed_cache"]
    return c.as_strided(c.shape, (0,) + tuple(c.stride()[1:]), c.storage_offset())


def _alias_k(kw):
    T, D = kw["k"].shape
    ring = kw["tail_cache"]
    flat = ring.as_strided((ring.numel() // D, D), (D, 1), ring.storage_offset()) if ring.is_contiguous() else None
    return flat[:T] if flat is not None and flat.shape[0] >= T else kw["tail_cache"][0, 0, :T]


CORRUPTIONS: Dict[str, Tuple[Callable[[dict], dict], type]] = {
    "scalar-int-type": (_replace(index_topk=lambda kw: np.int64(kw["index_topk"])), E.KPoolTypeError),
    "scalar-bool-type": (_replace(compute_topk=lambda kw: 1), E.KPoolTypeError),
    "index-kpool-positive": (_replace(index_kpool=lambda kw: 0), E.KPoolConfigError),
    "index-topk-multiple": (_replace(index_topk=lambda kw: kw["index_topk"] + 1), E.KPoolConfigError),
    "score-mode": (_replace(score_mode=lambda kw: "softmax"), E.KPoolConfigError),
    "tensor-type": (_replace(gate=lambda kw: kw["gate"].cpu().numpy()), E.KPoolDtypeError),
    "dtype": (_replace(q=lambda kw: kw["q"].float()), E.KPoolDtypeError),
    "shape": (_replace(gate=lambda kw: kw["gate"][:, :-1]), E.KPoolShapeError),
    "ring-capacity": (_replace(tail_cache=lambda kw: kw["tail_cache"][:, :, :kw["index_kpool"] - 1]), E.KPoolShapeError),
    "cache-inner-stride": (_replace(compressed_cache=lambda kw: kw["compressed_cache"][..., ::2],
                                    tail_cache=lambda kw: kw["tail_cache"][..., ::2],
                                    k=lambda kw: kw["k"][:, ::2], gate=lambda kw: kw["gate"][:, ::2],
                                    ape=lambda kw: kw["ape"][:, ::2], q=lambda kw: kw["q"][..., ::2]),
                           E.KPoolShapeError),
    "cache-empty": (_replace(compressed_cache=lambda kw: kw["compressed_cache"][:0]), E.KPoolShapeError),
    "tail-block-table-columns": (_replace(tail_block_table=lambda kw: kw["tail_block_table"][:, :0]), E.KPoolShapeError),
    "q-heads": (_replace(q=lambda kw: kw["q"][:, :0], weights=lambda kw: kw["weights"][:, :0]), E.KPoolShapeError),
    "output-buffer-shape": (_replace(output_buffer=_out_buffer(width_delta=-1)), E.KPoolShapeError),
    "output-buffer-column-stride": (_replace(output_buffer=_out_buffer(column_step=2)), E.KPoolShapeError),
    "output-buffer-row-overlap": (_replace(output_buffer=_out_buffer(row_stride_delta=-1)), E.KPoolShapeError),
    "one-device": (_replace(weights=lambda kw: kw["weights"].to("meta")), E.KPoolShapeError),
    "written-self-overlap": (_replace(compressed_cache=_self_overlap), E.KPoolAliasingError),
    "written-aliases": (_replace(k=_alias_k), E.KPoolAliasingError),
}
"""Rule name -> ``(fn(kwargs) -> kwargs, error class)``. Needs a scored step (``compute_topk``)
of at least two rows, ``C >= 2`` and an even head dim (``bad-arguments`` has them)."""


def corrupt(name: str, kwargs: dict) -> dict:
    """``kwargs`` with the corruption ``name`` (:data:`CORRUPTIONS`) applied (a new dict).

    Raises:
        KeyError: unknown name.
    """
    return CORRUPTIONS[name][0](kwargs)
