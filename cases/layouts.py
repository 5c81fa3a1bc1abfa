"""Strided input layouts (issue 19 family 2; kpool-algorithm.md §2, §3; validation.py: what the
forward accepts).

Serving engines pass views, not fresh contiguous tensors: head weights as an ``[H, T]`` buffer
viewed as ``[T, H]`` (a slice of a fused projection), q with padded head and row strides, k and
gate rows of a wider projection output, strided metadata. ``kpool.validation.validate_forward``
accepts any strides for these inputs (only the caches' head-dim stride and the output buffer's
column stride must be 1), so every kernel must honour every stride. An :class:`InputLayout`
says how one step's inputs are laid out; :func:`apply_layout` re-lays a forward's keyword
arguments, each tensor a view into a fresh buffer whose padding holds poison (NaN for floats,
:data:`POISON_INT` for ints), so a kernel that ignores a stride reads poison or another row.
Both sides get identical views: the runner calls it for each side (``cases.steps.forward_kwargs``).

:func:`layout_for` picks a layout from a seed (the generated cases, :mod:`cases.strategies`).
The caches' page and ring-block strides are drawn by the generators already
(``CacheGeometry.page_padding`` / ``ring_block_padding``); the output buffer's row stride by
:class:`cases.spec.OutputBufferSpec`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Optional

import torch

WEIGHTS_LAYOUTS = ("contiguous", "transposed", "padded", "transposed-padded")
"""``transposed``: an ``[H, T]`` buffer viewed as ``[T, H]``; ``padded``: row stride ``H + pad``;
``transposed-padded``: an ``[H, T + pad]`` buffer viewed as ``[T, H]``."""
POISON_INT = -777_777
"""Padding of int metadata buffers (an index nobody may use)."""
POISON_BF16_BITS = 0x7FA1
POISON_FP32_BITS = 0x7FA00001
"""Padding of float buffers: NaN payloads (a read of padding turns a score or a pool NaN)."""
METADATA = ("positions", "cum_query_lens", "raw_seq_lens", "seq_lens", "slot_mapping", "tail_slot_mapping")
TABLES = ("block_table", "tail_block_table")


@dataclass(frozen=True)
class InputLayout:
    """How one step's inputs are laid out (all paddings in elements; 0 = none).

    Attributes:
        weights: one of :data:`WEIGHTS_LAYOUTS`; ``weights_pad``: its padding.
        q_head_pad: ``stride_q_h = D + q_head_pad``. q_row_pad: ``stride_q_t = H * stride_q_h + q_row_pad``.
        q_dim_stride: elements between q's channels (1 = unit).
        k_row_pad / gate_row_pad: row strides ``D + pad``. k_transposed: k as a ``[D, T]`` buffer
            viewed as ``[T, D]`` (applied before ``k_row_pad``; one of the two).
        ape_transposed: APE as a ``[D, P]`` buffer viewed as ``[P, D]``.
        metadata_step: the 1-D metadata tensors (:data:`METADATA`) at every n-th element of a
            buffer; > 1 also transposes the block tables (:data:`TABLES`) into column-major views.
    """

    weights: str = "contiguous"
    weights_pad: int = 0
    q_head_pad: int = 0
    q_row_pad: int = 0
    q_dim_stride: int = 1
    k_row_pad: int = 0
    gate_row_pad: int = 0
    k_transposed: bool = False
    ape_transposed: bool = False
    metadata_step: int = 1

    def __post_init__(self):
        if self.weights not in WEIGHTS_LAYOUTS:
            raise ValueError(f"weights layout must be one of {WEIGHTS_LAYOUTS}, got {self.weights!r}")
        if min(self.weights_pad, self.q_head_pad, self.q_row_pad, self.k_row_pad, self.gate_row_pad) < 0 \
                or self.q_dim_stride < 1 or self.metadata_step < 1:
            raise ValueError(f"bad layout {self}")

    @property
    def is_contiguous(self) -> bool:
        """No field differs from the default."""
        return self == InputLayout()

    def classes(self) -> list:
        """Coverage labels of this layout (:mod:`parity.findings.coverage`)."""
        out = []
        if self.weights.startswith("transposed"):
            out.append("weights [H,T] viewed [T,H]")
        if self.weights.endswith("padded"):
            out.append("weights column-padded")
        if self.q_head_pad:
            out.append("q padded head stride")
        if self.q_row_pad:
            out.append("q padded row stride")
        if self.q_dim_stride > 1:
            out.append("q strided channels")
        if self.k_row_pad or self.gate_row_pad or self.k_transposed:
            out.append("k/gate strided rows")
        if self.ape_transposed:
            out.append("ape transposed")
        if self.metadata_step > 1:
            out.append("metadata strided")
        return out

    def to_json(self) -> dict:
        """JSON-able dict (fields that differ from the default)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    @staticmethod
    def from_json(d: Optional[dict]) -> Optional["InputLayout"]:
        """Inverse of :meth:`to_json` (``None`` stays ``None``)."""
        return None if d is None else InputLayout(**d)


LAYOUT_CLASSES = ("weights [H,T] viewed [T,H]", "weights column-padded", "q padded head stride",
                  "q padded row stride", "q strided channels", "k/gate strided rows", "ape transposed",
                  "metadata strided")
"""Every label :meth:`InputLayout.classes` can give (the coverage report's layout lines)."""


_FLOAT_POISON = {torch.bfloat16: (torch.int16, POISON_BF16_BITS), torch.float32: (torch.int32, POISON_FP32_BITS)}


def strided_copy(t: torch.Tensor, strides, *, storage: int) -> torch.Tensor:
    """A view of ``t``'s values with ``strides`` into a fresh poison-filled buffer of ``storage``
    elements on ``t``'s device (bitwise copy of the values).

    Raises:
        ValueError: the strides address past ``storage`` elements.
    """
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, strides)) if t.numel() else 0
    if span > storage:
        raise ValueError(f"strides {strides} of shape {tuple(t.shape)} need {span} > {storage} elements")
    buf = torch.empty(max(storage, 1), dtype=t.dtype, device=t.device)
    if t.dtype in _FLOAT_POISON:   # NaN payloads set by their bits (a float fill would canonicalise them)
        bits_dtype, bits = _FLOAT_POISON[t.dtype]
        buf.view(bits_dtype).fill_(bits)
    else:
        buf.fill_(POISON_INT)
    view = buf.as_strided(tuple(t.shape), tuple(strides), 0)
    if t.numel():
        view.copy_(t)
    return view


def _relay_2d(t: torch.Tensor, *, transposed: bool, pad: int) -> torch.Tensor:
    """``[A, B]`` as a view: row-major with row stride ``B + pad``, or a ``[B, A + pad]``
    buffer viewed transposed (column stride ``A + pad``)."""
    A, B = t.shape
    if transposed:
        return strided_copy(t, (1, A + pad), storage=B * (A + pad))
    return strided_copy(t, (B + pad, 1), storage=A * (B + pad))


def apply_layout(layout: Optional[InputLayout], kwargs: dict) -> dict:
    """``kwargs`` (a forward's keyword arguments) with every input re-laid as ``layout`` says;
    the caches and the output buffer are left as given. ``None`` or the default layout returns
    ``kwargs`` unchanged. Values are bitwise those of ``kwargs``; only strides differ.

    Returns:
        a new dict (the given tensors are not modified).
    """
    if layout is None or layout.is_contiguous:
        return kwargs
    out = dict(kwargs)
    w = out.get("weights")
    if isinstance(w, torch.Tensor) and w.dim() == 2 and layout.weights != "contiguous":
        out["weights"] = _relay_2d(w, transposed=layout.weights.startswith("transposed"),
                                   pad=layout.weights_pad if layout.weights.endswith("padded") else 0)
    q = out.get("q")
    if isinstance(q, torch.Tensor) and q.dim() == 3 and (layout.q_head_pad or layout.q_row_pad
                                                         or layout.q_dim_stride > 1):
        T, H, D = q.shape
        sd = layout.q_dim_stride
        sh = D * sd + layout.q_head_pad
        st = H * sh + layout.q_row_pad
        out["q"] = strided_copy(q, (st, sh, sd), storage=max(T, 1) * st)
    for name, pad in (("k", layout.k_row_pad), ("gate", layout.gate_row_pad)):
        t = out.get(name)
        transposed = name == "k" and layout.k_transposed
        if isinstance(t, torch.Tensor) and t.dim() == 2 and (pad or transposed):
            out[name] = _relay_2d(t, transposed=transposed, pad=0 if transposed else pad)
    ape = out.get("ape")
    if isinstance(ape, torch.Tensor) and ape.dim() == 2 and layout.ape_transposed:
        out["ape"] = _relay_2d(ape, transposed=True, pad=0)
    if layout.metadata_step > 1:
        n = layout.metadata_step
        for name in METADATA:
            t = out.get(name)
            if isinstance(t, torch.Tensor) and t.dim() == 1:
                out[name] = strided_copy(t, (n,), storage=max(t.shape[0], 1) * n)
        for name in TABLES:
            t = out.get(name)
            if isinstance(t, torch.Tensor) and t.dim() == 2:
                out[name] = _relay_2d(t, transposed=True, pad=1)
    return out


def layout_for(seed: int, *, heads: int, head_dim: int) -> InputLayout:
    """A layout chosen by ``seed`` (a pure function; the generators call it with a step's seed).

    About a third of the layouts transpose the weights (the serving engines' ``[H, T]`` slice),
    and every other field is set in about half of them; never the default layout.
    """
    rng = random.Random(f"layout-{int(seed)}")
    weights = rng.choice(WEIGHTS_LAYOUTS[1:] + ("transposed",))
    pad = lambda: rng.choice((0, 0, 1, 3, head_dim))   # noqa: E731
    k_transposed = rng.random() < 0.3
    layout = InputLayout(weights=weights, weights_pad=rng.choice((1, 2, heads + 1)),
                         q_head_pad=pad(), q_row_pad=pad(), q_dim_stride=rng.choice((1, 1, 1, 2)),
                         k_row_pad=0 if k_transposed else pad(), gate_row_pad=pad(), k_transposed=k_transposed,
                         ape_transposed=rng.random() < 0.5, metadata_step=rng.choice((1, 2, 3)))
    return layout
