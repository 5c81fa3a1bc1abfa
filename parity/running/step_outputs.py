"""Every output of every step of one implementation, kept and compared bit for bit (kernel vs
kernel and goldens, parity-contract.md §1 "kernel vs kernel" column: bitwise, no certificate).

:func:`run_captured` runs a case through :func:`parity.running.runner.run_case` (the normal run: the
reference findings come with it) with a step observer that keeps, per step, host copies of

* ``indices``: the forward's int32 ``[T, 1, W]`` result (``None`` when ``compute_topk=False`` or
  the forward raised);
* ``output_buffer``: the whole int32 backing of the caller's output buffer, guard bands included
  (:class:`parity.checking.sentinel.GuardedOutputBuffer`; ``None`` without one);
* ``compressed_cache``: the whole compressed backing as int16 bits (page padding and guards too);
* ``tail_ring``: the whole tail-ring backing as int32 bits (block padding and guards too).

:func:`diff_step` compares two such dicts and, for each output that differs, names the count and
the first differing element with both sides' values, located in the case's cache layout
(:func:`parity.checking.sentinel.locate_compressed` / :func:`parity.checking.sentinel.locate_ring`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from ..checking import sentinel as sen
from ..checking.compare import bits

OUTPUTS = ("indices", "output_buffer", "compressed_cache", "tail_ring")
"""The outputs of a step, in report order."""
StepDict = Dict[str, Optional[torch.Tensor]]
_DIMS = {"indices": ("row", None, "col"), "output_buffer": ("backing_row", "backing_col")}


class StepCapture:
    """A :func:`parity.running.runner.run_case` step observer that keeps every step's outputs.

    Attributes:
        steps: ``{step index: StepDict}`` (a step whose inputs could not be built has no entry).
    """

    def __init__(self):
        self.steps: Dict[int, StepDict] = {}

    def __call__(self, *, step_index, kernel_out, kernel_caches, kernel_buffer=None, **_) -> list:
        compressed, ring = sen.backing_bits(kernel_caches)
        host = kernel_out.detach().cpu().clone() if isinstance(kernel_out, torch.Tensor) else None
        buf = kernel_buffer.backing.detach().cpu().clone() if kernel_buffer is not None else None
        self.steps[step_index] = {"indices": host, "output_buffer": buf, "compressed_cache": compressed,
                                  "tail_ring": ring}
        return []


def run_captured(selected, implementation, device, semantics=None) -> Tuple[object, Dict[int, StepDict]]:
    """Run one :class:`parity.selection.kernel_cases.Selected` case on ``implementation`` (a
    :class:`parity.implementations.Implementation`) and the reference.

    Args:
        semantics: :class:`parity.implementations.semantics.RunSemantics` (score mode applied to
            the case, validation / RNE wrapping, tie policy); default: the implementation's
            declared ones (:func:`parity.implementations.semantics.resolve_semantics`).
    Returns:
        ``(CaseResult, {step: StepDict})``: the normal run's findings and every step's outputs.
    """
    from ..implementations.semantics import resolve_semantics
    from .runner import run_case
    sem = semantics or resolve_semantics(implementation)
    capture = StepCapture()
    result = run_case(sem.case(selected.case), device=device, kernel_forward=sem.forward(implementation.forward),
                      reference_forward=selected.reference_forward, check_oracle=selected.check_oracle,
                      tie_policy=sem.tie_policy, step_observer=capture, keep_outputs=0)
    return result, capture.steps


def tensor_hash(t: Optional[torch.Tensor]) -> Optional[str]:
    """sha256 hex of dtype, shape and the bytes of ``t`` (``None`` for ``None``)."""
    if t is None:
        return None
    flat = t.detach().cpu().clone(memory_format=torch.contiguous_format).reshape(-1)
    h = hashlib.sha256(f"{t.dtype}{list(t.shape)}".encode())
    h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def step_hashes(step: StepDict) -> Dict[str, Optional[str]]:
    """``{output: sha256 or None}`` of a step."""
    return {name: tensor_hash(step.get(name)) for name in OUTPUTS}


@dataclass(frozen=True)
class OutputDiff:
    """One output of one step that is not bitwise equal on the two sides.

    Attributes:
        output: a name of :data:`OUTPUTS`. count: differing elements (``-1``: shape, dtype or
        presence differs). total: elements compared. where: location of the first differing
        element (``{"region": "view", "page": 2, ...}`` for caches, ``{"index": [...]}`` else).
        a / b: both sides' values there (text: integers as values, floats as bits and value).
        detail: what differs when ``count == -1``.
        rows: for ``indices``, every token row with a differing element (sorted), else ``None``.
    """

    output: str
    count: int
    total: int = 0
    where: Optional[dict] = None
    a: str = ""
    b: str = ""
    detail: str = ""
    rows: Optional[List[int]] = None

    def text(self, a_name: str = "baseline", b_name: str = "candidate") -> str:
        """One line: ``compressed_cache: 3/2048 differ, first region=view page=2 page_row=1
        channel=9: baseline 0x3F80 (1.0 bf16) vs candidate 0x3F81 (1.0078125 bf16)`` (indices:
        then ``; 2 rows differ: [0, 5]``)."""
        if self.count < 0:
            return f"{self.output}: {self.detail}"
        where = " ".join(f"{k}={v}" for k, v in (self.where or {}).items())
        rows = "" if self.rows is None else f"; {len(self.rows)} rows differ: {rows_text(self.rows)}"
        return (f"{self.output}: {self.count}/{self.total} differ, first {where}: {a_name} {self.a} vs "
                f"{b_name} {self.b}{rows}")


def rows_text(rows: List[int], limit: int = 24) -> str:
    """``[14, 27, 28, ...]``: at most ``limit`` row numbers, then ``... (+N)``."""
    shown = ", ".join(map(str, rows[:limit]))
    return f"[{shown}{f', ... (+{len(rows) - limit})' if len(rows) > limit else ''}]"


def _value(flat_bits: torch.Tensor, i: int, output: str) -> str:
    v = int(flat_bits[i])
    if output == "compressed_cache":
        f = torch.tensor([v], dtype=torch.int16).view(torch.bfloat16).float().item()
        return f"0x{v & 0xFFFF:04X} ({f!r} bf16)"
    if output == "tail_ring":
        f = torch.tensor([v], dtype=torch.int32).view(torch.float32).item()
        return f"0x{v & 0xFFFFFFFF:08X} ({f!r} fp32)"
    return str(v)


def diff_tensors(output: str, a: Optional[torch.Tensor], b: Optional[torch.Tensor], layout=None) -> Optional[OutputDiff]:
    """The :class:`OutputDiff` of one output, or ``None`` when ``a`` and ``b`` hold the same bits
    (``None`` equals only ``None``). ``layout``: the case's :class:`kpool.cache.KPoolCaches`
    (:func:`parity.checking.sentinel.case_caches`) to name cache elements by page/row/channel."""
    if a is None or b is None:
        if a is None and b is None:
            return None
        return OutputDiff(output, -1, detail=f"{'baseline' if a is None else 'candidate'} has none, the other "
                                             f"{(b if a is None else a).dtype}{list((b if a is None else a).shape)}")
    if a.dtype != b.dtype or a.shape != b.shape:
        return OutputDiff(output, -1, detail=f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
    fa, fb = bits(a).reshape(-1), bits(b).reshape(-1)
    diff = fa != fb
    n = int(diff.sum())
    if n == 0:
        return None
    flat = int(diff.nonzero()[0])
    if layout is not None and output == "compressed_cache":
        where = sen.locate_compressed(layout, flat)
    elif layout is not None and output == "tail_ring":
        where = sen.locate_ring(layout, flat)
    else:
        coord = [int(x) for x in torch.unravel_index(torch.tensor(flat), a.shape)] if a.dim() else []
        names = _DIMS.get(output) if len(_DIMS.get(output, ())) == len(coord) else None
        where = {n: c for n, c in zip(names, coord) if n is not None} if names else {"index": coord}
    rows = None
    if output == "indices" and a.dim() >= 1 and a.shape[0]:   # the token rows that differ (row = dim 0)
        rows = [int(t) for t in diff.reshape(a.shape[0], -1).any(dim=1).nonzero().flatten()]
    return OutputDiff(output, n, diff.numel(), where, _value(fa, flat, output), _value(fb, flat, output), rows=rows)


def diff_step(a: Optional[StepDict], b: Optional[StepDict], layout=None) -> List[OutputDiff]:
    """Every output of :data:`OUTPUTS` that differs between two steps' outputs (empty: identical).
    A step present on one side only is one ``step`` difference."""
    if a is None or b is None:
        if a is None and b is None:
            return []
        return [OutputDiff("step", -1, detail=f"step ran on the {'candidate' if a is None else 'baseline'} only")]
    return [d for name in OUTPUTS if (d := diff_tensors(name, a.get(name), b.get(name), layout)) is not None]


def diff_steps(a: Dict[int, StepDict], b: Dict[int, StepDict], case) -> Dict[int, List[OutputDiff]]:
    """``{step: [OutputDiff]}`` over every step either side ran (identical steps map to ``[]``)."""
    layout = sen.case_caches(case)
    return {i: diff_step(a.get(i), b.get(i), layout) for i in sorted(set(a) | set(b))}
