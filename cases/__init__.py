"""Parity cases: the case model (:mod:`cases.spec`), input generators (:mod:`cases.values`,
bit-exact :mod:`cases.genvalues`), the named seed scenarios (:mod:`cases.scenarios`), the public
failure cases C01..C31 (:mod:`cases.public`), hypothesis strategies for generated batches and
engine sequences (:mod:`cases.strategies` over :mod:`cases.engine`) with their profiles
(:mod:`cases.profiles`), driver (:mod:`cases.generated`) and coverage accounting
(:mod:`cases.coverage`), the corpus of shrunk failures (:mod:`cases.corpus`, ``cases/corpus/``)
and the suites of ``python -m parity run --suite`` (:mod:`cases.suites`)."""
