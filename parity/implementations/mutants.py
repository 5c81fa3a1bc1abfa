"""Planted faults: mutated copies of the ``kpool`` package, for testing that the harness catches
real kernel bugs (and classifies them right) without any fault hook in production code.

:func:`load_mutant` copies the ``kpool`` source tree into a temporary directory under another
package name (``kpool_mutant_<name>``), applies one textual mutation (an exact substring that
must occur exactly once, so a refactor that removes it fails loudly instead of silently testing
nothing), imports the copy and returns its ``indexer`` module, whose ``forward`` is the mutated
kernel forward. Real files are written because Triton reads kernel source with
``inspect.getsource``. ``kpool`` imports itself relatively, so the copy is self-contained.

Import the kernels only after ``kpool.platform.resolve_device`` (the interpreter flag is read
when a kernel is decorated).
"""
from __future__ import annotations

import atexit
import importlib
import os
import re
import shutil
import sys
import tempfile
from typing import Callable, Optional, Tuple

MUTANTS = {
    # own incomplete pool admitted: visible = floor((p + P) / P) instead of floor((p + 1) / P), §4.1
    # (the score kernels' one visibility helper: decode and prefill tiles alike)
    "visible-off-by-one": (
        "ops/_portable.py",
        "tl.minimum((pos + 1) // P, pools_of_req)",
        "tl.minimum((pos + P) // P, pools_of_req)",
        "wrong-index"),
    # APE slot order reversed (slot j gets ape[P-1-j]), §5.3 step 1; done at the launch site,
    # which is equivalent to the kernel indexing the APE rows backwards.
    "ape-reversed": (
        "ops/compress.py",
        "k, gate, ape, compressed_cache.view(torch.int16), tail_cache,",
        "k, gate, ape.flip(0), compressed_cache.view(torch.int16), tail_cache,",
        "cache-mismatch"),
    # packed tail written one column to the right, §4.5 step 2
    "tail-wrong-column": (
        "ops/expand.py",
        "tail_col = tl.minimum(tail_start, index_topk)",
        "tail_col = tl.minimum(tail_start + 1, index_topk)",
        "wrong-tail"),
    # the t < T_live guard of the cache-update kernels removed: the compression's live rows and
    # the ring write's last request run to the graph-static T, so padding rows with stale
    # positive ring slots write the ring, §5.4 (stray-write where a stale slot hits a ring row
    # nobody writes in that step; a ring-mismatch too when it clobbers a live row)
    "padding-row-writes": (
        "ops/compress.py",
        ("live = live_rows(rows, num_rows, cum_query_lens_ptr, num_requests)",
         "in_batch = live_rows(rows, num_rows, cum_query_lens_ptr, num_requests)",
         "span_end = tl.load(cum_query_lens_ptr + r, mask=has_req, other=0)"),
        ("live = rows < num_rows",
         "in_batch = rows < num_rows",
         "span_end = tl.where(r == num_requests - 1, num_rows, "
         "tl.load(cum_query_lens_ptr + r, mask=has_req, other=0))"),
        "stray-write"),
    # C01: the ring stash gated on the pool-granular slot_mapping (-1 for every token that is not
    # the last of its pool), §5.4: tokens inside a pool are never stashed, so a later chunk or
    # decode completing that pool reads stale ring rows (missing-write on a fresh ring slot)
    "ring-stash-gated-on-pool-slot": (
        "ops/compress.py",
        "positions, cum_query_lens, tail_slot_mapping,",
        "positions, cum_query_lens, torch.where(slot_mapping >= 0, tail_slot_mapping, -1),",
        "missing-write"),
    # C21: a P-slot ring (the capacity C = P + spec ignored): every verify row, rejected drafts
    # included, is stashed at p % P, so a rejected draft overwrites a committed token of the open
    # pool, §3.3, §5.4 (the ring layout moves too, so any C > P case shows a ring-mismatch)
    "ring-capacity-p": (
        "ops/compress.py",
        "num_tail_blocks, C = int(tail_cache.shape[0]), int(tail_cache.shape[2])",
        "num_tail_blocks, C = int(tail_cache.shape[0]), int(tail_cache.shape[2]); "
        "tail_slot_mapping = torch.where(tail_slot_mapping >= 0, tail_slot_mapping // C * index_kpool "
        "+ positions % index_kpool, tail_slot_mapping); C = int(index_kpool)",
        "ring-mismatch"),
    # C17: padding rows' ring slot -1 used as an index: the ring write covers the graph-static T
    # rows (its last request runs to T) and checks only the upper bound of the slot, so slot -1
    # (block 0, row -1 after C division) writes before the ring, §5.4, §6 "FULL-mode padding"
    # (three edits, one fault)
    "padding-slot-minus-one": (
        "ops/compress.py",
        ("valid = near_end & (pos >= 0) & (tslot >= 0) & (tslot < num_tail_slots)",
         "in_batch = live_rows(rows, num_rows, cum_query_lens_ptr, num_requests)",
         "span_end = tl.load(cum_query_lens_ptr + r, mask=has_req, other=0)"),
        ("valid = near_end & (pos >= 0) & (tslot < num_tail_slots)",
         "in_batch = rows < num_rows",
         "span_end = tl.where(r == num_requests - 1, num_rows, "
         "tl.load(cum_query_lens_ptr + r, mask=has_req, other=0))"),
        "stray-write"),
    # Chunked scoring (§4.6): when the score scratch holds fewer rows than the step has live rows,
    # every chunk's selected pool ids and scores are written at rows [:n] of the top-k buffers
    # instead of [row_start:row_start + n]: later chunks overwrite the first chunk's rows and the
    # rows of every chunk after the first keep uninitialized memory (wrong-index). Invisible to
    # any step scored in one chunk: prefill-topk's chunk-2 (max_score_rows) catches it.
    "chunk-offset": (
        "indexer.py",
        "out=top_keys[row_start:row_start + n], work=top_index,",
        "out=top_keys[:n], work=top_index,",
        "wrong-index"),
}
"""``name -> (file relative to kpool/, exact old substring, new substring, expected verdict)``;
``old`` / ``new`` may be equal-length tuples for a fault that needs several edits of one file."""

PLANTED_FAULTS = {
    "own incomplete pool visible": "visible-off-by-one",
    "ring stash gated on the pool slot": "ring-stash-gated-on-pool-slot",
    "rejected MTP draft kept in the ring": "ring-capacity-p",
    "padding slot -1 used as an index": "padding-slot-minus-one",
}
"""The planted faults the generated runs must find (the issue's list) -> :data:`MUTANTS` name."""

_ROOT: Optional[str] = None


def _kpool_dir() -> str:
    import kpool
    return os.path.dirname(os.path.abspath(kpool.__file__))


def _root() -> str:
    global _ROOT
    if _ROOT is None:
        _ROOT = tempfile.mkdtemp(prefix="kpool_mutants_")
        atexit.register(shutil.rmtree, _ROOT, True)
        sys.path.insert(0, _ROOT)
    return _ROOT


def package_name(name: str) -> str:
    """``kpool_mutant_<name>`` with every non-identifier character replaced by ``_``."""
    return "kpool_mutant_" + re.sub(r"\W", "_", name)


def apply_mutation(source: str, old, new, *, where: str = "") -> str:
    """Replace the single occurrence of ``old`` in ``source`` by ``new`` (or, for tuples, each
    ``old[i]`` by ``new[i]`` in turn).

    Raises:
        AssertionError: ``old`` occurs zero or several times (the kernel changed: update MUTANTS).
    """
    if isinstance(old, tuple):
        assert isinstance(new, tuple) and len(new) == len(old), "tuple mutations need one new per old"
        for o, n in zip(old, new):
            source = apply_mutation(source, o, n, where=where)
        return source
    count = source.count(old)
    assert count == 1, f"mutation substring occurs {count} times in {where or 'source'} (expected 1): {old!r}"
    return source.replace(old, new)


def build_mutant(name: str, mutation: Optional[Tuple[str, str, str, Optional[str]]] = None) -> str:
    """Write the mutated package ``package_name(name)`` to disk (once per process).

    Args:
        name: mutant name (a key of :data:`MUTANTS` unless ``mutation`` is given).
        mutation: ``(relative_file, old, new, expected_verdict)``; defaults to ``MUTANTS[name]``.
    Returns:
        The package name, importable (its parent directory is on ``sys.path``).
    Raises:
        KeyError: unknown name without ``mutation``. AssertionError: see :func:`apply_mutation`.
        FileNotFoundError: the file does not exist in ``kpool``.
    """
    rel, old, new, _ = mutation if mutation is not None else MUTANTS[name]

    def mutate(tmp: str) -> None:
        path = os.path.join(tmp, rel)
        with open(path) as f:
            src = f.read()
        with open(path, "w") as f:
            f.write(apply_mutation(src, old, new, where=f"kpool/{rel}"))

    return copy_package(package_name(name), _kpool_dir(), edit=mutate)


def copy_package(pkg: str, source_dir: str, *, edit: Optional[Callable[[str], None]] = None) -> str:
    """Copy the package directory ``source_dir`` (a ``kpool`` tree) to the importable package
    ``pkg`` under this process's temporary root, once per process (a second call returns at once).

    Args:
        pkg: the copy's package name (a Python identifier, e.g. ``kpool_mutant_x``, ``kpool_git_<sha>``).
        source_dir: the directory to copy (``__pycache__`` and ``*.pyc`` left out).
        edit: called with the copy's directory before it is published (a mutation); may raise.
    Returns:
        ``pkg``, importable (its parent directory is on ``sys.path``).
    Raises:
        FileNotFoundError: ``source_dir`` does not exist; whatever ``edit`` raises (nothing is
        published then).
    """
    dest = os.path.join(_root(), pkg)
    if os.path.isdir(dest):
        return pkg
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source_dir, tmp, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    try:
        if edit is not None:
            edit(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.replace(tmp, dest)
    importlib.invalidate_caches()
    return pkg


def load_mutant(name: str, *, mutation: Optional[Tuple[str, str, str, Optional[str]]] = None,
                module: str = "indexer"):
    """Import a mutated copy of ``kpool`` and return one of its modules.

    Args:
        name: key of :data:`MUTANTS`, or any name together with ``mutation``.
        mutation: ``(relative_file, old, new, expected_verdict)`` overriding ``MUTANTS[name]``.
        module: the module to return (default ``"indexer"``: its ``forward`` is the mutated
            kernel forward, same signature as ``kpool.indexer.forward``).
    Returns:
        The imported module ``kpool_mutant_<name>.<module>``.
    Raises:
        As :func:`build_mutant`; ImportError if the mutated package does not import.
    """
    pkg = build_mutant(name, mutation)
    return importlib.import_module(f"{pkg}.{module}")


def expected_verdict(name: str) -> str:
    """The verdict :data:`MUTANTS` says the harness must report for mutant ``name``."""
    return MUTANTS[name][3]
