"""Stage 7 of ``parity/`` (docs/design.md "Layout"): a list of cases run the way the CLI runs it.
Options, the implementation under test, progress, workers and relations (:mod:`.session`), the
``run`` and ``record`` commands (:mod:`.commands`), and the repro bundle a run writes and a
replay reads (:mod:`.bundle`, :mod:`.bundle_checks`). May import the folders of stages 1-6.
"""
