"""Stage 11 of ``parity/`` (docs/design.md "Layout"), beside the parity pipeline: ``make bench``
(``python -m parity.bench`` runs :mod:`.__main__`): the kernels' benchmark table, launch counts
and targets (:mod:`.kernels`) over the benchmark shapes and their eager PyTorch versions
(:mod:`.shapes`). May import any folder below it; nothing imports it but scripts and tests.
"""
