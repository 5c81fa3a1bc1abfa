"""A throwaway clone of this repository with a planted kernel commit in its history, for checking
``ab`` against ``git:REV`` and ``bisect`` (issue 12's done-when) without touching any real checkout.

:func:`plant_history` clones a repository (``git clone --local --no-hardlinks``, the source is
only read) and commits ``before`` harmless commits (a note file each), one commit that applies a
planted fault of :data:`parity.implementations.mutants.MUTANTS` to the clone's ``kpool`` sources, and ``after``
harmless commits. The planted commit is ``HEAD~after``; the clone's original HEAD is
``HEAD~(before + after + 1)``.

Command line (prints the revisions)::

    python -m parity.verbs.planted_history DEST [--repo REPO] [--mutant NAME] [--before 4] [--after 4]
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, Optional

IDENTITY = ("-c", "user.name=parity planted history", "-c", "user.email=parity@localhost",
            "-c", "commit.gpgsign=false")
DEFAULT_MUTANT = "tail-wrong-column"


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *IDENTITY, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def plant_history(dest: str, *, repo: Optional[str] = None, mutant: str = DEFAULT_MUTANT, before: int = 4,
                  after: int = 4) -> Dict[str, str]:
    """Clone ``repo`` (default: this harness's checkout) to ``dest`` and add the commits.

    Returns:
        ``{"base": sha, "planted": sha, "head": sha}``.
    Raises:
        subprocess.CalledProcessError: git failed (``dest`` exists and is not empty, ``repo`` is
        not a repository); KeyError: unknown mutant; AssertionError: the mutation's text is not in
        the clone's kernels (:func:`parity.implementations.mutants.apply_mutation`).
    """
    from ..implementations.mutants import MUTANTS, apply_mutation
    rel, old, new, _ = MUTANTS[mutant]
    repo = repo or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run(["git", "clone", "-q", "--local", "--no-hardlinks", repo, dest], check=True, capture_output=True)
    out = {"base": _git(dest, "rev-parse", "HEAD")}
    for i in range(before + 1 + after):
        if i == before:
            path = os.path.join(dest, "kpool", rel)
            with open(path) as f:
                text = apply_mutation(f.read(), old, new, where=f"kpool/{rel}")
            with open(path, "w") as f:
                f.write(text)
            message = f"planted kernel change: {mutant} (kpool/{rel})"
        else:
            with open(os.path.join(dest, f"planted-history-note-{i}.txt"), "w") as f:
                f.write(f"harmless commit {i}\n")
            message = f"harmless commit {i}"
        _git(dest, "add", "-A")
        _git(dest, "commit", "-q", "-m", message)
        if i == before:
            out["planted"] = _git(dest, "rev-parse", "HEAD")
    out["head"] = _git(dest, "rev-parse", "HEAD")
    return out


def main(argv=None) -> int:
    """``python -m parity.verbs.planted_history DEST ...``: build the clone, print its revisions."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m parity.verbs.planted_history", description=__doc__.split("\n\n")[0])
    p.add_argument("dest")
    p.add_argument("--repo", default=None)
    p.add_argument("--mutant", default=DEFAULT_MUTANT)
    p.add_argument("--before", type=int, default=4)
    p.add_argument("--after", type=int, default=4)
    a = p.parse_args(argv)
    revs = plant_history(a.dest, repo=a.repo, mutant=a.mutant, before=a.before, after=a.after)
    for name, sha in revs.items():
        print(f"{name:<8} {sha}")
    print(f"planted = HEAD~{a.after}, base = HEAD~{a.before + a.after + 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
