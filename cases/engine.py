"""A tiny serving-engine model that turns scheduler decisions into parity steps
(kpool-algorithm.md §5.2, §5.4, §6 batch shapes; §11 "Harness scenarios").

:class:`EngineSim` owns the allocation state a real engine has over one persistent cache pair:
a free list of compressed pages (reference-counted, so a prefix-cache hit can share full pages),
a free list of ring blocks, and per request its committed length, pages and ring block. Each call
of :meth:`EngineSim.step` records one :class:`cases.spec.Step` (a batch of request actions) and
advances the committed lengths; :meth:`EngineSim.build` returns the :class:`cases.spec.Case`.

Request actions inside one step: zero-length (present, no rows), decode (1 row), a prefill
chunk (``n`` rows starting at the committed length, so at any residue mod P), or an MTP verify
(``1 + s`` rows, of which ``1 + accepted`` are kept: the next step replays from the first rejected
position, kpool-algorithm.md §5.4). Between steps a request may finish (its pages and ring block
return to the free lists and are handed to later requests with stale contents), and new requests
are admitted fresh or as a pool- and page-aligned prefix resume of a live one (shared pages, a
garbage ring; the oracle forks the history, ``Step.forks``).

Free lists are stacks: the most recently freed page / ring block is first, so a choice of index 0
(what hypothesis shrinks to) reuses it. Every choice goes through the ``pick(n) -> index`` callback
the caller supplies (hypothesis draws in :mod:`cases.strategies`, a ``random.Random`` elsewhere).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from kpool.config import KPoolConfig
from kpool.metadata import BatchSpec, RequestSpec

from .spec import Case, CacheGeometry, OutputBufferSpec, Step


@dataclass
class SimRequest:
    """Scheduler state of one live request.

    Attributes:
        rid: case-level request id. committed: tokens whose K/gate are final (the next step's
        ``cached_len``). pages: physical compressed pages, logical order. ring_block: its ring block.
    """

    rid: int
    committed: int
    pages: List[int]
    ring_block: int


@dataclass(frozen=True)
class Action:
    """One request's part of a step.

    Attributes:
        rid: the request. query_len: rows this step (0 = zero-length request).
        accepted: MTP verify only: drafts accepted of ``query_len - 1``; the committed length then
            advances by ``1 + accepted`` instead of ``query_len``.
    """

    rid: int
    query_len: int
    accepted: Optional[int] = None


@dataclass(frozen=True)
class FullMode:
    """FULL-graph replay parameters (kpool-algorithm.md §6): ``pad_rows`` rows past the live ones,
    ``padded_requests`` zero-length requests, ``stale`` positive ring slots on padding rows."""

    pad_rows: int = 0
    padded_requests: int = 0
    stale: bool = False


class EngineSim:
    """Allocation state and step recorder (module docstring).

    Args:
        config: the case configuration (P, C = ring capacity).
        page_size: ``B`` pools per compressed page.
        num_pages: physical pages (enough for ``max_live * max_pages`` plus spares).
        num_ring_blocks: ring blocks (at least the most requests alive at once).
        max_pages: pages per request (the FULL-mode static block-table width).
        pick: ``fn(n) -> int in [0, n)`` choosing from a free list.

    Attributes:
        requests: live requests by id. steps: recorded steps. events: ``Counter`` of engine events
            (``finish``, ``reuse-ring``, ``reuse-pages``, ``fork``, ``mtp-verify``,
            ``mtp-rejection``...), for coverage accounting.
    """

    def __init__(self, config: KPoolConfig, *, page_size: int, num_pages: int, num_ring_blocks: int,
                 max_pages: int, pick: Callable[[int], int]):
        self.config = config
        self.P, self.C, self.B = config.index_kpool, config.ring_capacity, page_size
        self.num_pages, self.num_ring_blocks, self.max_pages = num_pages, num_ring_blocks, max_pages
        self.pick = pick
        self.free_pages: List[int] = list(range(num_pages))
        self.free_ring: List[int] = list(range(num_ring_blocks))
        self.refcount: Dict[int, int] = {}
        self.used_pages: set = set()
        self.used_ring: set = set()
        self.requests: Dict[int, SimRequest] = {}
        self.next_rid = 0
        self.steps: List[Step] = []
        self.events: Counter = Counter()
        self._pending_forks: List[Tuple[int, int, int]] = []

    # ---- allocation ---------------------------------------------------------------------------

    def pages_for(self, raw_len: int) -> int:
        """Pages a request of ``raw_len`` tokens holds: ``max(1, ceil(raw_len / (P * B)))``
        (pages for every token, incomplete pool included, like a scheduler)."""
        return max(1, -(-raw_len // (self.P * self.B)))

    def max_len(self) -> int:
        """Longest request the page budget allows (``max_pages * B * P`` tokens)."""
        return self.max_pages * self.B * self.P

    def _take_page(self) -> int:
        page = self.free_pages.pop(self.pick(len(self.free_pages)))
        if page in self.used_pages:
            self.events["reuse-pages"] += 1
        self.used_pages.add(page)
        self.refcount[page] = 1
        return page

    def _grow(self, req: SimRequest, raw_len: int) -> None:
        while len(req.pages) < self.pages_for(raw_len):
            req.pages.append(self._take_page())

    def admit(self, fork_from: Optional[int] = None, shared_pages: int = 0) -> int:
        """Admit a new request; returns its id. With ``fork_from``, it resumes from the first
        ``shared_pages`` full pages of that request (``shared_pages * B * P`` tokens, pool- and
        page-aligned): the pages are shared and the oracle forks the history before the next step.

        Raises:
            ValueError: no free ring block, or the source does not hold that many complete pages.
        """
        if not self.free_ring:
            raise ValueError("no free ring block")
        block = self.free_ring.pop(self.pick(len(self.free_ring)))
        if block in self.used_ring:
            self.events["reuse-ring"] += 1
        self.used_ring.add(block)
        rid = self.next_rid
        self.next_rid += 1
        req = SimRequest(rid, 0, [], block)
        if fork_from is not None and shared_pages > 0:
            src = self.requests[fork_from]
            if shared_pages > self.complete_pages(fork_from):
                raise ValueError(f"request {fork_from} holds {self.complete_pages(fork_from)} complete pages")
            req.pages = list(src.pages[:shared_pages])
            for page in req.pages:
                self.refcount[page] += 1
            req.committed = shared_pages * self.B * self.P
            self._pending_forks.append((fork_from, rid, req.committed))
            self.events["fork"] += 1
        self.requests[rid] = req
        return rid

    def complete_pages(self, rid: int) -> int:
        """Leading pages of ``rid`` whose every pool is committed (shareable by a prefix hit)."""
        req = self.requests[rid]
        return min(len(req.pages), req.committed // self.P // self.B)

    def finish(self, rid: int) -> None:
        """Release a request: its pages (when no other request shares them) and its ring block
        go to the front of the free lists."""
        req = self.requests.pop(rid)
        for page in req.pages:
            self.refcount[page] -= 1
            if self.refcount[page] == 0:
                self.free_pages.insert(0, page)
        self.free_ring.insert(0, req.ring_block)
        self.events["finish"] += 1

    # ---- steps --------------------------------------------------------------------------------

    def step(self, actions: Sequence[Action], *, name: str, compute_topk: bool = True,
             full: Optional[FullMode] = None, output_buffer: Optional[OutputBufferSpec] = None,
             inputs=None, seed: int = 0, patch=None, expect_error: Optional[type] = None) -> Step:
        """Record one step (rows in ``actions`` order) and advance the committed lengths.

        A step with ``expect_error`` (bad metadata) changes nothing: no lengths advance and pending
        forks wait for the next step (the harness runs no oracle step for it).

        Returns:
            the recorded :class:`cases.spec.Step`.
        Raises:
            ValueError: unknown request, a request twice, or a verify acceptance out of range.
        """
        specs, rids = [], []
        for a in actions:
            req = self.requests[a.rid]
            if a.rid in rids:
                raise ValueError(f"request {a.rid} twice in one step")
            if a.accepted is not None and not 0 <= a.accepted <= a.query_len - 1:
                raise ValueError(f"accepted {a.accepted} of {a.query_len - 1} drafts")
            self._grow(req, req.committed + a.query_len)
            specs.append(RequestSpec(req.committed, a.query_len, list(req.pages), req.ring_block))
            rids.append(a.rid)
        t_live = sum(a.query_len for a in actions)
        batch = BatchSpec(specs, num_tokens=t_live + full.pad_rows if full else None,
                          full_mode=full is not None,
                          num_padded_requests=full.padded_requests if full else 0,
                          block_table_width=self.max_pages if full else None,
                          stale_tail_slots=bool(full and full.stale))
        forks = () if expect_error else tuple(self._pending_forks)
        step = Step(name=name, batch=batch, request_ids=rids, compute_topk=compute_topk,
                    output_buffer=output_buffer, seed=seed, inputs=inputs, patch_metadata=patch,
                    expect_error=expect_error, forks=forks)
        self.steps.append(step)
        if expect_error:
            return step
        self._pending_forks = []
        for a in actions:
            req = self.requests[a.rid]
            if a.accepted is not None:
                self.events["mtp-verify"] += 1
                if a.accepted < a.query_len - 1:
                    self.events["mtp-rejection"] += 1
                req.committed += 1 + a.accepted
            else:
                req.committed += a.query_len
        return step

    def geometry(self, *, page_padding: int = 0, ring_block_padding: int = 0) -> CacheGeometry:
        """The cache layout; the guard covers a whole ring block (a ``-1`` slot used as an index
        then lands in the guard, not outside the allocation)."""
        D = self.config.index_head_dim
        block_stride = 2 * self.C * D + ring_block_padding
        guard = max(64, block_stride + self.B * D + page_padding)
        return CacheGeometry(num_pages=self.num_pages, page_size=self.B, num_tail_blocks=self.num_ring_blocks,
                             page_padding=page_padding, ring_block_padding=ring_block_padding, guard=guard)

    def build(self, name: str, *, ape: Optional[torch.Tensor] = None, seed: int = 0, values: str = "random",
              description: str = "", tags: Sequence[str] = (), page_padding: int = 0,
              ring_block_padding: int = 0, size: str = "generated") -> Case:
        """The recorded steps as a :class:`cases.spec.Case`."""
        return Case(name=name, size=size, config=self.config,
                    geometry=self.geometry(page_padding=page_padding, ring_block_padding=ring_block_padding),
                    steps=list(self.steps), ape=ape, seed=seed, values=values, description=description,
                    tags=tuple(tags))
