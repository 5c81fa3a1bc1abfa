"""Compile counting of a run (``parity.running.compiles``, issue 20 point 5): the Triton hooks count each
variant a kernel builds, per kernel, chain hooks already set and change nothing else. The hooks
are called the way Triton's JIT calls them (the interpreter compiles nothing)."""
import pytest

triton = pytest.importorskip("triton")
knobs = pytest.importorskip("triton.knobs")

from parity.running import compiles  # noqa: E402


class _Fn:
    def __init__(self, name):
        self.name = name


def _compile(name, key):
    """What ``JITFunction._do_compile`` does around one build: the cache hook, then the post hook."""
    assert knobs.runtime.jit_cache_hook(key=key, repr=f"{name}[]", fn=_Fn(name), compile={}, is_manual_warmup=False,
                                        already_compiled=False) is None
    knobs.runtime.jit_post_compile_hook(key=key, repr=f"{name}[]", fn=_Fn(name), compile={},
                                        is_manual_warmup=False, already_compiled=False)


def test_variants_are_counted_per_kernel_and_chain_earlier_hooks(monkeypatch):
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(kw["key"]))
    monkeypatch.setattr(compiles, "_STATE", {"installed": False, "counts": {}, "seconds": {}, "started": {}})
    assert compiles.install() and compiles.install()          # idempotent
    before = compiles.snapshot()
    _compile("_score_decode_kernel", ("a", 1))
    _compile("_score_decode_kernel", ("a", 2))
    _compile("_select_kernel", ("b", 1))
    got = compiles.since(before)
    assert got["variants"] == 3 and got["by_kernel"] == {"_score_decode_kernel": 2, "_select_kernel": 1}
    assert got["seconds"] >= 0 and seen == [("a", 1), ("a", 2), ("b", 1)]     # the earlier hook still runs
    assert compiles.total([got, None, {"variants": 1, "seconds": 1.0, "by_kernel": {"_select_kernel": 1}}]) == {
        "variants": 4, "seconds": round(got["seconds"] + 1.0, 3),
        "by_kernel": {"_score_decode_kernel": 2, "_select_kernel": 2}}
    assert compiles.line(got).startswith("compilations: 3 kernel variants")
    assert "not counted" in compiles.line(None)
