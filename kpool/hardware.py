"""Hardware gate: which accelerators the KPool backend runs on (kpool-algorithm.md §6
"Hardware gate"; platform-numerics.md §2.2, §6.2).

Ascend SoCs are identified by the integer ``torch_npu.npu.get_soc_version()`` with vllm-ascend's
ranges: 220-225 -> A2 (Ascend910B*), 250-255 -> A3 (Ascend910_93*), 260 -> A5 (Ascend950).
Everything else (310P 200-206, old 910A 100-104, 310B 240-243, unknown) is rejected with a
message naming the SoC. CUDA and the CPU interpreter are accepted as development targets.
Nothing here imports torch_npu or Triton at module import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import KPoolUnsupportedError

ASCEND_FAMILIES = (("A2", range(220, 226)), ("A3", range(250, 256)), ("A5", range(260, 261)))
REJECTED_FAMILIES = (("Ascend310P", range(200, 207)), ("Ascend910 (A1)", range(100, 105)),
                     ("Ascend310B", range(240, 244)))
UNSUPPORTED_MESSAGE = "KPool sparse attention requires Ascend A2, A3 or A5."


@dataclass(frozen=True)
class HardwareProfile:
    """What the backend runs on.

    Attributes:
        device: ``"npu"``, ``"cuda"`` or ``"cpu"`` (Triton interpreter).
        family: ``"A2"``, ``"A3"``, ``"A5"`` on NPU; the GPU name on CUDA; ``"interpreter"`` on cpu.
        soc_version: the integer SoC version on NPU, else ``None``.
        device_name: human-readable device name.
    """

    device: str
    family: str
    soc_version: Optional[int] = None
    device_name: str = ""

    @property
    def is_a5(self) -> bool:
        """Ascend 950 (A5): different codegen defaults (no multibuffer)."""
        return self.family == "A5"


def ascend_family(soc_version: int, device_name: str = "") -> str:
    """Map an integer SoC version to ``"A2"``/``"A3"``/``"A5"``.

    Raises:
        KPoolUnsupportedError: any other SoC; the message names it.
    """
    for family, versions in ASCEND_FAMILIES:
        if soc_version in versions:
            return family
    label = next((name for name, versions in REJECTED_FAMILIES if soc_version in versions), "unknown SoC")
    shown = f"{device_name} " if device_name else ""
    raise KPoolUnsupportedError(f"{UNSUPPORTED_MESSAGE} Found {shown}({label}, soc_version={soc_version}).")


def hardware_profile(device: str) -> HardwareProfile:
    """Probe the hardware of a resolved device (``kpool.platform.resolve_device``).

    Raises:
        KPoolUnsupportedError: an unsupported Ascend SoC, or an unknown device name.
    """
    if device == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)
        import torch
        version = int(torch_npu.npu.get_soc_version())
        name = str(torch.npu.get_device_name())
        return HardwareProfile("npu", ascend_family(version, name), version, name)
    if device == "cuda":
        import torch
        name = torch.cuda.get_device_name()
        return HardwareProfile("cuda", name, None, name)
    if device == "cpu":
        return HardwareProfile("cpu", "interpreter", None, "Triton interpreter (CPU)")
    raise KPoolUnsupportedError(f"unknown device {device!r}")


_PROFILE: Optional[HardwareProfile] = None


def current_hardware_profile(device) -> HardwareProfile:
    """The profile of the process's resolved backend, probed once per process.

    Args:
        device: the backend name, or a zero-argument callable returning it
            (``kpool.platform.resolve_device``: called only when nothing is cached yet, and passed
            by the caller so that this module imports nothing of ``kpool.platform``).
    Raises:
        KPoolUnsupportedError: as :func:`hardware_profile`.
    """
    global _PROFILE
    if _PROFILE is None:          # one backend per process (resolve_device is cached too)
        _PROFILE = hardware_profile(device() if callable(device) else device)
    return _PROFILE
