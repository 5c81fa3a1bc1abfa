"""The KPool parity harness (parity-contract.md): runs the production kernels and the PyTorch
reference step by step on byte-identical caches, compares every output bitwise, checks sentinel
bytes around every buffer, and reports one row per step x output. Everything that *runs* lives
here; the cases it runs are data (:mod:`cases`). Map: docs/design.md "Packages".

Modules: :mod:`parity.running.runner` (``run_case``: lockstep/resync; :mod:`.findings.results`, :mod:`.implementations.forwards`,
:mod:`.checking.determinism`, :mod:`.checking.oracle_check`, :mod:`.checking.localize`), :mod:`parity.checking.sentinel` (sentinel
bytes, write sets, a case's caches), :mod:`parity.checking.compare` (bitwise comparators, triage classes,
``assert_bitwise_equal``) over :mod:`parity.findings.vocabulary`, :mod:`parity.checking.certificates` (the certified
exceptions of parity-contract.md §3), :mod:`parity.checking.programs` (which kernel program wrote an
element), :mod:`parity.checking.metamorphic` (kernel-vs-kernel relations), :mod:`parity.findings.coverage`,
:mod:`parity.checking.checked_reference`, :mod:`parity.implementations.recording`, :mod:`parity.running.generated` (hypothesis
runs), :mod:`parity.running.public` (the public cases' runner and checks), :mod:`parity.selection.suites`,
:mod:`parity.sessions.commands`, :mod:`parity.sessions.session` (the run/record loop), :mod:`parity.running.parallel`
(``--jobs``), :mod:`parity.selection.shard` / :mod:`parity.verbs.merge` (``--shard``, ``merge``),
:mod:`parity.reporting.report` (tables, CSV/JSON/markdown/JUnit), :mod:`parity.sessions.bundle` /
:mod:`parity.verbs.replay` (repro bundles), :mod:`parity.implementations.mutants` (planted faults for tests),
:mod:`parity.cli` (``python -m parity``).

Importing this package never imports :mod:`kpool.ops`, :mod:`cases` or :mod:`reference`: the CLI
must resolve the device (``kpool.platform.resolve_device``) before any Triton kernel is imported.
"""
