"""Run one parity case on both sides, step by step (parity-contract.md §1, §4, §5, §7).

For each case: allocate both caches from ``case.geometry`` with sentinels everywhere, give the
kernel side a byte-identical copy on the device and the reference side one on the CPU, then for
each step: build the step (:func:`cases.steps.build_step`: metadata, patch, inputs), re-lay the
compressed rows of the step's write set, snapshot every backing byte, run both forwards on their
own caches, and compare the index rows, both caches, the sentinels of both sides, the kernel's
repeat runs (:mod:`parity.checking.determinism`) and (optionally) the stateful reference against the
whole-history oracle (:mod:`parity.checking.oracle_check`); kernel-side findings are then localised
(:mod:`parity.checking.localize`). Results: :mod:`parity.findings.results`.

``kpool.indexer``, ``reference.stateful`` and ``reference.oracle`` are imported inside the
functions that need them, so importing this module never imports Triton.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import pandas as pd
import torch

from cases.steps import build_step, fp32_ape
from cases.unvalidated import runs_unvalidated

from ..checking import compare as cmp
from ..checking import sentinel as sen
from ..checking.certificates import check_tie_policy
from ..checking.checked_reference import checked_reference, is_checked
from ..checking.determinism import determinism_findings
from ..implementations.forwards import accepts_keyword, backend_of, call, longest_query, torch_device
from ..implementations.semantics import is_unsupported, validation_note
from ..checking.localize import localize
from ..checking.oracle_check import oracle_findings
from ..findings.results import KEEP_OUTPUT_STEPS, TIMING_COLUMNS, CaseResult, StepOutputs  # noqa: F401 (the run's API)

MODES = ("lockstep", "resync")
"""lockstep: each side consumes only its own caches (catches drift); resync: before each step
the reference caches are overwritten with the kernel's (pins a divergence to its first step)."""


def _modified_inputs(kwargs: dict, sources: dict) -> dict:
    """``{name: elements changed}`` of every input tensor the forward wrote (bitwise; caches and
    the output buffer are outputs and are not listed in ``sources``)."""
    def elements(t: torch.Tensor) -> torch.Tensor:   # [numel, element_size] raw bytes
        # A fresh row-major copy, not contiguous(): a tensor with a size-0 or size-1 dimension
        # counts as contiguous whatever that dimension's stride, and such a stride of 0 (an empty
        # (0, 1) tensor with strides (1, 0) on CUDA) cannot be viewed as bytes.
        flat = t.detach().cpu().clone(memory_format=torch.contiguous_format).reshape(-1)
        return flat.view(torch.uint8).reshape(t.numel(), t.element_size())

    changed = {}
    for name, src in sources.items():
        got = kwargs.get(name)
        if not isinstance(src, torch.Tensor) or not isinstance(got, torch.Tensor):
            continue
        if got.shape != src.shape or got.dtype != src.dtype:
            changed[name] = max(got.numel(), src.numel(), 1)
            continue
        n = int((elements(got) != elements(src)).any(dim=1).sum())
        if n:
            changed[name] = n
    return changed



def claimed_bitwise(bitwise_outputs: Optional[Sequence[str]]) -> frozenset:
    """The outputs a run compares with no certificate: ``bitwise_outputs`` (``None``: kpool's
    claim), or none when the ``exactness`` family is switched off (:mod:`cases.families`).

    Raises:
        ValueError: an output outside :data:`parity.implementations.semantics.BITWISE_OUTPUTS`.
    """
    from cases.families import enabled

    from ..implementations.semantics import BITWISE_OUTPUTS, KPOOL_BITWISE
    claimed = frozenset(KPOOL_BITWISE if bitwise_outputs is None else bitwise_outputs)
    if claimed - set(BITWISE_OUTPUTS):
        raise ValueError(f"unknown bitwise outputs {sorted(claimed - set(BITWISE_OUTPUTS))}; known {BITWISE_OUTPUTS}")
    return claimed if enabled("exactness") else frozenset()

@dataclass
class _Side:
    """One side's persistent state: caches and device."""

    name: str
    caches: object
    dev: torch.device
    timings: List[float] = field(default_factory=list)


def run_case(case, *, device, kernel_forward: Optional[Callable] = None,
             reference_forward: Optional[Callable] = None, check_oracle: bool = True,
             mode: str = "lockstep", repeat: int = 1, certificates: Optional[bool] = None,
             on_step: Optional[Callable] = None, keep_outputs: int = KEEP_OUTPUT_STEPS,
             stop_on_failure: bool = False, tie_policy: str = "canonical",
             step_observer: Optional[Callable] = None, bitwise_outputs: Optional[Sequence[str]] = None) -> CaseResult:
    """Run every step of ``case`` on the kernel and the reference and compare them.

    Args:
        case: :class:`cases.spec.Case`.
        device: kernel device: ``"cpu"`` (Triton interpreter), ``"cuda"``, ``"npu"``, ``"auto"``
            or a :class:`torch.device`. The reference always runs on the CPU.
        kernel_forward: the implementation under test (default ``kpool.indexer.forward``); tests
            and :mod:`parity.implementations.mutants` inject others.
        reference_forward: default ``reference.stateful.forward``.
        check_oracle: also check the stateful reference against ``reference.oracle.HistoryOracle``
            (indices and pool writes bitwise; findings with output ``reference-vs-oracle``);
            not in ``resync`` mode, where the reference runs on the kernel's caches.
        mode: ``"lockstep"`` or ``"resync"`` (:data:`MODES`).
        repeat: kernel forwards per step (>= 1). With ``repeat > 1`` every extra run starts from
            a byte copy of the pre-step kernel caches and must reproduce the first run bitwise
            (output ``determinism``; ``nondeterministic`` otherwise, parity-contract.md §6).
        certificates: allow the certified exceptions of parity-contract.md §3; ``None`` (default)
            means "unless ``case.values == "exact"``" (exact data gets no exception at all).
        on_step: optional ``fn(case, step_index, step)`` called after every step (progress bars).
        step_observer: optional third opinion on the kernel's outputs (``--oracle hf``,
            :mod:`parity.oracles.hf_run`): called after each step's checks as ``fn(case=, step_index=,
            step=, meta=, inputs=, ape=, kernel_out=, kernel_caches=, device=)`` (and
            ``kernel_buffer=``, the step's output buffer or ``None``, when it takes that keyword)
            and returns finding dicts added to that step's findings.
        keep_outputs: keep both sides' outputs of this many failing steps (repro bundles).
        stop_on_failure: stop after the first step with a failure finding (generated runs: a
            shrink attempt only needs its first failing step; parity.running.generated).
        tie_policy: the implementation's top-k tie policy, ``"canonical"`` or ``"any"``
            (:data:`parity.checking.certificates.TIE_POLICIES`); under ``any`` exact-data steps get a
            zero-tolerance tie context too.
        bitwise_outputs: outputs the implementation claims bitwise (``"indices"``,
            ``"compressed_cache"``, ``"tail_ring"``; ``None``: kpool's claim,
            :data:`parity.implementations.semantics.KPOOL_BITWISE`): no certificate applies to
            them, so a 1-ulp move of a claimed cache is a ``cache-mismatch`` (issue 19 family 5).

    Returns:
        :class:`CaseResult`. Exceptions of either forward become findings (``crash``, or the
        ``error`` comparison on ``expect_error`` steps); an unexpected exception stops the case
        after that step's checks.

    Raises:
        ValueError: unknown ``mode`` or ``tie_policy``, or ``repeat < 1``.
    """
    check_tie_policy(tie_policy)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")

    t_case = time.perf_counter()
    dev = torch_device(device)
    if kernel_forward is None:
        from kpool.indexer import forward as kernel_forward
    if reference_forward is None:
        from reference.stateful import forward as reference_forward
    cfg = case.config
    base = sen.sentinel_caches(case)
    kernel = _Side("kernel", base.to(dev), dev)
    ref = _Side("reference", base.clone(), torch.device("cpu"))
    ape = fp32_ape(case)
    oracle = None
    if check_oracle and mode != "resync":   # resync hands the reference the kernel's caches: its
        # state is no longer its own history, so comparing it with the oracle would blame it
        from reference.oracle import HistoryOracle
        oracle = HistoryOracle(index_kpool=cfg.index_kpool)
    if certificates is None:
        certificates = case.values != "exact"
    run = _RunState(kernel_forward=kernel_forward, reference_forward=reference_forward, mode=mode,
                    repeat=repeat, certificates=bool(certificates), oracle=oracle, tie_policy=tie_policy,
                    bitwise=claimed_bitwise(bitwise_outputs))

    frames, timings, steps_run, outputs = [], [], 0, {}
    for i, step in enumerate(case.steps):
        ctx = dict(case=case.name, size=case.size, step=i, step_name=step.name)
        res = _run_step(case, step, ape, kernel, ref, run)
        if step_observer is not None and res.meta is not None:
            t0 = time.perf_counter()
            extra = {"kernel_buffer": res.kbuf} if accepts_keyword(step_observer, "kernel_buffer") else {}
            res.rows += step_observer(case=case, step_index=i, step=step, meta=res.meta, inputs=res.inputs, ape=ape,
                                      kernel_out=res.kout, kernel_caches=kernel.caches, device=dev, **extra)
            res.times["observer"] = time.perf_counter() - t0
        frames.append(cmp.findings_frame(res.rows, **ctx))
        timings += [{**ctx, "side": side, "wall_s": s} for side, s in res.times.items()]
        steps_run += 1
        if len(outputs) < keep_outputs and any(cmp.is_failure(r["verdict"]) for r in res.rows):
            outputs[i] = res.outputs(i, kernel, ref)
        if on_step is not None:
            on_step(case, i, step)
        if res.stop or (stop_on_failure and any(cmp.is_failure(r["verdict"]) for r in res.rows)):
            break
    findings = pd.concat(frames, ignore_index=True) if frames else cmp.findings_frame([])
    return CaseResult(case=case.name, size=case.size, case_id=case.case_id, findings=findings,
                      timings=pd.DataFrame(timings, columns=list(TIMING_COLUMNS)),
                      steps_run=steps_run, wall_s=time.perf_counter() - t_case, mode=mode,
                      repeat=repeat, outputs=outputs)


@dataclass
class _RunState:
    """Per-case settings and state carried across steps."""

    kernel_forward: Callable
    reference_forward: Callable
    mode: str
    repeat: int
    certificates: bool
    oracle: object
    carried: dict = field(default_factory=dict)   # RoundingContext.carried, across steps
    tie_policy: str = "canonical"
    bitwise: frozenset = frozenset()              # outputs claimed bitwise: never certified


@dataclass
class _StepResult:
    rows: List[dict]
    times: dict
    stop: bool
    kout: object = None
    rout: object = None
    kbuf: object = None
    rbuf: object = None
    meta: object = None        # the step's metadata and inputs (for a step observer)
    inputs: object = None

    def outputs(self, step: int, kernel: _Side, ref: _Side) -> StepOutputs:
        def host(x):
            return x.detach().cpu().clone() if isinstance(x, torch.Tensor) else None
        kc, kr = sen.backing_bits(kernel.caches)
        rc, rr = sen.backing_bits(ref.caches)
        return StepOutputs(step=step, kernel_indices=host(self.kout), reference_indices=host(self.rout),
                           kernel_compressed=kc, reference_compressed=rc, kernel_ring=kr, reference_ring=rr,
                           kernel_buffer=host(self.kbuf.backing) if self.kbuf is not None else None,
                           reference_buffer=host(self.rbuf.backing) if self.rbuf is not None else None)


def _score_rows(step, fn: Optional[Callable]) -> Optional[int]:
    """The step's ``max_score_rows`` when it sets one and the forward ``fn`` accepts it, else None."""
    rows = getattr(step, "max_score_rows", None)
    return int(rows) if fn is not None and rows is not None and accepts_keyword(fn, "max_score_rows") else None


def _side_kwargs(case, step, built, caches, buf, dev, fn: Optional[Callable] = None) -> dict:
    """One side's forward keyword arguments (:meth:`cases.steps.StepInputs.forward_kwargs`, every
    tensor copied: the sides share no tensor). ``fn`` is the kernel forward: it also gets the
    step's ``max_score_rows`` (chunked scoring, :attr:`cases.spec.Step.max_score_rows`) when set
    and accepted, ``validate=False`` on a stale-metadata step (:mod:`cases.unvalidated`), and the
    step's longest query as ``max_query_len`` when accepted (as :class:`kpool.backend.KPoolIndexerBackend`
    passes it: the launch hint of a serving engine, read from the metadata's own
    ``cum_query_lens``); the reference has no score scratch and never validates."""
    rows = _score_rows(step, fn)
    extra = {} if rows is None else {"max_score_rows": rows}
    if fn is not None and accepts_keyword(fn, "max_query_len", explicit=True):
        extra["max_query_len"] = longest_query(built.meta)
    if fn is not None and runs_unvalidated(step) and accepts_keyword(fn, "validate"):
        extra["validate"] = False          # stale metadata: the FULL-replay path (cases.unvalidated)
    return built.forward_kwargs(case, step, caches, device=dev, copy=True,
                                output_buffer=buf.view if buf is not None else None, **extra)


def _bad_arguments(step, kwargs: dict) -> dict:
    """The keyword arguments a side is called with: ``kwargs``, or its corruption when the step
    is a bad-argument step (:attr:`cases.spec.Step.bad_argument`, parity-contract.md §5)."""
    name = getattr(step, "bad_argument", None)
    if name is None:
        return kwargs
    from cases.bad_arguments import corrupt
    return corrupt(name, kwargs)


def _run_step(case, step, ape, kernel: _Side, ref: _Side, run: _RunState) -> _StepResult:
    """One step: forwards of both sides (the kernel ``run.repeat`` times), every comparison."""
    from ..checking import certificates as certs

    cfg, geo = case.config, case.geometry
    P, C, B = cfg.index_kpool, cfg.ring_capacity, geo.page_size
    try:
        built = build_step(case, step, ape=ape)
    except Exception as exc:
        return _StepResult([cmp.crash_finding("setup", exc, output="setup")], {}, True)
    meta, inputs = built.meta, built.inputs

    if run.mode == "resync":
        ref.caches.copy_(kernel.caches)
    ring_before = ref.caches.tail_cache.detach().clone()      # the window inputs of §3.1
    ws = sen.EMPTY_WRITE_SET if step.expect_error else sen.compute_write_set(
        meta, index_kpool=P, ring_capacity=C, page_size=B, num_pages=geo.num_pages,
        num_tail_blocks=geo.num_tail_blocks, compute_topk=step.compute_topk)
    results, times, det_rows, modified_inputs = {}, {}, [], {}
    ref_fn = run.reference_forward
    if step.expect_error is not None:
        # parity-contract.md §5, both halves: the reference never validates (it must not import
        # kpool), so the harness checks the metadata on its side (parity.checking.checked_reference).
        ref_fn = checked_reference(ref_fn)
    for side, fn in ((kernel, run.kernel_forward), (ref, ref_fn)):
        sen.relay_compressed_rows(side.caches, ws)
        before = sen.backing_bits(side.caches)
        pristine = side.caches.clone() if side is kernel and run.repeat > 1 else None
        buf = sen.allocate_output_buffer(step.output_buffer, device=side.dev) if step.output_buffer else None
        buf_before = buf.backing.detach().cpu().clone() if buf is not None else None
        kwargs = _side_kwargs(case, step, built, side.caches, buf, side.dev, fn if side is kernel else None)
        if side is ref and runs_unvalidated(step) and is_checked(fn):
            kwargs["validate"] = False      # the harness's metadata check too (parity.checking.checked_reference)
        out, exc, wall = call(fn, _bad_arguments(step, kwargs), side.dev)
        modified_inputs[side.name] = _modified_inputs(kwargs, dict(inputs, ape=ape, **meta.forward_kwargs()))
        times[side.name] = wall
        if pristine is not None:
            t0 = time.perf_counter()
            det_rows = determinism_findings(
                step, fn, lambda caches, b: _bad_arguments(step, _side_kwargs(case, step, built, caches, b, side.dev, fn)),
                side.caches, side.dev, pristine, (out, exc, buf), run.repeat)
            times["kernel-repeat"] = time.perf_counter() - t0
        checks = sen.check_caches(side.caches, before, ws)
        if buf is not None:
            checks.append(buf.check(buf_before, ws.output_rows))
        results[side.name] = (out, exc, buf, checks)

    kout, kexc, kbuf, kchecks = results["kernel"]
    rout, rexc, rbuf, rchecks = results["reference"]
    if is_unsupported(kexc):
        return _unsupported_step(case, step, meta, inputs, ape, kernel, ref, run, kexc, rout, rexc, rchecks,
                                 modified_inputs["reference"], times)
    backend = backend_of(kernel.dev)
    rctx = tctx = None
    if run.certificates and "compressed_cache" not in run.bitwise:
        rctx = certs.RoundingContext(
            windows=lambda: certs.step_windows(meta, inputs, ring_before, index_kpool=P,
                                               num_pages=geo.num_pages, page_size=B),
            ape=ape, budget_ulps=certs.ROUNDING_BUDGET_ULPS[backend], carried=run.carried)
    # ties=any on exact data: exact scores, zero tolerance (parity.checking.certificates.ties)
    exact_ties = run.tie_policy == "any" and not run.certificates and case.values == "exact"
    if (run.certificates or exact_ties) and step.compute_topk and inputs.get("q") is not None \
            and "indices" not in run.bitwise:
        tctx = certs.TieContext(
            q=inputs["q"], weights=inputs["weights"], kernel_cache=kernel.caches.compressed_cache,
            reference_cache=ref.caches.compressed_cache, positions=meta.positions,
            cum_query_lens=meta.cum_query_lens, seq_lens=meta.seq_lens, block_table=meta.block_table,
            index_topk=cfg.index_topk, index_kpool=P, score_mode=cfg.score_mode, pack_tail=cfg.pack_tail,
            exact_scores=exact_ties)
    rows, stop = [], False
    if step.expect_error is not None:
        rows += cmp.compare_errors(kexc, rexc, step.expect_error, rule=getattr(step, "expect_rule", None))
        note = validation_note(kexc)        # --validate-with kpool: the caller's check rejected it
        if note:
            rows[-1]["detail"] = f"{note}; {rows[-1]['detail']}"
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
                reference_buffer=rbuf.view if rbuf is not None else None, context=tctx,
                tie_policy=run.tie_policy)
    if not stop:
        rows += cmp.compare_compressed(kernel.caches.compressed_cache, ref.caches.compressed_cache,
                                       context=rctx, claimed_bitwise="compressed_cache" in run.bitwise)
        rows += cmp.compare_ring(kernel.caches.tail_cache, ref.caches.tail_cache)
    rows += cmp.sentinel_findings(kchecks, "kernel")
    rows += cmp.sentinel_findings(rchecks, "reference")
    for side_name, changed in modified_inputs.items():
        rows += [cmp.finding(f"inputs[{side_name}]", "stray-write", n, region=name,
                             detail=f"{side_name} modified its input {name} in place ({n} elements); "
                                    "inputs are read-only (the metadata is shared by every layer)")
                 for name, n in changed.items()]
    rows += det_rows
    localize(rows, case, meta, kbuf, run.kernel_forward, kernel.dev,
             max_score_rows=_score_rows(step, run.kernel_forward))

    if run.oracle is not None and step.expect_error is None and rexc is None:
        t0 = time.perf_counter()
        rows += oracle_findings(run.oracle, case, step, meta, inputs, ape, rout, ref.caches)
        times["oracle"] = time.perf_counter() - t0
    return _StepResult(rows, times, stop, kout, rout, kbuf, rbuf, meta=meta, inputs=inputs)




def _unsupported_step(case, step, meta, inputs, ape, kernel: _Side, ref: _Side, run: _RunState, kexc, rout, rexc,
                      rchecks, ref_modified: dict, times: dict) -> _StepResult:
    """A step the implementation declares no support for (``unsupported by IMPL``,
    :class:`parity.implementations.semantics.UnsupportedModeError`): one ``unsupported`` row for
    the kernel side, the reference side's own checks (sentinels, inputs, its oracle), and the
    kernel caches made the reference's (the operator was never called), so later steps compare
    from the same state."""
    rows = [cmp.finding("forward[kernel]", "unsupported", 0, detail=str(kexc))]
    stop = rexc is not None and step.expect_error is None
    if stop:
        rows.append(cmp.crash_finding("reference", rexc))
    rows += cmp.sentinel_findings(rchecks, "reference")
    rows += [cmp.finding("inputs[reference]", "stray-write", n, region=name,
                         detail=f"reference modified its input {name} in place ({n} elements)")
             for name, n in ref_modified.items()]
    kernel.caches.copy_(ref.caches)
    if run.oracle is not None and step.expect_error is None and rexc is None:
        t0 = time.perf_counter()
        rows += oracle_findings(run.oracle, case, step, meta, inputs, ape, rout, ref.caches)
        times["oracle"] = time.perf_counter() - t0
    return _StepResult(rows, times, stop, None, rout)   # no meta: a step observer has no kernel output to judge
