"""Pure-PyTorch reference of the KPool indexer: canonical numerics, a stateful reference with
the kernels' cache semantics, and a whole-history oracle (parity-contract.md §7).

Nothing here imports :mod:`kpool`; data flows in as plain tensors."""
