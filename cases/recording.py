"""Recording forwards: wrap a forward (kernel or reference) so a parity run keeps what every call
returned and left in the caches, for value assertions after :func:`parity.runner.run_case`
(public cases' stated values, run-to-run determinism, C27).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

METADATA_FIELDS = ("positions", "cum_query_lens", "raw_seq_lens", "seq_lens", "block_table", "slot_mapping",
                   "tail_block_table", "tail_slot_mapping")


@dataclass
class Call:
    """One recorded forward call (CPU copies).

    Attributes:
        out: int32 ``[T, 1, W]`` returned rows (``None`` for cache-only steps or on error).
        compressed: bf16 ``[N, B, 1, D]`` cache after the call. tail: fp32 ``[blocks, 2, C, D]`` ring
            after the call. error: the exception raised, if any. meta: the metadata tensors passed.
        inputs: ``k``, ``gate``, ``q``, ``weights`` passed.
    """

    out: Optional[torch.Tensor]
    compressed: torch.Tensor
    tail: torch.Tensor
    error: Optional[BaseException]
    meta: dict
    inputs: dict


def _cpu(t):
    return t.detach().to("cpu", copy=True) if isinstance(t, torch.Tensor) else t


class Recorder:
    """A forward that records every call (:class:`Call`) and otherwise behaves like ``forward``.

    Args:
        forward: the wrapped forward (keyword arguments of docs/design.md).

    Attributes:
        calls: recorded :class:`Call` objects, in call order.
    """

    def __init__(self, forward: Callable):
        self.forward = forward
        self.calls: List[Call] = []
        # A recorder of a metadata-checked reference is itself checked (cases.patches).
        self.__checked_metadata__ = getattr(forward, "__checked_metadata__", False)

    def __call__(self, **kwargs):
        out, error = None, None
        try:
            out = self.forward(**kwargs)
            return out
        except Exception as exc:
            error = exc
            raise
        finally:
            self.calls.append(Call(
                out=_cpu(out), compressed=_cpu(kwargs["compressed_cache"]), tail=_cpu(kwargs["tail_cache"]),
                error=error, meta={n: _cpu(kwargs[n]) for n in METADATA_FIELDS},
                inputs={n: _cpu(kwargs.get(n)) for n in ("k", "gate", "q", "weights")}))


def same_bits(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    """Bitwise equality of two tensors of one dtype (NaN payloads included); ``None == None``."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    width = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
