"""Bitwise comparators and triage classes (parity-contract.md §1, §6), and
:func:`assert_bitwise_equal`, the tests' one bitwise assertion.

Every comparator returns a list of *findings* (:mod:`parity.findings.vocabulary`: plain dicts, one per
(output, class)); an output that matches produces one ``exact`` finding, so the results table
shows everything that was checked. Bit views come from :func:`cases.bits.bits`.

Comparison rules (parity-contract.md §1):

* ``indices`` int32 ``[T, 1, W]``: bitwise. A differing element in a padding row
  (``t >= cum_query_lens[-1]``) or an alignment column (``>= W`` of a caller buffer) is
  ``padding-leak``; in a live row's tail columns (§4.5 step 2) ``wrong-tail``; anywhere else
  ``wrong-index``. ``compute_topk=False`` requires ``None`` on both sides.
* compressed cache bf16 ``[N, B, 1, D]``: bitwise on the int16 bits, whole tensor:
  ``cache-mismatch`` (``nan-introduced`` where the kernel holds NaN and the reference does not).
* tail ring fp32 ``[blocks, 2, C, D]``: bitwise on the int32 bits: ``ring-mismatch`` /
  ``nan-introduced``.
* sentinels (§4): ``stray-write`` / ``missing-write`` per buffer and side (:mod:`parity.checking.sentinel`).
* bad input (§5): the same exception type on both sides, else ``not-rejected`` / ``crash``.

Certified exceptions (§3.1 rounding boundary, §3.2 tie) come from :mod:`parity.checking.certificates`
(derivations: docs/certificates.md): the comparators take a per-step context
(:class:`parity.checking.certificates.RoundingContext`, :class:`parity.checking.certificates.TieContext`) and
without one (exact-data cases) certify nothing. :func:`compare_indices` takes the
implementation's tie policy (``canonical`` or ``any``, :data:`parity.checking.certificates.TIE_POLICIES`).
Uncertified differences carry the certificate's reason in ``detail``.
"""
from __future__ import annotations

import bisect
from typing import List, Optional, Sequence

import torch

from cases.bits import bits, same_bits
from reference.numerics import tail_start

# The tests' assertion lives in .bitwise; callers use it through here too.
from .bitwise import assert_bitwise_equal, bitwise_mismatch
from .certificates import certify_rounding_boundaries, certify_ties, check_tie_policy
# The findings vocabulary lives in parity.findings.vocabulary; comparators' callers use it through here too.
from ..findings.vocabulary import (FINDING_COLUMNS, LOCATION_COLUMNS, PASS_VERDICTS, TEXT_LOCATION_COLUMNS, VERDICTS,
                                   crash_finding, finding, findings_frame, is_failure)

__all__ = ["assert_bitwise_equal", "bitwise_mismatch", "bits", "same_bits", "compare_indices", "compare_compressed",
           "compare_ring", "compare_errors", "sentinel_findings", "exception_kind", "tail_column_mask",
           "FINDING_COLUMNS", "LOCATION_COLUMNS", "PASS_VERDICTS", "TEXT_LOCATION_COLUMNS", "VERDICTS",
           "crash_finding", "finding", "findings_frame", "is_failure"]

# --------------------------------------------------------------------------- indices

def _request_of(cum: Sequence[int], t: int) -> int:
    """kpool-algorithm.md §3.4: ``r(t) = #{i : cum[i] <= t}`` (``R`` for padding rows)."""
    return bisect.bisect_right(list(cum), t)


def tail_column_mask(positions: torch.Tensor, num_rows: int, *, index_topk: int, index_kpool: int,
                     pack_tail: bool, width: int) -> torch.Tensor:
    """bool ``[num_rows, width]``: the tail columns of every row (kpool-algorithm.md §4.5 step 2):
    ``[tail_col, tail_col + P - 1)`` with ``tail_col = min(tail_start, K_tok)`` (packed) or
    ``K_tok`` (fixed), ``tail_start = (p + 1) // P * P``. Empty when ``P == 1`` or when
    ``width <= K_tok`` (rows without a tail: ``always_select_tail=False``)."""
    P, K = index_kpool, index_topk
    mask = torch.zeros(num_rows, width, dtype=torch.bool)
    if P == 1 or width <= K:
        return mask
    first = tail_start(positions.detach().cpu()[:num_rows], P)
    tail_col = torch.clamp(first, max=K) if pack_tail else torch.full_like(first, K)
    cols = torch.arange(width)[None, :]
    return (cols >= tail_col[:, None]) & (cols < tail_col[:, None] + P - 1)


def compare_indices(kernel, reference, *, positions: torch.Tensor, cum_query_lens: torch.Tensor,
                    index_topk: int, index_kpool: int, pack_tail: bool, compute_topk: bool,
                    kernel_buffer: Optional[torch.Tensor] = None,
                    reference_buffer: Optional[torch.Tensor] = None,
                    output: str = "indices", context=None, tie_policy: str = "canonical") -> List[dict]:
    """Compare the returned index rows bitwise (parity-contract.md §1-§2).

    Args:
        kernel / reference: int32 ``[T, 1, W]`` or ``None`` (any device).
        positions: int64 ``[T]``; cum_query_lens: int32 ``[R]`` (the step's metadata).
        index_topk / index_kpool / pack_tail: ``K_tok``, ``P``, tail layout.
        compute_topk: ``False`` requires ``None`` on both sides.
        kernel_buffer / reference_buffer: the int32 ``[capacity, width]`` caller buffers when the
            step used one; their alignment columns ``[:T, W:width]`` are compared too, and each
            side's ``[:T, :W]`` must hold exactly the rows it returned.
        context: :class:`parity.checking.certificates.TieContext` of the step, or ``None`` (no
            certificate: exact-data cases under the ``canonical`` tie policy).
        tie_policy: ``"canonical"`` (exact ties to the lower pool id, the contract's default) or
            ``"any"`` (exact ties may be ordered or chosen differently; certified rows say
            ``ties=any`` in their detail), :func:`parity.checking.certificates.certify_ties`.

    Returns:
        Findings: ``exact``, or one per class among ``padding-leak``, ``wrong-tail``,
        ``tie-equivalent`` (rows certified by parity-contract.md §3.2; only rows whose tail
        columns agree qualify) and ``wrong-index``, each with the first mismatch's row,
        position, request, column, pool id (reference value // P, else kernel's).

    Raises:
        ValueError: unknown ``tie_policy``.
    """
    check_tie_policy(tie_policy)
    if not compute_topk or kernel is None or reference is None:
        if kernel is None and reference is None:
            return [finding(output, "exact", detail="None on both sides" if not compute_topk else "")]
        who = [n for n, v in (("kernel", kernel), ("reference", reference))
               if (v is None) == compute_topk]
        want = "a tensor" if compute_topk else "None (compute_topk=False)"
        return [finding(output, "wrong-index", 1, detail=f"{' and '.join(who)} did not return {want}")]
    k, r = kernel.detach().cpu(), reference.detach().cpu()
    if k.shape != r.shape or k.dtype != r.dtype:
        return [finding(output, "wrong-index", max(k.numel(), r.numel(), 1),
                        detail=f"kernel {k.dtype}{list(k.shape)} vs reference {r.dtype}{list(r.shape)}")]
    T = k.shape[0]
    if T == 0:  # a step without rows: equal shapes are all there is to compare
        return [finding(output, "exact", detail="no rows")]
    k2, r2 = k.reshape(T, -1), r.reshape(T, -1)
    W = k2.shape[1]
    P = index_kpool
    cum = [int(c) for c in cum_query_lens.detach().cpu().tolist()]
    t_live = min(cum[-1], T) if cum else 0
    pos = positions.detach().cpu().to(torch.int64)

    diff = k2 != r2
    padding = torch.zeros_like(diff)
    padding[t_live:] = True
    tail = tail_column_mask(pos, T, index_topk=index_topk, index_kpool=P, pack_tail=pack_tail, width=W)
    tail &= ~padding
    history = ~padding & ~tail

    # Alignment columns >= W of the caller buffers are padding too (§2).
    align_diff = None
    if kernel_buffer is not None and reference_buffer is not None:
        kb, rb = kernel_buffer.detach().cpu()[:T, W:], reference_buffer.detach().cpu()[:T, W:]
        align_diff = kb != rb

    def loc(mask: torch.Tensor, kvals: torch.Tensor, rvals: torch.Tensor, col_offset: int = 0,
            with_pool: bool = False) -> dict:
        t, c = (int(x) for x in mask.nonzero()[0])
        kv, rv = int(kvals[t, c]), int(rvals[t, c])
        pool = None
        if with_pool:  # history columns only: the pool behind the token id
            pool = rv // P if rv >= 0 else (kv // P if kv >= 0 else None)
        p = int(pos[t]) if t < pos.numel() else None
        return {"row": t, "position": p, "request": _request_of(cum, t), "column": c + col_offset,
                "pool_id": pool, "_kr": (kv, rv)}

    out = []
    pad_mask = diff & padding
    n_pad = int(pad_mask.sum()) + (int(align_diff.sum()) if align_diff is not None else 0)
    if n_pad:
        if pad_mask.any():
            where = loc(pad_mask, k2, r2)
        else:
            where = loc(align_diff, kernel_buffer.detach().cpu()[:T, W:],
                        reference_buffer.detach().cpu()[:T, W:], col_offset=W)
        kv, rv = where.pop("_kr")
        out.append(finding(output, "padding-leak", n_pad, detail=f"kernel={kv} reference={rv}", **where))
    tail_mask = diff & tail
    if tail_mask.any():
        where = loc(tail_mask, k2, r2)
        kv, rv = where.pop("_kr")
        out.append(finding(output, "wrong-tail", int(tail_mask.sum()),
                           detail=f"kernel={kv} reference={rv}", **where))
    # The result must be the caller's buffer (kpool-algorithm.md §4.5: output_buffer[:T, :W]
    # viewed as [T, 1, W]); a side returning other rows than it left in the buffer is wrong.
    for side, ret, buf in (("kernel", k2, kernel_buffer), ("reference", r2, reference_buffer)):
        if buf is None:
            continue
        held = buf.detach().cpu()[:T, :W]
        apart = held != ret if held.shape == ret.shape else torch.ones_like(ret, dtype=torch.bool)
        if apart.any():
            where = loc(apart, ret, held if held.shape == ret.shape else ret)
            kv, rv = where.pop("_kr")
            out.append(finding(output, "wrong-index", int(apart.sum()),
                               detail=f"{side} returned {kv} but left {rv} in output_buffer "
                                      f"(the result must be output_buffer[:T, :W])", **where))
    hist_mask = diff & history
    if hist_mask.any():
        # §3.2: a row is certifiable only if its tail (and padding) columns agree.
        rows = (hist_mask.any(dim=1) & ~tail_mask.any(dim=1)).nonzero().flatten()
        cert, reasons = certify_ties(k2, r2, rows, context, tail, tie_policy=tie_policy)
        certified_rows = rows[cert]
        if certified_rows.numel():
            t0 = int(certified_rows[0])
            out.append(finding(output, "tie-equivalent", int(hist_mask[certified_rows].sum()),
                               detail=f"{certified_rows.numel()} rows certified tie-equivalent"
                                      + (" (ties=any: exact ties may be ordered differently)"
                                         if tie_policy == "any" else ""),
                               row=t0, position=int(pos[t0]) if t0 < pos.numel() else None,
                               request=_request_of(cum, t0)))
            hist_mask[certified_rows] = False
        why = {int(t): r for t, r, c in zip(rows.tolist(), reasons, cert.tolist()) if not c}
        if hist_mask.any():
            where = loc(hist_mask, k2, r2, with_pool=True)
            kv, rv = where.pop("_kr")
            reason = why.get(where["row"], "tail columns differ too" if context is not None else "")
            out.append(finding(output, "wrong-index", int(hist_mask.sum()),
                               detail=f"kernel={kv} reference={rv}; {int(hist_mask.any(1).sum())} rows differ"
                                      + (f"; not a tie: {reason}" if reason else ""),
                               **where))
    return out or [finding(output, "exact")]


# --------------------------------------------------------------------------- caches

def _cache_findings(output: str, kbits: torch.Tensor, rbits: torch.Tensor, knan: torch.Tensor,
                    rnan: torch.Tensor, names: Sequence[Optional[str]], mismatch_class: str,
                    certify=None) -> List[dict]:
    diff = kbits != rbits
    out = []
    reason = ""
    if certify is not None and diff.any():
        cert, reason = certify(kbits, rbits, diff)
        cert &= diff
        if cert.any():
            out.append(finding(output, "rounding-boundary", int(cert.sum()),
                               detail=f"{int(cert.sum())} elements certified on a bf16 rounding boundary",
                               **_coords(cert, names)))
            diff &= ~cert
    nan_new = diff & knan & ~rnan
    other = diff & ~nan_new
    for mask, verdict in ((nan_new, "nan-introduced"), (other, mismatch_class)):
        if mask.any():
            coords = _coords(mask, names)
            first = tuple(int(x) for x in mask.nonzero()[0])
            detail = (f"kernel=0x{int(kbits[first]) & _mask_bits(kbits):X} "
                      f"reference=0x{int(rbits[first]) & _mask_bits(rbits):X}")
            if reason and verdict == mismatch_class:
                detail += f"; not a rounding boundary: {reason}"
            out.append(finding(output, verdict, int(mask.sum()), detail=detail, **coords))
    return out or [finding(output, "exact")]


def _mask_bits(t: torch.Tensor) -> int:
    return 0xFFFF if t.dtype == torch.int16 else 0xFFFFFFFF


def _coords(mask: torch.Tensor, names: Sequence[Optional[str]]) -> dict:
    first = mask.nonzero()[0].tolist()
    return {n: int(c) for n, c in zip(names, first) if n is not None}


def compare_compressed(kernel_cache: torch.Tensor, reference_cache: torch.Tensor,
                       output: str = "compressed_cache", context=None, claimed_bitwise: bool = False) -> List[dict]:
    """Compare bf16 ``[N, B, 1, D]`` compressed caches on their int16 bits, whole tensor.

    Args:
        context: :class:`parity.checking.certificates.RoundingContext` of the step, or ``None`` (no
            certificate: exact-data cases).
        claimed_bitwise: the implementation claims its cache bitwise (issue 19 family 5): no
            certificate, and every mismatch says so.

    Returns findings ``exact``, ``rounding-boundary`` (certified elements, parity-contract.md
    §3.1, a zero of the other sign included; with certificates on and no bitwise claim, also a
    NaN whose payload differs: IEEE 754 leaves an operation's NaN payload open,
    docs/certificates.md §2.4), ``cache-mismatch`` /
    ``nan-introduced`` (first at page, page_row, channel).
    Raises:
        ValueError: shapes or dtypes differ (a harness bug: both sides share one layout).
    """
    if kernel_cache.shape != reference_cache.shape or kernel_cache.dtype != reference_cache.dtype:
        raise ValueError(f"cache layouts differ: {kernel_cache.shape} vs {reference_cache.shape}")
    k, r = kernel_cache.detach().cpu(), reference_cache.detach().cpu()
    knan, rnan = torch.isnan(k), torch.isnan(r)
    if claimed_bitwise:
        def certify(a, b, d):
            return torch.zeros_like(d), "claimed bitwise by the implementation: no certificate applies"
    else:
        # IEEE 754 leaves the payload of an operation's NaN result open: docs/certificates.md §2.4
        same_value = knan & rnan

        def certify(a, b, d):
            cert, reason = certify_rounding_boundaries(a, b, d, context)
            if context is not None:
                cert = cert | (d & same_value)
            return cert, reason
    return _cache_findings(output, bits(k), bits(r), knan, rnan,
                           ("page", "page_row", None, "channel"), "cache-mismatch", certify=certify)


def compare_ring(kernel_ring: torch.Tensor, reference_ring: torch.Tensor,
                 output: str = "tail_ring") -> List[dict]:
    """Compare fp32 ``[blocks, 2, C, D]`` rings on their int32 bits, whole tensor.

    Returns findings ``exact`` or ``ring-mismatch`` / ``nan-introduced`` (first at block, plane,
    slot, channel).
    Raises:
        ValueError: shapes or dtypes differ.
    """
    if kernel_ring.shape != reference_ring.shape or kernel_ring.dtype != reference_ring.dtype:
        raise ValueError(f"ring layouts differ: {kernel_ring.shape} vs {reference_ring.shape}")
    k, r = kernel_ring.detach().cpu(), reference_ring.detach().cpu()
    return _cache_findings(output, bits(k), bits(r), torch.isnan(k), torch.isnan(r),
                           ("block", "plane", "slot", "channel"), "ring-mismatch")


# --------------------------------------------------------------------------- sentinels, errors

def sentinel_findings(checks, side: str) -> List[dict]:
    """Findings of :class:`parity.checking.sentinel.SentinelCheck` results of one side
    (``"kernel"``/``"reference"``); output name ``sentinel:<buffer>[<side>]``."""
    out = []
    for chk in checks:
        name = f"sentinel:{chk.buffer}[{side}]"
        if chk.ok:
            out.append(finding(name, "exact"))
        for count, where, verdict, what in ((chk.stray, chk.first_stray, "stray-write", "changed outside the write set"),
                                            (chk.missing, chk.first_missing, "missing-write", "still sentinel inside the write set")):
            if count:
                where = dict(where or {})
                out.append(finding(name, verdict, count, detail=f"{count} elements {what}", **where))
    return out


def exception_kind(exc: BaseException, kind: type) -> bool:
    """Whether ``exc`` is a ``kind``, by class *name* along the MRO (a mutant package or the
    reference may define its own copy of the :mod:`kpool.errors` classes)."""
    return any(c.__name__ == kind.__name__ for c in type(exc).__mro__)


def _same_error_type(kernel_exc: BaseException, reference_exc: BaseException) -> bool:
    """"Same exception type" across a package boundary: the reference never imports
    :mod:`kpool` (docs/design.md), so it may raise a builtin base of the kernel's named error
    (``ValueError`` for ``KPoolMetadataError``). Accept the reference's type when its name is in
    the kernel exception's MRO, except the catch-alls ``Exception``/``BaseException``."""
    names = {c.__name__ for c in type(kernel_exc).__mro__} - {"Exception", "BaseException", "object"}
    return type(reference_exc).__name__ in names


def compare_errors(kernel_exc: Optional[BaseException], reference_exc: Optional[BaseException],
                   expected: type, output: str = "error", rule: Optional[str] = None) -> List[dict]:
    """parity-contract.md §5: both sides must reject the bad input with the same exception type.

    The kernel must raise an ``expected`` (by class name along its MRO, see
    :func:`exception_kind`); the reference must raise the same type or a builtin base of it
    (:func:`_same_error_type`).

    ``rule``: the :data:`kpool.rules.RULES` name the kernel's exception must carry (its ``rule``
    attribute), or ``None`` for any.

    Returns one finding: ``exact``; ``not-rejected`` when a side raised nothing; ``crash`` when a
    side raised something else, or the kernel's exception names another rule than ``rule``. (That nothing was written is checked by the sentinels with an
    empty write set and by the cache comparisons.)
    """
    def name(e):
        return "nothing" if e is None else f"{type(e).__name__}({e})"[:200]
    both = f"kernel: {name(kernel_exc)}; reference: {name(reference_exc)}"
    missing = [s for s, e in (("kernel", kernel_exc), ("reference", reference_exc)) if e is None]
    if missing:
        return [finding(output, "not-rejected", len(missing),
                        detail=f"expected {expected.__name__}; {' and '.join(missing)} raised nothing ({both})")]
    if not exception_kind(kernel_exc, expected) or not _same_error_type(kernel_exc, reference_exc):
        return [finding(output, "crash", 1, detail=f"expected {expected.__name__} on both sides; {both}")]
    if rule is not None and getattr(kernel_exc, "rule", None) != rule:
        return [finding(output, "crash", 1, detail=f"expected rule {rule!r}, kernel raised rule "
                                                   f"{getattr(kernel_exc, 'rule', None)!r}; {both}")]
    return [finding(output, "exact", detail=f"kernel {type(kernel_exc).__name__}, "
                                            f"reference {type(reference_exc).__name__}")]
