"""Launch geometry of the KPool kernels (platform-numerics.md §1.3, §6.1, §6.2).

Every kernel runs a fixed grid of ``min(work, cores * programs_per_core, limit)`` programs and
walks its tiles with a grid-stride loop, so the grid never depends on the problem size beyond
``work`` and never exceeds Ascend's ``coreDim <= UINT16_MAX`` (65535):

* npu: ``cores`` = vector cores, ``triton.runtime.driver.active.utils.get_device_properties(i)
  ["num_vectorcore"]`` (``num_aicore`` if absent); vector-only kernels, one program per core.
* cuda: ``cores`` = streaming multiprocessors, ``torch.cuda.get_device_properties(d)
  .multi_processor_count``.
* cpu (Triton interpreter): no core count; programs run one after another, so only ``limit``
  (or a caller's small cap) applies. The Triton driver is never touched there (it raises
  "0 active drivers" on a host without GPU/NPU).

Core counts are read once per (backend, device index) and cached. The grid only decides which
program computes which tile, never the order of any cell's operations, so results are bitwise
independent of it. Importing this module imports Triton and torch only.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton

GRID_LIMIT = 65535
"""Most programs in one launch: Ascend ``coreDim`` is a uint16 (platform-numerics.md §1.3)."""

_core_cache: dict = {}


def _device_index(backend: str, device: torch.device) -> int:
    """Explicit index of ``device``, else the backend's current device."""
    if device.index is not None:
        return int(device.index)
    if backend == "cuda":
        return int(torch.cuda.current_device())
    return int(torch.npu.current_device())


def core_count(backend: str, device: torch.device) -> Optional[int]:
    """Parallel cores the grid is sized from, or ``None`` on the interpreter.

    Args:
        backend: ``"cuda"``, ``"npu"`` or ``"cpu"``.
        device: the torch device the kernel's tensors live on (index ``None`` = current device).
    Returns:
        cuda: SM count; npu: ``num_vectorcore`` (``num_aicore`` if missing, 1 if neither);
        cpu: ``None``. Always ``>= 1`` when not ``None``.
    """
    if backend not in ("cuda", "npu"):
        return None
    index = _device_index(backend, device)
    key = (backend, index)
    if key not in _core_cache:
        if backend == "cuda":
            cores = torch.cuda.get_device_properties(index).multi_processor_count
        else:
            props = triton.runtime.driver.active.utils.get_device_properties(index)
            cores = props.get("num_vectorcore") or props.get("num_aicore") or 1
        _core_cache[key] = max(1, int(cores))
    return _core_cache[key]


def launch_grid(work: int, backend: str, device: torch.device, *, programs_per_core: int = 1,
                limit: int = GRID_LIMIT, cpu_cap: Optional[int] = None) -> int:
    """Programs of a 1-D launch over ``work`` tiles (the kernel grid-strides over the rest).

    ``min(work, cores * programs_per_core, limit)`` on cuda/npu; ``min(work, cpu_cap, limit)``
    on cpu (``cpu_cap=None``: no extra cap); at least 1.

    Args:
        work: number of tiles (logical blocks), ``>= 0``.
        backend, device: as :func:`core_count`.
        programs_per_core: resident programs per core (cuda: more than one per SM hides memory
            latency; npu: 1, each vector core runs one block at a time).
        limit: upper bound (default :data:`GRID_LIMIT`; callers may pass a smaller one).
        cpu_cap: upper bound on the interpreter.
    Returns:
        int grid size in ``[1, min(limit, GRID_LIMIT)]``.
    """
    cores = core_count(backend, device)
    cap = min(int(limit), GRID_LIMIT)
    if cores is not None:
        cap = min(cap, cores * max(1, int(programs_per_core)))
    elif cpu_cap is not None:
        cap = min(cap, int(cpu_cap))
    return max(1, min(int(work), cap))
