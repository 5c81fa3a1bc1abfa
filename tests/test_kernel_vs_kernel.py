"""Kernel vs kernel (parity-contract.md §1): ``git:REV`` implementations, ``ab``, device goldens,
``bisect`` (issue 12). The unit tier uses a tiny fake repository and no kernel run; the
integration tier works in a throwaway clone of this repository with planted commits."""
import json
import os
import subprocess

import pytest
import torch

from parity.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SELECT = ["--suite", "seed", "--size", "small", "--case", "prefill-tail"]
PLANT = "tail-wrong-column"    # a kpool/ops/expand.py edit that moves the packed tail's column


def git(repo, *args) -> str:
    """Run git in ``repo`` with a throwaway identity; return stdout."""
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.com",
                           "-c", "commit.gpgsign=false", *args], check=True, capture_output=True, text=True).stdout


def state(repo) -> tuple:
    """HEAD, branch and porcelain status of ``repo`` (what bisect must leave alone)."""
    return (git(repo, "rev-parse", "HEAD"), git(repo, "symbolic-ref", "-q", "HEAD"),
            git(repo, "status", "--porcelain"), git(repo, "worktree", "list"))


# --------------------------------------------------------------------------- unit tier

def _fake_repo(path, versions):
    """A repository whose ``kpool/indexer.py`` defines ``forward`` returning each version's value."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "kpool").mkdir()
    (path / "kpool" / "__init__.py").write_text("from .indexer import forward  # relative: copies stay separate\n")
    for v in versions:
        (path / "kpool" / "indexer.py").write_text(f"def forward(**kwargs):\n    return {v!r}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"version {v}")
    return path


def test_git_rev_loads_two_revisions_side_by_side_and_leaves_the_checkout(tmp_path, monkeypatch):
    from parity.implementations import resolve
    repo = _fake_repo(tmp_path / "repo", ["old", "new"])
    (repo / "untracked.txt").write_text("user's file\n")
    before = state(repo)
    monkeypatch.setenv("KPOOL_GIT_REPO", str(repo))
    old, new = resolve("git:HEAD~1"), resolve("git:HEAD")
    assert (old.forward(), new.forward()) == ("old", "new")
    sha = git(repo, "rev-parse", "HEAD~1").strip()
    assert old.package == f"kpool_git_{sha[:12]}" and old.forward.__module__ == f"{old.package}.indexer"
    assert state(repo) == before and (repo / "untracked.txt").read_text() == "user's file\n"
    with pytest.raises(ValueError, match="rev-parse"):
        resolve("git:no-such-revision")


def test_diff_names_the_first_differing_element_with_both_values():
    from parity.running.step_outputs import diff_step, tensor_hash
    a = {"indices": torch.arange(12, dtype=torch.int32).reshape(3, 1, 4), "output_buffer": None,
         "compressed_cache": torch.zeros(8, dtype=torch.int16), "tail_ring": torch.zeros(4, dtype=torch.int32)}
    b = {k: (v.clone() if v is not None else None) for k, v in a.items()}
    assert diff_step(a, b) == [] and tensor_hash(a["indices"]) == tensor_hash(b["indices"])
    b["indices"][2, 0, 1] = -1
    b["indices"][2, 0, 3] = -1
    b["tail_ring"][3] = torch.tensor([1.0]).view(torch.int32)
    (ind, ring) = diff_step(a, b)
    assert (ind.output, ind.count, ind.where, ind.a, ind.b) == ("indices", 2, {"row": 2, "col": 1}, "9", "-1")
    assert ring.output == "tail_ring" and ring.count == 1 and ring.b.startswith("0x3F800000")
    assert tensor_hash(a["indices"]) != tensor_hash(b["indices"])
    b["output_buffer"] = torch.zeros(2, 2, dtype=torch.int32)
    assert [d.output for d in diff_step(a, b)] == ["indices", "output_buffer", "tail_ring"]


def test_golden_of_another_device_kind_is_refused(tmp_path, capsys, device):
    kind_dir = tmp_path / "golden" / "cuda_NVIDIA_H200"
    kind_dir.mkdir(parents=True)
    (kind_dir / "golden.json").write_text(json.dumps({"format": 1, "device_kind": "cuda:NVIDIA H200", "cases": {}}))
    if device == "cuda":
        pytest.skip("this device is the recorded kind")
    assert main(["golden", "check", str(tmp_path / "golden"), "--device", device]) == 2
    err = capsys.readouterr().err
    assert "cuda:NVIDIA H200" in err and "cannot be checked here" in err
    assert main(["golden", "check", str(kind_dir), "--device", device]) == 2     # the kind directory itself
    assert "were recorded on device kind 'cuda:NVIDIA H200'" in capsys.readouterr().err
    assert main(["golden", "check", str(tmp_path / "none"), "--device", device]) == 2
    assert "no goldens" in capsys.readouterr().err


def test_bisect_refuses_a_dirty_checkout(tmp_path, monkeypatch, capsys):
    repo = _fake_repo(tmp_path / "repo", ["a", "b"])
    (repo / "kpool" / "indexer.py").write_text("def forward(**kwargs):\n    return 'edited'\n")
    monkeypatch.setenv("KPOOL_GIT_REPO", str(repo))
    before = state(repo)
    assert main(["bisect", "HEAD~1", "HEAD", "--case", "prefill-tail", "--device", "cpu"]) == 2
    assert "uncommitted changes" in capsys.readouterr().err
    assert state(repo) == before


def test_generated_selection_is_the_same_fixed_list_every_time(device):
    """ab and golden need both sides (and a later check) to see the same generated cases."""
    import argparse

    from rich.console import Console

    from parity.selection.kernel_cases import selected_cases
    args = argparse.Namespace(suite="generated", size="small", case=None, seed=0, profile="ci", no_oracle=False)
    first, again = (selected_cases(args, "cpu", Console(quiet=True)) for _ in range(2))
    assert len(first) > 10 and len({s.key for s in first}) == len(first)
    assert [s.case.case_id for s in first] == [s.case.case_id for s in again]
    assert [s.case.steps for s in first] == [s.case.steps for s in again]


def test_list_implementations_names_git_rev(capsys):
    assert main(["list", "implementations"]) == 0
    assert {"kpool", "mutant:NAME", "git:REV"} <= set(capsys.readouterr().out.split())


# --------------------------------------------------------------------------- integration tier

@pytest.fixture(scope="module")
def planted_clone(tmp_path_factory):
    """A clone of this repository's HEAD plus 3 commits (:mod:`parity.verbs.planted_history`): one
    harmless, one that plants :data:`PLANT` in the kernels (HEAD~1), one harmless. One harmless
    commit on each side is enough for bisect to have to tell the planted commit from both its
    neighbours; each further commit costs a bisect step (a fresh process running the case)."""
    from parity.verbs.planted_history import plant_history
    if subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    clone = tmp_path_factory.mktemp("kvk") / "clone"
    revs = plant_history(str(clone), repo=ROOT, mutant=PLANT, before=1, after=1)
    assert git(clone, "rev-parse", "HEAD~1").strip() == revs["planted"]
    assert git(clone, "rev-parse", "HEAD~3").strip() == revs["base"]
    return clone


@pytest.mark.integration
def test_ab_of_identical_revisions_is_identical(planted_clone, monkeypatch, capsys, device):
    monkeypatch.setenv("KPOOL_GIT_REPO", str(planted_clone))
    assert main(["ab", "--baseline", "git:HEAD~3", "--candidate", "git:HEAD~2", "--device", device, *SELECT]) == 0
    out = capsys.readouterr().out
    assert "3 steps: 3 identical, 0 differ" in out and "IDENTICAL" in out


@pytest.mark.integration
def test_ab_against_a_revision_that_changed_a_kernel_reports_the_changed_outputs(planted_clone, monkeypatch, capsys,
                                                                                  device, tmp_path):
    monkeypatch.setenv("KPOOL_GIT_REPO", str(planted_clone))
    assert main(["ab", "--baseline", "kpool", "--candidate", "git:HEAD~1", "--device", device, *SELECT,
                 "--report", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "3 of 3 steps differ" in out and "DIFFERS" in out
    assert "step 0 (prefill): differs" in out and "indices: 81/880 differ, first row=0 col=0: baseline 0 vs candidate -1" in out
    import pandas as pd
    rows = pd.read_csv(tmp_path / "ab.csv")
    assert set(rows[rows["status"] == "differs"]["output"]) == {"indices"}
    assert list(rows["step"]) == [0, 1, 2]


@pytest.mark.integration
def test_golden_check_after_a_planted_fault_names_case_step_and_output(tmp_path, capsys, device):
    golden = tmp_path / "golden"
    assert main(["golden", "record", str(golden), "--device", device, *SELECT]) == 0
    (kind,) = [p for p in golden.iterdir() if p.is_dir()]
    manifest = json.loads((kind / "golden.json").read_text())
    assert set(manifest["cases"]) == {"prefill-tail[small]"} and manifest["environment"]["torch"] == torch.__version__
    assert main(["golden", "check", str(golden), "--device", device]) == 0
    assert "3 steps identical" in capsys.readouterr().out
    assert main(["golden", "check", str(golden), "--device", device, "--kernel", f"mutant:{PLANT}"]) == 1
    out = capsys.readouterr().out
    assert "MOVED prefill-tail[small] step 2 (decode) indices: 4/55 differ, first row=4 col=4: golden 4 vs now -1" in out
    assert main(["golden", "record", str(golden), "--device", device, *SELECT]) == 2     # no silent overwrite


@pytest.mark.integration
def test_bisect_finds_the_planted_commit_and_leaves_the_checkout(planted_clone, monkeypatch, capfd, device):
    monkeypatch.setenv("KPOOL_GIT_REPO", str(planted_clone))
    before = state(planted_clone)
    assert main(["bisect", "HEAD~3", "HEAD", "--case", "prefill-tail", "--device", device]) == 0
    out = capfd.readouterr().out
    planted = git(planted_clone, "rev-parse", "HEAD~1").strip()
    assert f"first revision where prefill-tail's outputs change: {planted}" in out
    assert f"planted kernel change: {PLANT}" in out and "MOVED prefill-tail[small] step 0 (prefill) indices" in out
    assert state(planted_clone) == before
    assert not os.path.exists(planted_clone / ".git" / "BISECT_START")
    assert main(["bisect", "HEAD~3", "HEAD~2", "--case", "prefill-tail", "--device", device]) == 1
    assert "nothing to bisect" in capfd.readouterr().out
    assert state(planted_clone) == before


@pytest.mark.integration
def test_ab_against_the_vendor_stand_in_is_identical(capsys, device):
    """Our kernels behind the vendor's signatures (tests/vendor_standin/new): the same bits, both
    sides in the stand-in's declared score mode."""
    if device not in ("cpu", "npu"):
        pytest.skip("the new stand-in calls triton-ascend's extract_slice: interpreter (--device cpu) or NPU only")
    assert main(["ab", "--baseline", "kpool", "--candidate", "vllm-ascend:tests/vendor_standin/new",
                 "--device", device, *SELECT]) == 0
    out = capsys.readouterr().out
    assert "3 steps: 3 identical, 0 differ" in out and "candidate score_mode=merged ties=any" in out


def test_an_indices_diff_names_every_differing_row():
    from parity.running.step_outputs import diff_tensors
    a = torch.zeros(6, 1, 3, dtype=torch.int32)
    b = a.clone()
    b[1, 0, 2] = 7
    b[4, 0, 0] = -1
    d = diff_tensors("indices", a, b)
    assert d.rows == [1, 4] and d.text().endswith("; 2 rows differ: [1, 4]")
    assert diff_tensors("tail_ring", a.float(), b.float()).rows is None
