"""The KPool parity harness (parity-contract.md): runs the production kernels and the PyTorch
reference step by step on byte-identical caches, compares every output bitwise, checks sentinel
bytes around every buffer, and reports one row per step x output. Everything that *runs* lives
here; the cases it runs are data (:mod:`cases`). Map: docs/design.md "Packages".

Modules: :mod:`parity.runner` (``run_case``: lockstep/resync; :mod:`.results`, :mod:`.forwards`,
:mod:`.determinism`, :mod:`.oracle_check`, :mod:`.localize`), :mod:`parity.sentinel` (sentinel
bytes, write sets, a case's caches), :mod:`parity.compare` (bitwise comparators, triage classes,
``assert_bitwise_equal``) over :mod:`parity.findings`, :mod:`parity.certificates` (the certified
exceptions of parity-contract.md §3), :mod:`parity.programs` (which kernel program wrote an
element), :mod:`parity.metamorphic` (kernel-vs-kernel relations), :mod:`parity.coverage`,
:mod:`parity.checked_reference`, :mod:`parity.recording`, :mod:`parity.generated` (hypothesis
runs), :mod:`parity.public` (the public cases' runner and checks), :mod:`parity.suites`,
:mod:`parity.commands`, :mod:`parity.session` (the run/record loop), :mod:`parity.parallel`
(``--jobs``), :mod:`parity.shard` / :mod:`parity.merge` (``--shard``, ``merge``),
:mod:`parity.report` (tables, CSV/JSON/markdown/JUnit), :mod:`parity.bundle` /
:mod:`parity.replay` (repro bundles), :mod:`parity.mutants` (planted faults for tests),
:mod:`parity.cli` (``python -m parity``).

Importing this package never imports :mod:`kpool.ops`, :mod:`cases` or :mod:`reference`: the CLI
must resolve the device (``kpool.platform.resolve_device``) before any Triton kernel is imported.
"""
