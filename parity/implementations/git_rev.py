"""``git:REV``: this repository's kernels at a git revision (kernel vs kernel, parity-contract.md §1).

:func:`load_revision` checks REV out into a temporary ``git worktree add --detach`` (under a temp
directory, removed again at once: the user's checkout, index and branch are never touched), copies
that revision's ``kpool`` tree into a separately named package ``kpool_git_<sha12>`` (the package-
copy machinery of :mod:`parity.implementations.mutants`, :func:`parity.implementations.mutants.copy_package`) and imports it, so
two revisions (and the working tree's ``kpool``) live in one process. ``kpool`` imports itself
relatively, so the copy is self-contained; the harness code doing the checking stays the caller's.

The repository is ``$KPOOL_GIT_REPO`` when set, else the git checkout of the working directory
(``git rev-parse --show-toplevel``). REV is anything ``git rev-parse`` accepts (``HEAD~3``, a
tag, ``BISECT_HEAD``).
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import tempfile
from typing import Optional

PREFIX = "git:"
REPO_ENV = "KPOOL_GIT_REPO"


def _git(repo: str, *args: str) -> str:
    """Run ``git -C repo ARGS`` and return its stdout; raise :class:`ValueError` with git's message."""
    try:
        done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    except OSError as exc:   # no git on this host: git:REV cannot work here
        raise ValueError(f"git:REV needs git, which cannot run here: {exc}") from exc
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def repository(repo: Optional[str] = None) -> str:
    """The top level of the repository ``git:REV`` reads: ``repo``, else ``$KPOOL_GIT_REPO``,
    else the working directory's checkout.

    Raises:
        ValueError: not inside a git repository.
    """
    return _git(repo or os.environ.get(REPO_ENV) or os.getcwd(), "rev-parse", "--show-toplevel")


def resolve_revision(rev: str, repo: Optional[str] = None) -> str:
    """The full commit sha of ``rev`` in :func:`repository`.

    Raises:
        ValueError: empty or unknown revision, or no repository.
    """
    if not rev:
        raise ValueError("git:REV needs a revision, e.g. git:HEAD~1")
    return _git(repository(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")


def package_name(sha: str) -> str:
    """``kpool_git_<first 12 hex digits>``: the package a revision's kernels are loaded as."""
    return f"kpool_git_{sha[:12]}"


def load_revision(rev: str, repo: Optional[str] = None, module: str = "indexer"):
    """Import ``kpool`` at revision ``rev`` as :func:`package_name` and return its ``module``.

    The revision's tree comes from a temporary detached worktree (removed, with ``git worktree
    prune``, before returning, whatever happens); only the package copy stays, for the process.

    Raises:
        ValueError: unknown revision, not a repository, a revision without ``kpool/``;
        ImportError: the revision's kernels do not import.
    """
    from .mutants import copy_package
    top = repository(repo)
    sha = resolve_revision(rev, top)
    pkg = package_name(sha)
    tmp = tempfile.mkdtemp(prefix="kpool_git_wt_")
    tree = os.path.join(tmp, "tree")
    try:
        _git(top, "worktree", "add", "--detach", "--quiet", tree, sha)
        source = os.path.join(tree, "kpool")
        if not os.path.isfile(os.path.join(source, "__init__.py")):
            raise ValueError(f"revision {rev} ({sha[:12]}) has no kpool package")
        copy_package(pkg, source)
    finally:
        subprocess.run(["git", "-C", top, "worktree", "remove", "--force", tree], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", top, "worktree", "prune"], capture_output=True)
    return importlib.import_module(f"{pkg}.{module}")
