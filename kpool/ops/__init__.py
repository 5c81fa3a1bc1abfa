"""Triton kernels of the KPool indexer (kpool-algorithm.md §4, §5; docs/kernels.md).

``plan`` (launch plans: grid, tiles, options per backend; imports torch only), ``compress``
(cache update), ``score`` (tensor-core scoring with the fused selection key), ``merged`` (score
mode (M)), ``topk`` (exact canonical selection), ``expand`` (index rows), ``_portable`` (shared
device helpers), ``indexer`` (the steps in one namespace). Importing this package imports
nothing; the kernel modules import Triton and must be imported only after
``kpool.platform.resolve_device()`` has chosen the backend (it sets ``TRITON_INTERPRET=1`` for
``cpu``, which Triton reads when a kernel is decorated, and installs the interpreter compat).

Kernel arguments (Triton tutorials' and vllm-ascend's convention; ``tests/test_kernel_names.py``):
a tensor is passed as ``<tensor>_ptr`` (the field's name: ``positions_ptr``, ``block_table_ptr``,
``top_keys_ptr``) and its strides as ``stride_<tensor>_<axis>``, axis ``t`` token row, ``d``
channel, ``h`` head, ``n`` page, ``b`` row in a page, ``r`` request, ``m`` block-table column,
``c`` ring slot, ``k`` selected-key column, ``p`` APE slot, ``blk`` ring block, ``plane`` K / gate
(``stride_k_t``, ``stride_block_table_r``); compile-time constants are upper case (``P``,
``BLOCK_D``). The int32 position window ``p < INT32_MAX - P`` uses ``kpool.config.INT32_MAX``,
the constant validation checks against.
"""
