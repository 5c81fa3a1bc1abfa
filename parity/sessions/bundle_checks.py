"""What a repro bundle may ask a replay to do (parity-contract.md §6; :mod:`parity.sessions.bundle`).

A bundle is a file someone hands over: before anything runs, its kernel spec, run options, cache
geometry and step count are checked, so a wrong or absurd field is a usage error (``replay``
exits 2 with the reason) instead of a traceback, an allocation of terabytes, or arbitrary code.
"""
from __future__ import annotations

from typing import Optional

MAX_REPEAT = 64
"""Largest ``repeat`` a bundle may ask for (kernel runs per step)."""
MAX_CACHE_BYTES = 2 ** 38
"""Largest cache allocation (both caches, one side) a bundle may ask for: 256 GiB, above any real
device and far above every case the harness builds."""
REPLAYABLE_MODULES = ("kpool", "parity", "cases", "reference", "tests")
"""Top-level packages of this checkout whose functions a bundle may name as its kernel."""
EXTERNAL_KINDS = ("vllm-ascend:", "git:")
"""Kernel kinds that load code from outside this checkout's tree (a vendor checkout, another git
revision): a bundle may record one, but a replay runs it only when the user names it again with
``--kernel`` (:func:`needs_explicit_kernel`)."""


def needs_explicit_kernel(spec: str) -> bool:
    """Whether replaying a bundle recorded with ``spec`` needs ``--kernel SPEC`` spelled out."""
    return isinstance(spec, str) and spec.startswith(EXTERNAL_KINDS)


def check_kernel_spec(spec) -> None:
    """A bundle must not choose arbitrary code to run: its kernel is ``kpool``, ``mutant:NAME``
    (a known planted fault) or a function of this checkout's packages (:data:`REPLAYABLE_MODULES`).

    Raises:
        ValueError: any other spec.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"the bundle's kernel {spec!r} is not a kernel spec")
    if spec == "kpool" or needs_explicit_kernel(spec):
        return
    if spec.startswith("mutant:"):
        from ..implementations.mutants import MUTANTS
        if spec.split(":", 1)[1] not in MUTANTS:
            raise ValueError(f"the bundle names kernel {spec!r}, an unknown planted fault; known: "
                             f"{', '.join(MUTANTS)}")
        return
    if ":" not in spec or spec.split(":", 1)[0].split(".", 1)[0] not in REPLAYABLE_MODULES:
        raise ValueError(f"the bundle names kernel {spec!r}; replay runs only kpool, mutant:NAME or a function "
                         f"of {', '.join(REPLAYABLE_MODULES)} (rerun other kernels with python -m parity run "
                         f"--kernel)")


def _int(value, what: str, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"the bundle's {what} is {value!r}; it must be an integer {bound}")
    return value


def check_run(run: dict) -> None:
    """The recorded :class:`parity.sessions.session.RunOptions` fields.

    Raises:
        ValueError: not an object, a bad kernel spec, ``repeat`` outside ``[1, MAX_REPEAT]``, an
        unknown mode or relation, a non-boolean ``check_oracle``.
    """
    from .session import RELATION_NAMES
    if not isinstance(run, dict):
        raise ValueError("the bundle's run options are not an object")
    check_kernel_spec(run.get("kernel", "kpool"))
    _int(run.get("repeat", 1), "repeat", 1, MAX_REPEAT)
    if run.get("mode", "lockstep") not in ("lockstep", "resync"):
        raise ValueError(f"the bundle's mode {run.get('mode')!r} is not lockstep or resync")
    if not isinstance(run.get("check_oracle", True), bool):
        raise ValueError(f"the bundle's check_oracle {run.get('check_oracle')!r} is not true or false")
    for key in ("metamorphic", "decode_relations"):
        names = run.get(key, [])
        if not isinstance(names, list) or any(n not in RELATION_NAMES for n in names):
            raise ValueError(f"the bundle's {key} {names!r} names unknown relations; known: {', '.join(RELATION_NAMES)}")


def check_case(case: dict, steps_saved: int) -> None:
    """The recorded case: configuration, a cache geometry of sane size, and as many steps as
    ``inputs.pt`` holds.

    Raises:
        ValueError: a field of the wrong type or range, caches above :data:`MAX_CACHE_BYTES`, or
        a step count that differs between ``case.json`` and ``inputs.pt``.
    """
    from kpool.config import KPoolConfig
    try:
        config = KPoolConfig(**case["config"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"the bundle's configuration is invalid: {type(exc).__name__}: {exc}") from exc
    geo = case.get("geometry")
    if not isinstance(geo, dict):
        raise ValueError("the bundle's geometry is not an object")
    pages = _int(geo.get("num_pages"), "geometry.num_pages", 1)
    page_size = _int(geo.get("page_size"), "geometry.page_size", 1)
    blocks = _int(geo.get("num_tail_blocks"), "geometry.num_tail_blocks", 1)
    page_pad = _int(geo.get("page_padding", 0), "geometry.page_padding", 0)
    ring_pad = _int(geo.get("ring_block_padding", 0), "geometry.ring_block_padding", 0)
    guard = _int(geo.get("guard", 64), "geometry.guard", 0)
    D, C = config.index_head_dim, config.ring_capacity
    need = (pages * (page_size * D + page_pad) * 2 + blocks * (2 * C * D + ring_pad) * 4 + 4 * guard * 6)
    if need > MAX_CACHE_BYTES:
        raise ValueError(f"the bundle's geometry needs {need / 2 ** 30:.0f} GiB of caches per side "
                         f"(limit {MAX_CACHE_BYTES // 2 ** 30} GiB): num_pages={pages} page_size={page_size} "
                         f"num_tail_blocks={blocks}")
    steps = case.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ValueError("the bundle's case has no steps")
    if len(steps) != steps_saved:
        raise ValueError(f"the bundle's case.json has {len(steps)} steps but inputs.pt holds {steps_saved}")


def check_counts(data: dict, outputs: dict, findings) -> None:
    """``steps_run``, the kept outputs and the findings refer to steps the case has.

    Raises:
        ValueError: a step index outside the case.
    """
    n = len(data["case"]["steps"])
    _int(data.get("steps_run", n), "steps_run", 0, n)
    bad = [k for k in outputs if not isinstance(k, int) or not 0 <= k < n]
    steps = [int(s) for s in findings["step"].dropna()] if len(findings) else []
    bad += [s for s in steps if not 0 <= s < n]
    if bad:
        raise ValueError(f"the bundle refers to steps {sorted(set(map(str, bad)))} of a {n}-step case")
