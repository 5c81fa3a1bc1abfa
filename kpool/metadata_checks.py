"""Value rules of one forward's metadata (kpool-algorithm.md §3.2-§3.4, §4.6, §5.4, §6).

All rules run as vectorised array ops over one host copy of the metadata (a single device sync),
never as Python loops over tokens or requests, so they stay cheap on GLM-size batches. The host
copy is viewed as numpy arrays: on these small host arrays a numpy op costs about a fifth of a
torch op's dispatch (measured on the GLM-size decode batch of 64 requests x 16384 pools).

What is checked on which rows (``T_live = cum_query_lens[-1]``; a row ``t < T_live`` is *live*
and belongs to request ``r(t)``; a request is *scheduled* when its query length is > 0):

* live rows: contiguous positions, the int32 window, ``slot_mapping`` exactly the §3.2 slot of
  a row completing a pool (``-1`` otherwise), ``tail_slot_mapping`` exactly the §3.3 ring slot,
  no compressed slot written twice;
* scheduled requests: ring block in range and not shared with another scheduled request;
* every request: lengths, ``seq_lens == raw_seq_lens // P`` and, for the pages it reads, the
  block table in range (zero-length padded requests may carry stale lengths, public case C17);
* padding rows (``t >= T_live``): nothing. FULL-mode padding rows keep stale ring slots and
  positions from an earlier replay (C17, ``BatchSpec.stale_tail_slots``); the kernels never
  write from them (``t < T_live`` guard, §5.4).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .config import INT32_MAX
from .rules import reject


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _host_copy(tensors) -> list:
    """Every metadata tensor as a flat int64 numpy array, in order: CPU tensors are read in
    place; device tensors are concatenated there and copied with one transfer (one sync)."""
    if all(t.device.type == "cpu" for t in tensors):
        return [t.detach().numpy().reshape(-1).astype(np.int64, copy=False) for t in tensors]
    return one_transfer(tensors)


def one_transfer(tensors) -> list:
    """:func:`_host_copy` for device tensors: one concatenation on the device, one copy."""
    flat = [t.reshape(-1).to(torch.int64) for t in tensors]
    host = torch.cat(flat).cpu().numpy()
    return np.split(host, np.cumsum([f.numel() for f in flat])[:-1])


def check_metadata_values(*, positions, cum_query_lens, raw_seq_lens, seq_lens, block_table, slot_mapping,
                          tail_block_table, tail_slot_mapping, max_pool_seq_len: int, index_kpool: int,
                          num_pages: int, page_size: int, num_tail_blocks: int, ring_capacity: int,
                          max_query_len: Optional[int] = None) -> int:
    """Check the metadata values (module docstring); shapes and dtypes were checked already.

    Args: the :class:`kpool.metadata.KPoolMetadata` tensors (positions, slot_mapping,
        tail_slot_mapping int64 ``[T]``; cum_query_lens, raw_seq_lens, seq_lens int32 ``[R]``;
        block_table int32 ``[R, M]``; tail_block_table int32 ``[R, >= 1]``), ``max_pool_seq_len``,
        ``P``, the compressed cache's ``N`` pages of ``B`` rows, ``blocks`` ring blocks of ``C`` rows,
        ``max_query_len`` (``None``, or the host bound on every query length: a launch hint).

    Returns:
        ``T_live`` (0 when ``R == 0``).

    Raises:
        KPoolMetadataError, KPoolBlockIdError, KPoolWriteConflictError, KPoolSlotMappingError:
        see :data:`kpool.rules.RULES` for each rule.
    """
    P, N, B, blocks, C = index_kpool, num_pages, page_size, num_tail_blocks, ring_capacity
    R, M = block_table.shape
    T = positions.shape[0]
    if R == 0:
        return 0
    cum, raw, pools, ring, pos_all, slots_all, tslots_all, table = _host_copy((
        cum_query_lens, raw_seq_lens, seq_lens, tail_block_table[:, 0], positions, slot_mapping,
        tail_slot_mapping, block_table))
    table = table.reshape(R, M)

    # ---- lengths (§3.4, §4.6, §6) -------------------------------------------------------------
    starts = np.concatenate([[0], cum[:-1]])
    qlen = cum - starts
    if int(cum[0]) < 0 or bool((qlen < 0).any()):
        reject("cum-query-lens-order", f"cum_query_lens must be non-negative and non-decreasing, got {cum.tolist()}")
    t_live = int(cum[-1])
    if t_live > T:
        reject("cum-query-lens-rows", f"cum_query_lens[-1]={t_live} exceeds the {T} token rows")
    if bool((raw < qlen).any()):
        r = _first(raw < qlen)
        reject("query-len-exceeds-raw", f"request {r}: raw_seq_lens={int(raw[r])} < query length {int(qlen[r])}")
    if not np.array_equal(pools, raw // P):
        r = _first(pools != raw // P)
        reject("seq-lens-pools", f"request {r}: seq_lens={int(pools[r])} must be raw_seq_lens // P = "
                                 f"{int(raw[r]) // P} (pool lengths, not token lengths)")
    if max_query_len is not None and int(qlen.max()) > max_query_len:
        r = _first(qlen > max_query_len)
        reject("max-query-len-range", f"request {r} has {int(qlen[r])} query rows, more than "
                                      f"max_query_len={max_query_len}")
    if int(pools.max()) > max_pool_seq_len:
        reject("max-pool-seq-len-below-pools", f"max(seq_lens)={int(pools.max())} exceeds "
                                               f"max_pool_seq_len={max_pool_seq_len}")

    # ---- live positions (§3.4) and the kernels' int32 window -----------------------------------
    req = np.repeat(np.arange(R), qlen)                           # request of each live row
    pos = pos_all[:t_live]
    expected = (raw - qlen)[req] + (np.arange(t_live) - starts[req])
    if not np.array_equal(pos, expected):
        t = _first(pos != expected)
        reject("positions-contiguous", f"row {t}: position {int(pos[t])} != {int(expected[t])} "
                                       "(positions must be contiguous per request)")
    if t_live and int(pos.max()) >= INT32_MAX - P:
        # the kernels' int32 window arithmetic needs p + P < INT32_MAX (kpool/ops/compress.py)
        reject("positions-int32-window", f"positions must be < INT32_MAX - P = {INT32_MAX - P}, got {int(pos.max())}")

    # ---- ids in range (§3.1-§3.3) --------------------------------------------------------------
    read = np.arange(M)[None, :] < ((pools + B - 1) // B)[:, None]
    bad = read & ((table < 0) | (table >= N))
    if bad.any():
        r, m = divmod(_first(bad), M)
        reject("block-table-range", f"block_table[{r}, {m}] = {int(table[r, m])} is outside the {N} compressed pages")
    scheduled = qlen > 0
    bad = scheduled & ((ring < 0) | (ring >= blocks))
    if bad.any():
        r = _first(bad)
        reject("ring-block-range", f"tail_block_table[{r}, 0] = {int(ring[r])} is outside the {blocks} ring blocks")
    slots, tslots = slots_all[:t_live], tslots_all[:t_live]
    for rule, name, live, limit in (("slot-range", "slot_mapping", slots, N * B),
                                    ("tail-slot-range", "tail_slot_mapping", tslots, blocks * C)):
        bad = (live < -1) | (live >= limit)
        if bad.any():
            t = _first(bad)
            reject(rule, f"{name}[{t}] = {int(live[t])} is outside [-1, {limit})")

    # ---- one writer per cache row (§3.3, §5.4) ---------------------------------------------------
    owners = np.flatnonzero(scheduled)
    dup = _duplicate(ring[owners])
    if dup is not None:
        r0, r1 = owners[ring[owners] == dup][:2].tolist()
        reject("ring-block-shared", f"requests {r0} and {r1} both own ring block {dup} (tail_block_table[:, 0]); "
                                    "a ring block belongs to one request")
    writers = np.flatnonzero(slots >= 0)
    dup = _duplicate(slots[writers])
    if dup is not None:
        t0, t1 = writers[slots[writers] == dup][:2].tolist()
        reject("slot-duplicate", f"rows {t0} (request {int(req[t0])}) and {t1} (request {int(req[t1])}) both "
                                 f"write compressed slot {dup} (slot_mapping): block tables share a page "
                                 "that both requests fill")

    # ---- slots are the ones the tables and positions give (§3.2, §3.3) ---------------------------
    completing = (pos + 1) % P == 0
    pool = pos // P
    if M > 0:
        page = table[req, np.minimum(pool // B, M - 1)]
        want = np.where(completing, page * B + pool % B, -1)
    else:
        want = np.full_like(pos, -1)             # no page, so no visible (or completable) pool
    if not np.array_equal(slots, want):
        t = _first(slots != want)
        why = (f"block_table[{int(req[t])}, {int(pool[t]) // B}] * B + {int(pool[t]) % B}" if bool(completing[t])
               else "-1 (position does not complete a pool)")
        reject("slot-mapping-mismatch", f"slot_mapping[{t}] = {int(slots[t])} but position {int(pos[t])} of "
                                        f"request {int(req[t])} needs {int(want[t])} = {why}")
    want = ring[req] * C + pos % C
    if not np.array_equal(tslots, want):
        t = _first(tslots != want)
        reject("tail-slot-mapping-mismatch", f"tail_slot_mapping[{t}] = {int(tslots[t])} but position {int(pos[t])} "
                                             f"of request {int(req[t])} needs tail_block_table[{int(req[t])}, 0] * C "
                                             f"+ p % C = {int(want[t])} (C = {C})")
    return t_live


def _duplicate(values: np.ndarray):
    """A value occurring twice in ``values`` (1-D int64), or ``None``."""
    s = np.sort(values)
    same = s[1:] == s[:-1]
    return int(s[1:][same][0]) if same.any() else None
