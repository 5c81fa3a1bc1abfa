"""KPool indexer hyper-parameters (kpool-algorithm.md §1, §2, §3.3).

``KPoolConfig`` is a frozen dataclass; construction validates every field and raises
:class:`kpool.errors.KPoolConfigError` on bad values (:class:`kpool.errors.KPoolTypeError` on a
field of the wrong type), so an invalid configuration can never reach a kernel launch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import KPoolConfigError
from .rules import as_bool, as_int, optional_int

INT32_MAX = 2147483647
"""``2**31 - 1``: the kernels compute positions in int32, so a live position ``p`` must satisfy
``p < INT32_MAX - P`` (the window arithmetic reaches ``p + P``, kpool/ops/compress.py); checked by
:func:`kpool.validation.validate_forward` (rule ``positions-int32-window``)."""

SCORE_MODES = ("relu", "merged")
"""``relu``: per-head ReLU then head-weighted sum (model semantics, §4.2 (R));
``merged``: head-merged query without ReLU (legacy vllm-ascend, §4.2 (M))."""


@dataclass(frozen=True)
class KPoolConfig:
    """Hyper-parameters of one KPool indexer layer.

    Attributes:
        index_n_heads: ``H``, indexer query heads (>= 1).
        index_head_dim: ``D``, indexer head dim (power of two, >= 1).
        index_kpool: ``P``, pool size in tokens (>= 1).
        index_topk: ``K_tok``, history tokens selected through pools; a positive
            multiple of ``P`` (§2: "KPool top-k must be divisible by its positive pool size").
        num_speculative_tokens: MTP look-ahead; the ring capacity is
            ``C = P + num_speculative_tokens`` unless ``tail_ring_capacity`` is given.
        tail_ring_capacity: explicit ring capacity ``C`` (>= P); ``None`` derives it.
        score_mode: ``"relu"`` (default) or ``"merged"`` (§4.2).
        pack_tail: packed causal tail (CANN SFA contract, default) or fixed at column
            ``K_tok`` (§4.5 step 2).
        always_select_tail: append the causal tail (default, every serving implementation);
            ``False`` is HF's ``index_kpool_always_select_tail=False`` (kpool-algorithm.md §1.1,
            §10): no tail columns, rows of width ``K_tok`` holding the selected pools only.

    Integer fields accept Python and numpy integers (``operator.index``) and are stored as
    Python ints; bools, floats and strings are rejected.

    Raises:
        KPoolTypeError: a field of the wrong type (a float ``num_speculative_tokens``, a
            non-bool ``pack_tail`` or ``always_select_tail``, ``index_kpool=True``...).
        KPoolConfigError: any other invalid field.
    """

    index_n_heads: int = 32
    index_head_dim: int = 128
    index_kpool: int = 4
    index_topk: int = 2048
    num_speculative_tokens: int = 0
    tail_ring_capacity: int | None = None
    score_mode: str = "relu"
    pack_tail: bool = True
    always_select_tail: bool = True

    def __post_init__(self) -> None:
        for name in ("index_n_heads", "index_head_dim", "index_kpool", "index_topk", "num_speculative_tokens"):
            object.__setattr__(self, name, as_int(name, getattr(self, name)))
        object.__setattr__(self, "tail_ring_capacity", optional_int("tail_ring_capacity", self.tail_ring_capacity))
        as_bool("pack_tail", self.pack_tail)
        as_bool("always_select_tail", self.always_select_tail)
        for name in ("index_n_heads", "index_head_dim", "index_kpool", "index_topk"):
            value = getattr(self, name)
            if value < 1:
                raise KPoolConfigError(f"{name} must be a positive int, got {value!r}")
        if self.index_head_dim & (self.index_head_dim - 1):
            raise KPoolConfigError(f"index_head_dim must be a power of two, got {self.index_head_dim}")
        if self.index_topk % self.index_kpool != 0:
            raise KPoolConfigError(
                "KPool top-k must be divisible by its positive pool size: "
                f"index_topk={self.index_topk}, index_kpool={self.index_kpool}")
        if self.num_speculative_tokens < 0:
            raise KPoolConfigError(f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}")
        if self.tail_ring_capacity is not None and self.tail_ring_capacity < self.index_kpool:
            raise KPoolConfigError(
                f"tail ring capacity C={self.tail_ring_capacity} must be >= index_kpool P={self.index_kpool}")
        if not isinstance(self.score_mode, str) or self.score_mode not in SCORE_MODES:
            raise KPoolConfigError(f"score_mode must be one of {SCORE_MODES}, got {self.score_mode!r}")

    @property
    def ring_capacity(self) -> int:
        """``C``: rows per request ring (§3.3); ``P + num_speculative_tokens`` by default."""
        if self.tail_ring_capacity is not None:
            return self.tail_ring_capacity
        return self.index_kpool + self.num_speculative_tokens

    @property
    def topk_pools(self) -> int:
        """``K_pool = K_tok / P``: pools selected per row (§4.4)."""
        return self.index_topk // self.index_kpool

    @property
    def output_width(self) -> int:
        """``W``: index row width (§4.5): ``K_tok + P - 1``, or ``K_tok`` without the tail
        (``always_select_tail=False``)."""
        if not self.always_select_tail:
            return self.index_topk
        return self.index_topk + self.index_kpool - 1

    def with_(self, **changes) -> "KPoolConfig":
        """Copy with fields replaced (re-validated)."""
        return replace(self, **changes)


GLM53_FLASH = KPoolConfig(index_n_heads=32, index_head_dim=128, index_kpool=4, index_topk=2048)
"""GLM-5.3-Flash preset (§1.1): H=32, D=128, P=4, index_topk=2048 -> K_pool=512, W=2051."""

SMALL = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=4, index_topk=8)
"""Small preset for fast interpreter runs: H=2, D=16, P=4, index_topk=8 -> K_pool=2, W=11."""
