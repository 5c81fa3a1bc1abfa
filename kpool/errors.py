"""Named exceptions raised by the KPool backend before any kernel launch.

Every validation failure raises one of these (all are ``ValueError`` or
``NotImplementedError`` subclasses, so callers that catch the builtin types used
by the public implementations keep working). Nothing is written when one is
raised (parity-contract.md §5).
"""


class KPoolError(Exception):
    """Base class of every error this package raises on purpose."""


class KPoolConfigError(KPoolError, ValueError):
    """Invalid hyper-parameters, e.g. ``index_topk % index_kpool != 0`` or ring capacity < P
    (kpool-algorithm.md §2, §9 item 5)."""


class KPoolDtypeError(KPoolError, ValueError):
    """A tensor has the wrong dtype (kpool-algorithm.md §2 dtype guards)."""


class KPoolShapeError(KPoolError, ValueError):
    """A tensor has the wrong rank, shape or stride (kpool-algorithm.md §2, §3)."""


class KPoolMetadataError(KPoolError, ValueError):
    """Inconsistent batch metadata: non-monotonic ``cum_query_lens``, negative lengths,
    ``seq_lens`` that are not ``raw_seq_lens // P``, non-contiguous positions,
    ``max_pool_seq_len`` out of range (kpool-algorithm.md §3.4, §4.6, §6)."""


class KPoolBlockIdError(KPoolMetadataError):
    """A block-table entry or slot addresses a page / ring block outside the cache
    (kpool-algorithm.md §3.1-§3.3)."""


class KPoolUnsupportedError(KPoolError, NotImplementedError):
    """The requested hardware or parallel configuration is not supported
    (kpool-algorithm.md §6: hardware gate A2/A3/A5, PCP/DCP rejection)."""
