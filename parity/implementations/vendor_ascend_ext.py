"""triton-ascend's language extensions (``triton.language.extra.cann.extension``) emulated under
the Triton CPU interpreter, for ``--kernel vllm-ascend:PATH`` (the names of
:data:`parity.implementations.vendor_manifest.EXTENSIONS`).

Semantics (triton-ascend's documentation of the ops, MLIR ``tensor.extract_slice``):

* ``extract_slice(ful, offsets, sizes, strides)``: the tensor of shape ``sizes`` whose element
  ``i`` (a multi-index) is ``ful[offsets + i * strides]`` (element-wise over the dimensions); one
  offset, size and stride per dimension of ``ful``; sizes >= 1, strides >= 0.
* ``get_element(src, indice)``: the scalar ``src[indice]``.

Under the interpreter a kernel runs as Python with ``tl.tensor`` values over NumPy arrays
(``tensor.handle.data``), so the ops are plain functions on those arrays. They exist only there:
compiled Triton (CUDA) cannot call them, and a revision that uses them runs under the interpreter
(docs/vendor-revisions.md). Out-of-range slices raise instead of reading past the tensor (on the
NPU they are undefined).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def _int(value) -> int:
    """A Python int from an int, a ``tl.constexpr`` or a scalar interpreter tensor."""
    value = getattr(value, "value", value)           # tl.constexpr
    handle = getattr(value, "handle", None)
    if handle is not None:                           # interpreter tensor: data is a 1-element array
        return int(np.asarray(handle.data).reshape(-1)[0])
    return int(value)


def _interpreter_tensor(data: np.ndarray, like, shape: Sequence[int]):
    """A ``tl.tensor`` of the interpreter holding ``data`` with ``like``'s element type."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle
    scalar = like.type.scalar
    ty = tl.block_type(scalar, list(shape)) if len(shape) else scalar
    return tl.tensor(TensorHandle(np.ascontiguousarray(data), scalar), ty)


def extract_slice(ful, offsets, sizes, strides):
    """``ful[offsets + i * strides]`` for ``i`` over ``sizes`` (module docstring).

    Raises:
        ValueError: offsets/sizes/strides do not have one entry per dimension, a size < 1, a
            stride < 0.
        IndexError: the slice reaches outside ``ful``.
    """
    data = np.asarray(ful.handle.data)
    offsets, sizes, strides = ([_int(v) for v in seq] for seq in (offsets, sizes, strides))
    if not len(offsets) == len(sizes) == len(strides) == data.ndim:
        raise ValueError(f"extract_slice: {data.ndim}-d tensor needs one offset, size and stride per dimension, "
                         f"got {offsets}, {sizes}, {strides}")
    if any(s < 1 for s in sizes) or any(s < 0 for s in strides):
        raise ValueError(f"extract_slice: sizes must be >= 1 and strides >= 0, got {sizes}, {strides}")
    index = [o + st * np.arange(sz) for o, sz, st in zip(offsets, sizes, strides)]
    for dim, (ix, extent) in enumerate(zip(index, data.shape)):
        if ix.min() < 0 or ix.max() >= extent:
            raise IndexError(f"extract_slice: dimension {dim} reads [{ix.min()}, {ix.max()}] of a size-{extent} tensor")
    return _interpreter_tensor(data[np.ix_(*index)], ful, sizes)


def get_element(src, indice):
    """The scalar ``src[indice]`` (one index per dimension).

    Raises:
        ValueError: not one index per dimension; IndexError: an index outside ``src``.
    """
    data = np.asarray(src.handle.data)
    index = tuple(_int(v) for v in (indice if isinstance(indice, (tuple, list)) else (indice,)))
    if len(index) != data.ndim:
        raise ValueError(f"get_element: {data.ndim}-d tensor needs {data.ndim} indices, got {index}")
    for dim, (ix, extent) in enumerate(zip(index, data.shape)):
        if not 0 <= ix < extent:
            raise IndexError(f"get_element: index {ix} of dimension {dim} outside a size-{extent} tensor")
    return _interpreter_tensor(np.asarray([data[index]], dtype=data.dtype), src, ())
