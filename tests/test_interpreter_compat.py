"""The NumPy >= 2.3 interpreter compat (``kpool.platform.install_interpreter_compat``, applied by
``resolve_device("cpu")``, never by importing a kernel module) in both interpreter shapes:
triton-ascend 3.2's one-argument ``_patch_lang_tensor(tensor)`` and triton 3.6's scoped
``_patch_lang_tensor(tensor, scope)`` (platform-numerics.md §5). Fakes stand in for the
interpreter, so both shapes are checked whichever Triton is installed; the real one is checked
by running a kernel with a runtime loop bound.
"""
import os

os.environ.setdefault("KPOOL_DEVICE", "cpu")
from kpool.platform import resolve_device, torch_device  # noqa: E402

DEVICE = resolve_device()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from kpool import platform  # noqa: E402

pytestmark = pytest.mark.interpreter_ok


class _Handle:
    def __init__(self, value):
        self.data = np.array([value], dtype=np.int32)   # the interpreter's 1-element 1-D scalar


def _fake_tensor_class():
    class FakeTensor:
        def __init__(self, value):
            self.handle = _Handle(value)
    return FakeTensor


def _numpy_2_3_index(self):
    """What the interpreters install: int() of a 1-D array (TypeError under NumPy >= 2.3)."""
    data = self.handle.data
    if data.ndim > 0:
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
    return int(data)


def test_one_argument_form_triton_ascend_3_2():
    calls = []

    def original(tensor):                  # triton-ascend 3.2: direct assignment, never restored
        calls.append(tensor)
        tensor.__index__ = _numpy_2_3_index
        tensor.__bool__ = lambda self: True

    wrapped = platform.compat_patch_lang_tensor(original)
    assert wrapped is not original and wrapped._kpool_compat
    cls = _fake_tensor_class()
    wrapped(cls)
    assert calls == [cls]                  # the original still runs (its other attributes stay)
    assert bool(cls(0)) is True
    assert list(range(cls(3))) == [0, 1, 2]
    assert cls(-7).__index__() == -7


def test_two_argument_form_triton_3_6_scope_restores_ours_first():
    class Scope:                           # triton 3.6 _LangPatchScope: set_attr, LIFO restore
        def __init__(self):
            self.saved = []

        def set_attr(self, obj, name, value):
            self.saved.append((obj, name, getattr(obj, name, None)))
            setattr(obj, name, value)

        def restore(self):
            while self.saved:
                obj, name, old = self.saved.pop()
                setattr(obj, name, old)

    def original(tensor, scope):
        scope.set_attr(tensor, "__index__", _numpy_2_3_index)

    wrapped = platform.compat_patch_lang_tensor(original)
    cls, scope = _fake_tensor_class(), Scope()
    wrapped(cls, scope)
    assert list(range(cls(2))) == [0, 1]
    assert [name for _, name, _ in scope.saved] == ["__index__", "__index__"]
    scope.restore()                        # after the launch: the class is as before
    assert cls.__index__ is None


def test_unknown_shape_is_left_alone():
    def original(tensor, scope, extra):
        pass
    assert platform.compat_patch_lang_tensor(original) is original


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter only")
def test_installed_interpreter_is_wrapped_and_runtime_loops_run():
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    if not _int_of_1d_array_ok():          # NumPy >= 1.25: the compat must be in place
        assert getattr(interpreter._patch_lang_tensor, "_kpool_compat", False)

    @triton.jit(do_not_specialize=["n"])
    def count(out_ptr, n):
        acc = tl.zeros([1], dtype=tl.int32)
        for i in range(0, n):              # runtime bound: int(1-element array) in the interpreter
            acc += i
        tl.store(out_ptr + tl.arange(0, 1), acc)

    out = torch.zeros(1, dtype=torch.int32, device=torch_device(DEVICE))
    count[(1,)](out, 5)
    assert out.item() == 0 + 1 + 2 + 3 + 4


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter only")
def test_install_is_idempotent_and_not_an_import_side_effect(monkeypatch):
    from triton.runtime import interpreter
    if _int_of_1d_array_ok():
        pytest.skip("NumPy < 1.25 needs no patch")
    patched = interpreter._patch_lang_tensor
    assert platform.install_interpreter_compat() is True
    assert interpreter._patch_lang_tensor is patched            # a second call wraps nothing again
    # Importing the kernel modules installs nothing: with the original restored, a fresh import
    # of the portable helpers leaves it alone, and only the explicit call patches it again.
    import importlib
    import sys
    original = patched.__closure__[0].cell_contents if patched.__closure__ else None
    assert original is not None and not getattr(original, "_kpool_compat", False)
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", original)
    monkeypatch.delitem(sys.modules, "kpool.ops._portable", raising=False)
    importlib.import_module("kpool.ops._portable")
    assert interpreter._patch_lang_tensor is original
    assert platform.install_interpreter_compat() is True
    assert getattr(interpreter._patch_lang_tensor, "_kpool_compat", False)


def _int_of_1d_array_ok() -> bool:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            int(np.array([1]))
            return True
        except (TypeError, DeprecationWarning):
            return False
