"""Triton kernels of the KPool indexer (kpool-algorithm.md §4, §5).

Importing this package imports nothing; the kernel modules (``kpool.ops.compress``,
``kpool.ops.indexer``) import Triton and must be imported only after
``kpool.platform.resolve_device()`` has chosen the backend (it sets ``TRITON_INTERPRET=1``
for ``cpu``, which Triton reads when a kernel is decorated).
"""
