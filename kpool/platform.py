"""Device resolution and per-backend launch options (platform-numerics.md §6.2).

Order: ``KPOOL_DEVICE`` in {auto, npu, cuda, cpu} (default auto); if ``TRITON_INTERPRET=1`` is
already set -> cpu; else npu when ``torch_npu`` imports and ``torch.npu.is_available()``; else cuda
when ``torch.cuda.is_available()``; else cpu. ``cpu`` means the Triton interpreter: the resolver
sets ``TRITON_INTERPRET=1`` before any kernel module is imported (Triton reads it when a kernel
is decorated), and raises if kernels were already imported in compiled mode.

Nothing here imports Triton at module import.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from functools import lru_cache

import torch

from .errors import KPoolUnsupportedError

DEVICES = ("npu", "cuda", "cpu")
_KERNEL_MODULES = ("kpool.ops.compress", "kpool.ops.indexer")


def _npu_available() -> bool:
    try:
        if importlib.util.find_spec("torch_npu") is None:
            return False
        import torch_npu  # noqa: F401
        return bool(torch.npu.is_available())
    except Exception:
        return False


def detect_device(requested: str | None = None) -> str:
    """Pick ``"npu"``, ``"cuda"`` or ``"cpu"`` (interpreter) without side effects.

    Args:
        requested: ``None``/``"auto"`` or one of :data:`DEVICES`; ``None`` reads ``KPOOL_DEVICE``.
    Raises:
        KPoolUnsupportedError: an unknown name, or a device that is not available here.
    """
    name = (requested or os.environ.get("KPOOL_DEVICE") or "auto").lower()
    if name not in ("auto",) + DEVICES:
        raise KPoolUnsupportedError(f"KPOOL_DEVICE must be one of auto, npu, cuda, cpu; got {name!r}")
    if name == "auto":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return "cpu"
        if _npu_available():
            return "npu"
        if torch.cuda.is_available():
            return "cuda"
        return "cpu"
    if name == "npu" and not _npu_available():
        raise KPoolUnsupportedError("KPOOL_DEVICE=npu but torch_npu is missing or sees no NPU")
    if name == "cuda" and not torch.cuda.is_available():
        raise KPoolUnsupportedError("KPOOL_DEVICE=cuda but torch.cuda.is_available() is False")
    return name


@lru_cache(maxsize=None)
def resolve_device(requested: str | None = None) -> str:
    """:func:`detect_device`, then make the choice effective for Triton, once per process.

    For ``cpu`` sets ``TRITON_INTERPRET=1``; raises if a kernel module was already imported
    while ``TRITON_INTERPRET`` was unset (the two modes cannot be mixed in one process). For
    ``cuda``/``npu`` raises if ``TRITON_INTERPRET=1`` is set.

    Raises:
        KPoolUnsupportedError: as :func:`detect_device`, or on a mode conflict.
    """
    device = detect_device(requested)
    loaded = [m for m in _KERNEL_MODULES if m in sys.modules]
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if device == "cpu":
        if loaded and not interp:
            raise KPoolUnsupportedError(
                f"kernels {loaded} were imported in compiled mode; set KPOOL_DEVICE=cpu (or "
                "TRITON_INTERPRET=1) before importing kpool.ops")
        os.environ["TRITON_INTERPRET"] = "1"
    elif interp:
        raise KPoolUnsupportedError(f"TRITON_INTERPRET=1 is set but device {device!r} was requested")
    return device


def torch_device(device: str) -> torch.device:
    """The torch device for a resolved backend name (``npu`` -> ``npu:current``)."""
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("npu", torch.npu.current_device())


def launch_options(device: str) -> dict:
    """Backend-specific Triton launch kwargs (platform-numerics.md §6.2).

    cuda: ``num_warps=4`` and ``enable_fp_fusion=False`` (no FMA contraction: bit parity);
    npu: ``multibuffer=True`` (False on A5) and ``enable_fp_fusion=False`` (the field exists in
    triton-ascend's NPUOptions; whether BiShengIR contracts mul+add is unverified, §6.4 item 2);
    cpu (interpreter): none. NPU-only options are
    never returned for CUDA (compiled upstream Triton rejects unknown kwargs).
    """
    if device == "cuda":
        return {"num_warps": 4, "enable_fp_fusion": False}
    if device == "npu":
        from .hardware import current_hardware_profile
        return {"multibuffer": not current_hardware_profile().is_a5, "enable_fp_fusion": False}
    return {}
