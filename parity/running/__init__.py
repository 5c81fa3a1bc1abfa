"""Stage 4 of ``parity/`` (docs/design.md "Layout"): one case on both sides, step by step.
:mod:`.runner` (``run_case``: lockstep or resync, every check of every step), every output of
every step kept for kernel-vs-kernel runs (:mod:`.step_outputs`), worker processes for ``--jobs``
(:mod:`.parallel`), the runners of the generated cases (:mod:`.generated`: hypothesis, shrinking,
warm-up) and of the public failure cases (:mod:`.public`), and the device-only large case
(:mod:`.large_case`). May import the findings, implementations and checking folders.
"""
