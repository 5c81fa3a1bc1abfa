"""Input families of issue 19 that can be switched off, for the self-test only.

A family is a class of inputs the suites draw (the generated batches and engine sequences, and
its seed scenarios). ``python -m parity selftest --without-family NAME`` and the tests turn one
off to show that a planted fault only that family catches survives every suite without it
(docs/validation.md "kill table"). A default run never turns a family off.

Families here:

* ``values``: finite values from the whole range the contract allows (:mod:`cases.ranges`);
* ``layouts``: every strided input the forward accepts (:mod:`cases.layouts`).

Switch: the environment variable :data:`FAMILIES_OFF_ENV` (comma-separated names), read at each
call, so worker processes of ``--jobs N`` inherit it.
"""
from __future__ import annotations

import os
from typing import FrozenSet

FAMILIES_OFF_ENV = "PARITY_FAMILIES_OFF"
"""Comma-separated family names turned off (self-test and tests only)."""
SWITCHABLE = ("values", "layouts")
"""Families this switch knows (another family module may extend the tuple)."""


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
    """Whether family ``name`` is drawn (True unless switched off)."""
    return name not in families_off()


def case_enabled(case) -> bool:
    """Whether a case belongs to no switched-off family (its ``family-switch:NAME`` tags)."""
    off = families_off()
    return not any(t.startswith("family-switch:") and t.split(":", 1)[1] in off for t in case.tags)
