"""The generated case an isolated worker is running, kept on disk so that the parent knows which
case killed the worker (:meth:`parity.running.isolation.CaseWorker.run_generated`): the child
writes each case before it runs it, the parent reads it back after a crash."""
from __future__ import annotations

import os
import pickle


def record_case(path: str, case) -> None:
    """Write ``case`` (pickled) to ``path`` atomically (a crash mid-write leaves the previous one).

    Raises:
        OSError: ``path`` cannot be written.
    """
    with open(path + ".tmp", "wb") as f:
        pickle.dump(case, f)
    os.replace(path + ".tmp", path)


def recorded_case(path: str):
    """The case :func:`record_case` last left at ``path``, or ``None`` (none, or unreadable)."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
