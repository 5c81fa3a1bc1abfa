"""Triton kernels of the KPool indexer (kpool-algorithm.md §4, §5; docs/kernels.md).

``plan`` (launch plans: grid, tiles, options per backend; imports torch only), ``compress``
(cache update), ``score`` (tensor-core scoring with the fused selection key), ``merged`` (score
mode (M)), ``topk`` (exact canonical selection), ``expand`` (index rows), ``_portable`` (shared
device helpers), ``indexer`` (the steps in one namespace). Importing this package imports
nothing; the kernel modules import Triton and must be imported only after
``kpool.platform.resolve_device()`` has chosen the backend (it sets ``TRITON_INTERPRET=1`` for
``cpu``, which Triton reads when a kernel is decorated, and installs the interpreter compat).
"""
