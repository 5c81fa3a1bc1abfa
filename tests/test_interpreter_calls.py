"""Helper calls under the Triton interpreter patch the language once per launch
(``kpool.interpreter_calls``, installed by ``resolve_device("cpu")``): same results, the launch
still restores the language, and a loop of helper calls costs no re-patching."""
import os

os.environ.setdefault("KPOOL_DEVICE", "cpu")
from kpool.platform import resolve_device, torch_device  # noqa: E402

DEVICE = resolve_device()

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kpool import interpreter_calls  # noqa: E402

from triton.runtime import interpreter  # noqa: E402

pytestmark = [pytest.mark.interpreter_ok, pytest.mark.skipif(DEVICE != "cpu", reason="interpreter only"),
              pytest.mark.skipif(not hasattr(interpreter, "_LangPatchScope"),
                                 reason="an interpreter without scoped patches (triton-ascend 3.2): left as it is")]


@triton.jit
def _count_true(cond):
    return tl.sum(tl.where(cond, 1, 0))


@triton.jit
def _count_above_kernel(x_ptr, out_ptr, n, PASSES: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=-1)
    for p in range(PASSES):          # one helper call per pass, as the top-k's counting passes do
        tl.store(out_ptr + p, _count_true(x > p))


def _run(x, passes=40):
    out = torch.full((passes,), -7, dtype=torch.int32, device=torch_device(DEVICE))
    _count_above_kernel[(1,)](x, out, x.numel(), PASSES=passes, BLOCK=64)
    return out


@pytest.fixture
def counted_patches(monkeypatch):
    """The interpreter's real ``_patch_lang`` counted (names of the functions it patched), with
    the call cache installed on top of the counter."""
    real = getattr(interpreter._patch_lang, "__wrapped__", interpreter._patch_lang)
    seen = []

    def counted(fn):
        seen.append(fn.__name__)
        return real(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counted)
    return seen


def test_a_loop_of_helper_calls_patches_the_language_once_per_launch(counted_patches):
    assert interpreter_calls.install() is True
    x = torch.arange(50, dtype=torch.int32, device=torch_device(DEVICE))
    for launch in range(3):
        del counted_patches[:]
        out = _run(x)
        assert out.tolist() == [sum(int(v) > p for v in x.tolist()) for p in range(40)]
        # 40 calls of _count_true, each calling tl.sum (a jit function of triton.language whose
        # globals see tl.core, not tl): the kernel's own patch is the only real one per launch,
        # plus, once per process, tl.core's for tl.sum, which no launch restores (the uncached
        # interpreter patches 81 times per launch)
        assert counted_patches in (["_count_above_kernel"], ["_count_above_kernel", "sum"]), counted_patches
        assert launch == 0 or counted_patches == ["_count_above_kernel"]


def test_the_launch_still_restores_the_language(counted_patches):
    assert interpreter_calls.install() is True
    builtin_where = tl.where
    assert tl.core.is_builtin(builtin_where)
    _run(torch.arange(10, dtype=torch.int32, device=torch_device(DEVICE)), passes=3)
    assert tl.where is builtin_where
    # and the next launch patches for real again (its helper calls still do not)
    del counted_patches[:]
    _run(torch.arange(10, dtype=torch.int32, device=torch_device(DEVICE)), passes=3)
    assert counted_patches == ["_count_above_kernel"]


def test_without_the_cache_every_helper_call_patches(counted_patches):
    """The uncached interpreter, for contrast: what the cache removes is really there."""
    _run(torch.arange(10, dtype=torch.int32, device=torch_device(DEVICE)), passes=5)
    assert counted_patches == ["_count_above_kernel"] + ["_count_true", "sum"] * 5
