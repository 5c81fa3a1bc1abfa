"""The KPool parity harness (parity-contract.md): runs the production kernels and the PyTorch
reference step by step on byte-identical caches, compares every output bitwise, checks sentinel
bytes around every buffer, and reports one row per step x output.

Modules: :mod:`parity.sentinel` (sentinel bytes, write sets), :mod:`parity.compare` (bitwise
comparators and triage classes), :mod:`parity.certificates` (the certified exceptions of
parity-contract.md §3), :mod:`parity.programs` (which kernel program wrote an element),
:mod:`parity.runner` (``run_case``: lockstep/resync, determinism repeats, localisation),
:mod:`parity.metamorphic` (kernel-vs-kernel relations), :mod:`parity.report` (tables,
CSV/JSON/markdown/JUnit), :mod:`parity.bundle` (repro bundles, replay), :mod:`parity.session`
and :mod:`parity.commands` (the run/record/replay loop), :mod:`parity.mutants` (planted faults
for tests), :mod:`parity.cli` (``python -m parity``).

Importing this package never imports :mod:`kpool.ops`, :mod:`cases` or :mod:`reference`: the CLI
must resolve the device (``kpool.platform.resolve_device``) before any Triton kernel is imported.
"""
