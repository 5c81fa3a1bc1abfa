"""``python -m parity bisect GOOD BAD --case NAME``: the first revision of this repository whose
kernels change a case's outputs (parity-contract.md §1, kernel vs kernel, bitwise);
``--kernel vllm-ascend:PATH``: the first revision of the vendor checkout at PATH whose operators
change them (each revision loaded as ``vllm-ascend:PATH@SHA``, :mod:`parity.implementations.checkout_rev`).

1. Refuse a dirty checkout (tracked changes) or a bisection already in progress.
2. Record goldens of the case at GOOD (``golden record`` with ``--kernel git:GOOD``,
   :mod:`parity.verbs.golden`, :mod:`parity.implementations.git_rev`) in a temporary directory.
3. Check BAD against them; when BAD is identical there is nothing to bisect (exit 1).
4. ``git bisect start --no-checkout BAD GOOD`` and ``git bisect run`` this module's
   :func:`bisect_step`, which checks the revision git proposes (``BISECT_HEAD``) against the
   goldens with ``--kernel git:BISECT_HEAD``: identical is good, moved is bad, a revision whose
   kernels cannot be loaded is skipped (exit 125). ``--no-checkout`` means the checkout's files
   never change, and every step runs this process's harness (``PYTHONPATH``, from a neutral
   working directory), so only the kernels vary between revisions.
5. Print the first bad revision and what moved there; ``git bisect reset`` and verify that HEAD,
   the branch and a clean status are as before (restoring the branch if needed).

Exit status: 0 the first changing revision was found, 1 BAD's outputs are identical to GOOD's
(or only skipped revisions remain), 2 usage error (dirty tree, unknown revision, GOOD's goldens
could not be recorded).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from typing import List, Optional

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
SKIP = 125
"""``git bisect run``'s "cannot test this revision" status."""


def add_bisect_parser(sub) -> None:
    """The ``bisect`` sub-command (no torch import)."""
    p = sub.add_parser("bisect", help="find the first revision whose kernels change a case's outputs (git bisect)",
                       description="Record goldens of a case at GOOD (its kernels via git:GOOD), then git bisect run "
                                   "over GOOD..BAD checking each revision's kernels against them; print the first "
                                   "revision where the case's outputs change. The checkout is never modified "
                                   "(git bisect --no-checkout) and is verified afterwards. Exit 0 found, 1 nothing "
                                   "changed, 2 usage error.")
    p.add_argument("good", metavar="GOOD", help="a revision whose outputs are the reference (e.g. a tag, HEAD~10)")
    p.add_argument("bad", metavar="BAD", help="a later revision whose outputs differ (e.g. HEAD)")
    p.add_argument("--case", nargs="+", required=True, metavar="NAME", help="the case(s) whose outputs are followed")
    from .golden import _isolate_argument
    _isolate_argument(p)
    p.add_argument("--kernel", default=None, metavar="vllm-ascend:PATH",
                   help="bisect the history of the vendor checkout at PATH instead of this repository: GOOD and "
                        "BAD are revisions of PATH's repository, each loaded as vllm-ascend:PATH@REV "
                        "(default: this repository's kernels, git:REV)")
    p.add_argument("--suite", default="seed", choices=("corpus", "seed", "public"), help="the case's suite (default seed)")
    p.add_argument("--size", default="small", help="seed case size (default small)")
    p.add_argument("--seed", type=int, default=0, help="case seed offset (default 0)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"), help="device (default auto)")


def _git(repo: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ValueError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def checkout_state(repo: str) -> dict:
    """``{"head": sha, "branch": refs/heads/... or None (detached), "status": porcelain text}``."""
    branch = _git(repo, "symbolic-ref", "-q", "HEAD", check=False).stdout.strip() or None
    return {"head": _git(repo, "rev-parse", "HEAD").stdout.strip(), "branch": branch,
            "status": _git(repo, "status", "--porcelain", "--untracked-files=no").stdout}


def _harness_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _selection(args) -> List[str]:
    return ["--device", args.device, "--suite", args.suite, "--size", args.size, "--seed", str(args.seed),
            "--case", *args.case]


def kernel_template(kernel: Optional[str]) -> tuple:
    """``(repository, template)`` of a bisection: the repository whose history is walked and the
    kernel spec of one of its revisions, ``template.format(rev=SHA)``: ``git:{rev}`` of this
    repository (``kernel`` ``None``), or ``vllm-ascend:/abs/PATH@{rev}`` of the checkout at PATH.

    Raises:
        ValueError: another kind of spec, a PATH with ``@REV`` or not in a git repository.
    """
    from ..implementations.checkout_rev import split_spec
    from ..implementations.git_rev import repository
    if kernel is None or kernel.startswith("git:"):
        return repository(), "git:{rev}"
    prefix = "vllm-ascend:"
    if not kernel.startswith(prefix) or not kernel[len(prefix):]:
        raise ValueError(f"--kernel must be vllm-ascend:PATH (a vendor checkout whose history is bisected), got "
                         f"{kernel!r}")
    path, rev = split_spec(kernel[len(prefix):])
    if rev is not None:
        raise ValueError(f"--kernel {kernel!r}: give the checkout without @REV (GOOD and BAD are the revisions)")
    path = os.path.abspath(os.path.expanduser(path))
    return repository(path), prefix + path.replace("{", "{{").replace("}", "}}") + "@{rev}"


def bisect_main(args) -> int:
    """``python -m parity bisect GOOD BAD --case NAME [--kernel vllm-ascend:PATH]``: as the module
    docstring says."""
    from ..implementations.git_rev import REPO_ENV, resolve_revision
    prog = "python -m parity bisect"
    try:
        repo, template = kernel_template(getattr(args, "kernel", None))
        good, bad = resolve_revision(args.good, repo), resolve_revision(args.bad, repo)
    except ValueError as exc:
        return _usage(f"{prog}: error: {exc}")
    before = checkout_state(repo)
    if before["status"]:
        return _usage(f"{prog}: error: the checkout {repo} has uncommitted changes; commit or stash them first "
                      f"(bisect must leave it exactly as it was):\n{before['status']}")
    if os.path.exists(os.path.join(repo, _git(repo, "rev-parse", "--git-path", "BISECT_START").stdout.strip())):
        return _usage(f"{prog}: error: a git bisect is already in progress in {repo} (git bisect reset ends it)")
    env = dict(os.environ, PYTHONPATH=_harness_root(), **{REPO_ENV: repo})
    work = tempfile.mkdtemp(prefix="kpool_bisect_")
    golden = os.path.join(work, "golden")
    py = [sys.executable, "-m", "parity"]
    print(f"bisect {args.case} over {good[:12]} (good) .. {bad[:12]} (bad) in {repo}; goldens at good in {golden}",
          flush=True)
    try:
        isolate = ["--isolate", getattr(args, "isolate", "auto")]
        rec = subprocess.run(py + ["golden", "record", golden, "--kernel", template.format(rev=good)] + isolate
                             + _selection(args), cwd=work, env=env)
        if rec.returncode != 0:
            return _usage(f"{prog}: error: recording the goldens at {args.good} failed (exit {rec.returncode})")
        chk = subprocess.run(py + ["golden", "check", golden, "--device", args.device, "--kernel",
                                   template.format(rev=bad)] + isolate, cwd=work, env=env)
        if chk.returncode == 0:
            print(f"{args.bad} ({bad[:12]}): the outputs of {args.case} are identical to {args.good}'s: nothing to bisect")
            return EXIT_FAIL
        if chk.returncode != 1:
            return _usage(f"{prog}: error: checking {args.bad} failed (exit {chk.returncode})")
        try:
            return _run_bisect(repo, good, bad, golden, work, env, args, template)
        except ValueError as exc:   # git refused (GOOD not an ancestor of BAD...)
            return _usage(f"{prog}: error: {exc}")
    finally:
        _restore(repo, before)
        import shutil
        shutil.rmtree(work, ignore_errors=True)


def _run_bisect(repo, good, bad, golden, work, env, args, template: str = "git:{rev}") -> int:
    _git(repo, "bisect", "start", "--no-checkout", bad, good)
    step = shlex.join([sys.executable, "-m", "parity.verbs.bisect", golden, "--device", args.device,
                       "--log", os.path.join(work, "logs"), "--kernel-template", template,
                       "--isolate", getattr(args, "isolate", "auto")])
    run = subprocess.run(["git", "-C", repo, "bisect", "run", "sh", "-c", f"cd {shlex.quote(work)} && exec {step}"],
                         env=env, capture_output=True, text=True)
    text = run.stdout + run.stderr
    if "is the first bad commit" not in text:
        print(text)
        print(f"no single first changing revision (git bisect run exit {run.returncode}; skipped revisions?)")
        return EXIT_FAIL
    first = _git(repo, "rev-parse", "refs/bisect/bad").stdout.strip()
    subject = _git(repo, "log", "-1", "--format=%h %s", first).stdout.strip()
    print(f"first revision where {' '.join(args.case)}'s outputs change: {first}\n  {subject}")
    log = os.path.join(work, "logs", f"{first}.txt")
    if os.path.isfile(log):
        with open(log) as f:
            print("  what moved there:\n" + "".join(f"    {line}" for line in f if "MOVED" in line or "MISSING" in line))
    return EXIT_OK


def _restore(repo: str, before: dict) -> None:
    """End any bisection and put HEAD / the branch back if they moved; warn if the status changed."""
    if _git(repo, "bisect", "log", check=False).returncode == 0:
        _git(repo, "bisect", "reset", check=False)
    after = checkout_state(repo)
    if after["branch"] != before["branch"] or after["head"] != before["head"]:
        target = before["branch"][len("refs/heads/"):] if before["branch"] else before["head"]
        _git(repo, "checkout", "-q", target, check=False)
        after = checkout_state(repo)
    if after != before:
        print(f"warning: the checkout is not as before bisect: {before} -> {after}", file=sys.stderr)


def _usage(message: str) -> int:
    print(message, file=sys.stderr)
    return EXIT_USAGE


def bisect_step(argv: Optional[List[str]] = None) -> int:
    """One ``git bisect run`` step: ``golden check GOLDEN --kernel git:BISECT_HEAD`` (or
    ``--kernel-template``'s spec of ``BISECT_HEAD``, :func:`kernel_template`) mapped to git's
    statuses (0 identical = good, 1 moved = bad, anything else = :data:`SKIP`); the check's text
    is also written to ``--log DIR/<sha>.txt``."""
    import argparse

    from rich.console import Console

    from .golden import golden_main
    from ..implementations.git_rev import resolve_revision
    p = argparse.ArgumentParser(prog="python -m parity.verbs.bisect")
    p.add_argument("golden")
    p.add_argument("--device", default="auto")
    p.add_argument("--log", default=None)
    p.add_argument("--kernel-template", default="git:{rev}")
    p.add_argument("--isolate", default="auto")
    a = p.parse_args(argv)
    console = Console(record=True, width=200)
    try:
        sha = resolve_revision("BISECT_HEAD")
        status = golden_main(argparse.Namespace(golden_command="check", dir=a.golden, device=a.device,
                                                kernel=a.kernel_template.format(rev=sha), isolate=a.isolate),
                             console=console)
    except Exception as exc:   # a revision that cannot be evaluated is skipped, not blamed
        print(f"cannot evaluate this revision: {type(exc).__name__}: {exc}", file=sys.stderr)
        return SKIP
    if a.log:
        os.makedirs(a.log, exist_ok=True)
        with open(os.path.join(a.log, f"{sha}.txt"), "w") as f:
            f.write(console.export_text())
    return {EXIT_OK: 0, EXIT_FAIL: 1}.get(status, SKIP)


if __name__ == "__main__":
    sys.exit(bisect_step())
