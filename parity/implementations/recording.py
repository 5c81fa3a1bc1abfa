"""Recording forwards: wrap a forward (kernel or reference) so a parity run keeps what every call
returned and left in the caches, for value assertions after :func:`parity.running.runner.run_case`
(public cases' stated values, run-to-run determinism of generated cases, C27).
"""
from __future__ import annotations

from typing import Callable, List

import torch

from cases.public.model import Call

METADATA_FIELDS = ("positions", "cum_query_lens", "raw_seq_lens", "seq_lens", "block_table", "slot_mapping",
                   "tail_block_table", "tail_slot_mapping")


def _cpu(t):
    return t.detach().to("cpu", copy=True) if isinstance(t, torch.Tensor) else t


class Recorder:
    """A forward that records every call (:class:`cases.public.model.Call`) and otherwise behaves
    like ``forward``.

    Args:
        forward: the wrapped forward (keyword arguments of docs/design.md).

    Attributes:
        calls: recorded :class:`cases.public.model.Call` objects, in call order.
    """

    def __init__(self, forward: Callable):
        self.forward = forward
        self.calls: List[Call] = []
        # A recorder of a metadata-checked reference is itself checked (parity.checking.checked_reference).
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
