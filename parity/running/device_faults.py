"""A kernel fault on a device is a crash, as a segfault is under the interpreter (parity-contract.md §6).

A kernel that reads out of bounds on CUDA does not kill the process: the launch returns, the
fault surfaces asynchronously as ``torch.AcceleratorError: CUDA error: an illegal memory
access was encountered`` at the next synchronizing operation, and the context stays broken
("sticky"): every later CUDA call of the process fails the same way. Left alone, the harness's
next tensor operation raises and every following case of the worker becomes a ``harness-crash``
(or hypothesis calls the case ``flaky``) although the harness did nothing wrong.

So the isolated worker checks the device after every call of the implementation under test
(:func:`device_fault`: one synchronize) and, when the context failed, writes what the device said
to its fault log and exits with :data:`DEVICE_FAULT_EXIT` (:func:`exit_on_device_fault`). The
parent then handles it as any dead worker: one ``crash`` finding for the case (step, kernel call,
the device's message), a fresh worker for the next case, and for generated kinds the case is
skipped on the re-run. The check costs one synchronize per implementation call, only in isolated
workers on a device; the interpreter has no device context (nothing to check).

Importing this module imports neither torch nor any kernel.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

DEVICE_FAULT_EXIT = 86
"""Exit status of an isolated worker whose device context failed (not a signal, not 0/1)."""


def _synchronize(device: str) -> None:
    import torch

    from ..implementations.forwards import sync      # the harness's one device synchronize
    sync(torch.device(device))


def device_fault(device: str, sync: Optional[Callable[[str], None]] = None) -> Optional[str]:
    """``None`` when ``device``'s context works, else the device's error text.

    Args:
        device: ``"cuda"``, ``"npu"`` or ``"cpu"`` (the interpreter: always ``None``).
        sync: the synchronize to try (default ``parity.implementations.forwards.sync``; tests pass a
            fake).
    """
    if device not in ("cuda", "npu"):
        return None
    try:
        (sync or _synchronize)(device)
    except Exception as exc:  # a broken context raises from any synchronizing call
        return f"{type(exc).__name__}: {str(exc).strip()}"
    return None


def exit_on_device_fault(device: str, call: int, log, raised: Optional[BaseException] = None,
                         sync: Optional[Callable[[str], None]] = None,
                         exit_fn: Callable[[int], None] = os._exit) -> None:
    """After implementation call number ``call``: when the device context failed, write the
    device's message (and what the call raised, if it raised) to ``log`` (a text file, the
    worker's fault log) and end the process with :data:`DEVICE_FAULT_EXIT`; else return."""
    text = device_fault(device, sync)
    if text is None:
        return
    lines = [f"the {device} context failed during kernel call {call} (an asynchronous fault: the kernel that "
             f"faulted ran in or before that call); every later device call of the worker would fail: {text}"]
    if raised is not None:
        lines.append(f"the call raised {type(raised).__name__}: {str(raised).strip()}")
    log.write("\n".join(lines) + "\n")
    log.flush()
    exit_fn(DEVICE_FAULT_EXIT)


def call_checked(raw: Callable, kwargs: dict, device: str, call: int, log):
    """``raw(**kwargs)`` followed by :func:`exit_on_device_fault` (also when it raised: a device
    fault ends the process, any other exception propagates)."""
    try:
        out = raw(**kwargs)
    except Exception as exc:
        exit_on_device_fault(device, call, log, exc)
        raise
    exit_on_device_fault(device, call, log)
    return out
