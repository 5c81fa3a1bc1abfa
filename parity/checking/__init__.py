"""Stage 3 of ``parity/`` (docs/design.md "Layout"): two outputs compared and judged. Bitwise
comparators and their triage classes (:mod:`.compare`, the tests' assertion in :mod:`.bitwise`),
the certified exceptions (:mod:`.certificates`), sentinel bytes and per-step write sets
(:mod:`.sentinel`), the reference side's argument checks (:mod:`.checked_reference`), the
reference against the whole-history oracle (:mod:`.oracle_check`), run-to-run determinism
(:mod:`.determinism`), the metamorphic relations (:mod:`.relation_base`, :mod:`.metamorphic`,
:mod:`.captured`) and the localisation of a finding to the kernel program that wrote it
(:mod:`.localize`, :mod:`.programs`). May import the findings and implementations folders only.
"""
