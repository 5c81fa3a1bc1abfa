"""The size family on a device (issue 19 family 6): the default device run (profiles ``device``
and ``nightly``) of the generated suite also runs

1. the int64-addressing check (:func:`parity.running.large_case.int64_addressing_check`: caches of
   >= 2**31 elements, written at the top of their address range);
2. :func:`cases.size.long_pools_case` (a request of 65537 pools) and
   :func:`cases.size.many_rows_case` (65536 rows in one forward) against the reference
   (lockstep, sentinels, no whole-history oracle: its replay of 262k tokens adds nothing the
   reference does not check).

The kernels launch 1-D grids of at most 65535 programs that walk their tiles (``kpool.ops.plan``),
so these cases pass by construction; they exist for an implementation (or a change) that puts
rows or pools on another grid axis (65535 there on CUDA) or computes an offset in int32.
On the CPU interpreter they are skipped, with the reason: 12 GiB of caches and 262k interpreted
rows would take hours.
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional, Tuple

SIZE_PROFILES = ("device", "nightly")
CPU_SKIP = ("size family skipped on the cpu interpreter: caches of >= 2**31 elements (12 GiB) and 262k "
            "interpreted rows would take hours; the device profile runs it (make parity DEVICE=cuda)")


def run_size_family(device: str, profile: str, kernel_forward: Optional[Callable] = None) -> Tuple[bool, List[str]]:
    """Run the size family's checks (module docstring) on ``device``.

    Returns:
        ``(ok, lines)``: ``ok`` False when a check failed; ``lines`` one report line per check
        (or the reason nothing ran).
    """
    from cases.families import enabled
    if not enabled("size"):
        return True, ["size family: switched off (PARITY_FAMILIES_OFF)"]
    if device == "cpu":
        return True, [CPU_SKIP]
    if profile not in SIZE_PROFILES:
        return True, [f"size family: not in profile {profile} (profiles {', '.join(SIZE_PROFILES)} run it)"]
    from cases.size import long_pools_case, many_rows_case

    from ..checking.compare import is_failure
    from .large_case import ELEMENTS, int64_addressing_check
    from .runner import run_case
    ok, lines = True, []
    t0 = time.perf_counter()
    problems = int64_addressing_check(device, kernel_forward)
    ok &= not problems
    lines.append(f"size: caches of >= {ELEMENTS} elements (int64 addressing): "
                 + ("ok" if not problems else "FAILED: " + "; ".join(problems[:3])) + f" [{time.perf_counter() - t0:.1f} s]")
    for case in (long_pools_case(), many_rows_case()):
        t0 = time.perf_counter()
        res = run_case(case, device=device, kernel_forward=kernel_forward, check_oracle=False)
        bad = res.findings[res.findings["verdict"].map(is_failure)] if len(res.findings) else res.findings
        ok &= not len(bad)
        rows = max(int(s.batch.num_tokens or sum(r.query_len for r in s.batch.requests)) for s in case.steps)
        what = (f"ok, {len(res.findings)} checks" if not len(bad) else
                f"FAILED: {len(bad)} failures, first {bad.iloc[0]['output']} {bad.iloc[0]['verdict']}: "
                f"{str(bad.iloc[0].get('detail', ''))[:160]}")
        lines.append(f"size: {case.name} ({case.description}; at most {rows} rows in one forward): {what} "
                     f"[{time.perf_counter() - t0:.1f} s]")
    return ok, lines
