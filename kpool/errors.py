"""Named exceptions raised by the KPool backend before any kernel launch.

Every validation failure raises one of these (all are ``ValueError``, ``TypeError`` or
``NotImplementedError`` subclasses, so callers that catch the builtin types used by the public
implementations keep working). Nothing is written when one is raised (parity-contract.md §5).

Each exception raised by a validation rule carries that rule's name in ``rule`` (see
:data:`kpool.rules.RULES`, the catalogue of every rejection rule); ``None`` elsewhere.
"""
from __future__ import annotations

from typing import Optional


class KPoolError(Exception):
    """Base class of every error this package raises on purpose.

    Args:
        message: what is wrong, with the offending value.
        rule: name of the validation rule that rejected the input (:data:`kpool.rules.RULES`).
    """

    def __init__(self, message: str = "", *, rule: Optional[str] = None) -> None:
        super().__init__(message)
        self.rule = rule

    def __reduce__(self):
        # keep ``rule`` across pickling (parallel workers send exceptions back)
        return _rebuild, (type(self), str(self), self.rule)


def _rebuild(cls, message, rule):
    return cls(message, rule=rule)


class KPoolConfigError(KPoolError, ValueError):
    """Invalid hyper-parameters, e.g. ``index_topk % index_kpool != 0`` or ring capacity < P
    (kpool-algorithm.md §2, §9 item 5), or a parallel size that is not a positive int."""


class KPoolTypeError(KPoolError, TypeError, ValueError):
    """A Python scalar argument of the wrong type: a non-bool ``compute_topk``/``pack_tail``, a
    bool or float where an int count is required (``index_kpool=True``, a float
    ``num_speculative_tokens`` or request length), a numpy integer where the kernels need a
    Python int, or a backend argument that is not the documented object. Both a ``TypeError``
    and a ``ValueError``, so either builtin catch keeps working."""


class KPoolDtypeError(KPoolError, ValueError):
    """A tensor has the wrong dtype (kpool-algorithm.md §2 dtype guards)."""


class KPoolShapeError(KPoolError, ValueError):
    """A tensor has the wrong rank, shape or stride (kpool-algorithm.md §2, §3), or disagrees
    with the backend's :class:`kpool.config.KPoolConfig` (``D``, ``H``, ``C``)."""


class KPoolAliasingError(KPoolShapeError):
    """A tensor the forward writes (either cache, the output buffer) shares memory with another
    tensor argument, or overlaps itself (e.g. an ``as_strided`` cache with a zero stride)
    (kpool-algorithm.md §3.1, §3.3, §4.6 "non-overlapping rows")."""


class KPoolMetadataError(KPoolError, ValueError):
    """Inconsistent batch metadata: non-monotonic ``cum_query_lens``, negative lengths,
    ``seq_lens`` that are not ``raw_seq_lens // P``, non-contiguous positions,
    ``max_pool_seq_len`` out of range (kpool-algorithm.md §3.4, §4.6, §6)."""


class KPoolBlockIdError(KPoolMetadataError):
    """A block-table entry or slot addresses a page / ring block outside the cache
    (kpool-algorithm.md §3.1-§3.3)."""


class KPoolSlotMappingError(KPoolMetadataError):
    """A live row's ``slot_mapping`` or ``tail_slot_mapping`` is not the slot its request's
    tables and its position give (kpool-algorithm.md §3.2, §3.3)."""


class KPoolWriteConflictError(KPoolMetadataError):
    """Two live writers target the same cache row: one ring block owned by two requests with
    rows, or two live rows with the same compressed slot (kpool-algorithm.md §3.3 "owned
    exclusively", §5.4 "exactly one writer per call")."""


class KPoolUnsupportedError(KPoolError, NotImplementedError):
    """The requested hardware or parallel configuration is not supported
    (kpool-algorithm.md §6: hardware gate A2/A3/A5, PCP/DCP rejection)."""
