"""``--kernel vllm-ascend:PATH`` (issues 11, 18): the adapter on the stand-in vendor checkouts
(``tests/vendor_standin/new``: 12-argument tail compression, indexer with
``output_buffer``/``pack_tail`` and an ``extract_slice`` shared-query kernel; ``old``: 11-argument
tail compression, fixed-layout indexer using ``get_element``; ``state``: the state-cache
compression and an indexer with ``compact_indices``), the stand-ins' imports against the one manifest, the emulated triton-ascend
extensions, the run semantics declared per revision, planted faults in copies of the stand-ins,
and the CLI end to end (integration tier).

The stand-ins wrap our kernels behind vLLM-Ascend's signatures (no vLLM-Ascend code), so in
merged mode they must agree with the reference bit for bit.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton
import triton.language as tl

from parity.implementations import resolve
from parity.implementations import vllm_ascend as va
from parity.implementations.semantics import resolve_semantics, with_score_mode
from parity.implementations.vendor_ascend_ext import extract_slice, get_element
from parity.implementations.vendor_manifest import STANDINS
from parity.running.runner import run_case

ROOT = Path(__file__).resolve().parents[1]
STANDIN = {w: f"tests/vendor_standin/{w}" for w in ("new", "old", "state")}
INDEXER = "vllm_ascend/ops/triton/glm5_next_lightning_indexer.py"
COMPRESS = "vllm_ascend/ops/triton/glm5_next_kpool_tail_compress.py"
SHAPES = {"new": ("tail-slots", "pack_tail", True, ("extract_slice",)),
          "old": ("tail-ring", None, False, ("get_element",)),
          "state": ("state", "compact_indices", False, ())}
"""Per stand-in: compression kind, the indexer's layout switch, takes output_buffer, extensions."""


DEVICE = "cpu"


def _needs_interpreter(which: str) -> None:
    """The new and old stand-ins call triton-ascend's extract_slice / get_element, which only the
    interpreter emulates off the NPU (a compiled session refuses them at load)."""
    if DEVICE not in ("cpu", "npu") and which in ("new", "old"):
        pytest.skip(f"stand-in {which} uses a triton-ascend extension: interpreter (--device cpu) or NPU only")


@pytest.fixture(autouse=True)
def _session_device(device):
    """In-process runs use the session's backend (the stand-ins' kernels compile on a device)."""
    global DEVICE
    DEVICE = device


def _seed(name: str):
    from cases.scenarios import seed_cases
    return next(c for c in seed_cases(["small"]) if c.name == name)


def _copy_standin(tmp_path, which: str, file: str, old: str, new: str) -> str:
    """A copy of a stand-in checkout with one line of ``file`` changed."""
    dst = tmp_path / which
    shutil.copytree(ROOT / STANDIN[which], dst, symlinks=False)
    path = dst / file
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {file}"
    path.write_text(text.replace(old, new))
    return str(dst)


def _run(spec: str, case, ties=None):
    impl = resolve(spec)
    sem = resolve_semantics(impl, ties=ties)
    return run_case(sem.case(case), device=DEVICE, kernel_forward=sem.forward(impl.forward), tie_policy=sem.tie_policy)


def _imported(path: Path) -> dict:
    """``{module: {names}}`` of the ``from M import ...`` statements of a file."""
    found: dict = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.setdefault(node.module, set()).update(a.name for a in node.names)
    return found


def test_the_standins_import_exactly_the_manifests_names():
    """Every name a stand-in operator file imports from vLLM or vLLM-Ascend is one the public files
    import (vendor_manifest.STANDINS), and together the stand-ins import every one of them."""
    union: dict = {}
    for which in STANDIN:
        for path in sorted((ROOT / STANDIN[which] / "vllm_ascend").rglob("*.py")):
            for module, names in _imported(path).items():
                if module.split(".")[0] in ("vllm", "vllm_ascend"):
                    assert module in STANDINS and names <= set(STANDINS[module]), (path, module, names)
                    union.setdefault(module, set()).update(names)
    assert union == {m: set(n) for m, n in STANDINS.items()}


@pytest.mark.parametrize("which", ["new", "old", "state"])
def test_adapter_recognises_the_revision_shape_and_declares_its_semantics(which):
    impl = resolve(f"vllm-ascend:{STANDIN[which]}")
    rev = va.describe(va.load_operators(STANDIN[which]))
    assert (rev.compress, rev.pack_flag, rev.output_buffer, rev.extensions) == SHAPES[which]
    assert (impl.score_mode, impl.tie_policy, impl.validates, impl.package, impl.interp_rne) == \
        ("merged", "any", False, None, True)
    # the new stand-in refuses token rows without a request, as 5a705b99 does (its source says so)
    assert impl.supports == ({"fixed-tail", "output-buffer"} if which == "new" else {"fixed-tail", "requestless-rows"})
    assert SHAPES[which][0] in impl.description


def test_a_revision_with_an_extension_is_refused_once_on_a_compiled_gpu():
    """Stock Triton cannot compile extract_slice: on cuda the run stops once, as a usage error that
    names the way out, instead of a crash on every decode step; cpu (the emulation) and npu run."""
    from parity.cli import build_parser
    from parity.implementations import device_refusal
    from parity.sessions.commands import run_options
    new, state = resolve(f"vllm-ascend:{STANDIN['new']}"), resolve(f"vllm-ascend:{STANDIN['state']}")
    assert new.devices == {"cpu", "npu"} and state.devices is None
    assert device_refusal(new, "cpu") is None and device_refusal(new, "npu") is None
    why = device_refusal(new, "cuda")
    assert "cannot run on cuda" in why and "extract_slice" in why and "--device cpu" in why
    assert device_refusal(state, "cuda") is None
    args = build_parser().parse_args(["run", "--kernel", f"vllm-ascend:{STANDIN['new']}"])
    assert isinstance(run_options(args, "cuda", "prog"), str) and "cannot run on cuda" in run_options(args, "cuda", "prog")
    assert not isinstance(run_options(args, "cpu", "prog"), str)


def test_stubs_exist_only_while_loading():
    with va.vendor_stubs() as installed:
        import vllm.triton_utils as tu
        from vllm.utils.math_utils import next_power_of_2
        from vllm_ascend.ops.triton.triton_utils import extract_slice, get_vectorcore_num
        import triton.language as tl
        assert tu.tl is tl and get_vectorcore_num() == va.DEFAULT_VECTOR_CORES
        assert [next_power_of_2(n) for n in (0, 1, 3, 4, 5)] == [1, 1, 4, 4, 8]
        assert extract_slice.__module__ == "parity.implementations.vendor_ascend_ext"
        assert {"vllm.triton_utils", "vllm.utils.math_utils", "vllm_ascend.ops.triton.triton_utils"} <= set(installed)
    assert not any(name in sys.modules for name in installed)


@triton.jit
def _extension_kernel(x_ptr, out_ptr, scalar_ptr, off):
    r, c = tl.arange(0, 8), tl.arange(0, 4)
    x = tl.load(x_ptr + r[:, None] * 4 + c[None, :])
    part = extract_slice(x, (off, 1), (2, 2), (2, 1))                   # rows off, off+2; columns 1, 2
    tl.store(out_ptr + tl.arange(0, 2)[:, None] * 2 + tl.arange(0, 2)[None, :], part)
    tl.store(scalar_ptr, get_element(x, (off + 1, 3)))


def test_extract_slice_and_get_element_follow_triton_ascends_semantics():
    """Offsets, sizes and strides per dimension (a stride-2 row slice, a column window), a scalar
    by multi-index, and a slice past the tensor refused, under the interpreter."""
    if DEVICE != "cpu":
        pytest.skip("the extensions are emulated under the CPU interpreter only")
    import numpy as np
    import torch
    from kpool.platform import install_interpreter_compat
    install_interpreter_compat()
    kernel = _extension_kernel
    x = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    out, scalar = torch.zeros(2, 2), torch.zeros(1)
    kernel[(1,)](x, out, scalar, 3)
    assert torch.equal(out, x[[3, 5]][:, 1:3]) and scalar.item() == x[4, 3].item()
    with pytest.raises(Exception, match="extract_slice"):
        kernel[(1,)](x, out, scalar, 6)                                 # rows 6 and 8: past the tensor
    assert np.array_equal(va.packed_from_fixed(torch.tensor([[-1] * 8 + [0, 1, 2], [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14]],
                                                            dtype=torch.int32), torch.tensor([2, 14]), 8, 4).numpy(),
                          [[0, 1, 2] + [-1] * 8, [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14]])


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
    impl = resolve(f"vllm-ascend:{STANDIN['old']}")
    sem = resolve_semantics(impl)
    assert (sem.score_mode, sem.tie_policy, sem.validate_with, sem.interp_rne, sem.supports) == \
        ("merged", "any", "kpool", True, ("fixed-tail", "requestless-rows"))
    sem = resolve_semantics(impl, score_mode="relu", ties="canonical", validate_with="none", interp_rne=False,
                            supports=["all"])
    assert (sem.score_mode, sem.tie_policy, sem.validate_with, sem.interp_rne, sem.supports) == \
        ("relu", "canonical", None, False, None)
    ours = resolve_semantics(resolve("kpool"))
    assert (ours.score_mode, ours.tie_policy, ours.validate_with, ours.interp_rne) == (None, "canonical", None, False)
    # the operators claim no output bitwise (tl.exp): the rounding certificate applies to their cache
    assert sem.bitwise_outputs == () and resolve_semantics(impl).bitwise_outputs == ()
    assert ours.bitwise_outputs == resolve("kpool").bitwise_outputs != ()
    with pytest.raises(ValueError):
        resolve_semantics(impl, ties="lower-first")


@pytest.mark.parametrize("which, case", [("new", "decode-tail"), ("old", "decode-tail"), ("state", "prefill-tail")])
def test_standin_is_bit_exact_in_merged_mode(which, case):
    """Every shape, with its declared semantics: the state cache converted to and from the ring
    (state), the fixed layout repacked (old, state), the shared-query extract_slice path (new)."""
    _needs_interpreter(which)
    res = _run(f"vllm-ascend:{STANDIN[which]}", _seed(case), "canonical")
    assert res.ok, res.failures.to_string()
    assert (res.findings["verdict"] == "exact").all()


@pytest.mark.parametrize("which, file, old, new, output", [
    ("new", COMPRESS, "ape = ape.contiguous()", "ape = ape.flip(0).contiguous()", "compressed_cache"),
    # the shared-query kernel's pair slice with row stride 0: both rows of a pair are the first
    ("new", INDEXER, "(PAIR_ROWS, BLOCK), (1, 1))", "(PAIR_ROWS, BLOCK), (0, 1))", "indices"),
    ("state", "vllm_ascend/ops/triton/glm5_next_kpool_state_compress.py", "ape.contiguous()",
     "ape.flip(0).contiguous()", "compressed_cache"),
])
def test_planted_fault_in_a_standin_copy_is_caught(tmp_path, which, file, old, new, output):
    if output == "indices":
        _needs_interpreter(which)
    path = _copy_standin(tmp_path, which, file, old, new)
    res = _run(f"vllm-ascend:{path}", _seed("decode-tail"))
    assert not res.ok
    assert output in set(res.failures["output"].astype(str))


def test_exact_tie_reordering_passes_only_under_ties_any(tmp_path):
    _needs_interpreter("new")
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


@pytest.mark.parametrize("which", ["new", "old"])
def test_a_revision_that_refuses_requestless_rows_is_unsupported_there_not_a_crash(which):
    """The empty-steps case's ``R=0,T=2`` step (FULL-mode padding rows, no request): a revision
    whose indexer raises on an empty ``cum_query_lens`` (5a705b99; the new stand-in) declares no
    ``requestless-rows``, so that step is ``unsupported`` and every other step is still compared;
    one that accepts it (the old stand-in) is compared there too, and its padding rows leak as
    the fixed-layout revisions' do (docs/vendor-revisions.md §4.2)."""
    _needs_interpreter(which)
    from cases.coverage_cases import empty_steps_case
    case = empty_steps_case()
    res = _run(f"vllm-ascend:{STANDIN[which]}", case)
    assert res.steps_run == len(case.steps)
    other = res.findings[~res.findings["verdict"].isin(["exact", "tie-equivalent"])]
    found = sorted(set(zip(other["step_name"], other["verdict"])))
    if which == "new":
        assert found == [("R=0,T=2", "unsupported")] and res.ok, other
    else:
        assert found == [("R=0,T=2", "padding-leak")], other


def test_a_direct_call_check_needing_an_absent_mode_is_unsupported_not_a_crash():
    """C19's in-place replay hands the forward an output buffer; a fixed-layout revision declares
    no ``output-buffer``: that check is ``unsupported`` (not asked), the case's other checks pass."""
    _needs_interpreter("old")
    from cases.public import PUBLIC_CASES
    from parity.findings.vocabulary import UNSUPPORTED
    from parity.running.public.runner import run_public
    impl = resolve(f"vllm-ascend:{STANDIN['old']}")
    sem = resolve_semantics(impl)
    _, checks = run_public(PUBLIC_CASES["C19"], DEVICE, kernel_forward=sem.forward(impl.forward), semantics=sem,
                           package=None)
    direct = [c for c in checks if c.name == "expectations evaluated"]
    assert len(direct) == 1 and direct[0].verdict == UNSUPPORTED, checks
    assert "output-buffer" in direct[0].detail and all(c.ok for c in checks if c is not direct[0])


def test_direct_call_checks_call_the_implementation_under_test():
    """C05's ``validate=False`` replay (parity.running.public.kernel_checks) launches the forward it is
    given, every step, not ``kpool`` behind its back."""
    from types import SimpleNamespace

    from cases.public import PUBLIC_CASES
    from parity.running.public.kernel_checks import KERNEL_CHECKS
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
    args = _make_parity_args(f"KERNEL=vllm-ascend:{STANDIN['old']}", "PARITY_EXTRA=--no-interp-rne --ties canonical")
    assert args.kernel == f"vllm-ascend:{STANDIN['old']}" and args.interp_rne is False and args.ties == "canonical"
    assert _make_parity_args(f"KERNEL=vllm-ascend:{STANDIN['old']}").interp_rne is None   # declared: on


@pytest.mark.integration
@pytest.mark.parametrize("which", ["new", "old", "state"])
def test_cli_runs_a_standin_checkout_end_to_end(which, tmp_path):
    """The done-when command with no semantics flag (the revision's declared ones) on seed cases
    (decode, output buffers, no-tail, non-finite, bad arguments; for ``new`` also the shared-query
    path that calls ``extract_slice``: prefill-topk's one-request MTP step, and the strided
    layouts) plus, for ``new``, the public cases whose checks call the implementation directly
    (C05: bad input validated by the caller; C27: determinism). The whole suites run on the real
    revisions (docs/vendor-revisions.md), not in CI."""
    base = ("run", "--kernel", f"vllm-ascend:{STANDIN[which]}", "--size", "small", "--report", str(tmp_path / "r"))
    cases = ("--case", "decode-tail", "full-padding", "prefill-topk-no-tail", "non-finite", "bad-arguments",
             *(("prefill-topk", "strided-layouts") if which == "new" else ()))
    seed = _cli(*base, "--suite", "seed", *cases)
    assert seed.returncode == 0, seed.stdout[-3000:] + seed.stderr[-2000:]
    assert "interp_rne=on" in seed.stdout and "ties=any" in seed.stdout and "score_mode=merged" in seed.stdout
    unsupported = 4 if which == "new" else 7          # no-tail steps; output-buffer replays too without one
    assert f"{unsupported} unsupported by IMPL" in seed.stdout, seed.stdout[-2000:]
    if which != "new":
        return
    public = _cli(*base, "--suite", "public", "--case", "C05", "C27")
    assert public.returncode == 0, public.stdout[-3000:] + public.stderr[-2000:]
    text = (tmp_path / "r" / "public" / "results.csv").read_text()
    assert "not validated by the operator" in text and "logits bitwise identical (skipped)" in text
    # the two skipped logits checks (eager, FULL mode) are not asked, so not counted exact
    assert "2 unsupported by IMPL" in public.stdout, public.stdout[-2000:]


@pytest.mark.integration
def test_cli_fails_on_a_planted_fault_in_a_standin(tmp_path):
    path = _copy_standin(tmp_path, "new", COMPRESS, "ape = ape.contiguous()", "ape = ape.flip(0).contiguous()")
    out = _cli("run", "--kernel", f"vllm-ascend:{path}", "--suite", "seed", "--size", "small", "--case",
               "decode-tail", "--report", str(tmp_path / "r"))
    assert out.returncode == 1, out.stdout[-3000:]


def test_the_adapter_hands_the_operators_contiguous_1d_metadata():
    """§4.6 gives the operators' positions / lengths as plain [T] / [R] tensors (only the block
    table has "any strides"), and the public revisions read them with unit stride: the adapter,
    as a vLLM caller does, hands them contiguous even when the harness draws them strided."""
    import dataclasses
    import functools

    from parity.implementations.semantics import resolve_semantics
    from parity.implementations.vllm_ascend import load_operators, make_forward
    ops = load_operators(STANDIN["state"])
    seen = []

    @functools.wraps(ops.indexer)
    def indexer(*args, **kwargs):          # (q, cache, weights, cum_query_lens, seq_lens, block_table, positions)
        seen.append([args[i].is_contiguous() for i in (3, 4, 6)])
        return ops.indexer(*args, **kwargs)
    impl = resolve(f"vllm-ascend:{STANDIN['state']}")
    impl = dataclasses.replace(impl, forward=make_forward(dataclasses.replace(ops, indexer=indexer)))
    sem = resolve_semantics(impl)
    res = run_case(sem.case(_seed("strided-layouts")), device=DEVICE, kernel_forward=sem.forward(impl.forward),
                   tie_policy=sem.tie_policy)
    assert res.ok, res.failures.to_string()
    assert seen and all(all(flags) for flags in seen)
