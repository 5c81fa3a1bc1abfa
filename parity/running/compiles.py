"""Kernel compilations of a run (issue 20 point 5): how many Triton kernel variants this process
compiled (or loaded from Triton's disk cache) and the seconds that took, per kernel.

:func:`install` registers Triton's ``knobs.runtime.jit_cache_hook`` (called before a variant is
built) and ``jit_post_compile_hook`` (after), chaining any hooks already set; both return
``None``, so they never change what Triton does. A variant is one entry of a kernel's in-memory
cache (one per specialization: constexprs, dtypes, specialized ints, alignment, launch options),
so the count is exactly the number of compilations a cold Triton cache would pay. The
interpreter compiles nothing (count 0). Triton builds without ``triton.knobs`` (triton-ascend
3.2) are not counted (:func:`install` returns False). Worker processes count their own and hand
each case's share back with its result (``parity.running.parallel``).
"""
from __future__ import annotations

import time
from typing import Dict, Optional

_STATE: Dict[str, object] = {"installed": False, "counts": {}, "seconds": {}, "started": {}}


def install() -> bool:
    """Register the counting hooks in this process (idempotent). Returns whether counting works."""
    if _STATE["installed"]:
        return True
    try:
        from triton import knobs
        runtime = knobs.runtime
        before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    except (ImportError, AttributeError):
        return False

    def name_of(kwargs) -> str:
        fn = kwargs.get("fn")
        return str(getattr(fn, "name", None) or kwargs.get("repr", "?").split("[")[0])

    def on_start(*args, **kwargs):
        _STATE["started"][repr(kwargs.get("key"))] = time.perf_counter()
        return before(*args, **kwargs) if before else None

    def on_done(*args, **kwargs):
        name = name_of(kwargs)
        start = _STATE["started"].pop(repr(kwargs.get("key")), None)
        _STATE["counts"][name] = _STATE["counts"].get(name, 0) + 1
        if start is not None:
            _STATE["seconds"][name] = _STATE["seconds"].get(name, 0.0) + time.perf_counter() - start
        return after(*args, **kwargs) if after else None

    runtime.jit_cache_hook, runtime.jit_post_compile_hook = on_start, on_done
    _STATE["installed"] = True
    return True


def snapshot() -> Optional[dict]:
    """``{"variants": n, "seconds": s, "by_kernel": {name: n}}`` so far in this process, or None
    when not installed."""
    if not _STATE["installed"]:
        return None
    counts, seconds = dict(_STATE["counts"]), _STATE["seconds"]
    return {"variants": sum(counts.values()), "seconds": round(sum(seconds.values()), 3), "by_kernel": counts}


def since(before: Optional[dict]) -> Optional[dict]:
    """What this process compiled after ``before`` (a :func:`snapshot`; None: since install)."""
    now = snapshot()
    if now is None:
        return None
    before = before or {"variants": 0, "seconds": 0.0, "by_kernel": {}}
    by = {k: n - before["by_kernel"].get(k, 0) for k, n in now["by_kernel"].items()}
    return {"variants": now["variants"] - before["variants"], "seconds": round(now["seconds"] - before["seconds"], 3),
            "by_kernel": {k: n for k, n in by.items() if n}}


def total(parts) -> Optional[dict]:
    """The sum of several :func:`since` results (None entries skipped; None if all are None)."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    by: Dict[str, int] = {}
    for p in parts:
        for k, n in p["by_kernel"].items():
            by[k] = by.get(k, 0) + n
    return {"variants": sum(p["variants"] for p in parts), "seconds": round(sum(p["seconds"] for p in parts), 3),
            "by_kernel": by}


def line(counts: Optional[dict]) -> str:
    """``"compilations: 23 kernel variants, 41.2 s (_score_prefill_kernel 6, ...)"``."""
    if counts is None:
        return "compilations: not counted (this Triton has no knobs.runtime compile hooks)"
    kernels = ", ".join(f"{k} {n}" for k, n in sorted(counts["by_kernel"].items(), key=lambda kv: -kv[1]))
    return (f"compilations: {counts['variants']} kernel variants, {counts['seconds']:.1f} s compiling or loading"
            + (f" ({kernels})" if kernels else ""))
