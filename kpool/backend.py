"""Model-side KPool indexer backend (kpool-algorithm.md §6; platform-numerics.md §3, §6.2).

Construction is where capability checks happen (not import): the device is resolved, the
hardware gate applied (Ascend A2/A3/A5; CUDA and the CPU interpreter as development targets),
PCP/DCP rejected with messages naming the CLI flags, and the Triton kernels imported.
"""
from __future__ import annotations

import importlib
from typing import Optional

from .config import KPoolConfig
from .errors import KPoolUnsupportedError
from .hardware import HardwareProfile, hardware_profile
from .platform import resolve_device, torch_device

PCP_MESSAGE = ("GLM-Next KPool indexing does not support PCP or DCP: set "
               "--prefill-context-parallel-size (prefill_context_parallel_size) to 1")
DCP_MESSAGE = ("GLM-Next KPool indexing does not support PCP or DCP: set "
               "--decode-context-parallel-size (decode_context_parallel_size) to 1")


def check_context_parallel(*, prefill_context_parallel_size: int = 1, decode_context_parallel_size: int = 1,
                           pcp_world_size: int = 1, dcp_world_size: int = 1) -> None:
    """Reject prefill/decode context parallelism (kpool-algorithm.md §6 "PCP / DCP").

    Raises:
        KPoolUnsupportedError: naming ``prefill_context_parallel_size`` or
            ``decode_context_parallel_size`` (and the CLI flag) when the size is > 1.
    """
    if max(prefill_context_parallel_size, pcp_world_size) > 1:
        raise KPoolUnsupportedError(
            f"{PCP_MESSAGE} (got {max(prefill_context_parallel_size, pcp_world_size)})")
    if max(decode_context_parallel_size, dcp_world_size) > 1:
        raise KPoolUnsupportedError(
            f"{DCP_MESSAGE} (got {max(decode_context_parallel_size, dcp_world_size)})")


class KPoolIndexerBackend:
    """The KPool indexer of one layer on the resolved device.

    Args:
        config: hyper-parameters (validated by :class:`KPoolConfig`).
        device: ``None``/``"auto"``, ``"npu"``, ``"cuda"`` or ``"cpu"`` (interpreter).
        prefill_context_parallel_size, decode_context_parallel_size, pcp_world_size,
        dcp_world_size: parallel configuration; anything > 1 is rejected.

    Attributes:
        supports_pcp: ``False`` (so vLLM's own compatibility check fires too).
        can_return_lse_for_decode: ``False``.
        profile: the :class:`HardwareProfile`.

    Raises:
        KPoolUnsupportedError: unsupported hardware or PCP/DCP > 1, at construction.
    """

    supports_pcp = False
    can_return_lse_for_decode = False

    def __init__(self, config: KPoolConfig, *, device: Optional[str] = None,
                 prefill_context_parallel_size: int = 1, decode_context_parallel_size: int = 1,
                 pcp_world_size: int = 1, dcp_world_size: int = 1) -> None:
        check_context_parallel(prefill_context_parallel_size=prefill_context_parallel_size,
                               decode_context_parallel_size=decode_context_parallel_size,
                               pcp_world_size=pcp_world_size, dcp_world_size=dcp_world_size)
        self.config = config
        self.device_name = resolve_device(device)
        self.profile: HardwareProfile = hardware_profile(self.device_name)
        self.device = torch_device(self.device_name)
        # Kernels are imported here, not at module import (a metadata-only process never loads Triton).
        self._compress = importlib.import_module(".ops.compress", __package__)
        self._indexer = importlib.import_module(".ops.indexer", __package__)
        self._orchestration = importlib.import_module(".indexer", __package__)

    def forward(self, *, k, gate, q, weights, ape, caches, metadata, compute_topk: bool = True,
                output_buffer=None, validate: bool = True):
        """Run one forward: see :func:`kpool.indexer.forward` for shapes, dtypes and errors.

        Args:
            caches: :class:`kpool.cache.KPoolCaches` (updated in place).
            metadata: :class:`kpool.metadata.KPoolMetadata`.
        """
        cfg = self.config
        return self._orchestration.forward(
            k=k, gate=gate, q=q, weights=weights, ape=ape,
            compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
            index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, score_mode=cfg.score_mode,
            pack_tail=cfg.pack_tail, compute_topk=compute_topk, output_buffer=output_buffer,
            validate=validate, **metadata.forward_kwargs())
