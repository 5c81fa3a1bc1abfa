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
from typing import Callable, Dict, List, Optional

import pandas as pd
import torch

from . import compare as cmp
from . import sentinel as sen
from .certificates import check_tie_policy

MODES = ("lockstep", "resync")
"""lockstep: each side consumes only its own caches (catches drift); resync: before each step
the reference caches are overwritten with the kernel's (pins a divergence to its first step)."""

TIMING_COLUMNS = ("case", "size", "step", "step_name", "side", "wall_s")


KEEP_OUTPUT_STEPS = 4
"""Failing steps whose outputs (both sides' index rows, caches, output buffers) a
:class:`CaseResult` keeps for repro bundles."""


@dataclass
class StepOutputs:
    """Host copies of both sides' outputs after one step (for repro bundles, :mod:`parity.bundle`).

    Attributes:
        step: step index.
        kernel_indices / reference_indices: int32 ``[T, 1, W]`` or ``None``.
        kernel_compressed / reference_compressed: int16 bits of the compressed backing (flat).
        kernel_ring / reference_ring: int32 bits of the ring backing (flat).
        kernel_buffer / reference_buffer: int32 output-buffer backing, or ``None``.
    """

    step: int
    kernel_indices: Optional[torch.Tensor]
    reference_indices: Optional[torch.Tensor]
    kernel_compressed: torch.Tensor
    reference_compressed: torch.Tensor
    kernel_ring: torch.Tensor
    reference_ring: torch.Tensor
    kernel_buffer: Optional[torch.Tensor] = None
    reference_buffer: Optional[torch.Tensor] = None

    def tensors(self) -> dict:
        """Every tensor field by name (``None`` fields omitted)."""
        return {k: v for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}


@dataclass
class CaseResult:
    """Outcome of :func:`run_case`.

    Attributes:
        case: case name; size: its size label; case_id: ``name[size]``.
        findings: DataFrame with :data:`parity.compare.FINDING_COLUMNS`, one row per step x
            output x class (``exact`` rows included).
        timings: DataFrame with :data:`TIMING_COLUMNS`: wall seconds of each forward per side
            (``kernel``, ``reference``, ``oracle``; ``kernel-repeat``: the extra kernel runs of
            the determinism check, comparisons included).
        steps_run: steps executed (a crash stops the case).
        wall_s: wall seconds of the whole case.
        mode: ``lockstep`` or ``resync``; repeat: kernel runs per step (determinism check).
        outputs: ``{step: StepOutputs}`` of the first :data:`KEEP_OUTPUT_STEPS` failing steps.
    """

    case: str
    size: str
    case_id: str
    findings: pd.DataFrame
    timings: pd.DataFrame
    steps_run: int
    wall_s: float
    mode: str = "lockstep"
    repeat: int = 1
    outputs: Dict[int, StepOutputs] = field(default_factory=dict)

    @property
    def failures(self) -> pd.DataFrame:
        """The findings whose verdict is a failure (:func:`parity.compare.is_failure`)."""
        return self.findings[self.findings["verdict"].map(cmp.is_failure)]

    @property
    def ok(self) -> bool:
        """No failure finding."""
        return self.failures.empty

    @property
    def failing_steps(self) -> List[int]:
        """Sorted step indices with at least one failure."""
        return sorted({int(s) for s in self.failures["step"].dropna()})

    @property
    def first_divergent_step(self) -> Optional[int]:
        """The first step with a failure (``None`` if none). In ``resync`` mode this is the step
        that *produces* the first divergence: every step starts from the kernel's caches, so a
        difference can not be inherited from an earlier step."""
        steps = self.failing_steps
        return steps[0] if steps else None


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


def backend_of(dev: torch.device) -> str:
    """``"cuda"``, ``"npu"`` or ``"cpu"`` (interpreter) for a kernel torch device."""
    return dev.type if dev.type in ("cuda", "npu") else "cpu"


def run_case(case, *, device, kernel_forward: Optional[Callable] = None,
             reference_forward: Optional[Callable] = None, check_oracle: bool = True,
             mode: str = "lockstep", repeat: int = 1, certificates: Optional[bool] = None,
             on_step: Optional[Callable] = None, keep_outputs: int = KEEP_OUTPUT_STEPS,
             stop_on_failure: bool = False, tie_policy: str = "canonical",
             step_observer: Optional[Callable] = None) -> CaseResult:
    """Run every step of ``case`` on the kernel and the reference and compare them.

    Args:
        case: :class:`cases.spec.Case`.
        device: kernel device: ``"cpu"`` (Triton interpreter), ``"cuda"``, ``"npu"``, ``"auto"``
            or a :class:`torch.device`. The reference always runs on the CPU.
        kernel_forward: the implementation under test (default ``kpool.indexer.forward``); tests
            and :mod:`parity.mutants` inject others.
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
            :mod:`parity.hf_run`): called after each step's checks as ``fn(case=, step_index=,
            step=, meta=, inputs=, ape=, kernel_out=, kernel_caches=, device=)`` and returns
            finding dicts added to that step's findings.
        keep_outputs: keep both sides' outputs of this many failing steps (repro bundles).
        stop_on_failure: stop after the first step with a failure finding (generated runs: a
            shrink attempt only needs its first failing step; cases.generated).
        tie_policy: the implementation's top-k tie policy, ``"canonical"`` or ``"any"``
            (:data:`parity.certificates.TIE_POLICIES`); under ``any`` exact-data steps get a
            zero-tolerance tie context too.

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
    dev = _torch_device(device)
    if kernel_forward is None:
        from kpool.indexer import forward as kernel_forward
    if reference_forward is None:
        from reference.stateful import forward as reference_forward
    cfg, geo = case.config, case.geometry
    base = geo.allocate(cfg)
    sen.lay_cache_sentinels(base)
    kernel = _Side("kernel", base.to(dev), dev)
    ref = _Side("reference", base.clone(), torch.device("cpu"))
    if case.ape is not None:
        ape = case.ape.to(torch.float32) if case.ape.dtype != torch.float32 else case.ape
    else:
        from cases.values import make_ape
        ape = make_ape(cfg, case.seed, case.values)
    oracle = None
    if check_oracle and mode != "resync":   # resync hands the reference the kernel's caches: its
        # state is no longer its own history, so comparing it with the oracle would blame it
        from reference.oracle import HistoryOracle
        oracle = HistoryOracle(index_kpool=cfg.index_kpool)
    if certificates is None:
        certificates = case.values != "exact"
    run = _RunState(kernel_forward=kernel_forward, reference_forward=reference_forward, mode=mode,
                    repeat=repeat, certificates=bool(certificates), oracle=oracle, tie_policy=tie_policy)

    frames, timings, steps_run, outputs = [], [], 0, {}
    for i, step in enumerate(case.steps):
        ctx = dict(case=case.name, size=case.size, step=i, step_name=step.name)
        res = _run_step(case, step, ape, kernel, ref, run)
        if step_observer is not None and res.meta is not None:
            t0 = time.perf_counter()
            res.rows += step_observer(case=case, step_index=i, step=step, meta=res.meta, inputs=res.inputs, ape=ape,
                                      kernel_out=res.kout, kernel_caches=kernel.caches, device=dev)
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


def accepts_keyword(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes keyword ``name``, looking through wrappers that forward ``**kwargs``
    (``fn.forward`` of :class:`cases.recording.Recorder`, ``__wrapped__``)."""
    import inspect
    for _ in range(8):
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        if name in params:
            return True
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return False
        inner = getattr(fn, "forward", None) or getattr(fn, "__wrapped__", None)
        if inner is None or inner is fn:
            return True
        fn = inner
    return True


def _forward_kwargs(case, step, meta, inputs, ape, caches, buf, dev, fn: Optional[Callable] = None) -> dict:
    """The forward's keyword arguments for one side. ``fn`` is the kernel forward: it also gets the
    step's ``max_score_rows`` (chunked scoring, :attr:`cases.spec.Step.max_score_rows`) when set
    and accepted; the reference has no score scratch."""
    cfg = case.config
    kwargs = dict({n: _to(v, dev) for n, v in inputs.items()},
                  ape=_to(ape, dev), compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
                  **{n: _to(v, dev) for n, v in meta.forward_kwargs().items()},
                  index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, score_mode=cfg.score_mode,
                  pack_tail=cfg.pack_tail, compute_topk=step.compute_topk,
                  output_buffer=buf.view if buf is not None else None)
    rows = getattr(step, "max_score_rows", None)
    if fn is not None and rows is not None and accepts_keyword(fn, "max_score_rows"):
        kwargs["max_score_rows"] = int(rows)
    # No tail (HF's second mode, kpool-algorithm.md §10): only a case that needs it passes
    # always_select_tail=False, to both sides; every forward's default is True. A kernel forward
    # without the keyword then fails loudly (a TypeError crash finding naming it).
    if not cfg.always_select_tail:
        kwargs["always_select_tail"] = False
    return kwargs


def _run_step(case, step, ape, kernel: _Side, ref: _Side, run: _RunState) -> _StepResult:
    """One step: forwards of both sides (the kernel ``run.repeat`` times), every comparison."""
    from kpool.metadata import build_metadata
    from cases.values import make_inputs
    from . import certificates as certs

    cfg, geo = case.config, case.geometry
    P, C, B = cfg.index_kpool, cfg.ring_capacity, geo.page_size
    try:
        meta = build_metadata(step.batch, index_kpool=P, ring_capacity=C, page_size=B)
        if step.patch_metadata is not None:
            meta = step.patch_metadata(meta)
        inputs = make_inputs(case, step, meta)
    except Exception as exc:
        return _StepResult([cmp.crash_finding("setup", exc, output="setup")], {}, True)

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
        # kpool), so the harness checks the metadata on its side (cases.patches.check_metadata).
        from cases.patches import checked_reference
        ref_fn = checked_reference(ref_fn)
    for side, fn in ((kernel, run.kernel_forward), (ref, ref_fn)):
        sen.relay_compressed_rows(side.caches, ws)
        before = sen.backing_bits(side.caches)
        pristine = side.caches.clone() if side is kernel and run.repeat > 1 else None
        buf = sen.allocate_output_buffer(step.output_buffer, device=side.dev) if step.output_buffer else None
        buf_before = buf.backing.detach().cpu().clone() if buf is not None else None
        kwargs = _forward_kwargs(case, step, meta, inputs, ape, side.caches, buf, side.dev,
                                 fn if side is kernel else None)
        out, exc, wall = _call(fn, kwargs, side.dev)
        modified_inputs[side.name] = _modified_inputs(kwargs, dict(inputs, ape=ape, **meta.forward_kwargs()))
        times[side.name] = wall
        if pristine is not None:
            t0 = time.perf_counter()
            det_rows = _determinism(case, step, meta, inputs, ape, fn, side, pristine, (out, exc, buf), run.repeat)
            times["kernel-repeat"] = time.perf_counter() - t0
        checks = sen.check_caches(side.caches, before, ws)
        if buf is not None:
            checks.append(buf.check(buf_before, ws.output_rows))
        results[side.name] = (out, exc, buf, checks)

    kout, kexc, kbuf, kchecks = results["kernel"]
    rout, rexc, rbuf, rchecks = results["reference"]
    backend = backend_of(kernel.dev)
    rctx = tctx = None
    if run.certificates:
        rctx = certs.RoundingContext(
            windows=lambda: certs.step_windows(meta, inputs, ring_before, index_kpool=P,
                                               num_pages=geo.num_pages, page_size=B),
            ape=ape, budget_ulps=certs.ROUNDING_BUDGET_ULPS[backend], carried=run.carried)
    # ties=any on exact data: exact scores, zero tolerance (parity.certificates.ties)
    exact_ties = run.tie_policy == "any" and not run.certificates and case.values == "exact"
    if (run.certificates or exact_ties) and step.compute_topk and inputs.get("q") is not None:
        tctx = certs.TieContext(
            q=inputs["q"], weights=inputs["weights"], kernel_cache=kernel.caches.compressed_cache,
            reference_cache=ref.caches.compressed_cache, positions=meta.positions,
            cum_query_lens=meta.cum_query_lens, seq_lens=meta.seq_lens, block_table=meta.block_table,
            index_topk=cfg.index_topk, index_kpool=P, score_mode=cfg.score_mode, pack_tail=cfg.pack_tail,
            exact_scores=exact_ties)
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
                reference_buffer=rbuf.view if rbuf is not None else None, context=tctx,
                tie_policy=run.tie_policy)
    if not stop:
        rows += cmp.compare_compressed(kernel.caches.compressed_cache, ref.caches.compressed_cache,
                                       context=rctx)
        rows += cmp.compare_ring(kernel.caches.tail_cache, ref.caches.tail_cache)
    rows += cmp.sentinel_findings(kchecks, "kernel")
    rows += cmp.sentinel_findings(rchecks, "reference")
    for side_name, changed in modified_inputs.items():
        rows += [cmp.finding(f"inputs[{side_name}]", "stray-write", n, region=name,
                             detail=f"{side_name} modified its input {name} in place ({n} elements); "
                                    "inputs are read-only (the metadata is shared by every layer)")
                 for name, n in changed.items()]
    rows += det_rows
    _localize(rows, case, meta, kbuf, run.kernel_forward, kernel.dev)

    if run.oracle is not None and step.expect_error is None and rexc is None:
        t0 = time.perf_counter()
        rows += _oracle_findings(run.oracle, case, step, meta, inputs, ape, rout, ref.caches)
        times["oracle"] = time.perf_counter() - t0
    return _StepResult(rows, times, stop, kout, rout, kbuf, rbuf, meta=meta, inputs=inputs)


DETERMINISM_OUTPUT = "determinism"


def _determinism(case, step, meta, inputs, ape, fn, side: _Side, pristine, first, repeat: int) -> List[dict]:
    """Re-run the kernel ``repeat - 1`` times from byte copies of its pre-step caches (and a fresh
    output buffer) and compare every run bitwise with the first (parity-contract.md §1 "kernel vs
    kernel (repeat runs)": bitwise). Returns ``determinism`` findings: one ``exact`` row, or one
    ``nondeterministic`` row per output that changed, located at its first differing element."""
    out1, exc1, buf1 = first
    c1, r1 = sen.backing_bits(side.caches)
    found = []
    for n in range(2, repeat + 1):
        caches = pristine.clone()
        buf = sen.allocate_output_buffer(step.output_buffer, device=side.dev) if step.output_buffer else None
        out, exc, _ = _call(fn, _forward_kwargs(case, step, meta, inputs, ape, caches, buf, side.dev, fn), side.dev)
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
                where = locate(side.caches, int(diff[0]))
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


# --------------------------------------------------------------------------- localisation

def _kernel_package(fn) -> Optional[str]:
    """``"kpool"`` (or a mutant copy's package) when ``fn`` is ``<package>.indexer.forward`` of a
    package whose kernel modules are loaded; else ``None`` (a stand-in forward has no programs)."""
    import sys
    mod = getattr(fn, "__module__", "") or ""
    if not mod.endswith(".indexer"):
        return None
    pkg = mod[: -len(".indexer")]
    return pkg if f"{pkg}.ops.compress" in sys.modules and f"{pkg}.ops.indexer" in sys.modules else None


def _localize(rows: List[dict], case, meta, kbuf, kernel_forward, dev: torch.device) -> None:
    """Add the writer of each kernel-side finding's first element, in place (parity-contract.md
    §6): for compressed-cache and ring elements the token row that writes them this step (its
    position, request, pool id) and, when the production kernels ran, the program of the
    cache-update launch; for index elements the program of the expansion launch (and, in the
    detail, the score launch chunk and program of the pool)."""
    from . import programs
    cfg, B = case.config, case.geometry.page_size
    P, C, D = cfg.index_kpool, cfg.ring_capacity, cfg.index_head_dim
    pos = meta.positions.detach().cpu().tolist()
    slots = meta.slot_mapping.detach().cpu().tolist()
    tslots = meta.tail_slot_mapping.detach().cpu().tolist()
    cum = [int(c) for c in meta.cum_query_lens.detach().cpu().tolist()]
    T = len(pos)
    t_live = min(cum[-1], T) if cum else 0
    pkg = _kernel_package(kernel_forward)
    backend = backend_of(dev)
    cap = None

    def program(fn, *args, **kw):
        if pkg is None:
            return None
        try:
            return fn(*args, package=pkg, **kw)
        except Exception:  # a launcher that changed shape: localisation is best effort
            return None

    def writer(match) -> Optional[int]:
        hits = [t for t in range(t_live) if match(t)]
        return hits[-1] if hits else None

    def note(r, text):
        r["detail"] = f"{r['detail']}; {text}" if r.get("detail") else text

    def stale_writer(r, match, what):
        # No live row writes here: name a padding row whose (stale) slot points here, or say
        # the difference is older than this step.
        pads = [t for t in range(t_live, T) if match(t)]
        if pads:
            r.setdefault("row", pads[0])
            note(r, f"no live row writes this {what}; padding row {pads[0]} carries its slot")
        elif r["verdict"] in ("cache-mismatch", "ring-mismatch", "nan-introduced", "rounding-boundary"):
            note(r, f"{what} not written this step: difference inherited from an earlier step")

    import bisect

    def cache_writer(r, t, kernel_name):
        # Token row t wrote this cache element: locate it, and name the program of the
        # cache-update launch (compress and ring write share the row tiling) that ran it.
        nonlocal cap
        r.setdefault("row", t)
        r.setdefault("position", pos[t])
        r.setdefault("request", bisect.bisect_right(cum, t))
        if pkg is None:
            return
        if cap is None:
            cap = program(programs.grid_cap, backend, dev)
        pid = program(programs.cache_update_program, t, num_live=t_live, head_dim=D,
                      backend=backend, cap=cap) if cap else None
        if pid is not None:
            r["kernel"], r["program_id"] = kernel_name, pid

    for r in rows:
        out, kernel_side = r["output"], ("[reference]" not in r["output"] and r["output"] != ORACLE_OUTPUT)
        if not kernel_side or r["verdict"] == "exact":
            continue
        if r.get("page") is not None and r.get("page_row") is not None and r.get("region", "view") == "view" \
                and ("compressed" in out or out == DETERMINISM_OUTPUT):
            slot = r["page"] * B + r["page_row"]
            t = writer(lambda t: slots[t] == slot and pos[t] >= 0 and (pos[t] + 1) % P == 0)
            if t is None:
                stale_writer(r, lambda t: slots[t] == slot, "compressed row")
            else:
                r.setdefault("pool_id", pos[t] // P)
                cache_writer(r, t, "compress")
        elif r.get("block") is not None and r.get("slot") is not None and r.get("region", "view") == "view" \
                and ("ring" in out or out == DETERMINISM_OUTPUT):
            tslot = r["block"] * C + r["slot"]
            t = writer(lambda t: tslots[t] == tslot and pos[t] >= 0)
            if t is None:
                stale_writer(r, lambda t: tslots[t] == tslot, "ring row")
            else:
                cache_writer(r, t, "ring_write")
        elif r.get("row") is not None and r.get("column") is not None and pkg is not None \
                and r.get("region", "view") == "view" \
                and (out == "indices" or out.startswith("sentinel:output_buffer") or out == DETERMINISM_OUTPUT):
            width = int(kbuf.view.shape[1]) if kbuf is not None else cfg.output_width
            pid = program(programs.expand_program, r["row"], r["column"], num_rows=T, width=width, backend=backend,
                          device=dev)
            if pid is not None:
                r["kernel"], r["program_id"] = "expand", pid
            if r.get("pool_id") is not None and r["row"] < t_live and meta.max_pool_seq_len > 0:
                sp = program(programs.score_program, r["row"], r["pool_id"], num_live=t_live,
                             max_pool_seq_len=meta.max_pool_seq_len, num_heads=cfg.index_n_heads,
                             score_mode=cfg.score_mode, backend=backend, device=dev)
                if sp is not None:
                    note(r, f"pool scored by _score_kernel launch {sp[0]} program {sp[1]}")


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
            num_cache_slots=case.geometry.num_pages * B, always_select_tail=cfg.always_select_tail)
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
