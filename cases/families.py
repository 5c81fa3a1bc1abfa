"""The input and rule families of issue 19 that this branch adds, and the switch that turns one
off (for the self-test's evidence and the tests only: a fault a family kills must survive every
default suite without it, docs/validation.md).

* ``structure``: decode / MTP rows scored in a chunk that starts past row 0, forwards whose
  batches have the same counts in another arrangement, rows wider than the interpreter's pool
  block (4096), prefix-shared pages under a block table wider than the page pool
  (:mod:`cases.structure`);
* ``unvalidated``: stale metadata run through ``validate=False`` (:mod:`cases.unvalidated`);
* ``exactness``: outputs an implementation claims bitwise get no certificate
  (``parity.implementations.Implementation.bitwise_outputs``);
* ``size``: caches of >= 2**31 elements and launch-grid limits of long context (device profile).

``PARITY_FAMILIES_OFF=structure,exactness`` (environment, read at each use, so spawned workers
inherit it) switches families off; nothing in a default run sets it.
"""
from __future__ import annotations

import os

FAMILIES = ("structure", "unvalidated", "exactness", "size")
OFF_ENV = "PARITY_FAMILIES_OFF"


def switched_off() -> frozenset:
    """The families named in ``$PARITY_FAMILIES_OFF`` (comma-separated).

    Raises:
        ValueError: a name outside :data:`FAMILIES` (a typo would silently test nothing).
    """
    names = frozenset(n.strip() for n in os.environ.get(OFF_ENV, "").split(",") if n.strip())
    unknown = names - set(FAMILIES)
    if unknown:
        raise ValueError(f"{OFF_ENV}: unknown families {sorted(unknown)}; known: {FAMILIES}")
    return names


def enabled(family: str) -> bool:
    """Whether ``family`` (one of :data:`FAMILIES`) is on (the default)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    return family not in switched_off()
