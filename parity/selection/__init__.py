"""Stage 8 of ``parity/`` (docs/design.md "Layout"): which cases a run has. The suites behind
``--suite`` (:mod:`.suites`: corpus, seed, public, generated) and the commands of the generated
and public suites (:mod:`.generated_suite`, :mod:`.public_suite`), the cases of a
kernel-vs-kernel run selected with ``run``'s options (:mod:`.kernel_cases`), and one run split
over CI hosts (:mod:`.shard`). May import the folders of stages 1-7.
"""
