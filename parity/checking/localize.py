"""Localisation of kernel-side findings (parity-contract.md §6): for each finding's first element,
the token row that writes it this step (its position, request, pool id) and, when the production
kernels (or a mutant copy of them) ran, the kernel and program id of the launch that wrote it
(:mod:`parity.checking.programs`). Best effort: a launcher whose tiling changed leaves the program blank.
"""
from __future__ import annotations

import bisect
import sys
from typing import List, Optional

import torch

from . import programs
from .determinism import DETERMINISM_OUTPUT
from ..implementations.forwards import backend_of
from .oracle_check import ORACLE_OUTPUT


def kernel_package(fn) -> Optional[str]:
    """``"kpool"`` (or a mutant copy's package) when ``fn`` is ``<package>.indexer.forward`` of a
    package whose kernel modules are loaded; else ``None`` (a stand-in forward has no programs)."""
    mod = getattr(fn, "__module__", "") or ""
    if not mod.endswith(".indexer"):
        return None
    pkg = mod[: -len(".indexer")]
    return pkg if f"{pkg}.ops.compress" in sys.modules and f"{pkg}.ops.indexer" in sys.modules else None


def localize(rows: List[dict], case, meta, kbuf, kernel_forward, dev: torch.device, *,
             max_score_rows: Optional[int] = None) -> None:
    """Add the writer of each kernel-side finding's first element, in place (parity-contract.md
    §6): for compressed-cache and ring elements the token row that writes them this step (its
    position, request, pool id) and, when the production kernels ran, the kernel
    (``compress`` / ``ring_write``) and program of the cache-update launch; for index elements the
    program of the expansion launch and, in the detail, the score kernel, chunk and program that
    scored the element's pool.

    Args:
        rows: finding dicts (:func:`parity.checking.compare.finding`), updated in place.
        case, meta: the case and the step's metadata (``kpool.metadata.Metadata``, host or device).
        kbuf: the kernel side's caller output buffer (or ``None``).
        kernel_forward: the forward that ran (programs are named only for a ``kpool`` copy).
        dev: the kernels' torch device.
        max_score_rows: the step's ``max_score_rows`` when the forward got one (chunked scoring).
    """
    cfg, B = case.config, case.geometry.page_size
    P, C, D = cfg.index_kpool, cfg.ring_capacity, cfg.index_head_dim
    pos = meta.positions.detach().cpu().tolist()
    slots = meta.slot_mapping.detach().cpu().tolist()
    tslots = meta.tail_slot_mapping.detach().cpu().tolist()
    cum = [int(c) for c in meta.cum_query_lens.detach().cpu().tolist()]
    T = len(pos)
    t_live = min(cum[-1], T) if cum else 0
    pkg = kernel_package(kernel_forward)
    backend = backend_of(dev)

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

    def cache_writer(r, t, kernel_name):
        # Token row t wrote this cache element: locate it, and name the program of the
        # cache-update launch (launch 1 "compress" or launch 2 "ring_write") that ran it.
        r.setdefault("row", t)
        r.setdefault("position", pos[t])
        r.setdefault("request", bisect.bisect_right(cum, t))
        pid = program(programs.cache_update_program, t, num_rows=T, head_dim=D, index_kpool=P,
                      kernel=kernel_name, backend=backend, device=dev, channel=int(r.get("channel") or 0),
                      cum_query_lens=cum, ring_capacity=C)
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
                sp = program(programs.score_program, r["row"], r["pool_id"], cum_query_lens=cum, num_rows=T,
                             max_pool_seq_len=meta.max_pool_seq_len, num_heads=cfg.index_n_heads, head_dim=D,
                             score_mode=cfg.score_mode, backend=backend, device=dev,
                             max_score_rows=max_score_rows)
                name = program(programs.score_kernel, r["row"], cum)
                if sp is not None and name is not None:
                    note(r, f"pool {r['pool_id']} scored by {name} in score chunk {sp[0]}, program {sp[1]}")
