"""Stage 1 of ``parity/`` (docs/design.md "Layout"), what every other stage speaks: the findings
vocabulary (:mod:`.vocabulary`: verdicts, pass verdicts, location columns, ``finding()``), what
one case's run returns (:mod:`.results`: ``CaseResult``, timing columns) and which input classes
a run exercised (:mod:`.coverage`). Plain data and accounting, nothing that runs a forward: it
imports ``cases`` and ``kpool``'s data modules only, no other folder of ``parity``.
"""
