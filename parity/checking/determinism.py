"""Run-to-run determinism of the kernel (parity-contract.md §1 "kernel vs kernel (repeat runs)":
bitwise; public case C27): with ``repeat > 1`` the runner re-runs a step's kernel forward from
byte copies of its pre-step caches and compares every output with the first run."""
from __future__ import annotations

from typing import Callable, List

import torch

from . import compare as cmp
from . import sentinel as sen
from ..implementations.forwards import call

DETERMINISM_OUTPUT = "determinism"


def determinism_findings(step, fn: Callable, kwargs_of: Callable, caches, dev: torch.device, pristine, first,
                         repeat: int) -> List[dict]:
    """Re-run the kernel ``repeat - 1`` times from byte copies of its pre-step caches (and a fresh
    output buffer) and compare every run bitwise with the first (parity-contract.md §1 "kernel vs
    kernel (repeat runs)": bitwise).

    Args:
        step: the :class:`cases.spec.Step` (its output buffer spec).
        fn: the kernel forward. kwargs_of: ``fn(caches, output_buffer) -> forward kwargs``.
        caches: the kernel side's caches after the first run. dev: the kernel device.
        pristine: a byte copy of the caches before the first run.
        first: ``(out, exc, buffer)`` of the first run. repeat: total runs.
    Returns:
        ``determinism`` findings: one ``exact`` row, or one ``nondeterministic`` row per output
        that changed, located at its first differing element.
    """
    out1, exc1, buf1 = first
    side_caches = caches
    c1, r1 = sen.backing_bits(side_caches)
    found = []
    for n in range(2, repeat + 1):
        caches = pristine.clone()
        buf = sen.allocate_output_buffer(step.output_buffer, device=dev) if step.output_buffer else None
        out, exc, _ = call(fn, kwargs_of(caches, buf), dev)
        tag = f"run {n} vs run 1"
        if (exc is None) != (exc1 is None) or (exc is not None and type(exc) is not type(exc1)):
            found.append(cmp.finding(DETERMINISM_OUTPUT, "nondeterministic", 1,
                                     detail=f"{tag}: {type(exc1).__name__ if exc1 else 'no exception'} vs "
                                            f"{type(exc).__name__ if exc else 'no exception'}"))
            continue
        c, r = sen.backing_bits(caches)
        for name, a, b, locate in (("compressed_cache", c1, c, sen.locate_compressed),
                                   ("tail_ring", r1, r, sen.locate_ring)):
            diff = (a != b).nonzero().flatten()
            if diff.numel():
                where = locate(side_caches, int(diff[0]))
                found.append(cmp.finding(DETERMINISM_OUTPUT, "nondeterministic", int(diff.numel()),
                                         detail=f"{tag}: {name} differs", **where))
        if buf1 is not None and buf is not None:
            a, b = buf1.backing.detach().cpu(), buf.backing.detach().cpu()
            diff = (a != b).nonzero()
            if diff.shape[0]:
                where = buf1.locate(*diff[0].tolist())
                found.append(cmp.finding(DETERMINISM_OUTPUT, "nondeterministic", int(diff.shape[0]),
                                         detail=f"{tag}: output_buffer differs", **where))
        elif isinstance(out1, torch.Tensor) and isinstance(out, torch.Tensor):
            a = out1.detach().cpu().flatten(1)
            b = out.detach().cpu().flatten(1)
            if a.shape != b.shape:
                found.append(cmp.finding(DETERMINISM_OUTPUT, "nondeterministic", 1,
                                         detail=f"{tag}: indices shape {list(a.shape)} vs {list(b.shape)}"))
            else:
                diff = (a != b).nonzero()
                if diff.shape[0]:
                    t, col = diff[0].tolist()
                    found.append(cmp.finding(DETERMINISM_OUTPUT, "nondeterministic", int(diff.shape[0]),
                                             detail=f"{tag}: indices differ", row=t, column=col))
        elif (out1 is None) != (out is None):
            found.append(cmp.finding(DETERMINISM_OUTPUT, "nondeterministic", 1,
                                     detail=f"{tag}: indices returned on one run only"))
    return found or [cmp.finding(DETERMINISM_OUTPUT, "exact", detail=f"{repeat} runs bitwise identical")]
