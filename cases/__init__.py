"""Parity cases, data only: what to run, never how (docs/design.md "Packages").

The case model (:mod:`cases.spec`), one step made concrete (:mod:`cases.steps`: metadata, inputs,
forward arguments), input generators (:mod:`cases.values`, bit-exact :mod:`cases.genvalues`), the
named seed scenarios (:mod:`cases.scenarios`), the public failure cases C01..C31 one module each
(:mod:`cases.public`), the serving-engine model (:mod:`cases.engine`), hypothesis strategies
(:mod:`cases.strategies`) with their budgets (:mod:`cases.profiles`) and guaranteed-coverage
cases (:mod:`cases.coverage_cases`), metadata patches (:mod:`cases.patches`), the one case
serializer (:mod:`cases.serialize`) and the corpus of shrunk failures (:mod:`cases.corpus`,
``cases/corpus/``), bit views (:mod:`cases.bits`).

Nothing here runs a kernel, the reference or the harness: ``cases`` imports only
:mod:`kpool.config`, :mod:`kpool.metadata` and :mod:`kpool.errors` of this repository (plus
torch and hypothesis); everything that runs is :mod:`parity` (tests/test_layout.py checks it).
"""
