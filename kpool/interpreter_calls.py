"""Device-function calls under the Triton interpreter without re-patching the language each time.

Why: Triton 3.6's interpreter patches ``triton.language`` for a launch (``_patch_lang(kernel)``,
undone by ``scope.restore()`` when the launch ends) and then again at *every* call of a
``@triton.jit`` helper inside it (``_patch_lang(helper)``, whose scope is dropped). Each patch walks
the language modules with ``inspect.getmembers`` (about 3 ms); a helper called in a loop, such as
the counting passes of :func:`kpool.ops.topk._select_kernel` (64 calls per row), then spends
most of a CPU run re-patching a language that is already patched: 0.5 of the 0.9 s per
1000-row prefill step of ``prefill-tail[glm5.3-flash]`` went there (cProfile, this repository's
CPU). Nothing a compiled kernel runs changes.

:func:`install` wraps the interpreter's ``_patch_lang``: a call whose language modules (``tl``,
``tl.core`` as the function's globals see them) still hold the attributes the last real patch
installed returns an empty scope instead of patching again. The first patch of a launch always
runs (the launch's restore put the builtins back, so the check fails), and the launch's own scope
restores exactly what it did before. A helper that sees a language module the kernel does not
(``tl.core`` alone) is patched for real the first time, as before.

Only the interpreter shape this was written against is wrapped (``_patch_lang(fn)`` returning a
``_LangPatchScope``: Triton >= 3.4); triton-ascend 3.2's interpreter is left as it is.
"""
from __future__ import annotations

import inspect


def install() -> bool:
    """Wrap ``triton.runtime.interpreter._patch_lang`` (module docstring); idempotent.

    Returns:
        True when the interpreter's ``_patch_lang`` is wrapped (now or by an earlier call), False
        when it has another shape (no ``_LangPatchScope``) or no interpreter module exists.
    """
    try:
        from triton.runtime import interpreter as _interp
    except ImportError:  # pragma: no cover - a Triton build without the interpreter module
        return False
    original = getattr(_interp, "_patch_lang", None)
    scope_type = getattr(_interp, "_LangPatchScope", None)
    if original is None or scope_type is None:
        return False
    if getattr(original, "_kpool_cached", False):
        return True
    import triton.language as tl

    patched = {}        # id(language module) -> its `where` as the last real patch left it

    def _patch_lang(fn):
        langs = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
        if langs and all(patched.get(id(lang)) is getattr(lang, "where", None) for lang in langs):
            return scope_type()     # still patched (this launch, or a helper's never-restored patch)
        scope = original(fn)
        for lang in langs:
            patched[id(lang)] = getattr(lang, "where", None)
        return scope

    _patch_lang._kpool_cached = True
    _patch_lang.__wrapped__ = original
    _interp._patch_lang = _patch_lang
    return True

