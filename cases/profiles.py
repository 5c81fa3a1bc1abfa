"""Hypothesis profiles of the generated parity runs, shared by pytest (``conftest.py``) and
``python -m parity run --suite generated``.

Four profiles, selected by ``HYPOTHESIS_PROFILE`` (default ``ci``) or ``--profile``:

========  =========================================  ========  ========  ==============  =========
profile   meant for                                  batches   engines   example order   shrinking
========  =========================================  ========  ========  ==============  =========
ci        CPU interpreter, CI                        24        16        fixed (seed)    80 calls
dev       a developer's CPU run                      50        30        random          400 calls
device    compiled kernels on a GPU/NPU              300       200       random          1000 calls
nightly   long compiled runs, larger shapes          2000      1000      random          3000 calls
========  =========================================  ========  ========  ==============  =========

Every profile draws empty steps (``T == 0`` or ``R == 0``, :attr:`cases.strategies.Bounds.empty_steps`),
and every generated run first checks the guaranteed-coverage cases of :mod:`cases.coverage_cases`
(chunk starts at every residue mod P for each allowed P, empty steps) as explicit examples.

The ``ci`` order is fixed by a hypothesis ``seed`` (:attr:`Profile.seed`), not by
``derandomize``: hypothesis derives a derandomized seed from the source code of the test
function, so any edit of :func:`parity.running.generated.run_generated`'s example check used to reshuffle
the examples and the planted-fault budgets tuned on them.

No wall-clock deadline anywhere: a test must not depend on the machine's speed or load.
Hypothesis deadlines are off (``deadline=None``); the generated runner measures each example's
wall time net of Triton compilation (:class:`parity.running.generated.warmup.JitClock`) and reports the examples slower than
:attr:`Profile.slow_example_s` as a warning, never as a failure. Speed lives in ``make bench``.

Shrinking is bounded by a count, ``shrink_calls`` (shrink attempts that really run; later ones
pass at once, :func:`parity.running.generated.run_generated`), so the shrunk case is the same on a fast and
a slow machine, and by ``shrink_s`` as a safety net through hypothesis's documented
monkeypatchable ``MAX_SHRINKING_SECONDS`` (:func:`parity.running.generated.driver.shrink_budget`).

Data only: the budgets. Running them (the driver, the kernel warm-up, the compile clock) is
:mod:`parity.running.generated`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from .strategies import TINY, Bounds, scaled

PROFILE_ENV = "HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "ci"


@dataclass(frozen=True)
class Profile:
    """One generated-run budget.

    Attributes:
        name: profile name. max_examples: hypothesis default for other property tests.
        batch_examples / engine_examples: examples of :func:`cases.strategies.batch_cases` /
            :func:`cases.strategies.engine_cases` per generated run (the guaranteed-coverage
            cases come on top).
        bounds: shape limits (:class:`cases.strategies.Bounds`).
        slow_example_s: an example slower than this (wall seconds net of Triton compilation) is
            reported as a warning; it never fails (no test depends on wall-clock time).
        shrink_s: shrinking budget, seconds (a safety net; ``shrink_calls`` bounds it first).
        seed: hypothesis seed of a fixed example order (``None``: random order).
        shrink_calls: shrink attempts that really run after the first failure (a count, so the
            shrunk case does not depend on the machine's speed).
        fault_examples / fault_shrink_calls / fault_shrink_s: budget of a planted-fault search
            (tests that a generator finds a :data:`parity.implementations.mutants.PLANTED_FAULTS` entry and shrinks it).
    """

    name: str
    max_examples: int
    batch_examples: int
    engine_examples: int
    bounds: Bounds = field(default=TINY)
    slow_example_s: float = 30.0
    shrink_s: float = 45.0
    seed: Optional[int] = None
    shrink_calls: int = 120
    fault_examples: int = 40
    fault_shrink_calls: int = 120
    fault_shrink_s: float = 120.0

    @property
    def derandomize(self) -> bool:
        """Whether the example order is fixed (a :attr:`seed` is set)."""
        return self.seed is not None


CI_SEED = 1
"""The ``ci`` profile's hypothesis seed. Chosen (tests/test_strategies.py, tests/test_engine.py)
so that its 24 batches and 16 engine sequences find the four planted faults of
:data:`parity.implementations.mutants.PLANTED_FAULTS`; changing the strategies may need a new one."""

PROFILES = {
    "ci": Profile("ci", max_examples=20, batch_examples=24, engine_examples=16, slow_example_s=30.0,
                  shrink_s=120.0, seed=CI_SEED, shrink_calls=80, fault_examples=40, fault_shrink_calls=50,
                  fault_shrink_s=120.0),
    "dev": Profile("dev", max_examples=50, batch_examples=50, engine_examples=30,
                   shrink_s=300.0, shrink_calls=400),
    # Compiled profiles keep the compile-relevant choices (P, H, D) to a few values: every new
    # (P, H, D, score mode, weight dtype, tile) combination is a Triton compilation.
    "device": Profile("device", max_examples=300, batch_examples=300, engine_examples=200,
                      bounds=scaled(TINY, kpools=(4, 1, 16), max_heads=4, head_dims=(16, 128), max_topk_pools=4,
                                    max_live=4, max_steps=8, max_step_tokens=96, max_chunk=64, extra_len=12),
                      slow_example_s=10.0, shrink_s=300.0, shrink_calls=1000),
    "nightly": Profile("nightly", max_examples=2000, batch_examples=2000, engine_examples=1000,
                       bounds=scaled(TINY, max_heads=32, head_dims=(16, 128, 4, 32, 64), max_topk_pools=8,
                                     max_live=6, max_steps=12, max_step_tokens=256, max_chunk=160,
                                     extra_len=40),
                       slow_example_s=20.0, shrink_s=600.0, shrink_calls=3000),
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
            p.name, max_examples=p.max_examples, derandomize=p.derandomize, deadline=None,
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
