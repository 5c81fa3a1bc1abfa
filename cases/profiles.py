"""Hypothesis profiles of the generated parity runs, shared by pytest (``conftest.py``) and
``python -m parity run --suite generated``.

Four profiles, selected by ``HYPOTHESIS_PROFILE`` (default ``ci``) or ``--profile``:

========  =========================================  ========  ========  ============  =========
profile   meant for                                  batches   engines   net deadline  shrinking
========  =========================================  ========  ========  ============  =========
ci        CPU interpreter, CI, derandomized (fixed)  24        16        30 s          80 calls
dev       a developer's CPU run, random seed         50        30        30 s          400 calls
device    compiled kernels on a GPU/NPU              300       200       10 s          1000 calls
nightly   long compiled runs, larger shapes          2000      1000      20 s          3000 calls
========  =========================================  ========  ========  ============  =========

Empty steps (``T == 0`` or ``R == 0``) are drawn by ``dev``, ``device`` and ``nightly``
(:attr:`cases.strategies.Bounds.empty_steps`); ``ci`` keeps the example sequence its planted-fault
budgets were tuned on and covers them with a named test instead.

Deadlines. Every profile has a finite hypothesis ``deadline`` (a hang guard of
``deadline_s + jit_allowance_s``) *and* a tighter net deadline ``deadline_s`` that the generated
runner enforces on ``wall time - Triton compile time`` of each example (:class:`JitClock` reads
Triton's ``jit_cache_hook`` / ``jit_post_compile_hook``), after the kernels were warmed once
(:func:`warm_kernels`). So a new kernel specialization compiled in the middle of a run never
counts against an example, while a slow kernel or reference still fails the deadline. Under the
interpreter nothing compiles and the two clocks coincide.

Shrinking is bounded by a count, ``shrink_calls`` (shrink attempts that really run; later ones
pass at once, :func:`cases.generated.run_generated`), so the shrunk case is the same on a fast and
a slow machine, and by ``shrink_s`` as a safety net through hypothesis's documented
monkeypatchable ``MAX_SHRINKING_SECONDS`` (:func:`shrink_budget`).
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Iterator, Optional

from .strategies import TINY, Bounds, scaled

PROFILE_ENV = "HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "ci"


@dataclass(frozen=True)
class Profile:
    """One generated-run budget.

    Attributes:
        name: profile name. max_examples: hypothesis default for other property tests.
        batch_examples / engine_examples: examples of :func:`cases.strategies.batch_cases` /
            :func:`cases.strategies.engine_cases` per generated run.
        bounds: shape limits (:class:`cases.strategies.Bounds`).
        deadline_s: net per-example deadline (Triton compile time excluded), seconds.
        jit_allowance_s: added to ``deadline_s`` for hypothesis's own wall-clock deadline.
        shrink_s: shrinking budget, seconds. derandomize: fixed example sequence (CI).
        shrink_calls: shrink attempts that really run after the first failure (a count, so the
            shrunk case does not depend on the machine's speed; ``shrink_s`` stays a safety net).
        fault_examples / fault_shrink_calls / fault_shrink_s: budget of a planted-fault search
            (tests that a generator finds a :data:`parity.mutants.PLANTED_FAULTS` entry and shrinks it).
    """

    name: str
    max_examples: int
    batch_examples: int
    engine_examples: int
    bounds: Bounds = field(default=TINY)
    deadline_s: float = 30.0
    jit_allowance_s: float = 30.0
    shrink_s: float = 45.0
    derandomize: bool = False
    shrink_calls: int = 120
    fault_examples: int = 40
    fault_shrink_calls: int = 120
    fault_shrink_s: float = 120.0


PROFILES = {
    "ci": Profile("ci", max_examples=20, batch_examples=24, engine_examples=16, deadline_s=30.0,
                  shrink_s=120.0, derandomize=True, shrink_calls=80, fault_examples=40, fault_shrink_calls=50,
                  fault_shrink_s=120.0),
    "dev": Profile("dev", max_examples=50, batch_examples=50, engine_examples=30,
                   bounds=scaled(TINY, empty_steps=True), shrink_s=300.0, shrink_calls=400),
    # Compiled profiles keep the compile-relevant choices (P, H, D) to a few values: every new
    # (P, H, D, score mode, weight dtype, tile) combination is a Triton compilation.
    "device": Profile("device", max_examples=300, batch_examples=300, engine_examples=200,
                      bounds=scaled(TINY, kpools=(4, 1, 16), max_heads=4, head_dims=(16, 128), max_topk_pools=4,
                                    max_live=4, max_steps=8, max_step_tokens=96, max_chunk=64, extra_len=12,
                                    empty_steps=True),
                      deadline_s=10.0, jit_allowance_s=120.0, shrink_s=300.0, shrink_calls=1000),
    "nightly": Profile("nightly", max_examples=2000, batch_examples=2000, engine_examples=1000,
                       bounds=scaled(TINY, max_heads=32, head_dims=(16, 128, 4, 32, 64), max_topk_pools=8,
                                     max_live=6, max_steps=12, max_step_tokens=256, max_chunk=160,
                                     extra_len=40, empty_steps=True),
                       deadline_s=20.0, jit_allowance_s=300.0, shrink_s=600.0, shrink_calls=3000),
}
"""The four profiles (module docstring table)."""

_registered = False
_loaded: Optional[str] = None


def register_profiles() -> None:
    """Register every :data:`PROFILES` entry with hypothesis (idempotent)."""
    global _registered
    if _registered:
        return
    from hypothesis import HealthCheck, settings
    for p in PROFILES.values():
        settings.register_profile(
            p.name, max_examples=p.max_examples, derandomize=p.derandomize,
            deadline=timedelta(seconds=p.deadline_s + p.jit_allowance_s),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            print_blob=True)
    _registered = True


def load_profile(name: Optional[str] = None) -> Profile:
    """Register the profiles and load ``name`` (default: ``$HYPOTHESIS_PROFILE``, else ``ci``).

    Returns:
        The :class:`Profile`.
    Raises:
        KeyError: unknown profile name.
    """
    global _loaded
    name = name or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if name not in PROFILES:
        raise KeyError(f"unknown hypothesis profile {name!r}; known: {sorted(PROFILES)}")
    register_profiles()
    from hypothesis import settings
    settings.load_profile(name)
    _loaded = name
    return PROFILES[name]


def current_profile() -> Profile:
    """The profile loaded last (loading the default one if none was)."""
    return PROFILES[_loaded] if _loaded else load_profile()


@contextlib.contextmanager
def shrink_budget(seconds: float) -> Iterator[None]:
    """Bound hypothesis's shrinking phase to ``seconds`` (``MAX_SHRINKING_SECONDS`` is
    documented as monkeypatchable) and restore it afterwards."""
    from hypothesis.internal.conjecture import engine
    old = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = old


class JitClock:
    """Seconds spent compiling Triton kernels while installed (a context manager).

    Chains onto ``triton.knobs.runtime.jit_cache_hook`` (called before a compile) and
    ``jit_post_compile_hook`` (after it). Where those knobs do not exist (other Triton builds)
    or under the interpreter (nothing compiles) the clock stays at 0.

    Attributes:
        seconds: accumulated compile time. compiles: number of compilations.
    """

    def __init__(self):
        self.seconds = 0.0
        self.compiles = 0
        self._start: Optional[float] = None
        self._runtime = None
        self._old = (None, None)

    def __enter__(self) -> "JitClock":
        try:
            from triton import knobs
            self._runtime = knobs.runtime
        except Exception:  # older Triton, triton-ascend without knobs: no accounting
            return self
        old_cache, old_post = self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook

        def on_cache(*args, **kwargs):
            self._start = time.perf_counter()
            return old_cache(*args, **kwargs) if old_cache else None

        def on_post(*args, **kwargs):
            if self._start is not None:
                self.seconds += time.perf_counter() - self._start
                self.compiles += 1
                self._start = None
            return old_post(*args, **kwargs) if old_post else None
        self._old = (old_cache, old_post)
        self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook = on_cache, on_post
        return self

    def __exit__(self, *exc) -> None:
        if self._runtime is not None:
            self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook = self._old


def warm_kernels(device, kpools=(4,), score_modes=("relu",)) -> float:
    """Run every kernel once per ``(P, score_mode)`` on ``device`` (compiling them on a GPU, and
    paying the interpreter's first-call costs on a CPU) before deadlines are measured.

    Args:
        device: kernel device name or torch device.
        kpools / score_modes: the specializations to warm.
    Returns:
        wall seconds spent.
    Raises:
        AssertionError: the warm-up case itself disagrees with the reference.
    """
    from kpool.config import KPoolConfig
    from parity.runner import run_case

    from .engine import Action, EngineSim

    t0 = time.perf_counter()
    for P in kpools:
        for mode in score_modes:
            cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=P, index_topk=2 * P,
                              score_mode=mode)
            sim = EngineSim(cfg, page_size=2, num_pages=8, num_ring_blocks=2, max_pages=4, pick=lambda n: 0)
            rid = sim.admit()
            sim.step([Action(rid, 3 * P + 1)], name="warm-prefill")
            sim.step([Action(rid, 1)], name="warm-decode")
            res = run_case(sim.build(f"warm-P{P}-{mode}"), device=device, check_oracle=False)
            assert res.ok, f"warm-up case P={P} {mode} failed:\n{res.failures}"
    return time.perf_counter() - t0
