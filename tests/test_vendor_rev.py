"""``vllm-ascend:PATH@REV`` (issue 18, item 4): git revisions of a vendor checkout in ``run``,
``ab`` and ``bisect``, on a throwaway git repository built in a tmp dir from the stand-in checkout
``tests/vendor_standin/new`` (no vendor code): base, a harmless commit, a planted change of the
tail compression (the APE rows reversed), another harmless commit.

Costs (2-core CPU; user time, wall about twice that under load): the unit tests about 1 s
together (loads of revisions, no case run); integration: ab about 10 s (one in process, one
isolated: two worker starts), bisect about 17 s (golden record + check + 1-2 bisect steps, each
a fresh process; ``--isolate off``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from parity.implementations import resolve
from parity.implementations.checkout_rev import checkout_at, split_spec
from tests.helpers import parity_cli as _cli

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "vendor_standin" / "new"
COMPRESS = "vllm_ascend/ops/triton/glm5_next_kpool_tail_compress.py"
PLANT = ("ape = ape.contiguous()", "ape = ape.flip(0).contiguous()")
"""The planted change: the compression pools with the APE rows reversed (caught by every case
that compresses a pool)."""


def _git(repo, *args) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def vendor_history(root: Path) -> Path:
    """A git repository at ``root/vendor`` whose four commits are the stand-in checkout: base,
    ``harmless 1`` (a README), ``planted`` (:data:`PLANT`), ``harmless 2``; returns its path."""
    repo = root / "vendor"
    shutil.copytree(STANDIN, repo, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    (repo / "README").write_text("stand-in vendor history\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "harmless 1")
    path = repo / COMPRESS
    text = path.read_text()
    assert text.count(PLANT[0]) == 1, f"{PLANT[0]!r} must occur once in {COMPRESS}"
    path.write_text(text.replace(*PLANT))
    _git(repo, "commit", "-qam", "planted")
    (repo / "README").write_text("stand-in vendor history, again\n")
    _git(repo, "commit", "-qam", "harmless 2")
    return repo


def _state(repo: Path) -> tuple:
    """HEAD, branch, status (untracked too) and the worktree list of ``repo``."""
    return (_git(repo, "rev-parse", "HEAD"), _git(repo, "symbolic-ref", "-q", "HEAD"),
            _git(repo, "status", "--porcelain"), _git(repo, "worktree", "list", "--porcelain"))


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    return vendor_history(tmp_path_factory.mktemp("vendor_rev"))


def test_split_spec():
    assert split_spec("../vllm-ascend@main") == ("../vllm-ascend", "main")
    assert split_spec("../vllm-ascend") == ("../vllm-ascend", None)
    assert split_spec("a@b@HEAD~2") == ("a@b", "HEAD~2")
    with pytest.raises(ValueError):
        split_spec("@main")
    with pytest.raises(ValueError):
        split_spec("../vllm-ascend@")


def test_a_revision_loads_from_a_temporary_worktree_and_leaves_the_checkout_alone(history):
    before = _state(history)
    where, sha = checkout_at(str(history), "HEAD~2")
    assert sha == _git(history, "rev-parse", "HEAD~2")
    assert PLANT[1] not in (Path(where) / COMPRESS).read_text()           # the tree of HEAD~2, not HEAD's
    assert PLANT[1] in (Path(checkout_at(str(history), "HEAD")[0]) / COMPRESS).read_text()
    impl = resolve(f"vllm-ascend:{history}@HEAD~2")
    assert f"({sha[:12]})" in impl.description and callable(impl.forward)
    assert _state(history) == before                                     # index, branch, worktrees as before
    with pytest.raises(ValueError, match="nosuchrev"):
        resolve(f"vllm-ascend:{history}@nosuchrev")



@pytest.mark.integration
def test_ab_between_revisions_of_a_vendor_checkout(history):
    """Identical across a harmless commit, different across the planted one."""
    sel = ("--suite", "seed", "--size", "small", "--case", "decode-tail", "--device", "cpu")
    same = _cli("ab", "--baseline", f"vllm-ascend:{history}@HEAD~3", "--candidate", f"vllm-ascend:{history}@HEAD~2",
                "--isolate", "off", *sel)                     # in process: the cheaper way, also covered
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-2000:]
    moved = _cli("ab", "--baseline", f"vllm-ascend:{history}@HEAD~2", "--candidate", f"vllm-ascend:{history}", *sel)
    assert moved.returncode == 1, moved.stdout[-3000:] + moved.stderr[-2000:]
    assert "compressed_cache" in moved.stdout


@pytest.mark.integration
def test_bisect_walks_the_vendor_history_to_the_planted_commit(history):
    before = _state(history)
    out = _cli("bisect", "HEAD~2", "HEAD", "--kernel", f"vllm-ascend:{history}", "--case", "decode-tail",
               "--suite", "seed", "--size", "small", "--device", "cpu", "--isolate", "off")   # cheaper; isolation: ab
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    planted = _git(history, "rev-parse", "HEAD~1")
    assert f"change: {planted}" in out.stdout and "planted" in out.stdout
    assert _state(history) == before
