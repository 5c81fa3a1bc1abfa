"""The harness side of the public failure cases (:mod:`cases.public` holds the cases and their
record-reading checks): :mod:`.runner` runs a case with recording forwards and evaluates its
checks, :mod:`.reference_checks` and :mod:`.kernel_checks` hold the stated values that need
the reference or direct kernel calls, :mod:`parity.selection.public_suite` is ``python -m parity run --suite public``.
"""
