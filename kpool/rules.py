"""The catalogue of rejection rules (parity-contract.md §5) and the helpers that raise them.

Every check of :func:`kpool.validation.validate_forward`, :func:`kpool.cache.check_cache_layout`,
the backend and the metadata/cache builders rejects through :func:`reject` with a rule name from
:data:`RULES`; the exception is the rule's :mod:`kpool.errors` class and carries ``rule``. A test
proves that every rule is raised by at least one bad input and that no check uses an unregistered
name (tests/test_rules.py), so a planted fault "one per rejection rule" has a name to target.

Imports only :mod:`kpool.errors` (no torch), so config, metadata and cache modules can use it.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional

from . import errors as E


@dataclass(frozen=True)
class Rule:
    """One rejection rule: the exception class it raises and what it rejects (with its spec source)."""

    error: type
    text: str


RULES = {
    # ---- Python scalar arguments --------------------------------------------------------------
    "scalar-int-type": Rule(E.KPoolTypeError, "an int argument is a bool, a float, a str...; forward also needs "
                            "a Python int (not a numpy integer) because the value reaches the kernels"),
    "scalar-bool-type": Rule(E.KPoolTypeError, "compute_topk / pack_tail (and config / builder flags) must be bool"),
    "argument-type": Rule(E.KPoolTypeError, "a backend or builder argument is not the documented object"),
    "index-kpool-positive": Rule(E.KPoolConfigError, "index_kpool P >= 1 (§2)"),
    "index-topk-multiple": Rule(E.KPoolConfigError, "index_topk a positive multiple of P (§2)"),
    "score-mode": Rule(E.KPoolConfigError, "score_mode in SCORE_MODES (§4.2)"),
    "context-parallel-size": Rule(E.KPoolConfigError, "PCP/DCP sizes are positive ints (§6)"),
    "context-parallel-unsupported": Rule(E.KPoolUnsupportedError, "PCP/DCP size > 1 is not supported (§6)"),
    # ---- tensors: type, dtype, shape, strides, device ------------------------------------------
    "tensor-type": Rule(E.KPoolDtypeError, "a tensor argument is not a torch.Tensor"),
    "dtype": Rule(E.KPoolDtypeError, "dtype guards (§2, §4.6)"),
    "shape": Rule(E.KPoolShapeError, "rank and sizes agree across tensors (§2, §3, §4.6, §6)"),
    "ring-capacity": Rule(E.KPoolShapeError, "tail ring capacity C >= P (§3.3)"),
    "cache-inner-stride": Rule(E.KPoolShapeError, "head-dim stride 1 in both caches (§3.1, §3.3)"),
    "cache-empty": Rule(E.KPoolShapeError, "caches have at least one page/block and row"),
    "tail-block-table-columns": Rule(E.KPoolShapeError, "tail_block_table has a column 0 (§3.3)"),
    "q-heads": Rule(E.KPoolShapeError, "q has at least one head"),
    "output-buffer-shape": Rule(E.KPoolShapeError, "output_buffer int32 [>= T, >= W] (§4.6)"),
    "output-buffer-column-stride": Rule(E.KPoolShapeError, "output_buffer has unit column stride (§4.6)"),
    "output-buffer-row-overlap": Rule(E.KPoolShapeError, "output_buffer rows do not overlap (§4.6)"),
    "one-device": Rule(E.KPoolShapeError, "every tensor on one device"),
    # ---- memory aliasing ------------------------------------------------------------------------
    "written-self-overlap": Rule(E.KPoolAliasingError, "a written tensor (cache, output rows) whose elements "
                                 "overlap (e.g. an as_strided cache with a zero stride)"),
    "written-aliases": Rule(E.KPoolAliasingError, "a written tensor (cache, output buffer) shares memory with "
                            "another tensor argument"),
    # ---- backend config vs caches and data -----------------------------------------------------
    "config-head-dim": Rule(E.KPoolShapeError, "caches, k, q have the config's index_head_dim D"),
    "config-heads": Rule(E.KPoolShapeError, "q, weights have the config's index_n_heads H"),
    "config-ring-capacity": Rule(E.KPoolShapeError, "tail ring C equals the config's P + num_speculative_tokens "
                                 "(or tail_ring_capacity) (§3.3)"),
    # ---- metadata values (§3.2-§3.4, §4.6, §5.4, §6) -------------------------------------------
    "max-pool-seq-len-range": Rule(E.KPoolMetadataError, "0 <= max_pool_seq_len <= M * B (§4.6)"),
    "cum-query-lens-order": Rule(E.KPoolMetadataError, "cum_query_lens >= 0 and non-decreasing (§3.4)"),
    "cum-query-lens-rows": Rule(E.KPoolMetadataError, "cum_query_lens[-1] <= T (§4.6)"),
    "query-len-exceeds-raw": Rule(E.KPoolMetadataError, "0 <= query_len <= raw_seq_lens (§6)"),
    "seq-lens-pools": Rule(E.KPoolMetadataError, "seq_lens == raw_seq_lens // P (§6, pitfall §9.2)"),
    "max-pool-seq-len-below-pools": Rule(E.KPoolMetadataError, "max(seq_lens) <= max_pool_seq_len (§4.6)"),
    "max-query-len-range": Rule(E.KPoolMetadataError, "max_query_len is None or an int >= every query length (§6)"),
    "positions-contiguous": Rule(E.KPoolMetadataError, "live positions[qs + i] == raw - ql + i (§3.4)"),
    "positions-int32-window": Rule(E.KPoolMetadataError, "live positions < INT32_MAX - P (kernels' int32 window)"),
    "block-table-range": Rule(E.KPoolBlockIdError, "every page a request reads in [0, N) (§3.1)"),
    "ring-block-range": Rule(E.KPoolBlockIdError, "ring block of a request with rows in [0, blocks) (§3.3)"),
    "slot-range": Rule(E.KPoolBlockIdError, "live slot_mapping in [-1, N*B) (§3.2); which value: "
                       "slot-mapping-mismatch"),
    "tail-slot-range": Rule(E.KPoolBlockIdError, "live tail_slot_mapping in [-1, blocks*C) (§3.3); which value: "
                            "tail-slot-mapping-mismatch"),
    "ring-block-shared": Rule(E.KPoolWriteConflictError, "no ring block owned by two requests with rows "
                              "(§3.3 'owned exclusively')"),
    "slot-duplicate": Rule(E.KPoolWriteConflictError, "no compressed slot written by two live rows "
                           "(§5.4 'exactly one writer')"),
    "slot-mapping-mismatch": Rule(E.KPoolSlotMappingError, "live slot_mapping == block_table[r, j // B] * B + j % B "
                                  "for a row completing pool j, else -1 (§3.2)"),
    "tail-slot-mapping-mismatch": Rule(E.KPoolSlotMappingError, "live tail_slot_mapping == "
                                       "tail_block_table[r, 0] * C + p % C (§3.3)"),
    # ---- builders ------------------------------------------------------------------------------
    "builder-count": Rule(E.KPoolMetadataError, "build_metadata counts and lengths >= 0, P >= 1, C >= P, B >= 1, "
                          "num_tokens >= T_live (§6)"),
    "builder-block-table": Rule(E.KPoolMetadataError, "build_metadata: a request's table covers its pools and "
                                "fits block_table_width (§3.1)"),
    "allocation-size": Rule(E.KPoolShapeError, "allocate_caches sizes > 0, paddings and guard >= 0"),
}
"""Rule name -> :class:`Rule`."""


def reject(rule: str, message: str):
    """Raise the :mod:`kpool.errors` class of ``rule`` with ``message`` (never returns).

    Raises:
        KeyError: ``rule`` is not in :data:`RULES` (a programming error).
    """
    raise RULES[rule].error(message, rule=rule)


def as_int(name: str, value, *, python_only: bool = False) -> int:
    """``value`` as a Python int: ints and (unless ``python_only``) numpy integers through
    ``operator.index``; bools, floats, strings, ``None`` are rejected (``scalar-int-type``).
    ``python_only``: the value reaches a kernel as is, which needs a Python int."""
    if isinstance(value, bool):
        reject("scalar-int-type", f"{name} must be an int, got the bool {value!r}")
    if python_only and not isinstance(value, int):
        try:
            operator.index(value)
        except TypeError:
            pass
        else:
            reject("scalar-int-type", f"{name} must be a Python int, got {type(value).__module__}."
                                      f"{type(value).__name__} {value!r}: pass int({name})")
    try:
        return operator.index(value)
    except TypeError:
        reject("scalar-int-type", f"{name} must be an int, got {type(value).__name__} {value!r}")


def as_bool(name: str, value) -> bool:
    """``value`` if it is a bool, else ``scalar-bool-type`` (``'no'``, ``None``, ``0`` are not
    flags: a truthy string would silently mean ``True``)."""
    if not isinstance(value, bool):
        reject("scalar-bool-type", f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def optional_int(name: str, value, *, python_only: bool = False) -> Optional[int]:
    """:func:`as_int`, with ``None`` passed through."""
    return None if value is None else as_int(name, value, python_only=python_only)
