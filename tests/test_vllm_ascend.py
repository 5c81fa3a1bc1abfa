"""``--kernel vllm-ascend:PATH`` (issue 11): the adapter on the stand-in vendor checkouts
(``tests/vendor_standin/new``: current tail-compression signature; ``old``: the older one without
``tail_slot_mapping``), its import stubs, the run semantics it declares, a planted fault and an
exact-tie reordering in a copy of the stand-in, and the CLI end to end (integration tier).

The stand-ins wrap our kernels behind vLLM-Ascend's signatures (no vLLM-Ascend code), so in
merged mode they must agree with the reference bit for bit.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parity.implementations import resolve
from parity.implementations import vllm_ascend as va
from parity.implementations.semantics import RunSemantics, resolve_semantics, with_score_mode
from parity.runner import run_case

ROOT = Path(__file__).resolve().parents[1]
STANDIN = {"new": "tests/vendor_standin/new", "old": "tests/vendor_standin/old"}
INDEXER = "vllm_ascend/ops/triton/glm5_next_lightning_indexer.py"
COMPRESS = "vllm_ascend/ops/triton/glm5_next_kpool_tail_compress.py"


DEVICE = "cpu"


@pytest.fixture(autouse=True)
def _session_device(device):
    """In-process runs use the session's backend (the stand-ins' kernels compile on a device)."""
    global DEVICE
    DEVICE = device

def _seed(name: str):
    from cases.scenarios import seed_cases
    return next(c for c in seed_cases(["small"]) if c.name == name)


def _copy_standin(tmp_path, which: str, file: str, old: str, new: str) -> str:
    """A copy of a stand-in checkout (links resolved) with one line of ``file`` changed."""
    dst = tmp_path / which
    shutil.copytree(ROOT / STANDIN[which], dst, symlinks=False)
    path = dst / file
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {file}"
    path.write_text(text.replace(old, new))
    return str(dst)


def _run(spec: str, case, ties: str):
    impl = resolve(spec)
    sem = resolve_semantics(impl, ties=ties)
    return run_case(sem.case(case), device=DEVICE, kernel_forward=sem.forward(impl.forward), tie_policy=sem.tie_policy)


@pytest.mark.parametrize("which, slots", [("new", True), ("old", False)])
def test_adapter_detects_the_signature_and_declares_the_vendor_semantics(which, slots):
    impl = resolve(f"vllm-ascend:{STANDIN[which]}")
    compress, _ = va.load_operators(STANDIN[which])
    assert va.has_tail_slot_mapping(compress) is slots
    assert (impl.score_mode, impl.tie_policy, impl.validates, impl.package) == ("merged", "any", False, None)
    assert ("tail_slot_mapping" if slots else "older") in impl.description


def test_stubs_exist_only_while_loading():
    with va.vendor_stubs() as installed:
        import vllm.triton_utils as tu
        from vllm_ascend.ops.triton.triton_utils import get_vectorcore_num
        import triton.language as tl
        assert tu.tl is tl and get_vectorcore_num() == va.DEFAULT_VECTOR_CORES
        assert "vllm.triton_utils" in installed
    assert not any(name in sys.modules for name in installed)


def test_a_checkout_without_the_operators_is_a_named_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        resolve(f"vllm-ascend:{tmp_path}")


def test_relu_is_refused_before_any_launch():
    from kpool.errors import KPoolUnsupportedError
    forward = resolve(f"vllm-ascend:{STANDIN['new']}").forward
    res = run_case(with_score_mode(_seed("prefill-topk"), "relu"), device=DEVICE, kernel_forward=forward)
    crashes = res.findings[res.findings["verdict"] == "crash"]
    assert len(crashes) and KPoolUnsupportedError.__name__ in " ".join(crashes["detail"].astype(str))


def test_declared_defaults_apply_and_flags_override():
    impl = resolve(f"vllm-ascend:{STANDIN['new']}")
    # the operators claim no output bitwise (tl.exp): the rounding certificate applies to their cache
    assert resolve_semantics(impl) == RunSemantics("merged", "any", "kpool", False, bitwise_outputs=())
    assert resolve_semantics(impl, score_mode="relu", ties="canonical", validate_with="none", interp_rne=True) \
        == RunSemantics("relu", "canonical", None, True, bitwise_outputs=())
    assert resolve_semantics(resolve("kpool")) == RunSemantics(None, "canonical", None, False)
    with pytest.raises(ValueError):
        resolve_semantics(impl, ties="lower-first")


@pytest.mark.parametrize("which", ["new", "old"])
def test_standin_is_bit_exact_in_merged_mode(which):
    res = _run(f"vllm-ascend:{STANDIN[which]}", _seed("decode-tail"), "canonical")
    assert res.ok, res.failures.to_string()
    assert (res.findings["verdict"] == "exact").all()


def test_planted_fault_in_a_standin_copy_is_caught(tmp_path):
    path = _copy_standin(tmp_path, "new", COMPRESS, "ape = ape.contiguous()", "ape = ape.flip(0).contiguous()")
    res = _run(f"vllm-ascend:{path}", _seed("decode-tail"), "any")
    assert not res.ok
    assert "compressed_cache" in set(res.failures["output"].astype(str))


def test_exact_tie_reordering_passes_only_under_ties_any(tmp_path):
    path = _copy_standin(tmp_path, "new", INDEXER, 'TIES = "lower-id-first"', 'TIES = "higher-id-first"')
    case = _seed("pool-boundary-decode")
    canonical = _run(f"vllm-ascend:{path}", case, "canonical")
    assert not canonical.ok and "wrong-index" in set(canonical.failures["verdict"])
    anyorder = _run(f"vllm-ascend:{path}", case, "any")
    assert anyorder.ok, anyorder.failures.to_string()
    assert (anyorder.findings["verdict"] == "tie-equivalent").sum() > 0


@pytest.mark.parametrize("validate_with", ["kpool", "none"])
def test_bad_input_is_rejected_by_the_callers_validation_and_said_so(validate_with):
    """C05 (b): a bad ring block. The operators do not validate: with ``--validate-with kpool``
    the harness's validation rejects it (and says so); with ``none`` nothing rejects it."""
    from cases.public import PUBLIC_CASES
    from parity.implementations.semantics import NOT_VALIDATED_NOTE
    case = next(c for c in PUBLIC_CASES["C05"].build() if c.name == "tail-seed-b-bad-block")
    impl = resolve(f"vllm-ascend:{STANDIN['new']}")
    sem = resolve_semantics(impl, validate_with=validate_with)
    res = run_case(sem.case(case), device=DEVICE, kernel_forward=sem.forward(impl.forward), tie_policy=sem.tie_policy)
    errors = res.findings[res.findings["output"] == "error"]
    assert len(errors) == 1
    if validate_with == "kpool":
        assert res.ok and NOT_VALIDATED_NOTE in errors["detail"].iloc[0]
    else:
        assert not res.ok and errors["verdict"].iloc[0] == "not-rejected"


def test_direct_call_checks_call_the_implementation_under_test():
    """C05's ``validate=False`` replay (parity.public.kernel_checks) launches the forward it is
    given, every step, not ``kpool`` behind its back."""
    from types import SimpleNamespace

    from cases.public import PUBLIC_CASES
    from parity.public.kernel_checks import KERNEL_CHECKS
    case = with_score_mode(next(c for c in PUBLIC_CASES["C05"].build() if c.name == "tail-seed-b-bad-block"), "merged")
    inner = resolve(f"vllm-ascend:{STANDIN['new']}").forward
    calls = []

    def counting(**kwargs):
        calls.append(kwargs.get("validate", True))
        return inner(**kwargs)
    checks = KERNEL_CHECKS["C05"](DEVICE, {case.name: SimpleNamespace(case=case)}, forward=counting, package=None)
    assert calls == [True] + [False] * (len(case.steps) - 1)
    assert all(c.ok for c in checks)


def _cli(*args, timeout=900):
    env = dict(os.environ, PYTHONPATH=str(ROOT), KPOOL_DEVICE="cpu")
    return subprocess.run([sys.executable, "-m", "parity", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_list_implementations_names_every_kind():
    out = _cli("list", "implementations", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--kernel vllm-ascend:PATH" in out.stdout and "--kernel mutant:NAME" in out.stdout


def test_make_parity_kernel_knob_takes_a_checkout():
    from tests.test_cli_usage import _make_parity_args
    args = _make_parity_args(f"KERNEL=vllm-ascend:{STANDIN['old']}", "PARITY_EXTRA=--interp-rne --ties any")
    assert args.kernel == f"vllm-ascend:{STANDIN['old']}" and args.interp_rne and args.ties == "any"


@pytest.mark.integration
@pytest.mark.parametrize("which", ["new", "old"])
def test_cli_runs_a_standin_checkout_end_to_end(which, tmp_path):
    """The done-when command on the seed suite plus the public cases whose checks call the
    implementation directly (C05, C17: bad input validated by the caller; C27: determinism)."""
    base = ("run", "--kernel", f"vllm-ascend:{STANDIN[which]}", "--score-mode", "merged", "--ties", "any",
            "--interp-rne", "--size", "small", "--report", str(tmp_path / "r"))
    seed = _cli(*base, "--suite", "seed")
    assert seed.returncode == 0, seed.stdout[-3000:] + seed.stderr[-2000:]
    assert "interp_rne=on" in seed.stdout and "ties=any" in seed.stdout
    public = _cli(*base, "--suite", "public", "--case", "C05", "C27")
    assert public.returncode == 0, public.stdout[-3000:] + public.stderr[-2000:]
    text = (tmp_path / "r" / "public" / "results.csv").read_text()
    assert "not validated by the operator" in text and "logits bitwise identical (skipped)" in text


@pytest.mark.integration
def test_cli_fails_on_a_planted_fault_in_a_standin(tmp_path):
    path = _copy_standin(tmp_path, "new", COMPRESS, "ape = ape.contiguous()", "ape = ape.flip(0).contiguous()")
    out = _cli("run", "--kernel", f"vllm-ascend:{path}", "--suite", "seed", "--size", "small", "--case",
               "decode-tail", "--report", str(tmp_path / "r"))
    assert out.returncode == 1, out.stdout[-3000:]
