"""Model-side KPool indexer backend (kpool-algorithm.md §6; platform-numerics.md §3, §6.2).

Construction is where capability checks happen (not import): the device is resolved, the
hardware gate applied (Ascend A2/A3/A5; CUDA and the CPU interpreter as development targets),
PCP/DCP rejected with messages naming the CLI flags, and the Triton kernels imported.
"""
from __future__ import annotations

import importlib
from typing import Optional

from .cache import check_cache_layout
from .config import KPoolConfig
from .hardware import HardwareProfile, hardware_profile
from .platform import resolve_device, torch_device
from .rules import as_int, reject

PCP_MESSAGE = ("GLM-Next KPool indexing does not support PCP or DCP: set "
               "--prefill-context-parallel-size (prefill_context_parallel_size) to 1")
DCP_MESSAGE = ("GLM-Next KPool indexing does not support PCP or DCP: set "
               "--decode-context-parallel-size (decode_context_parallel_size) to 1")


def check_context_parallel(*, prefill_context_parallel_size: int = 1, decode_context_parallel_size: int = 1,
                           pcp_world_size: int = 1, dcp_world_size: int = 1) -> None:
    """Reject prefill/decode context parallelism (kpool-algorithm.md §6 "PCP / DCP").

    Raises:
        KPoolTypeError: a size that is not an int (a bool, a float...).
        KPoolConfigError: a size < 1 (a negative DCP size is a configuration bug, not "no DCP").
        KPoolUnsupportedError: naming ``prefill_context_parallel_size`` or
            ``decode_context_parallel_size`` (and the CLI flag) when the size is > 1.
    """
    sizes = dict(prefill_context_parallel_size=prefill_context_parallel_size, pcp_world_size=pcp_world_size,
                 decode_context_parallel_size=decode_context_parallel_size, dcp_world_size=dcp_world_size)
    for name, value in sizes.items():
        if as_int(name, value) < 1:
            reject("context-parallel-size", f"{name} must be a positive int (1 = no context parallelism), got {value}")
    if max(prefill_context_parallel_size, pcp_world_size) > 1:
        reject("context-parallel-unsupported",
               f"{PCP_MESSAGE} (got {max(prefill_context_parallel_size, pcp_world_size)})")
    if max(decode_context_parallel_size, dcp_world_size) > 1:
        reject("context-parallel-unsupported",
               f"{DCP_MESSAGE} (got {max(decode_context_parallel_size, dcp_world_size)})")


def check_call_matches_config(config: KPoolConfig, *, k, q, weights, caches, metadata, compute_topk) -> None:
    """The caches and data of a backend call agree with the backend's config (host-side shape
    reads only, no sync): ``D``, ``H``, ``C`` (kpool-algorithm.md §2, §3.3). ``P`` is checked by
    :func:`kpool.validation.validate_forward` itself (``ape`` ``[P, D]``, ``seq_lens == raw // P``,
    the §3.2 slots), which runs with the config's ``index_kpool``.

    Raises:
        KPoolTypeError: ``caches`` / ``metadata`` are not :class:`kpool.cache.KPoolCaches` /
            :class:`kpool.metadata.KPoolMetadata` (duck-typed).
        KPoolDtypeError, KPoolShapeError: see :func:`kpool.cache.check_cache_layout`; ``k``/``q``
            head dim not ``D`` (``config-head-dim``); ``q``/``weights`` heads not ``H``
            (``config-heads``).
    """
    for name, obj, attrs in (("caches", caches, ("compressed_cache", "tail_cache")),
                             ("metadata", metadata, ("forward_kwargs",))):
        if not all(hasattr(obj, a) for a in attrs):
            reject("argument-type", f"{name} must be a {'KPoolCaches' if name == 'caches' else 'KPoolMetadata'}, "
                                    f"got {type(obj).__name__}")
    check_cache_layout(caches.compressed_cache, caches.tail_cache, config)
    D, H = config.index_head_dim, config.index_n_heads
    named = [("k", k, -1, D, "config-head-dim", "index_head_dim")]
    if compute_topk is True:
        named += [("q", q, -1, D, "config-head-dim", "index_head_dim"), ("q", q, 1, H, "config-heads", "index_n_heads"),
                  ("weights", weights, -1, H, "config-heads", "index_n_heads")]
    for name, t, dim, want, rule, field in named:
        # a missing or 1-D tensor is left to validate_forward's type and shape rules
        if hasattr(t, "shape") and len(t.shape) >= 2 and t.shape[dim] != want:
            reject(rule, f"{name} has {t.shape[dim]} along dim {dim} but the backend's {field} is {want} "
                         f"(shape {list(t.shape)})")


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
        KPoolTypeError: ``config`` is not a :class:`KPoolConfig`, or a parallel size is not an int.
        KPoolConfigError: a parallel size < 1.
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
        if not isinstance(config, KPoolConfig):
            reject("argument-type", f"config must be a KPoolConfig, got {type(config).__name__}")
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
            validate: check first that the caches and data agree with this backend's config
                (:func:`check_call_matches_config`), then every rule of
                :func:`kpool.validation.validate_forward`; ``False`` skips both (serving path).

        Raises:
            The errors of :func:`check_call_matches_config` and :func:`kpool.indexer.forward`,
            before any launch.
        """
        cfg = self.config
        if validate:
            check_call_matches_config(cfg, k=k, q=q, weights=weights, caches=caches, metadata=metadata,
                                      compute_topk=compute_topk)
        return self._orchestration.forward(
            k=k, gate=gate, q=q, weights=weights, ape=ape,
            compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
            index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, score_mode=cfg.score_mode,
            pack_tail=cfg.pack_tail, compute_topk=compute_topk, output_buffer=output_buffer,
            validate=validate, max_query_len=metadata.max_query_len, **metadata.forward_kwargs())
