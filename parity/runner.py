"""Run one parity case on both sides, step by step (parity-contract.md §1, §4, §5, §7).

For each case: allocate both caches from ``case.geometry`` with sentinels everywhere, give the
kernel side a byte-identical copy on the device and the reference side one on the CPU, then for
each step: build (and patch) the metadata, make the inputs, re-lay the compressed rows of the
step's write set, snapshot every backing byte, run both forwards on their own caches, and
compare the index rows, both caches, the sentinels of both sides and (optionally) the stateful
reference against the whole-history oracle.

``kpool.indexer``, ``reference.stateful``, ``reference.oracle`` and ``cases.values`` are imported
inside the functions that need them, so importing this module never imports Triton.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import pandas as pd
import torch

from . import compare as cmp
from . import sentinel as sen

MODES = ("lockstep", "resync")
"""lockstep: each side consumes only its own caches (catches drift); resync: before each step
the reference caches are overwritten with the kernel's (pins a divergence to its first step)."""

TIMING_COLUMNS = ("case", "size", "step", "step_name", "side", "wall_s")


@dataclass
class CaseResult:
    """Outcome of :func:`run_case`.

    Attributes:
        case: case name; size: its size label; case_id: ``name[size]``.
        findings: DataFrame with :data:`parity.compare.FINDING_COLUMNS`, one row per step x
            output x class (``exact`` rows included).
        timings: DataFrame with :data:`TIMING_COLUMNS`: wall seconds of each forward per side
            (``kernel``, ``reference``, ``oracle``).
        steps_run: steps executed (a crash stops the case).
        wall_s: wall seconds of the whole case.
    """

    case: str
    size: str
    case_id: str
    findings: pd.DataFrame
    timings: pd.DataFrame
    steps_run: int
    wall_s: float

    @property
    def failures(self) -> pd.DataFrame:
        """The findings whose verdict is a failure (:func:`parity.compare.is_failure`)."""
        return self.findings[self.findings["verdict"].map(cmp.is_failure)]

    @property
    def ok(self) -> bool:
        """No failure finding."""
        return self.failures.empty


def _torch_device(device) -> torch.device:
    """A torch device from a backend name (``auto``/``cpu``/``cuda``/``npu``) or a torch device."""
    if isinstance(device, torch.device):
        return device
    from kpool.platform import resolve_device, torch_device
    return torch_device(resolve_device(None if device in (None, "auto") else device))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "npu":
        torch.npu.synchronize()


def _to(x, dev):
    return x.to(dev, copy=True) if isinstance(x, torch.Tensor) else x


def _call(fn: Callable, kwargs: dict, dev: torch.device):
    """Run ``fn(**kwargs)``; return ``(result, exception or None, wall seconds)``."""
    t0 = time.perf_counter()
    try:
        out = fn(**kwargs)
        _sync(dev)
        return out, None, time.perf_counter() - t0
    except Exception as exc:  # the harness reports it; it must not stop the run
        return None, exc, time.perf_counter() - t0


@dataclass
class _Side:
    """One side's persistent state: caches and device."""

    name: str
    caches: object
    dev: torch.device
    timings: List[float] = field(default_factory=list)


def run_case(case, *, device, kernel_forward: Optional[Callable] = None,
             reference_forward: Optional[Callable] = None, check_oracle: bool = True,
             mode: str = "lockstep", stop_on_failure: bool = False) -> CaseResult:
    """Run every step of ``case`` on the kernel and the reference and compare them.

    Args:
        case: :class:`cases.spec.Case`.
        device: kernel device: ``"cpu"`` (Triton interpreter), ``"cuda"``, ``"npu"``, ``"auto"``
            or a :class:`torch.device`. The reference always runs on the CPU.
        kernel_forward: the implementation under test (default ``kpool.indexer.forward``); tests
            and :mod:`parity.mutants` inject others.
        reference_forward: default ``reference.stateful.forward``.
        check_oracle: also check the stateful reference against ``reference.oracle.HistoryOracle``
            (indices and pool writes bitwise; findings with output ``reference-vs-oracle``).
        mode: ``"lockstep"`` or ``"resync"`` (:data:`MODES`).
        stop_on_failure: stop after the first step with a failure finding (generated runs:
            shrinking only needs the first failing step).

    Returns:
        :class:`CaseResult`. Exceptions of either forward become findings (``crash``, or the
        ``error`` comparison on ``expect_error`` steps); an unexpected exception stops the case
        after that step's checks.

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    from kpool.cache import allocate_caches

    t_case = time.perf_counter()
    dev = _torch_device(device)
    if kernel_forward is None:
        from kpool.indexer import forward as kernel_forward
    if reference_forward is None:
        from reference.stateful import forward as reference_forward
    cfg, geo = case.config, case.geometry
    base = allocate_caches(cfg, num_pages=geo.num_pages, page_size=geo.page_size,
                           num_tail_blocks=geo.num_tail_blocks, page_padding=geo.page_padding,
                           ring_block_padding=geo.ring_block_padding, guard=geo.guard)
    sen.lay_cache_sentinels(base)
    kernel = _Side("kernel", base.to(dev), dev)
    ref = _Side("reference", base.clone(), torch.device("cpu"))
    if case.ape is not None:
        ape = case.ape.to(torch.float32) if case.ape.dtype != torch.float32 else case.ape
    else:
        from cases.values import make_ape
        ape = make_ape(cfg, case.seed, case.values)
    oracle = None
    if check_oracle:
        from reference.oracle import HistoryOracle
        oracle = HistoryOracle(index_kpool=cfg.index_kpool)

    frames, timings, steps_run = [], [], 0
    for i, step in enumerate(case.steps):
        ctx = dict(case=case.name, size=case.size, step=i, step_name=step.name)
        rows, times, stop = _run_step(case, step, ape, kernel, ref, oracle, kernel_forward,
                                      reference_forward, mode)
        frames.append(cmp.findings_frame(rows, **ctx))
        timings += [{**ctx, "side": side, "wall_s": s} for side, s in times.items()]
        steps_run += 1
        if stop or (stop_on_failure and frames[-1]["verdict"].map(cmp.is_failure).any()):
            break
    findings = pd.concat(frames, ignore_index=True) if frames else cmp.findings_frame([])
    return CaseResult(case=case.name, size=case.size, case_id=case.case_id, findings=findings,
                      timings=pd.DataFrame(timings, columns=list(TIMING_COLUMNS)),
                      steps_run=steps_run, wall_s=time.perf_counter() - t_case)


def _run_step(case, step, ape, kernel: _Side, ref: _Side, oracle, kernel_forward, reference_forward,
              mode: str):
    """One step: returns ``(finding dicts, {side: wall_s}, stop)``."""
    from kpool.metadata import build_metadata
    from cases.values import make_inputs

    cfg, geo = case.config, case.geometry
    P, C, B = cfg.index_kpool, cfg.ring_capacity, geo.page_size
    try:
        meta = build_metadata(step.batch, index_kpool=P, ring_capacity=C, page_size=B)
        if step.patch_metadata is not None:
            meta = step.patch_metadata(meta)
        inputs = make_inputs(case, step, meta)
    except Exception as exc:
        return [cmp.crash_finding("setup", exc, output="setup")], {}, True

    if mode == "resync":
        ref.caches.copy_(kernel.caches)
    ws = sen.EMPTY_WRITE_SET if step.expect_error else sen.compute_write_set(
        meta, index_kpool=P, ring_capacity=C, page_size=B, num_pages=geo.num_pages,
        num_tail_blocks=geo.num_tail_blocks, compute_topk=step.compute_topk)
    results, times = {}, {}
    for side, fn in ((kernel, kernel_forward), (ref, reference_forward)):
        sen.relay_compressed_rows(side.caches, ws)
        before = sen.backing_bits(side.caches)
        buf = sen.allocate_output_buffer(step.output_buffer, device=side.dev) if step.output_buffer else None
        buf_before = buf.backing.detach().cpu().clone() if buf is not None else None
        kwargs = dict({n: _to(v, side.dev) for n, v in inputs.items()},
                      ape=_to(ape, side.dev), compressed_cache=side.caches.compressed_cache,
                      tail_cache=side.caches.tail_cache,
                      **{n: _to(v, side.dev) for n, v in meta.forward_kwargs().items()},
                      index_topk=cfg.index_topk, index_kpool=P, score_mode=cfg.score_mode,
                      pack_tail=cfg.pack_tail, compute_topk=step.compute_topk,
                      output_buffer=buf.view if buf is not None else None)
        out, exc, wall = _call(fn, kwargs, side.dev)
        times[side.name] = wall
        checks = sen.check_caches(side.caches, before, ws)
        if buf is not None:
            checks.append(buf.check(buf_before, ws.output_rows))
        results[side.name] = (out, exc, buf, checks)

    kout, kexc, kbuf, kchecks = results["kernel"]
    rout, rexc, rbuf, rchecks = results["reference"]
    rows, stop = [], False
    if step.expect_error is not None:
        rows += cmp.compare_errors(kexc, rexc, step.expect_error)
    else:
        for side, exc in (("kernel", kexc), ("reference", rexc)):
            if exc is not None:
                rows.append(cmp.crash_finding(side, exc))
                stop = True
        if not stop:
            rows += cmp.compare_indices(
                kout, rout, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
                index_topk=cfg.index_topk, index_kpool=P, pack_tail=cfg.pack_tail,
                compute_topk=step.compute_topk,
                kernel_buffer=kbuf.view if kbuf is not None else None,
                reference_buffer=rbuf.view if rbuf is not None else None)
    if not stop:
        rows += cmp.compare_compressed(kernel.caches.compressed_cache, ref.caches.compressed_cache)
        rows += cmp.compare_ring(kernel.caches.tail_cache, ref.caches.tail_cache)
    rows += cmp.sentinel_findings(kchecks, "kernel")
    rows += cmp.sentinel_findings(rchecks, "reference")

    if oracle is not None and step.expect_error is None and rexc is None:
        t0 = time.perf_counter()
        rows += _oracle_findings(oracle, case, step, meta, inputs, ape, rout, ref.caches)
        times["oracle"] = time.perf_counter() - t0
    return rows, times, stop


ORACLE_OUTPUT = "reference-vs-oracle"


def _oracle_findings(oracle, case, step, meta, inputs, ape, ref_out, ref_caches) -> List[dict]:
    """parity-contract.md §7: the stateful reference must equal the whole-history oracle bitwise
    (index rows, and every pool the step wrote, read back from the reference's cache)."""
    cfg, B = case.config, case.geometry.page_size
    try:
        for src, dst, upto in getattr(step, "forks", ()):   # prefix-cache resumes (cases.spec.Step.forks)
            oracle.fork(src, dst, upto)
        expect = oracle.step(
            request_ids=list(step.request_ids), k=inputs["k"], gate=inputs["gate"], q=inputs.get("q"),
            weights=inputs.get("weights"), ape=ape, positions=meta.positions,
            cum_query_lens=meta.cum_query_lens, raw_seq_lens=meta.raw_seq_lens, seq_lens=meta.seq_lens,
            slot_mapping=meta.slot_mapping, max_pool_seq_len=meta.max_pool_seq_len,
            index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, score_mode=cfg.score_mode,
            pack_tail=cfg.pack_tail, compute_topk=step.compute_topk,
            num_cache_slots=case.geometry.num_pages * B)
    except Exception as exc:
        return [cmp.crash_finding("oracle", exc, output=ORACLE_OUTPUT)]
    rows = [r for r in cmp.compare_indices(
        ref_out, expect.indices, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
        index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, pack_tail=cfg.pack_tail,
        compute_topk=step.compute_topk, output=ORACLE_OUTPUT)]
    # Pool writes: the last write of each slot wins (row order), as in the cache.
    last = {}
    for rid, j, slot, value in expect.pool_writes:
        last[int(slot)] = (rid, j, value)
    bad, first = 0, None
    cache = ref_caches.compressed_cache
    for slot, (rid, j, value) in last.items():
        got = cache[slot // B, slot % B, 0].view(torch.int16)
        diff = (got != value.view(torch.int16)).nonzero().flatten()
        if diff.numel():
            bad += int(diff.numel())
            if first is None:
                first = dict(page=slot // B, page_row=slot % B, channel=int(diff[0]), pool_id=j,
                             detail=f"request {rid!r} pool {j}: reference cache differs from the oracle")
    if bad:
        detail = first.pop("detail")
        rows = [r for r in rows if r["verdict"] != "exact"]
        rows.append(cmp.finding(ORACLE_OUTPUT, "cache-mismatch", bad, detail=detail, **first))
    elif rows[0]["verdict"] == "exact":
        rows[0]["detail"] = f"indices and {len(last)} pool writes"
    return rows
