"""``vllm-ascend:PATH@REV``: a git revision of a vendor checkout (kernel vs kernel across the
vendor's history, parity-contract.md §1), as ``git:REV`` (:mod:`.git_rev`) does for this
repository.

:func:`checkout_at` resolves REV in the git repository that holds ``PATH``, checks it out into a
temporary ``git worktree add --detach`` (removed again, with ``git worktree prune``, before it
returns, whatever happens), and copies the tree (without ``.git``) into a directory that lives as
long as the process (removed at exit): the operator files are imported from there, and Triton
reads a kernel's source lazily, so the files must outlive the worktree. The vendor checkout's
index, branch, HEAD and working tree are never touched; only git's worktree bookkeeping is
written and pruned again.

Imports no torch.
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from typing import Optional, Tuple

from .git_rev import _git, repository, resolve_revision


def split_spec(rest: str) -> Tuple[str, Optional[str]]:
    """``"PATH@REV"`` -> ``(PATH, REV)``; ``"PATH"`` -> ``(PATH, None)``. The last ``@`` splits,
    unless ``rest`` itself names an existing path (a directory with ``@`` in its name).

    Raises:
        ValueError: an empty PATH or REV around the ``@``.
    """
    if "@" not in rest or os.path.exists(rest):
        return rest, None
    path, rev = rest.rsplit("@", 1)
    if not path or not rev:
        raise ValueError(f"vllm-ascend:PATH@REV needs both a checkout path and a revision, got {rest!r}")
    return path, rev


def _copy_ignoring_git(src: str, dst: str) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".git"), symlinks=True)


@functools.lru_cache(maxsize=None)
def _tree_at(top: str, sha: str) -> str:
    """A process-lifetime copy of repository ``top``'s tree at commit ``sha`` (once per process)."""
    tmp = tempfile.mkdtemp(prefix="parity_checkout_wt_")
    tree = os.path.join(tmp, "tree")
    dest = tempfile.mkdtemp(prefix=f"parity_checkout_{sha[:12]}_")
    atexit.register(shutil.rmtree, dest, True)
    try:
        _git(top, "worktree", "add", "--detach", "--quiet", tree, sha)
        _copy_ignoring_git(tree, os.path.join(dest, "tree"))
    finally:
        subprocess.run(["git", "-C", top, "worktree", "remove", "--force", tree], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", top, "worktree", "prune"], capture_output=True)
    return os.path.join(dest, "tree")


def checkout_at(path: str, rev: str) -> Tuple[str, str]:
    """``(directory, sha)``: where ``path`` (a checkout, or a folder inside one) is found at
    revision ``rev`` of its repository, and the full commit sha.

    Raises:
        ValueError: ``path`` is not in a git repository, or ``rev`` is unknown there.
    """
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise ValueError(f"vllm-ascend:PATH@REV: {path} is not a directory")
    top = repository(path)
    sha = resolve_revision(rev, top)
    inner = os.path.relpath(path, top)
    return os.path.normpath(os.path.join(_tree_at(top, sha), inner)), sha


def resolve_checkout(rest: str) -> Tuple[str, str]:
    """``(path to load, label)`` of a ``vllm-ascend:`` spec's ``rest``: ``PATH`` as is (label
    ``""``), or for ``PATH@REV`` the copy of :func:`checkout_at` (label ``" at REV (sha12)"``).

    Raises:
        ValueError: see :func:`split_spec` and :func:`checkout_at`.
    """
    path, rev = split_spec(rest)
    if rev is None:
        return path, ""
    where, sha = checkout_at(path, rev)
    return where, f" at {rev} ({sha[:12]}) of {path}"
