"""Input and rule families of issue 19 that can be switched off, for the self-test only.

A family is a class of inputs the suites draw (generated batches and engine sequences, their
fixed cases, seed scenarios) or a rule of the comparison. The tests (and, on the branch of
families 1-2, ``python -m parity selftest --without-family NAME``) turn one off to show that a
planted fault only that family catches survives every suite without it (docs/validation.md
"kill table"). A default run never turns a family off.

Families here (1-2 on the values-layouts branch, 3-6 on this one):

* ``values``, ``layouts``: the whole value range, strided inputs (issue 19 families 1-2);
* ``structure``: decode / MTP rows scored in chunks past row 0, same counts in another
  arrangement, rows wider than the interpreter's pool block, prefix-shared pages under a table
  wider than the page pool (:mod:`cases.structure`);
* ``unvalidated``: stale metadata through ``validate=False`` (:mod:`cases.unvalidated`);
* ``exactness``: outputs an implementation claims bitwise get no certificate, and the inputs
  that make a 1-ulp change visible (``parity.running.family_cases``);
* ``size``: caches of >= 2**31 elements and > 65535 pools / rows (device profile,
  ``parity.running.size_cases``).

Switch: the environment variable :data:`FAMILIES_OFF_ENV` (comma-separated names), read at each
call, so worker processes inherit it.
"""
from __future__ import annotations

import os
from typing import FrozenSet

FAMILIES_OFF_ENV = "PARITY_FAMILIES_OFF"
"""Comma-separated family names turned off (self-test and tests only)."""
SWITCHABLE = ("values", "layouts", "structure", "unvalidated", "exactness", "size")
"""Families this switch knows."""


def families_off() -> FrozenSet[str]:
    """The families turned off by :data:`FAMILIES_OFF_ENV`.

    Raises:
        ValueError: an unknown family name (a typo must not silently keep a family on).
    """
    names = frozenset(n.strip() for n in os.environ.get(FAMILIES_OFF_ENV, "").split(",") if n.strip())
    unknown = names - set(SWITCHABLE)
    if unknown:
        raise ValueError(f"{FAMILIES_OFF_ENV}: unknown families {sorted(unknown)}; known: {list(SWITCHABLE)}")
    return names


def enabled(name: str) -> bool:
    """Whether family ``name`` is on (True unless switched off).

    Raises:
        ValueError: ``name`` or a switched-off name outside :data:`SWITCHABLE`.
    """
    if name not in SWITCHABLE:
        raise ValueError(f"unknown family {name!r}; known: {list(SWITCHABLE)}")
    return name not in families_off()


def case_enabled(case) -> bool:
    """Whether a case belongs to no switched-off family (its ``family-switch:NAME`` tags)."""
    off = families_off()
    return not any(t.startswith("family-switch:") and t.split(":", 1)[1] in off for t in case.tags)
