"""Stage 10 of ``parity/`` (docs/design.md "Layout"): the commands beyond ``run`` / ``record``, each
built on the stages below: ``ab``, ``golden``, ``bisect`` (:mod:`.ab`, :mod:`.golden`,
:mod:`.bisect`), ``replay`` (:mod:`.replay`), ``merge`` of shard reports (:mod:`.merge`),
``selftest`` and its planted-fault catalog (:mod:`.selftest`, :mod:`.faults`), growing the corpus
(:mod:`.grow`) and a throwaway clone with a planted kernel commit (:mod:`.planted_history`). Built
on the public API (stage 9, :mod:`parity.api`): implementations are resolved and cases selected
through it (:mod:`.cases`), never around it. May import the folders of stages 1-9; no folder
imports it (the CLI at the package root does).
"""
