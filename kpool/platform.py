"""Device resolution and per-backend launch options (platform-numerics.md §6.2).

Order: ``KPOOL_DEVICE`` in {auto, npu, cuda, cpu} (default auto); if ``TRITON_INTERPRET=1`` is
already set -> cpu; else npu when ``torch_npu`` imports and ``torch.npu.is_available()``; else cuda
when ``torch.cuda.is_available()``; else cpu. ``cpu`` means the Triton interpreter: the resolver
sets ``TRITON_INTERPRET=1`` before any kernel module is imported (Triton reads it when a kernel
is decorated), installs the interpreter compatibility patch (:func:`install_interpreter_compat`),
and raises if kernels were already imported in compiled mode.

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
_KERNEL_MODULES = ("kpool.ops.compress", "kpool.ops.score", "kpool.ops.merged", "kpool.ops.expand",
                   "kpool.ops.indexer")


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

    For ``cpu`` sets ``TRITON_INTERPRET=1`` and calls :func:`install_interpreter_compat`; raises
    if a kernel module was already imported while ``TRITON_INTERPRET`` was unset (the two modes
    cannot be mixed in one process). For ``cuda``/``npu`` raises if ``TRITON_INTERPRET=1`` is set.

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
        install_interpreter_compat()
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
        # the resolved backend's profile (a CPU host planning NPU tiles probes no NPU)
        return {"multibuffer": not current_hardware_profile(resolve_device).is_a5, "enable_fp_fusion": False}
    return {}


def install_interpreter_compat() -> bool:
    """Make runtime loop bounds work in the Triton interpreter under NumPy >= 2.3, and helper calls
    cheap (:func:`kpool.interpreter_calls.install`); idempotent.

    Why: the interpreter wraps every scalar kernel argument and ``tl.program_id`` in a
    1-element 1-D array and converts it for ``range(...)`` with ``int(array)``, which NumPy >= 2.3
    rejects ("only 0-dimensional arrays can be converted to Python scalars"); NumPy 1.25-2.2 only
    warn, once per runtime loop of every launch. Any ``for i in range(0, n)`` with a runtime ``n``
    then fails. This re-registers ``tensor.__index__`` to read the single element, wrapping the
    interpreter's ``_patch_lang_tensor`` in both shapes it has (platform-numerics.md §5):

    * triton >= 3.4 (3.6 here): ``_patch_lang_tensor(tensor, scope)``; attributes go through
      ``scope.set_attr`` and are restored LIFO when the launch ends, so ours is undone first.
    * triton-ascend 3.2 (Triton 3.2 base): ``_patch_lang_tensor(tensor)`` assigns the attributes
      directly and never restores them; ours is assigned right after and stays.

    Called by :func:`resolve_device` for ``cpu``; callable on its own (the harness calls it before
    interpreting other kernels too). It changes nothing a compiled kernel uses, so calling it in
    compiled mode is harmless. Imports Triton.

    Returns:
        True when the interpreter is patched (now or by an earlier call), False when nothing needed
        or could be patched: NumPy < 1.25 (plain ``int()`` works), no interpreter module, or an
        interpreter of another shape (the kernels then fail loudly at the first runtime loop).
    """
    import warnings

    import numpy as np

    from . import interpreter_calls
    interpreter_calls.install()     # helper calls without re-patching the language (speed only)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            int(np.array([1]))
            return False            # NumPy < 1.25: nothing to fix
        except (TypeError, DeprecationWarning):
            pass
    try:
        from triton.runtime import interpreter as _interp
    except ImportError:  # pragma: no cover - a Triton build without the interpreter module
        return False
    original = getattr(_interp, "_patch_lang_tensor", None)
    if original is None:
        return False
    if getattr(original, "_kpool_compat", False):
        return True
    wrapped = compat_patch_lang_tensor(original)
    if wrapped is original:
        return False
    _interp._patch_lang_tensor = wrapped
    return True


def _scalar_index(self) -> int:
    """``tensor.__index__`` for the interpreter: the single element of the 1-element array."""
    return int(self.handle.data.reshape(-1)[0])


def compat_patch_lang_tensor(original):
    """Wrap an interpreter's ``_patch_lang_tensor`` (one- or two-argument form, see
    :func:`install_interpreter_compat`) so that ``tensor.__index__`` reads the single element;
    any other signature is returned unchanged."""
    import inspect
    try:
        n_params = len(inspect.signature(original).parameters)
    except (TypeError, ValueError):  # pragma: no cover - builtins have no signature
        return original
    if n_params == 1:
        def _patch_lang_tensor(tensor):
            original(tensor)
            tensor.__index__ = _scalar_index
    elif n_params == 2:
        def _patch_lang_tensor(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", _scalar_index)
    else:
        return original
    _patch_lang_tensor._kpool_compat = True
    return _patch_lang_tensor
