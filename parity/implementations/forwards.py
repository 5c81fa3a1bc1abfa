"""Calling a forward on a device: device resolution, synchronisation, timing and keyword probing
(shared by the runner, its determinism repeats and the metamorphic relations).

Importing this module never imports Triton: the kernel device is resolved through
:mod:`kpool.platform` only when a name has to become a torch device.
"""
from __future__ import annotations

import inspect
import time
from typing import Callable

import torch


def torch_device(device) -> torch.device:
    """A torch device from a backend name (``auto``/``cpu``/``cuda``/``npu``) or a torch device."""
    if isinstance(device, torch.device):
        return device
    from kpool.platform import resolve_device, torch_device as to_torch
    return to_torch(resolve_device(None if device in (None, "auto") else device))


def backend_of(dev: torch.device) -> str:
    """``"cuda"``, ``"npu"`` or ``"cpu"`` (interpreter) for a kernel torch device."""
    return dev.type if dev.type in ("cuda", "npu") else "cpu"


def sync(dev: torch.device) -> None:
    """Wait for the device's queued work (a forward's wall time must include its kernels)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "npu":
        torch.npu.synchronize()


def call(fn: Callable, kwargs: dict, dev: torch.device):
    """Run ``fn(**kwargs)`` and synchronise ``dev``; return ``(result, exception or None, wall
    seconds)``: an exception is the caller's finding, never raised."""
    t0 = time.perf_counter()
    try:
        out = fn(**kwargs)
        sync(dev)
        return out, None, time.perf_counter() - t0
    except Exception as exc:  # the harness reports it; it must not stop the run
        return None, exc, time.perf_counter() - t0


def accepts_keyword(fn: Callable, name: str, *, explicit: bool = False) -> bool:
    """Whether ``fn`` takes keyword ``name``, looking through wrappers that forward ``**kwargs``
    (``fn.forward`` of :class:`parity.implementations.recording.Recorder`, ``__wrapped__``).
    ``explicit``: only when a function on the way names it (a bare ``**kwargs`` at the end, which
    may pass it on to a forward without it, does not count): for optional hints."""
    for _ in range(8):
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        if name in params:
            return True
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return False
        inner = getattr(fn, "forward", None) or getattr(fn, "__wrapped__", None)
        if inner is None or inner is fn:
            return not explicit
        fn = inner
    return not explicit


def longest_query(meta) -> int:
    """The longest request's query rows of ``meta`` (a :class:`kpool.metadata.KPoolMetadata`), from
    its ``cum_query_lens``: 0 without requests, never negative, also on metadata that breaks the
    length rules. The ``max_query_len`` a serving engine would pass with it."""
    cum = meta.cum_query_lens.detach().cpu().long()
    if cum.numel() == 0:
        return 0
    return max(0, int(torch.diff(cum, prepend=cum.new_zeros(1)).max()))
