"""Before a generated run: every kernel run once per specialisation (:func:`warm_kernels`), and
the clock of Triton compile time (:class:`JitClock`) that lets a run report each example's time
net of compilation (a warning only: no result depends on wall-clock time; cases.profiles).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from cases.engine import Action, EngineSim
from kpool.config import KPoolConfig


class JitClock:
    """Seconds spent compiling Triton kernels while installed (a context manager).

    Chains onto ``triton.knobs.runtime.jit_cache_hook`` (called before a compile) and
    ``jit_post_compile_hook`` (after it). Where those knobs do not exist (other Triton builds)
    or under the interpreter (nothing compiles) the clock stays at 0.

    Args:
        now: the clock, seconds (default ``time.perf_counter``; tests pass a fake one).

    Attributes:
        seconds: accumulated compile time. compiles: number of compilations.
    """

    def __init__(self, now=time.perf_counter):
        self._now = now
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
            self._start = self._now()
            return old_cache(*args, **kwargs) if old_cache else None

        def on_post(*args, **kwargs):
            if self._start is not None:
                self.seconds += self._now() - self._start
                self.compiles += 1
                self._start = None
            return old_post(*args, **kwargs) if old_post else None
        self._old = (old_cache, old_post)
        self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook = on_cache, on_post
        return self

    def __exit__(self, *exc) -> None:
        if self._runtime is not None:
            self._runtime.jit_cache_hook, self._runtime.jit_post_compile_hook = self._old


@dataclass
class WarmUp:
    """What :func:`warm_kernels` did.

    Attributes:
        seconds: wall seconds spent.
        failed: ``[(case, result)]`` of the warm-up cases that did not pass (a broken kernel:
            reported as findings with a bundle by the generated suite, never raised).
    """

    seconds: float = 0.0
    failed: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every warm-up case passed."""
        return not self.failed


def warm_up_cases(kpools=(4,), score_modes=("relu",)) -> list:
    """The tiny warm-up cases of :func:`warm_kernels`: per ``(P, score_mode)`` a prefill of
    ``3P + 1`` tokens and a decode (every kernel runs once)."""
    cases = []
    for P in kpools:
        for mode in score_modes:
            cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=P, index_topk=2 * P,
                              score_mode=mode)
            sim = EngineSim(cfg, page_size=2, num_pages=8, num_ring_blocks=2, max_pages=4, pick=lambda n: 0)
            rid = sim.admit()
            sim.step([Action(rid, 3 * P + 1)], name="warm-prefill")
            sim.step([Action(rid, 1)], name="warm-decode")
            cases.append(sim.build(f"warm-P{P}-{mode}", size="warm-up"))
    return cases


def warm_kernels(device, kpools=(4,), score_modes=("relu",), kernel_forward=None) -> WarmUp:
    """Run every kernel once per ``(P, score_mode)`` on ``device`` (compiling them on a GPU, and
    paying the interpreter's first-call costs on a CPU) before a generated run.

    Args:
        device: kernel device name or torch device.
        kpools / score_modes: the specializations to warm.
        kernel_forward: the implementation under test (default: the production kernels).
    Returns:
        :class:`WarmUp`; a warm-up case that disagrees with the reference is in ``failed`` (its
        findings classified like any case's), not raised.
    """
    from ..runner import run_case

    t0 = time.perf_counter()
    out = WarmUp()
    for case in warm_up_cases(kpools, score_modes):
        res = run_case(case, device=device, kernel_forward=kernel_forward, check_oracle=False)
        if not res.ok:
            out.failed.append((case, res))
    out.seconds = time.perf_counter() - t0
    return out
