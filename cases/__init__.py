"""Parity cases: the case model (:mod:`cases.spec`), input generators (:mod:`cases.values`),
the named seed scenarios (:mod:`cases.scenarios`) and the public failure cases."""
