"""The public failure cases C01..C31 of ``../shared/cases/public-cases.md`` as named regression
cases with their stated correct values (parity-contract.md §1; kpool-algorithm.md §4-§7).

Every :class:`PublicCase` holds one or more :class:`cases.spec.Case` objects. ``python -m parity
run --suite public`` (and ``tests/test_public_cases.py``) runs each through
:func:`parity.runner.run_case` -- kernels vs stateful reference vs whole-history oracle, bitwise,
sentinels, reference side wrapped in :func:`cases.patches.checked_reference` -- with recording
forwards (:mod:`cases.recording`), then asserts the case's stated values explicitly on what the
kernel (and the reference) actually returned and left in the caches. Cases that need direct
kernel calls (``validate=False`` runs, in-place graph-replay emulation, repeated launches) add
``extra`` checks. A case marked ``must_fail`` is a negative control: the harness must report it.

Where a public case states a value for an implementation style we do not have, the case
docstring says how it is adapted: our ring stores each request's last ``C`` rows (§5.4, so C05's
"slots 2 and 3 unchanged" becomes "slots 2, 3 hold tokens 206, 207") and has ``C = P + spec``
slots (C21's ring slots are ``p % C``); our top-k is a stable sort with no workspace or radix
switch (C23, C29 check what those cases *mean* for us: the canonical ``torch.topk`` set,
independence from earlier launches and from row order, no truncation above k = 256); there are
no CUDA graphs under the interpreter, so FULL-graph replay is emulated by FULL-mode metadata
copied in place (:meth:`kpool.metadata.KPoolMetadata.copy_`) into fixed buffers and
``validate=False`` launches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from kpool.config import KPoolConfig
from kpool.errors import KPoolBlockIdError, KPoolMetadataError
from kpool.metadata import BatchSpec, KPoolMetadata, RequestSpec, build_metadata

from .patches import MetadataPatch, checked_reference
from .recording import Call, Recorder, same_bits
from .spec import Case, CacheGeometry, OutputBufferSpec, Step
from .values import _fill_padding, _generator, exact_logit_inputs, row_requests

PUBLIC_SIZE = "public"


# ---- framework ---------------------------------------------------------------------------------

@dataclass
class Check:
    """One stated-value assertion: ``name``, whether it held, a detail, and the triage verdict
    (parity-contract.md §6) a failure is reported under."""

    name: str
    ok: bool
    detail: str = ""
    verdict: str = "wrong-index"


@dataclass
class PublicRun:
    """A case run through :func:`parity.runner.run_case` with recording forwards."""

    case: Case
    result: object
    kernel: Recorder
    reference: Recorder

    def call(self, step: int, side: str = "kernel") -> Call:
        """The recorded call of ``step`` on ``side`` (``"kernel"`` / ``"reference"``)."""
        return (self.kernel if side == "kernel" else self.reference).calls[step]


@dataclass
class PublicCase:
    """A public failure case.

    Attributes:
        cid: ``"C01"``..``"C31"``. title: one line.
        build: ``fn() -> [Case, ...]`` (run in order, each from fresh caches).
        expect: ``fn({case name: PublicRun}) -> [Check]`` (stated values on recorded outputs).
        extra: optional ``fn(device, runs) -> [Check]`` (direct kernel calls).
        must_fail: names of cases that are negative controls (their failures are expected;
            a check asserts the harness reported one).
        check_oracle: cases whose physical state is deliberately not a function of per-request
            history (C19 re-points requests at other blocks) run without the oracle.
    """

    cid: str
    title: str
    build: Callable[[], List[Case]]
    expect: Callable[[Dict[str, PublicRun]], List[Check]]
    extra: Optional[Callable] = None
    must_fail: Sequence[str] = ()
    check_oracle: bool = True


def run_with_recorders(case: Case, device, *, check_oracle: bool = True, kernel_forward=None) -> PublicRun:
    """Run ``case`` through :func:`parity.runner.run_case` with recording forwards (the reference
    wrapped in :func:`cases.patches.checked_reference`)."""
    from parity.runner import run_case
    if kernel_forward is None:
        from kpool.indexer import forward as kernel_forward
    kernel = Recorder(kernel_forward)
    reference = Recorder(checked_reference())
    result = run_case(case, device=device, kernel_forward=kernel, reference_forward=reference,
                      check_oracle=check_oracle)
    return PublicRun(case, result, kernel, reference)


def run_public(pc: PublicCase, device, *, kernel_forward=None):
    """Run every case of ``pc`` and evaluate its checks.

    Returns:
        ``(runs, checks)``: ``{case name: PublicRun}`` and the :class:`Check` list (a
        ``harness`` check per must-pass case, a ``negative control`` check per must-fail case,
        then the stated values and the extra checks).
    """
    import warnings
    runs: Dict[str, PublicRun] = {}
    checks: List[Check] = []
    with warnings.catch_warnings():
        # NaN / inf inputs make the interpreter's NumPy ops warn; the results are what is checked.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        return _run_public(pc, device, kernel_forward, runs, checks)


def _run_public(pc, device, kernel_forward, runs, checks):
    for case in pc.build():
        run = run_with_recorders(case, device, check_oracle=pc.check_oracle, kernel_forward=kernel_forward)
        runs[case.name] = run
        bad = run.result.failures
        if case.name in pc.must_fail:
            checks.append(Check(f"{case.name}: harness reports the planted fault", not bad.empty,
                                detail=", ".join(sorted(set(bad["verdict"]))) if not bad.empty else "no failure"))
    try:
        checks += pc.expect(runs)
        if pc.extra is not None:
            checks += pc.extra(device, runs)
    except Exception as exc:  # a crashed expectation is a failed one, with its reason
        checks.append(Check("expectations evaluated", False, f"{type(exc).__name__}: {exc}", "crash"))
    return runs, checks


def public_results(pc: PublicCase, device, *, kernel_forward=None):
    """``[CaseResult]`` of ``pc`` for the parity CLI: each must-pass case's harness findings plus
    one finding per stated-value check (output ``expected:<check>``) on the first result; a
    must-fail case contributes only its negative-control check."""
    import pandas as pd

    from parity import compare as cmp
    from parity.runner import CaseResult

    runs, checks = run_public(pc, device, kernel_forward=kernel_forward)
    results = []
    rows = [cmp.finding(f"expected:{c.name}"[:120], "exact" if c.ok else c.verdict, 0 if c.ok else 1,
                        detail=c.detail[:300]) for c in checks]
    first = True
    for name, run in runs.items():
        res = run.result
        findings = res.findings if name not in pc.must_fail else cmp.findings_frame([])
        if first:
            extra = cmp.findings_frame(rows, case=f"{pc.cid}:{name}", size=PUBLIC_SIZE, step=-1, step_name="checks")
            findings = pd.concat([findings, extra], ignore_index=True)
            first = False
        findings = findings.assign(case=f"{pc.cid}:{name}")
        results.append(CaseResult(case=f"{pc.cid}:{name}", size=PUBLIC_SIZE, case_id=f"{pc.cid}:{name}[{PUBLIC_SIZE}]",
                                  findings=findings, timings=res.timings, steps_run=res.steps_run, wall_s=res.wall_s))
    return results


# ---- helpers -----------------------------------------------------------------------------------

def _context_then_decode_steps(positions, inputs, *, num_tokens: int) -> list:
    """Request ``r`` (pages ``10r .. 10r + 9``, ring block ``r``) gets a cache-only context of
    ``positions[r]`` tokens, then one decode token eagerly and the same decode again in FULL mode
    padded to ``num_tokens`` rows."""
    ids = list(range(len(positions)))
    tables = {r: list(range(r * 10, r * 10 + 10)) for r in ids}
    ctx = _step("context", [(0, p, tables[r], r) for r, p in enumerate(positions)], ids, inputs=inputs,
                compute_topk=False)
    dec = [(p, 1, tables[r], r) for r, p in enumerate(positions)]
    return [ctx, _step("decode", dec, ids, inputs=inputs),
            _step("decode-full", dec, ids, inputs=inputs, num_tokens=num_tokens, full_mode=True,
                  block_table_width=10)]


def _cfg(**kw) -> KPoolConfig:
    # H = 2, D = 16 (SMALL's shapes, the ones every backend has compiled): the exact-logit
    # inputs use head 0 only, so the extra head changes no stated value.
    base = dict(index_n_heads=2, index_head_dim=16, index_kpool=4, index_topk=8)
    base.update(kw)
    return KPoolConfig(**base)


def _geo(num_pages=16, page_size=4, blocks=4, **kw) -> CacheGeometry:
    return CacheGeometry(num_pages=num_pages, page_size=page_size, num_tail_blocks=blocks, **kw)


def _case(name, config, geometry, steps, *, ape=None, values="random", description="", tags=()) -> Case:
    if ape is None:
        ape = torch.zeros(config.index_kpool, config.index_head_dim, dtype=torch.float32)
    return Case(name=name, size=PUBLIC_SIZE, config=config, geometry=geometry, steps=steps, ape=ape,
                values=values, description=description, tags=tuple(tags))


def _step(name, requests, rids, *, inputs, **kw) -> Step:
    """``requests``: ``[(cached, qlen, block_table, ring_block)]``."""
    batch_kw = {k: kw.pop(k) for k in ("num_tokens", "full_mode", "num_padded_requests", "block_table_width",
                                       "stale_tail_slots") if k in kw}
    batch = BatchSpec([RequestSpec(c, q, list(bt), ring) for c, q, bt, ring in requests], **batch_kw)
    return Step(name=name, batch=batch, request_ids=list(rids), inputs=inputs, **kw)


class TokenInputs:
    """``Step.inputs`` whose values are a function of (request id, position, version): the same
    token fed in two steps (chunked vs decode paths, speculative vs not) gets the same bits.

    Args:
        config: H, D. seed: value stream. fns: optional overrides ``fn(rid, pos) -> tensor`` for
            ``k`` (fp32 [D]), ``gate`` (fp32 [D]), ``q`` (bf16 [H, D]), ``weights`` (fp32 [H]).
        version: ``fn(step_name, rid, pos) -> int``: 0 for committed tokens, else a draft version
            (rejected MTP drafts get other bits).
        shared: every request sees the same token stream (C01's three paths over one sequence).
    """

    def __init__(self, config: KPoolConfig, seed: int = 0, version: Optional[Callable] = None,
                 shared: bool = False, **fns):
        self.config, self.seed, self.fns, self.shared = config, seed, fns, shared
        self.version = version or (lambda step, rid, pos: 0)

    def token(self, rid: int, pos: int, version: int = 0) -> dict:
        """The four values of one token (the same for every request when ``shared``)."""
        from .genvalues import random_bf16, random_fp32
        H, D = self.config.index_n_heads, self.config.index_head_dim
        g = _generator(self.seed, 0 if self.shared else rid, pos, version)
        out = dict(k=random_bf16((D,), g).to(torch.float32), gate=random_fp32((D,), g, -3, 1),
                   q=random_bf16((H, D), g), weights=random_fp32((H,), g, -6, -5))
        for name, fn in self.fns.items():
            out[name] = fn(rid, pos)
        return out

    def __call__(self, case, step, metadata) -> dict:
        H, D = self.config.index_n_heads, self.config.index_head_dim
        T, T_live = metadata.num_tokens, metadata.num_live_tokens
        k, gate = torch.zeros(T, D), torch.zeros(T, D)
        q, w = torch.zeros(T, H, D, dtype=torch.bfloat16), torch.zeros(T, H)
        req = row_requests(metadata)
        for t in range(T_live):
            rid, pos = step.request_ids[int(req[t])], int(metadata.positions[t])
            v = self.token(rid, pos, self.version(step.name, rid, pos))
            k[t], gate[t], q[t], w[t] = v["k"], v["gate"], v["q"], v["weights"]
        _fill_padding(T_live, k, gate, q, w, _generator(self.seed, 0xBAD))
        return dict(k=k, gate=gate, q=q, weights=w)


def rows(call: Call) -> List[List[int]]:
    """Index rows of a recorded call as int lists (``[T][W]``)."""
    return call.out[:, 0, :].tolist()


def valid(row: Sequence[int]) -> List[int]:
    """The non-negative entries of a row, sorted."""
    return sorted(v for v in row if v >= 0)


def pool_row(call: Call, request: int, j: int) -> torch.Tensor:
    """bf16 ``[D]`` compressed row of pool ``j`` of the call's request ``request`` (through its
    block table), after the call."""
    B = call.compressed.shape[1]
    page = int(call.meta["block_table"][request, j // B])
    return call.compressed[page, j % B, 0]


def pool_at(call: Call, table: Sequence[int], j: int) -> torch.Tensor:
    """bf16 ``[D]`` compressed row of pool ``j`` of a request with block table ``table`` (for a
    request that is not in the call's batch)."""
    B = call.compressed.shape[1]
    return call.compressed[table[j // B], j % B, 0]


def ring_row(call: Call, block: int, slot: int) -> torch.Tensor:
    """fp32 ``[2, D]`` (K, gate) of a ring row after the call."""
    return call.tail[block, :, slot]


def compress_tokens(tokens: Sequence[dict], ape: torch.Tensor) -> torch.Tensor:
    """bf16 ``[D]``: the canonical pool of P token dicts (``reference.numerics.compress_pools``)."""
    from reference.numerics import compress_pools
    k = torch.stack([t["k"] for t in tokens])[None]
    g = torch.stack([t["gate"] for t in tokens])[None]
    return compress_pools(k, g, ape)[0]


def _sides(run: PublicRun, step: int):
    return (("kernel", run.call(step, "kernel")), ("reference", run.call(step, "reference")))


def _row_check(name, got: Sequence[int], want: Sequence[int]) -> Check:
    return Check(name, list(got) == list(want), f"got {list(got)}, want {list(want)}")


def _set_check(name, got: Sequence[int], want: Sequence[int]) -> Check:
    return Check(name, valid(got) == sorted(want), f"got {valid(got)}, want {sorted(want)}")


def _bits_check(name, got: torch.Tensor, want: torch.Tensor, verdict: str = "cache-mismatch") -> Check:
    return Check(name, same_bits(got, want), f"got {got.tolist()}, want {want.tolist()}", verdict)


def _causal_checks(run: PublicRun, label: str) -> List[Check]:
    """Universal row checks on every scored step (C07, C09, C13): no entry > the row's position,
    valid history is a union of whole pools, -1 everywhere else on padding rows."""
    out = []
    P = run.case.config.index_kpool
    K = run.case.config.index_topk
    for i, step in enumerate(run.case.steps):
        call = run.call(i)
        if call.out is None:
            continue
        T_live = int(call.meta["cum_query_lens"][-1]) if call.meta["cum_query_lens"].numel() else 0
        pos = call.meta["positions"].tolist()
        bad_causal, bad_pool, bad_pad = [], [], []
        for t, row in enumerate(rows(call)):
            if t >= T_live:
                if any(v != -1 for v in row):
                    bad_pad.append(t)
                continue
            if any(v > pos[t] for v in row):
                bad_causal.append(t)
            tail_start = (pos[t] + 1) // P * P
            hist = [v for v in row if 0 <= v < tail_start]
            pools = {}
            for v in hist:
                pools.setdefault(v // P, set()).add(v)
            if any(len(s) != P for s in pools.values()) or len(hist) > K:
                bad_pool.append(t)
        out.append(Check(f"{label} step {i}: no index > its row's position", not bad_causal, f"rows {bad_causal}"))
        out.append(Check(f"{label} step {i}: history is whole pools", not bad_pool, f"rows {bad_pool}"))
        if T_live < len(pos):
            out.append(Check(f"{label} step {i}: padding rows all -1", not bad_pad, f"rows {bad_pad}", "padding-leak"))
    return out


# ---- C01 ---------------------------------------------------------------------------------------

C01_TABLES = {0: [0, 1], 1: [2, 3], 2: [4, 5]}


def _c01_cases() -> List[Case]:
    """Paths A (one 32-token prefill), B (32 decodes) and C (10-token prefill, 22 decodes) of the
    same tokens, as requests 0, 1, 2 of one case (rings 1, 2, 3; pages 0-1, 2-3, 4-5)."""
    cfg = _cfg(index_topk=8)
    inputs = TokenInputs(cfg, seed=101, shared=True)         # one token stream, three paths
    tables, ring = C01_TABLES, {0: 1, 1: 2, 2: 3}
    steps = []
    for t in range(32):
        reqs, rids = [(t, 1, tables[1], ring[1])], [1]
        if t == 0:
            reqs = [(0, 32, tables[0], ring[0])] + reqs + [(0, 10, tables[2], ring[2])]
            rids = [0, 1, 2]
        elif t >= 10:
            reqs.append((t, 1, tables[2], ring[2]))
            rids.append(2)
        steps.append(_step(f"t{t}", reqs, rids, inputs=inputs))
    ape = TokenInputs(cfg, seed=102).token(0, 0)["k"].repeat(4, 1) * torch.arange(1, 5, dtype=torch.float32)[:, None]
    return [_case("decode-vs-prefill-writer", cfg, _geo(num_pages=8, page_size=4, blocks=4), steps, ape=ape,
                  description="C01: pools 0-7 from prefill, decode-only and mixed paths")]


def _c01_expect(runs) -> List[Check]:
    run = runs["decode-vs-prefill-writer"]
    inputs = run.case.steps[0].inputs
    last = len(run.case.steps) - 1
    out = []
    for side, call in _sides(run, last):
        for j in range(8):
            a, b, c = (pool_at(call, C01_TABLES[r], j) for r in range(3))
            out.append(Check(f"{side}: pool {j} identical from prefill (A), decode (B) and mixed (C)",
                             same_bits(a, b) and same_bits(a, c), f"A={a.tolist()} B={b.tolist()} C={c.tolist()}",
                             "cache-mismatch"))
        want = compress_tokens([inputs.token(0, p) for p in range(4 * 7, 4 * 8)], run.case.ape)
        out.append(_bits_check(f"{side}: pool 7 = canonical compress(k28..k31)", pool_at(call, C01_TABLES[1], 7), want))
    bad = []
    for t in range(32):
        call = run.call(t)
        got = ring_row(call, 2, t % 4)
        tok = inputs.token(1, t)
        if not (same_bits(got[0], tok["k"]) and same_bits(got[1], tok["gate"])):
            bad.append(t)
    out.append(Check("path B: after step t ring slot t % 4 holds token t's K and gate bits", not bad,
                     f"steps {bad}", "ring-mismatch"))
    return out


# ---- C03 ---------------------------------------------------------------------------------------

C03_PADDING = 256


def _c03_cases() -> List[Case]:
    cfg = _cfg(index_topk=8)
    inputs = TokenInputs(cfg, seed=303)
    geo = _geo(num_pages=4, page_size=4, blocks=6, ring_block_padding=C03_PADDING)
    steps = [_step("prefill-to-10", [(0, 11, [2], 3)], [0], inputs=inputs),
             _step("decode-11", [(11, 1, [2], 3)], [0], inputs=inputs)]
    return [_case("padded-stride-ring", cfg, geo, steps, description="C03: ring block 3 of a padded-stride view")]


def _c03_expect(runs) -> List[Check]:
    from kpool.cache import allocate_caches
    from parity.sentinel import FP32_SENTINEL_INT32
    run = runs["padded-stride-ring"]
    inputs = run.case.steps[0].inputs
    cfg, geo = run.case.config, run.case.geometry
    D, C = cfg.index_head_dim, cfg.ring_capacity
    caches = allocate_caches(cfg, num_pages=geo.num_pages, page_size=geo.page_size, num_tail_blocks=geo.num_tail_blocks,
                             ring_block_padding=geo.ring_block_padding, guard=geo.guard)
    out = [Check("the ring passed to the kernel is a non-contiguous padded-stride view",
                 not caches.tail_cache.is_contiguous(), f"strides {caches.tail_cache.stride()}")]
    for side, call in _sides(run, 0):
        ok = all(same_bits(ring_row(call, 3, s)[0], inputs.token(0, 8 + s)["k"])
                 and same_bits(ring_row(call, 3, s)[1], inputs.token(0, 8 + s)["gate"]) for s in range(3))
        out.append(Check(f"{side}: tail[3, :, 0..2] = K, gate of tokens 8, 9, 10", ok, verdict="ring-mismatch"))
    # Where a dense-stride kernel would have seeded block 3 (offset 3*2*C*D + s*D): in the padded
    # layout that is another block (or padding, which the harness's sentinel check covers): it
    # must still hold the sentinel.
    stride0 = 2 * C * D + geo.ring_block_padding
    for side, call in _sides(run, 1):
        bits = call.tail.view(torch.int32)
        hits, ok = 0, True
        for s_ in range(3):
            for d in range(D):
                blk, rem = divmod(3 * 2 * C * D + s_ * D + d, stride0)
                if rem >= 2 * C * D:
                    continue
                plane, rem = divmod(rem, C * D)
                slot, dd = divmod(rem, D)
                hits += 1
                ok &= blk != 3 and int(bits[blk, plane, slot, dd]) == FP32_SENTINEL_INT32
        out.append(Check(f"{side}: the {hits} dense-address elements of block 3 still hold the sentinel", ok and hits > 0,
                         verdict="stray-write"))
        want = compress_tokens([inputs.token(0, p) for p in range(8, 12)], run.case.ape)
        out.append(_bits_check(f"{side}: pool 2 = compress(k8, k9, k10, k11)", pool_row(call, 0, 2), want))
    return out


# ---- C05 ---------------------------------------------------------------------------------------

def _c05_cases() -> List[Case]:
    """P=4, a ring of 2 blocks (plus the harness's guard bands); the request owns block 1.
    (a) final chunk 200..209; (b) the same chunk with the ring block patched to 3537 (must be
    rejected on both sides, nothing written); (c) a pool-aligned final chunk 200..207.

    Adapted value: our ring write stores each request's last ``C`` rows (kpool-algorithm.md
    §5.4), so (a) also writes tokens 206, 207 into slots 2, 3 and (c) writes 204..207 into slots
    0..3; the public case's "slots 2 and 3 unchanged" / "no tail write" describe a ring that
    seeds only the open pool's tokens."""
    cfg = _cfg(index_topk=8)
    inputs = TokenInputs(cfg, seed=505)
    pages = list(range(14))
    context = _step("context", [(0, 200, pages, 1)], [0], inputs=inputs, compute_topk=False)
    geo = _geo(num_pages=16, page_size=4, blocks=2)
    a = _case("tail-seed-a", cfg, geo, [context, _step("chunk-200-209", [(200, 10, pages, 1)], [0], inputs=inputs)])
    b = _case("tail-seed-b-bad-block", cfg, geo, [
        context, _step("chunk-200-209-block-3537", [(200, 10, pages, 1)], [0], inputs=inputs,
                       patch_metadata=MetadataPatch("ring-block-out-of-range", (0, 3537, cfg.ring_capacity)),
                       expect_error=KPoolBlockIdError)])
    c = _case("tail-seed-c-aligned", cfg, geo, [context, _step("chunk-200-207", [(200, 8, pages, 1)], [0], inputs=inputs)])
    return [a, b, c]


def _c05_expect(runs) -> List[Check]:
    out = []
    a, b, c = runs["tail-seed-a"], runs["tail-seed-b-bad-block"], runs["tail-seed-c-aligned"]
    inputs = a.case.steps[0].inputs
    for side, call in _sides(a, 1):
        want = {0: 208, 1: 209, 2: 206, 3: 207}
        ok = all(same_bits(ring_row(call, 1, s)[0], inputs.token(0, p)["k"])
                 and same_bits(ring_row(call, 1, s)[1], inputs.token(0, p)["gate"]) for s, p in want.items())
        out.append(Check(f"(a) {side}: block 1 slots 0, 1 = tokens 208, 209 (2, 3 = 206, 207: last C rows)", ok,
                         verdict="ring-mismatch"))
    err = b.result.findings[b.result.findings["output"] == "error"]
    out.append(Check("(b) both sides reject ring block 3537 with KPoolBlockIdError (reference: ValueError)",
                     list(err["verdict"]) == ["exact"], "; ".join(err["detail"].astype(str))))
    for side in ("kernel", "reference"):
        call = b.call(1, side)
        out.append(Check(f"(b) {side}: raised before writing; ring bitwise unchanged",
                         call.error is not None and same_bits(call.tail, b.call(0, side).tail),
                         repr(call.error), "stray-write"))
    for side, call in _sides(c, 1):
        ok = all(same_bits(ring_row(call, 1, p % 4)[0], inputs.token(0, p)["k"]) for p in range(204, 208))
        out.append(Check(f"(c) {side}: pool-aligned chunk: ring holds its last C rows 204..207", ok,
                         verdict="ring-mismatch"))
    return out


def _c05_extra(device, runs) -> List[Check]:
    """(b) once more with ``validate=False`` (a captured graph skips validation): the kernels'
    own guards must store nothing into the ring, fault nothing, and leave guards untouched."""
    from kpool.cache import allocate_caches
    from kpool.indexer import forward
    from kpool.platform import torch_device
    from parity import sentinel as sen

    from .scenarios import step_metadata
    from .values import make_inputs

    run = runs["tail-seed-b-bad-block"]
    case = run.case
    cfg, geo = case.config, case.geometry
    dev = torch_device(device) if isinstance(device, str) else device
    caches = allocate_caches(cfg, num_pages=geo.num_pages, page_size=geo.page_size,
                             num_tail_blocks=geo.num_tail_blocks, guard=geo.guard)
    sen.lay_cache_sentinels(caches)
    caches = caches.to(dev)
    # Replay the context step, then the bad step without validation.
    ring_after_context = None
    for i, step in enumerate(case.steps):
        meta = step_metadata(case, step)
        inputs = make_inputs(case, step, meta)
        kw = {n: v.to(dev) for n, v in inputs.items()}
        kw.update({n: (v.to(dev) if isinstance(v, torch.Tensor) else v) for n, v in meta.forward_kwargs().items()})
        if i == 1:
            ring_after_context = caches.tail_backing.detach().cpu().clone()
        forward(**kw, ape=case.ape.to(dev), compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
                index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, compute_topk=step.compute_topk,
                validate=(i == 0))
    same = same_bits(caches.tail_backing.detach().cpu(), ring_after_context)
    return [Check("(b) validate=False: ring and its guard bands bitwise unchanged, no fault", same,
                  verdict="stray-write")]


# ---- C07 ---------------------------------------------------------------------------------------

def _c07_cases() -> List[Case]:
    cfg = _cfg(index_topk=8)                       # K = 2 pools, W = 11
    steps = [_step("packed-prefill", [(0, 3, [0], 1), (0, 13, [2, 3], 2)], [0, 1],
                   inputs=exact_logit_inputs({1: [1.0, 3.0, 2.0]}),
                   output_buffer=OutputBufferSpec(capacity=20, width=11))]
    return [_case("short-row-in-mixed-batch", cfg, _geo(num_pages=4, page_size=2, blocks=3), steps, values="exact")]


def _c07_expect(runs) -> List[Check]:
    run = runs["short-row-in-mixed-batch"]
    out = []
    for side, call in _sides(run, 0):
        r = rows(call)
        for t in range(3):
            out.append(_set_check(f"{side}: req0 pos {t} = {{0..{t}}}", r[t], range(t + 1)))
        want = {5: [0, 1, 2, 3, 4, 5], 7: list(range(8)), 11: list(range(4, 12)), 12: list(range(4, 13))}
        for p, w in want.items():
            out.append(_set_check(f"{side}: req1 pos {p}", r[3 + p], w))
        out.append(_row_check(f"{side}: req1 pos 11 row (pools 1, 2 by score)", r[3 + 11],
                              [4, 5, 6, 7, 8, 9, 10, 11, -1, -1, -1]))
        garbage = [v for row in r for v in row if v < -1 or v >= 13]
        out.append(Check(f"{side}: no garbage value anywhere", not garbage, f"{garbage[:5]}"))
    return out + _causal_checks(run, "C07")


# ---- C09 ---------------------------------------------------------------------------------------

def _c09_cases() -> List[Case]:
    cfg = _cfg(index_topk=4)                       # K = 1, W = 7
    steps = [_step("prefill-10", [(0, 10, [0], 1)], [0], inputs=exact_logit_inputs([1.0, 100.0]))]
    return [_case("own-incomplete-pool", cfg, _geo(num_pages=2, page_size=4, blocks=2), steps, values="exact")]


def _c09_expect(runs) -> List[Check]:
    run = runs["own-incomplete-pool"]
    want = {3: [0, 1, 2, 3, -1, -1, -1], 5: [0, 1, 2, 3, 4, 5, -1], 6: [0, 1, 2, 3, 4, 5, 6],
            7: [4, 5, 6, 7, -1, -1, -1], 9: [4, 5, 6, 7, 8, 9, -1]}
    out = []
    for side, call in _sides(run, 0):
        r = rows(call)
        out += [_row_check(f"{side}: pos {p}", r[p], w) for p, w in want.items()]
    return out + _causal_checks(run, "C09")


# ---- C11 ---------------------------------------------------------------------------------------

def _c11_inputs(case, step, metadata):
    cfg = case.config
    T, D = metadata.num_tokens, cfg.index_head_dim
    k = torch.zeros(T, D)
    k[:, 0] = torch.arange(1, T + 1, dtype=torch.float32)           # K[t] = (t + 1) * e0, flat row t
    return dict(k=k, gate=torch.zeros(T, D), q=torch.ones(T, cfg.index_n_heads, D, dtype=torch.bfloat16),
                weights=torch.full((T, cfg.index_n_heads), 2.0 ** -6))


def _c11_cases() -> List[Case]:
    cfg = _cfg(index_topk=8)
    steps = [_step("flat-prefill-6-7", [(0, 6, [3], 2), (0, 7, [1], 0)], [0, 1], inputs=_c11_inputs)]
    return [_case("request-boundary-pooling", cfg, _geo(num_pages=5, page_size=2, blocks=3), steps, values="exact")]


def _c11_expect(runs) -> List[Check]:
    run = runs["request-boundary-pooling"]
    out = []
    D = run.case.config.index_head_dim
    for side, call in _sides(run, 0):
        for r, v in ((0, 2.5), (1, 8.5)):
            want = torch.zeros(D, dtype=torch.bfloat16)
            want[0] = v
            out.append(_bits_check(f"{side}: req{r} pool 0 = {v} * e0 (not 6.5: flat rows 4..7)", pool_row(call, r, 0), want))
        for block, slot_rows in ((2, {0: 4, 1: 5}), (0, {0: 10, 1: 11, 2: 12})):
            ok = all(float(ring_row(call, block, s)[0, 0]) == t + 1 for s, t in slot_rows.items())
            out.append(Check(f"{side}: ring block {block} slots {list(slot_rows)} = flat rows {list(slot_rows.values())}",
                             ok, verdict="ring-mismatch"))
    return out


# ---- C13 ---------------------------------------------------------------------------------------

def _c13_cases() -> List[Case]:
    cfg = _cfg(index_topk=8)                       # K = 2
    inputs = exact_logit_inputs([3.0, 2.0, 2.0])
    steps = [_step("context", [(0, 12, [0, 1], 1)], [0], inputs=inputs, compute_topk=False),
             _step("decode-12", [(12, 1, [0, 1], 1)], [0], inputs=inputs)]
    return [_case("partial-pool-tie", cfg, _geo(num_pages=3, page_size=2, blocks=2), steps, values="exact")]


def _c13_expect(runs) -> List[Check]:
    run = runs["partial-pool-tie"]
    out = []
    for side, call in _sides(run, 1):
        out.append(_row_check(f"{side}: pool 0 + the lower tied pool 1 + tail 12", rows(call)[0],
                              [0, 1, 2, 3, 4, 5, 6, 7, 12, -1, -1]))
    return out + _causal_checks(run, "C13")


# ---- C15 ---------------------------------------------------------------------------------------

def _c15_cases() -> List[Case]:
    """Ragged MTP decode lens [1, 2, 3] (req0 at 20; req1 at 9, 10; req2 at 30..32 with tokens
    28, 29 in its ring beforehand), tail blocks [0, 1, 2]; flat and padded-grid (FULL, 3 x 3)."""
    cfg = _cfg(index_topk=8, num_speculative_tokens=2)          # C = 6
    inputs = TokenInputs(cfg, seed=1515)
    tables = {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}
    context = _step("context", [(0, 20, tables[0], 0), (0, 9, tables[1], 1), (0, 30, tables[2], 2)], [0, 1, 2],
                    inputs=inputs, compute_topk=False)
    ragged = [(20, 1, tables[0], 0), (9, 2, tables[1], 1), (30, 3, tables[2], 2)]
    geo = _geo(num_pages=10, page_size=4, blocks=3)
    flat = _case("ragged-flat", cfg, geo, [context, _step("decode-1-2-3", ragged, [0, 1, 2], inputs=inputs)])
    padded = _case("ragged-padded-grid", cfg, geo, [context, _step(
        "decode-1-2-3-padded", ragged, [0, 1, 2], inputs=inputs, num_tokens=9, full_mode=True,
        block_table_width=3)])
    return [flat, padded]


def _c15_expect(runs) -> List[Check]:
    flat, padded = runs["ragged-flat"], runs["ragged-padded-grid"]
    P = 4
    want_tails = [(20, [20]), (9, [8, 9]), (10, [8, 9, 10]), (30, [28, 29, 30]), (31, []), (32, [32])]
    out = []
    inputs = flat.case.steps[0].inputs
    for side, call in _sides(flat, 1):
        r = rows(call)
        for t, (p, tail) in enumerate(want_tails):
            got_tail = [v for v in r[t] if v >= (p + 1) // P * P]
            out.append(Check(f"{side}: row {t} (pos {p}) tail {tail}", got_tail == tail, f"got {got_tail}", "wrong-tail"))
        want = compress_tokens([inputs.token(2, p) for p in range(28, 32)], flat.case.ape)
        out.append(_bits_check(f"{side}: req2 pool 7 = compress(k28_ring, k29_ring, k30, k31)", pool_row(call, 2, 7), want))
        slots = call.meta["slot_mapping"].tolist()
        out.append(Check(f"{side}: pool 7 of req2 written by exactly one row", sum(1 for s in slots[3:6] if s >= 0) == 1))
    for side, call in _sides(padded, 1):
        r = rows(call)
        flat_rows = rows(flat.call(1, side))
        out.append(Check(f"{side}: padded grid live rows = flat rows", r[:6] == flat_rows, verdict="wrong-index"))
        out.append(Check(f"{side}: padded-grid rows 6..8 all -1", all(v == -1 for row in r[6:] for v in row),
                         verdict="padding-leak"))
        out.append(Check(f"{side}: padded grid leaves the same caches as flat",
                         same_bits(call.compressed, flat.call(1, side).compressed)
                         and same_bits(call.tail, flat.call(1, side).tail), verdict="cache-mismatch"))
    return out


# ---- C17 ---------------------------------------------------------------------------------------

def _c17_cases() -> List[Case]:
    """FULL graph captured at 8 tokens (uniform decode, next_n = 2, 4 request slots) replayed with
    3 real requests x 2 tokens plus 1 padded request (2 padding rows, slot -1) whose seq_len is
    (a) 0 (what the builder writes), (b) -4 (must be rejected by name, never crash), (c) a stale
    37; and the eager run without padding the real rows must equal."""
    cfg = _cfg(index_topk=8, num_speculative_tokens=1)          # C = 5
    inputs = TokenInputs(cfg, seed=1717)
    tables = {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}
    ring = {0: 1, 1: 2, 2: 3}
    lens = {0: 9, 1: 14, 2: 21}
    context = _step("context", [(0, lens[r], tables[r], ring[r]) for r in range(3)], [0, 1, 2], inputs=inputs,
                    compute_topk=False)
    real = [(lens[r], 2, tables[r], ring[r]) for r in range(3)]
    full = dict(num_tokens=8, full_mode=True, num_padded_requests=1, block_table_width=3)
    geo = _geo(num_pages=10, page_size=4, blocks=4)
    a = _case("full-pad-seq0", cfg, geo, [context, _step("replay-a", real, [0, 1, 2], inputs=inputs, **full)])
    b = _case("full-pad-seq-minus4", cfg, geo, [context, _step(
        "replay-b", real, [0, 1, 2], inputs=inputs, patch_metadata=_NegativePaddedLength(3, -4, 4),
        expect_error=KPoolMetadataError, **full)])
    c = _case("full-pad-seq37", cfg, geo, [context, _step(
        "replay-c", real, [0, 1, 2], inputs=inputs, patch_metadata=MetadataPatch("stale-padded-lengths", (3, 37, 4)),
        **full)])
    eager = _case("eager-no-padding", cfg, geo, [context, _step("eager", real, [0, 1, 2], inputs=inputs)])
    return [a, b, c, eager]


@dataclass(frozen=True)
class _NegativePaddedLength:
    """C17 (b): padded requests ``>= first`` get ``raw_seq_lens = value`` (``seq_lens = value // P``),
    e.g. -4 from MTP draft-extend metadata: invalid, rejected before launch."""

    first: int
    value: int
    P: int

    def __call__(self, meta):
        meta = meta.clone()
        meta.raw_seq_lens[self.first:] = self.value
        meta.seq_lens[self.first:] = self.value // self.P
        return meta


def _c17_expect(runs) -> List[Check]:
    out = []
    eager = runs["eager-no-padding"]
    for name in ("full-pad-seq0", "full-pad-seq37"):
        run = runs[name]
        for side, call in _sides(run, 1):
            r, e = rows(call), rows(eager.call(1, side))
            out.append(Check(f"{name} {side}: padding rows 6, 7 all -1", all(v == -1 for row in r[6:] for v in row),
                             verdict="padding-leak"))
            out.append(Check(f"{name} {side}: real rows = the eager run's", r[:6] == e, verdict="wrong-index"))
            out.append(Check(f"{name} {side}: caches = the eager run's",
                             same_bits(call.compressed, eager.call(1, side).compressed)
                             and same_bits(call.tail, eager.call(1, side).tail), verdict="cache-mismatch"))
    a = runs["full-pad-seq0"]
    out.append(Check("(a) after the builder the padded request's seq_len buffer is 0",
                     int(a.call(1).meta["seq_lens"][3]) == 0 and int(a.call(1).meta["raw_seq_lens"][3]) == 0))
    b = runs["full-pad-seq-minus4"]
    err = b.result.findings[b.result.findings["output"] == "error"]
    out.append(Check("(b) seq_len -4 rejected by name on both sides (KPoolMetadataError / ValueError), no crash",
                     list(err["verdict"]) == ["exact"], "; ".join(err["detail"].astype(str))))
    return out


def _c17_extra(device, runs) -> List[Check]:
    """(b) with ``validate=False``: no crash, padding rows -1, real rows and caches as eager."""
    eager = runs["eager-no-padding"]
    got = _direct_run(runs["full-pad-seq-minus4"].case, device, validate_last=False)
    r = got["out"][:, 0, :].tolist()
    ok_rows = r[:6] == rows(eager.call(1)) and all(v == -1 for row in r[6:] for v in row)
    ok_caches = same_bits(got["compressed"], eager.call(1).compressed) and same_bits(got["tail"], eager.call(1).tail)
    return [Check("(b) validate=False with seq_len -4: no crash, padding -1, real rows as eager", ok_rows),
            Check("(b) validate=False with seq_len -4: caches as eager", ok_caches, verdict="cache-mismatch")]


def _direct_run(case: Case, device, *, validate_last: bool = True, repeats: int = 1, step: int = -1,
                start_from: Optional[Call] = None):
    """Run ``case`` directly on ``kpool.indexer.forward`` (no harness) up to step ``step``
    (default the last), that one with ``validate=validate_last``; returns CPU copies ``out``,
    ``compressed``, ``tail`` after it. With ``repeats > 1`` that step runs that many times, each
    from a byte copy of the caches before it, and a list of such dicts is returned.
    ``start_from``: the recorded kernel call of the step before ``step``; its cache contents are
    loaded instead of re-running the earlier steps (long contexts are slow under the interpreter)."""
    from kpool.indexer import forward
    from kpool.platform import torch_device
    from parity import sentinel as sen

    from .values import make_inputs

    cfg, geo = case.config, case.geometry
    dev = torch_device(device) if isinstance(device, str) else device
    caches = geo.allocate(cfg)
    sen.lay_cache_sentinels(caches)
    caches = caches.to(dev)

    def launch(step, caches, validate):
        meta = build_metadata(step.batch, index_kpool=cfg.index_kpool, ring_capacity=cfg.ring_capacity,
                              page_size=geo.page_size)
        if step.patch_metadata is not None:
            meta = step.patch_metadata(meta)
        inputs = make_inputs(case, step, meta)
        out = forward(**{n: v.to(dev) for n, v in inputs.items()}, ape=case.ape.to(dev),
                      compressed_cache=caches.compressed_cache, tail_cache=caches.tail_cache,
                      **{n: (v.to(dev) if isinstance(v, torch.Tensor) else v) for n, v in meta.forward_kwargs().items()},
                      index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, score_mode=cfg.score_mode,
                      pack_tail=cfg.pack_tail, compute_topk=step.compute_topk, validate=validate)
        return dict(out=None if out is None else out.detach().cpu(), compressed=caches.compressed_cache.detach().cpu(),
                    tail=caches.tail_cache.detach().cpu())
    last = step % len(case.steps)
    if start_from is not None:
        caches.compressed_cache.copy_(start_from.compressed.to(dev))
        caches.tail_cache.copy_(start_from.tail.to(dev))
    else:
        for s in case.steps[:last]:
            launch(s, caches, True)
    results = [launch(case.steps[last], caches.clone() if repeats > 1 else caches, validate_last)
               for _ in range(repeats)]
    return results if repeats > 1 else results[0]


# ---- C19 ---------------------------------------------------------------------------------------

C19_REPLAYS = (
    dict(name="capture", tails=(0, 1), tables=((2,), (3,)), positions=(5, 9)),
    dict(name="replay-1", tails=(1, 0), tables=((3,), (2,)), positions=(6, 10)),
    dict(name="replay-2", tails=(1, 0), tables=((1,), (0,)), positions=(7, 11)),
)


def _c19_step(spec, inputs) -> Step:
    reqs = [(p, 1, list(t), ring) for p, t, ring in zip(spec["positions"], spec["tables"], spec["tails"])]
    return _step(spec["name"], reqs, [0, 1], inputs=inputs, num_tokens=2, full_mode=True, block_table_width=1)


def _c19_cases() -> List[Case]:
    """Batch-2 decode FULL graph: captured with tail blocks [0, 1], tables [[2], [3]], positions
    [5, 9]; replay 1 swaps blocks and tables (positions 6, 10); replay 2 completes both pools
    (positions 7, 11) with tables [[1], [0]]. The replays re-point requests at other physical
    blocks on purpose, so the physical state is no function of per-request history and the case
    runs without the oracle (kernel vs reference, and in-place replay vs eager, :func:`_c19_extra`)."""
    cfg = _cfg(index_topk=8)
    inputs = TokenInputs(cfg, seed=1919)
    return [_case("graph-replay-metadata", cfg, _geo(num_pages=4, page_size=4, blocks=2),
                  [_c19_step(s, inputs) for s in C19_REPLAYS])]


def _c19_expect(runs) -> List[Check]:
    run = runs["graph-replay-metadata"]
    out = []
    for i, spec in enumerate(C19_REPLAYS[1:], start=1):
        call = run.call(i)
        slots = call.meta["tail_slot_mapping"].tolist()
        want = [b * 4 + p % 4 for b, p in zip(spec["tails"], spec["positions"])]
        out.append(Check(f"{spec['name']}: ring slots follow the replay's tail blocks", slots == want, f"{slots} vs {want}"))
    call = run.call(2)
    slots = call.meta["slot_mapping"].tolist()
    want = [t[0] * 4 + p // 4 for t, p in zip(C19_REPLAYS[2]["tables"], C19_REPLAYS[2]["positions"])]
    out.append(Check("replay-2: pools written to the replay's pages [[1], [0]]", slots == want, f"{slots} vs {want}"))
    return out


def _c19_extra(device, runs) -> List[Check]:
    """Emulated graph replay: one captured :class:`kpool.metadata.KPoolMetadata` and fixed input
    and output buffers on the device, refreshed in place (``copy_``) before each
    ``validate=False`` launch; after each replay the caches and rows equal an eager run."""
    from kpool.cache import allocate_caches
    from kpool.indexer import forward
    from kpool.platform import torch_device
    from parity import sentinel as sen

    run = runs["graph-replay-metadata"]
    case = run.case
    cfg, geo = case.config, case.geometry
    dev = torch_device(device) if isinstance(device, str) else device

    def fresh():
        c = allocate_caches(cfg, num_pages=geo.num_pages, page_size=geo.page_size, num_tail_blocks=geo.num_tail_blocks,
                            guard=geo.guard)
        sen.lay_cache_sentinels(c)
        return c.to(dev)
    graph_caches, eager_caches = fresh(), fresh()
    captured: Optional[KPoolMetadata] = None
    buffers: Optional[dict] = None
    out_buf = torch.full((2, cfg.output_width), -777, dtype=torch.int32, device=dev)
    from .values import make_inputs
    checks = []
    for i, step in enumerate(case.steps):
        meta = build_metadata(step.batch, index_kpool=cfg.index_kpool, ring_capacity=cfg.ring_capacity,
                              page_size=geo.page_size)
        inputs = make_inputs(case, step, meta)
        if captured is None:
            captured = meta.to(dev)
            buffers = {n: v.to(dev) for n, v in inputs.items()}
        else:
            captured.copy_(meta.to(dev))
            for n, v in inputs.items():
                buffers[n].copy_(v.to(dev))
        common = dict(ape=case.ape.to(dev), index_topk=cfg.index_topk, index_kpool=cfg.index_kpool)
        g = forward(**buffers, **common, compressed_cache=graph_caches.compressed_cache,
                    tail_cache=graph_caches.tail_cache, **captured.forward_kwargs(), output_buffer=out_buf,
                    validate=False)
        e = forward(**{n: v.to(dev) for n, v in inputs.items()}, **common,
                    compressed_cache=eager_caches.compressed_cache, tail_cache=eager_caches.tail_cache,
                    **meta.to(dev).forward_kwargs())
        checks.append(Check(f"{step.name}: in-place replay rows = eager rows", same_bits(g.cpu(), e.cpu())))
        checks.append(Check(f"{step.name}: in-place replay caches = eager caches",
                            same_bits(graph_caches.compressed_backing.cpu(), eager_caches.compressed_backing.cpu())
                            and same_bits(graph_caches.tail_backing.cpu(), eager_caches.tail_backing.cpu()),
                            verdict="cache-mismatch"))
    return checks


# ---- C21 ---------------------------------------------------------------------------------------

def _c21_version(step_name: str, rid: int, pos: int) -> int:
    """Drafts that get rejected have other bits than the tokens replayed later."""
    return 1 if step_name.startswith("verify") and pos > 6 else 0


def _c21_cases() -> List[Case]:
    """Committed through pos 5 (pool 0 done, ring holds k4, k5); verify drafts at 6, 7, 8 (7
    completes pool 1), only 6 accepted; then k7', k8', k9'. Variants: 5 drafts (6..11, more than
    P); a run without speculation; and the negative control with an undersized ring ``C = P``
    (MTP-2 with 4 slots: kernels and reference agree, the oracle must not).

    Adapted value: our ring has ``C = P + spec`` slots, so k8', k9' sit at slots ``8 % C``,
    ``9 % C`` (slots 0 and 1 of the public case's P-slot ring)."""
    out = []
    for name, spec, drafts, capacity in (("mtp-2-drafts", 2, 3, None), ("mtp-5-drafts", 5, 6, None),
                                         ("mtp-undersized-ring", 2, 3, 4)):
        cfg = _cfg(index_topk=8, num_speculative_tokens=spec, tail_ring_capacity=capacity)
        inputs = TokenInputs(cfg, seed=2121, version=_c21_version)
        table = [0, 1]
        steps = [_step("prefill-0-5", [(0, 6, table, 1)], [0], inputs=inputs),
                 _step("verify-6", [(6, drafts, table, 1)], [0], inputs=inputs),
                 _step("replay-7-9", [(7, 3, table, 1)], [0], inputs=inputs)]
        out.append(_case(name, cfg, _geo(num_pages=3, page_size=4, blocks=2), steps))
    cfg = _cfg(index_topk=8, num_speculative_tokens=2)
    inputs = TokenInputs(cfg, seed=2121, version=_c21_version)
    table = [0, 1]
    out.append(_case("no-speculation", cfg, _geo(num_pages=3, page_size=4, blocks=2), [
        _step("prefill-0-5", [(0, 6, table, 1)], [0], inputs=inputs),
        _step("decode-6", [(6, 1, table, 1)], [0], inputs=inputs),
        _step("step-7-9", [(7, 3, table, 1)], [0], inputs=inputs)]))
    return out


def _c21_expect(runs) -> List[Check]:
    out = []
    base = runs["no-speculation"]
    inputs = base.case.steps[0].inputs
    for name in ("mtp-2-drafts", "mtp-5-drafts"):
        run = runs[name]
        C = run.case.config.ring_capacity
        for side, call in _sides(run, 2):
            want = compress_tokens([inputs.token(0, p) for p in (4, 5, 6, 7)], run.case.ape)
            out.append(_bits_check(f"{name} {side}: pool 1 = compress(k4, k5, k6, k7')", pool_row(call, 0, 1), want))
            out.append(_bits_check(f"{name} {side}: pool 1 = the non-speculative run's", pool_row(call, 0, 1),
                                   pool_row(base.call(2, side), 0, 1)))
            ok = all(same_bits(ring_row(call, 1, p % C)[0], inputs.token(0, p)["k"]) for p in (8, 9))
            out.append(Check(f"{name} {side}: ring slots 8 % C, 9 % C hold k8', k9'", ok, verdict="ring-mismatch"))
            out.append(Check(f"{name} {side}: rows of pos 7, 8, 9 = the non-speculative run's",
                             rows(call) == rows(base.call(2, side))))
    bad = runs["mtp-undersized-ring"].result.failures
    out.append(Check("undersized ring (C = P, MTP-2): only the oracle disagrees (reference-vs-oracle)",
                     not bad.empty and set(bad["output"]) == {"reference-vs-oracle"},
                     f"outputs {sorted(set(bad['output']))}"))
    return out


# ---- C23 ---------------------------------------------------------------------------------------

C23_COUNTS = (1500, 3, 1500, 1500)
C23_BUMPED = 64


def _c23_inputs(case, step, metadata):
    """P = 1 (a pool is a token). Keys: rows 0 and 2 random bf16 (random fp32 logits); row 3's
    pools ``[1, 0]`` except 64 pools ``[1, i * 2^-8]`` (i = 1..64), so with ``q = [1, 2^-12]`` the
    logits are exactly 1.0 and ``1 + i * 2^-20`` (one exponent, one coarse bin); row 1 random."""
    from .genvalues import random_bf16
    cfg = case.config
    T, T_live, D, H = metadata.num_tokens, metadata.num_live_tokens, cfg.index_head_dim, cfg.index_n_heads
    req = row_requests(metadata)
    k = torch.zeros(T, D)
    q = torch.zeros(T, H, D, dtype=torch.bfloat16)
    spread = {int(j): i + 1 for i, j in enumerate(torch.randperm(C23_COUNTS[3], generator=_generator(23, 3))[:C23_BUMPED])}
    for t in range(T_live):
        rid, p = step.request_ids[int(req[t])], int(metadata.positions[t])
        if rid == 3:
            k[t, 0] = 1.0
            k[t, 1] = spread.get(p, 0) * 2.0 ** -8
            q[t, 0, 0], q[t, 0, 1] = 1.0, 2.0 ** -12
        else:
            k[t] = random_bf16((D,), _generator(23, rid, p)).to(torch.float32)
            q[t, 0] = random_bf16((D,), _generator(230, rid, p))
    w = torch.ones(T, H)
    _fill_padding(T_live, k, torch.zeros(T, D), q, w, _generator(23))
    return dict(k=k, gate=torch.zeros(T, D), q=q, weights=w)


def _c23_cases() -> List[Case]:
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=1, index_topk=C23_BUMPED)
    B = 128
    tables = {r: list(range(r * 12, r * 12 + 12)) for r in range(4)}
    ring = {r: r for r in range(4)}
    ctx = [(0, n - 1, tables[r], ring[r]) for r, n in enumerate(C23_COUNTS)]
    launch = [(n - 1, 1, tables[r], ring[r]) for r, n in enumerate(C23_COUNTS)]
    steps = [_step("context", ctx, [0, 1, 2, 3], inputs=_c23_inputs, compute_topk=False)]
    steps += [_step(f"launch-{i}", launch, [0, 1, 2, 3], inputs=_c23_inputs) for i in range(3)]
    perm = [2, 0, 3, 1]
    steps.append(_step("launch-permuted", [launch[r] for r in perm], perm, inputs=_c23_inputs))
    return [_case("topk-state-across-rows", cfg, _geo(num_pages=48, page_size=B, blocks=4), steps)]


def _c23_expect(runs) -> List[Check]:
    from reference.numerics import pool_scores
    run = runs["topk-state-across-rows"]
    out = []
    K = C23_BUMPED
    for side in ("kernel", "reference"):
        first = run.call(1, side)
        r = rows(first)
        for rid in (0, 2):
            n = C23_COUNTS[rid]
            pools = torch.stack([pool_row(first, rid, j) for j in range(n)])
            scores = pool_scores(first.inputs["q"][rid:rid + 1], first.inputs["weights"][rid:rid + 1], pools)[0]
            want = sorted(torch.topk(scores, K).indices.tolist())
            out.append(_set_check(f"{side}: row {rid} = torch.topk set of its {n} random logits", r[rid], want))
        out.append(_set_check(f"{side}: row 1 = {{0, 1, 2}} + -1", r[1], [0, 1, 2]))
        spread = sorted(int(j) for j in torch.randperm(C23_COUNTS[3], generator=_generator(23, 3))[:K])
        out.append(_set_check(f"{side}: row 3 = exactly the 64 bumped pools", r[3], spread))
        for i in (2, 3):
            out.append(Check(f"{side}: launch {i} rows = launch 1 rows (no state from earlier launches)",
                             rows(run.call(i, side)) == r))
        perm = run.case.steps[4].request_ids
        permuted = rows(run.call(4, side))
        out.append(Check(f"{side}: permuted batch: every request's row unchanged",
                         all(permuted[i] == r[rid] for i, rid in enumerate(perm))))
    return out


# ---- C25 ---------------------------------------------------------------------------------------

def _c25_key(margin_exp: int):
    """Pool keys: dims 0, 1 set per pool (all P tokens share them, so the pooled key restores them
    exactly whatever the random gate and APE), other dims random. Ranked pools: 4 (v=2), then
    1 and 3 (v=1, u differing by 1), then 0, 2. With ``q = [1, 2^margin_exp, 0...]`` the 2nd/3rd
    logits differ by ``2^margin_exp``."""
    v = {0: 0.5, 1: 1.0, 2: 0.25, 3: 1.0, 4: 2.0}
    u = {0: 0.0, 1: 1.0, 2: 0.0, 3: 2.0, 4: 0.0}

    def k_of(rid, pos):
        from .genvalues import random_bf16
        j = pos // 4
        key = random_bf16((16,), _generator(25, rid, pos)).to(torch.float32)
        key[0], key[1] = v.get(j, 0.0), u.get(j, 0.0)
        return key

    def q_of(rid, pos):
        q = torch.zeros(2, 16, dtype=torch.bfloat16)          # head 1 stays 0 (weight 0 too)
        q[0, 0], q[0, 1] = 1.0, 2.0 ** margin_exp
        return q
    return k_of, q_of


def _c25_cases() -> List[Case]:
    """One decode row, K = 2, 5 visible pools, real softmax pooling (random gate and APE); the 2nd
    and 3rd logits differ by 2^-23 (1 fp32 ulp at 1.0, far below 1 bf16 ulp of the pooled key)
    or by 2^-17 (64 fp32 ulps)."""
    out = []
    for name, margin in (("near-tie-1ulp", -23), ("margin-64ulp", -17)):
        cfg = _cfg(index_topk=8)
        k_of, q_of = _c25_key(margin)
        inputs = TokenInputs(cfg, seed=2525, k=k_of, q=q_of, weights=lambda rid, pos: torch.tensor([1.0, 0.0]))
        ape = TokenInputs(cfg, seed=2526).token(0, 0)["gate"].repeat(4, 1) * torch.tensor([[1.0], [-0.5], [0.25], [2.0]])
        steps = [_step("context", [(0, 21, [0, 1], 1)], [0], inputs=inputs, compute_topk=False),
                 _step("decode-21", [(21, 1, [0, 1], 1)], [0], inputs=inputs)]
        out.append(_case(name, cfg, _geo(num_pages=3, page_size=4, blocks=2), steps, ape=ape))
    return out


def _c25_expect(runs) -> List[Check]:
    out = []
    for name in ("near-tie-1ulp", "margin-64ulp"):
        for side, call in _sides(runs[name], 1):
            out.append(_row_check(f"{name} {side}: pools 4 then 3 (logit 1 + 2 * 2^m beats 1 + 2^m)", rows(call)[0][:8],
                                  [16, 17, 18, 19, 12, 13, 14, 15]))
    return out


def _c25_extra(device, runs) -> List[Check]:
    """Kernel choice stable over repeated launches; the reference fed the kernel's bf16 cache
    rows reproduces the kernel's rows exactly."""
    from reference.stateful import forward as reference_forward
    checks = []
    for name in ("near-tie-1ulp", "margin-64ulp"):
        run = runs[name]
        repeats = [r["out"] for r in _direct_run(run.case, device, repeats=3 if _is_cpu(device) else 20,
                                                 start_from=run.call(0))]
        checks.append(Check(f"{name}: kernel rows identical over {len(repeats)} runs",
                            all(same_bits(r, repeats[0]) for r in repeats), verdict="nondeterministic"))
        call = run.call(1)
        kw = dict(call.inputs, **call.meta, ape=run.case.ape, compressed_cache=call.compressed.clone(),
                  tail_cache=call.tail.clone(), max_pool_seq_len=int(call.meta["seq_lens"].max()),
                  index_topk=run.case.config.index_topk, index_kpool=run.case.config.index_kpool)
        ref = reference_forward(**kw)
        checks.append(Check(f"{name}: reference on the kernel's bf16 rows = kernel rows", same_bits(ref, call.out)))
    return checks


def _is_cpu(device) -> bool:
    return str(device).startswith("cpu")


# ---- C27 ---------------------------------------------------------------------------------------

C27_VISIBLE = (300, 1, 299, 64)


def _c27_cases() -> List[Case]:
    """Decode batch of 4 x 1 token with visible pools [300, 1, 299, 64], H = 32, random bf16 q
    and k, K = 16 pools: an eager launch, then the same launch in FULL mode (8 token rows, static
    ``max_pool_seq_len``); the repeat rewrites identical cache rows. P = 1 (the case is about the
    logits kernel; a pool per token keeps the context short under the interpreter)."""
    cfg = KPoolConfig(index_n_heads=32, index_head_dim=16, index_kpool=1, index_topk=16)
    inputs = TokenInputs(cfg, seed=2727)
    pos = [v - 1 for v in C27_VISIBLE]                        # P = 1: visible = p + 1
    steps = _context_then_decode_steps(pos, inputs, num_tokens=8)
    return [_case("determinism", cfg, _geo(num_pages=40, page_size=32, blocks=4), steps)]


def _c27_expect(runs) -> List[Check]:
    from reference.numerics import pool_scores
    run = runs["determinism"]
    out = []
    for side, call in _sides(run, 1):
        r = rows(call)
        for i, v in enumerate(C27_VISIBLE):
            pools = torch.stack([pool_row(call, i, j) for j in range(v)])
            scores = pool_scores(call.inputs["q"][i:i + 1], call.inputs["weights"][i:i + 1], pools)[0]
            want = sorted(torch.topk(scores, min(16, v)).indices.tolist())
            out.append(_set_check(f"{side}: row {i} ({v} visible) = torch.topk set of its logits", r[i], want))
    return out + [Check("FULL-mode rows = eager rows", rows(run.call(2))[:4] == rows(run.call(1))),
            Check("FULL-mode padding rows all -1", all(v == -1 for row in rows(run.call(2))[4:] for v in row)),
            Check("sparse path ran: the 300-pool row selects 16 pools",
                  len(valid(rows(run.call(1))[0])) == 16)]


def _c27_extra(device, runs) -> List[Check]:
    """Logits (the score kernel's fp32 output) and rows bitwise identical across repeated eager
    and FULL-mode launches (20 + 20 on a device, 2 + 2 under the interpreter)."""
    from kpool.ops.indexer import score_pools
    from kpool.platform import torch_device

    n = 2 if _is_cpu(device) else 20
    dev = torch_device(device) if isinstance(device, str) else device
    run = runs["determinism"]
    cfg = run.case.config
    checks = []
    for i, label in ((1, "eager"), (2, "FULL-mode")):
        call = run.call(i)
        batch = run.case.steps[i].batch
        meta = {k: v.to(dev) for k, v in call.meta.items()}
        T_live = int(call.meta["cum_query_lens"][-1])
        mpsl = batch.block_table_width * run.case.geometry.page_size if batch.full_mode else int(call.meta["seq_lens"].max())
        cache = call.compressed.to(dev)
        logits = []
        for _ in range(n):
            out = torch.empty((T_live, mpsl), dtype=torch.float32, device=dev)
            score_pools(q=call.inputs["q"].to(dev), weights=call.inputs["weights"].to(dev), compressed_cache=cache,
                        positions=meta["positions"], cum_query_lens=meta["cum_query_lens"], seq_lens=meta["seq_lens"],
                        block_table=meta["block_table"], max_pool_seq_len=mpsl, index_kpool=cfg.index_kpool,
                        score_mode=cfg.score_mode, row_start=0, num_rows=T_live, out=out)
            logits.append(out.cpu())
        checks.append(Check(f"{label}: logits bitwise identical over {n} launches",
                            all(same_bits(x, logits[0]) for x in logits), verdict="nondeterministic"))
        outs = [r["out"] for r in _direct_run(run.case, device, repeats=n, step=i, validate_last=not batch.full_mode,
                                              start_from=run.call(i - 1))]
        checks.append(Check(f"{label}: rows bitwise identical over {n} runs and equal to the harness run",
                            all(same_bits(o, call.out) for o in outs), verdict="nondeterministic"))
    return checks


# ---- C29 ---------------------------------------------------------------------------------------

C29_VISIBLE = (600, 300, 0)


def _c29_cases() -> List[Case]:
    """P = 4, K_tok = 2048 (K = 512 pools, above the 256 cap of aclnnTopk): rows with 600, 300 and
    0 visible pools, an eager launch and the same launch in FULL mode (graph-replay shapes)."""
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=4, index_topk=2048)
    inputs = TokenInputs(cfg, seed=2929)
    pos = [4 * v + 2 for v in C29_VISIBLE]                  # visible = v, tail of 3 tokens
    steps = _context_then_decode_steps(pos, inputs, num_tokens=4)
    return [_case("k512", cfg, _geo(num_pages=30, page_size=64, blocks=3), steps)]


def _c29_expect(runs) -> List[Check]:
    from reference.numerics import pool_scores
    run = runs["k512"]
    out = []
    for side, call in _sides(run, 1):
        r = rows(call)
        pools = torch.stack([pool_row(call, 0, j) for j in range(600)])
        scores = pool_scores(call.inputs["q"][0:1], call.inputs["weights"][0:1], pools)[0]
        top = sorted(torch.topk(scores, 512).indices.tolist())
        want = sorted([j * 4 + i for j in top for i in range(4)] + [2400, 2401, 2402])
        out.append(_set_check(f"{side}: 600-pool row = torch.topk set (512 pools) + tail", r[0], want))
        out.append(Check(f"{side}: sparse path ran: 600-pool row selects {len(valid(r[0])) - 3} < 2400 history tokens",
                         len(valid(r[0])) - 3 == 2048 < 2400))
        out.append(_set_check(f"{side}: 300-pool row = its 300 pools + tail", r[1], list(range(1203))))
        out.append(Check(f"{side}: 300-pool row: -1 after its 1203 valid entries",
                         r[1][1203:] == [-1] * (len(r[1]) - 1203), verdict="wrong-index"))
        out.append(_row_check(f"{side}: 0-pool row = only its tail", r[2], [0, 1, 2] + [-1] * (len(r[2]) - 3)))
        full = rows(run.call(2, side))
        out.append(Check(f"{side}: FULL-mode replay rows = eager rows, padding row -1",
                         full[:3] == r and all(v == -1 for v in full[3])))
    return out


# ---- C31 ---------------------------------------------------------------------------------------

def _c31_k(rid, pos):
    s = pos % 4
    k = torch.zeros(16)
    k[0], k[1], k[2] = s + 1, -(s + 1), 10 * s
    return k


def _c31_gate(rid, pos):
    s = pos % 4
    g = torch.zeros(16)
    g[0] = 5.0 if s == 3 else 0.0
    g[1] = 5.0 if s == 0 else 0.0
    return g


C31_LN3 = float(torch.tensor(math.log(3.0), dtype=torch.float32))


def _c31_cases() -> List[Case]:
    """One pool, P = 4, ``k_s = [s+1, -(s+1), 10 s, 0]``, gates dim 0 ``[0,0,0,5]``, dim 1
    ``[5,0,0,0]``, dim 2 zero; APE 0 (A) or ``ape[3, 2] = ln 3`` (B). Request 0 compresses it in a
    prefill, request 1 by decodes (window from the ring, which stores the raw gate)."""
    cfg = KPoolConfig(index_n_heads=2, index_head_dim=16, index_kpool=4, index_topk=4)
    inputs = TokenInputs(cfg, seed=3131, k=_c31_k, gate=_c31_gate)
    out = []
    for name, ape_val in (("softmax-per-dim-A", 0.0), ("softmax-per-dim-B", C31_LN3)):
        ape = torch.zeros(4, 16)
        ape[3, 2] = ape_val
        steps = [_step("prefill+decode-0", [(0, 4, [0], 0), (0, 1, [1], 1)], [0, 1], inputs=inputs)]
        steps += [_step(f"decode-{p}", [(p, 1, [1], 1)], [1], inputs=inputs) for p in (1, 2, 3)]
        out.append(_case(name, cfg, _geo(num_pages=2, page_size=1, blocks=2), steps, ape=ape))
    return out


def _c31_expect(runs) -> List[Check]:
    e5 = math.exp(5.0)
    out = []
    for name, dim2 in (("softmax-per-dim-A", 15.0), ("softmax-per-dim-B", 20.0)):
        run = runs[name]
        want = torch.tensor([(1 + 2 + 3 + 4 * e5) / (3 + e5), (-e5 - 2 - 3 - 4) / (e5 + 3), dim2] + [0.0] * 13,
                            dtype=torch.float64).to(torch.float32).to(torch.bfloat16)
        for side in ("kernel", "reference"):
            prefill = pool_row(run.call(0, side), 0, 0)
            decode = pool_row(run.call(3, side), 0, 0)
            out.append(_bits_check(f"{name} {side}: prefill pool = bf16([3.96037, -1.03963, {dim2:g}, 0...])", prefill, want))
            out.append(_bits_check(f"{name} {side}: decode-completed pool = prefill pool", decode, prefill))
    return out


# ---- registry ----------------------------------------------------------------------------------

PUBLIC_CASES: Dict[str, PublicCase] = {pc.cid: pc for pc in (
    PublicCase("C01", "the decode tail writer produces the same pools as the prefill writer", _c01_cases, _c01_expect),
    PublicCase("C03", "a padded-stride tail ring is addressed by its strides", _c03_cases, _c03_expect),
    PublicCase("C05", "tail-seed stores are bounded by the number of tail blocks", _c05_cases, _c05_expect,
               extra=_c05_extra),
    PublicCase("C07", "rows with fewer visible pools than K never expand uninitialised pool ids", _c07_cases,
               _c07_expect),
    PublicCase("C09", "prefill scoring never admits the query's own incomplete pool", _c09_cases, _c09_expect),
    PublicCase("C11", "pooling never crosses a request boundary in a packed batch", _c11_cases, _c11_expect),
    PublicCase("C13", "never select a partial pool (ties)", _c13_cases, _c13_expect),
    PublicCase("C15", "ragged MTP decode lengths: every row's tail is its own request's", _c15_cases, _c15_expect),
    PublicCase("C17", "FULL-graph padding rows: seq_len 0, -4, stale 37", _c17_cases, _c17_expect, extra=_c17_extra),
    PublicCase("C19", "graph replay sees each step's new metadata (in place)", _c19_cases, _c19_expect,
               extra=_c19_extra, check_oracle=False),
    PublicCase("C21", "rejected draft keys never enter a later completed pool", _c21_cases, _c21_expect,
               must_fail=("mtp-undersized-ring",)),
    PublicCase("C23", "top-k independent of earlier launches and row order; coarse-bin ties", _c23_cases,
               _c23_expect),
    PublicCase("C25", "near-ties: same bits, same choice every run, reference on the kernel's rows", _c25_cases,
               _c25_expect, extra=_c25_extra),
    PublicCase("C27", "logits and rows bitwise deterministic run to run", _c27_cases, _c27_expect, extra=_c27_extra),
    PublicCase("C29", "K = 512 pools (above aclnnTopk's 256): 600 / 300 / 0 visible, replay = eager", _c29_cases,
               _c29_expect),
    PublicCase("C31", "per-dimension softmax over slots with APE, one bf16 round", _c31_cases, _c31_expect),
)}
"""Every public case by id."""
