"""A run never edits the checkout (issue 9 point 2).

Failing runs (planted faults) write bundles and shrunk-failure candidates only under their output
root (``--report DIR``, default ``./parity-out``, gitignored); ``git status --porcelain`` is the
same before and after. The corpus changes only through ``python -m parity corpus add PATH``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git_status() -> str:
    proc = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    return proc.stdout


def _parity(*args, device):
    env = dict(os.environ, PYTHONPATH=ROOT, KPOOL_DEVICE=device)
    env.pop("KPOOL_CORPUS_DIR", None)
    env.pop("TRITON_INTERPRET", None)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "parity", "run", "--device", device, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.integration
def test_failing_runs_leave_the_checkout_untouched(device):
    """A failing generated run (planted fault: its warm-up, batches and engine sequences fail) and a
    failing seed case, both with the default output paths, run from the checkout's root."""
    before, start = _git_status(), time.time() - 1
    gen = _parity("--suite", "generated", "--profile", "ci", "--kernel", "mutant:visible-off-by-one", device=device)
    assert gen.returncode == 1, gen.stdout[-3000:] + gen.stderr[-3000:]
    assert "Traceback" not in gen.stderr, gen.stderr[-3000:]
    seed = _parity("--suite", "seed", "--size", "small", "--case", "prefill-topk", "--kernel", "mutant:chunk-offset",
                   device=device)
    assert seed.returncode == 1, seed.stdout[-3000:] + seed.stderr[-3000:]
    assert _git_status() == before
    out = os.path.join(ROOT, "parity-out")
    candidates = [f for f in os.listdir(os.path.join(out, "corpus-candidates"))
                  if os.path.getmtime(os.path.join(out, "corpus-candidates", f)) >= start]
    assert any(f.endswith(".json") for f in candidates), gen.stdout[-3000:]
    assert "python -m parity corpus add" in gen.stdout
    assert os.path.getmtime(os.path.join(out, "bundles", "prefill-topk-small", "case.json")) >= start
    assert "warm-up FAILED" in gen.stdout and "warm-P4-relu-warm-up" in gen.stdout


def test_corpus_add_promotes_a_candidate(tmp_path, capsys):
    from cases.corpus import load_case, save_case
    from cases.coverage_cases import residue_case
    from parity.cli import main
    path = save_case(residue_case(2), tmp_path / "candidates", expect="fail:chunk-offset", found_by="test")
    corpus = tmp_path / "corpus"
    assert main(["corpus", "add", str(path), "--dir", str(corpus)]) == 0
    case, doc = load_case(corpus / path.name)
    assert case.name == "coverage-residues-P2" and doc["expect"] == "fail:chunk-offset"
    assert (corpus / path.name).with_suffix(".pt").is_file()
    assert main(["corpus", "add", str(path), "--dir", str(corpus)]) == 2          # exists
    assert "exists" in capsys.readouterr().err
    assert main(["corpus", "add", str(path), "--dir", str(corpus), "--name", "renamed"]) == 0
    assert load_case(corpus / "renamed.json")[0].name == "renamed"
    assert main(["corpus", "add", str(tmp_path / "candidates"), "--dir", str(corpus), "--force"]) == 0
    assert main(["corpus", "add", str(tmp_path / "nothing.json"), "--dir", str(corpus)]) == 2
    (tmp_path / "bad.json").write_text("{}")
    (tmp_path / "bad.pt").write_bytes(b"")
    assert main(["corpus", "add", str(tmp_path / "bad.json"), "--dir", str(corpus)]) == 2
    assert "not a loadable corpus entry" in capsys.readouterr().err
