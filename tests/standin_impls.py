"""Stand-in implementations for the harness's own tests of declared modes and crash isolation:
this checkout's kernels (:func:`kpool.indexer.forward`) behind ``package.module:NAME`` specs,
with a reduced ``supports`` or a planted process crash. No vendor code."""
from __future__ import annotations

import ctypes
import os

from parity.implementations import Implementation

CRASH_PAGE_SIZE = 4
"""The page size that makes :func:`segfault_on_page_size_4` crash: only the seed case
``non-finite`` has it among the small seed cases (the others use 2 or 3)."""


def kpool_forward(**kwargs):
    """``kpool.indexer.forward`` itself (imported late: the CPU interpreter must be set first)."""
    from kpool.indexer import forward
    return forward(**kwargs)


no_output_buffer = Implementation(
    "tests.standin_impls:no_output_buffer", kpool_forward,
    supports=frozenset({"no-tail", "fixed-tail"}),
    description="kpool's kernels declaring no caller output buffer (tests of 'unsupported by IMPL')")
"""Declares every mode but ``output-buffer``: the steps of ``full-padding`` with a caller buffer
are ``unsupported``, the others run."""

no_modes = Implementation("tests.standin_impls:no_modes", kpool_forward, supports=frozenset(),
                          description="kpool's kernels declaring none of the optional modes")


def segfault_on_page_size_4(**kwargs):
    """``kpool.indexer.forward``, except that a call whose compressed cache has pages of
    :data:`CRASH_PAGE_SIZE` rows kills the process with a segfault (a read of address 0 through
    ``ctypes``), as a foreign operator reading out of bounds would; ``$PARITY_TEST_CRASH=abort``
    aborts (``os.abort``) instead."""
    if kwargs["compressed_cache"].shape[1] == CRASH_PAGE_SIZE:
        if os.environ.get("PARITY_TEST_CRASH") == "abort":
            os.abort()
        ctypes.string_at(0)
    return kpool_forward(**kwargs)


def segfault_always(**kwargs):
    """A forward whose every call kills the process with a segfault (ctypes read of address 0)."""
    ctypes.string_at(0)


def segfault_on_requestless_rows(**kwargs):
    """``kpool.indexer.forward``, except that a selection over token rows with no request
    (``R = 0``, ``T > 0``: FULL-mode padding only) kills the process with a segfault, as
    zzhx1@3ebb4fc4's indexer does under the interpreter (it launches on an empty batch and reads
    ``seq_lens[-1]``; docs/vendor-revisions.md §7)."""
    from parity.implementations.semantics import requestless_rows
    if requestless_rows(kwargs):
        ctypes.string_at(0)
    return kpool_forward(**kwargs)


def tail_column_off(**kwargs):
    """``kpool.indexer.forward`` with every selected index ``>= 0`` moved by one: a wrong answer
    (not a crash) on every step with a selection, for the isolated generated suite's failure path."""
    out = kpool_forward(**kwargs)
    if out is not None:
        out[out >= 0] += 1
    return out
