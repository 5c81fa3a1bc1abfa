"""Which kernel program wrote an element: read from the launchers' own launch plans
(parity-contract.md §6 "the program id of the kernel instance that wrote it").

Every KPool launcher launches exactly a :class:`kpool.ops.plan.LaunchPlan` (a fixed grid of
``min(work, cap)`` programs and a grid-stride loop over its tiles, platform-numerics.md §6.1),
so tile ``i`` is handled by program ``plan.program_of_tile(i)``. The functions below ask the
same plan functions the launchers call (``<package>.ops.plan``, read lazily: importing this
module never imports Triton, and a plan never needs Triton either) and map an element to its
tile. They describe the launch; they never change it, and they read no private attribute.

* compression (launch 1), ``ops/compress.py``: tiles of ``BLOCK_J * P`` token rows of the ``T``
  rows x ``D_SPLIT`` channels (a tile inside one request compresses one pool per lane, any other
  walks its rows; launches of at most ``latency_rows`` rows take one pool's rows per tile);
* ring write (launch 2): tiles of ``BLOCK_T`` lanes over the last ``C`` rows of each request
  (``per = min(C, BLOCK_T)`` rows of ``BLOCK_T // per`` requests a tile);
* scoring, ``ops/score.py``: per score chunk (``kpool.indexer`` splits the rows into chunks of the
  key scratch; each chunk is its own launches), the decode kernel (requests of at most
  ``DECODE_ROWS`` rows: tile = request x a segment of its ``BLOCK_N``-pool blocks) or the prefill kernel (tile = one
  request's block of ``BLOCK_M`` rows, blocks aligned to the request start, x ``BLOCK_N`` pools);
* expansion, ``ops/expand.py``: tiles of ``BLOCK_ROWS`` rows x ``BLOCK_COLS`` output columns.
"""
from __future__ import annotations

import bisect
from typing import Optional, Sequence


def _plan(package: str):
    import importlib
    return importlib.import_module(f"{package}.ops.plan")


def _device(device):
    import torch
    return torch.device(device) if device is not None else torch.device("cpu")


def _on(backend: str, device):
    """The device a plan is computed for: ``device`` when it matches ``backend``, else the bare
    backend name (a cpu device stands for the interpreter)."""
    dev = _device(device)
    return dev if (dev.type if dev.type in ("cuda", "npu") else "cpu") == backend else backend


def cache_update_program(row: int, *, num_rows: int, head_dim: int, index_kpool: int, backend: str,
                         kernel: str = "compress", package: str = "kpool", device=None, channel: int = 0,
                         cum_query_lens: Optional[Sequence[int]] = None, ring_capacity: int = 0) -> int:
    """Program of the compression (``kernel="compress"``) or ring-write (``"ring_write"``) launch
    that handles token ``row``.

    Args:
        num_rows: ``T``, the rows the launch covers (its grid depends on ``T``, never on ``T_live``).
        head_dim, index_kpool: ``D`` and ``P`` of the launch (``P`` sizes the compression tiles).
        backend: ``"cpu"``, ``"cuda"`` or ``"npu"``; device: a torch device of that backend.
        kernel: ``"compress"`` (launch 1) or ``"ring_write"`` (launch 2).
        package: ``"kpool"`` or a planted-fault copy of it (:mod:`parity.implementations.mutants`).
        channel: the element's channel (compression tiles split the channels in ``D_SPLIT`` chunks).
        cum_query_lens, ring_capacity: the step's ``[R]`` exclusive query ends and ``C`` (the ring
            write's tiles are requests' last ``C`` rows; required for ``"ring_write"``).
    Raises:
        ValueError: an unknown ``kernel``, or ``"ring_write"`` without ``cum_query_lens`` /
            ``ring_capacity``, or a row no request stashes. ImportError: the package has no ``ops.plan``.
    """
    if kernel not in ("compress", "ring_write"):
        raise ValueError(f"kernel must be 'compress' or 'ring_write', got {kernel!r}")
    plan = _plan(package)
    rows = int(num_rows)
    on = _on(backend, device)
    if kernel == "ring_write":
        if cum_query_lens is None or ring_capacity < 1:
            raise ValueError("the ring write's program needs cum_query_lens and ring_capacity")
        cum = [int(c) for c in cum_query_lens]
        r = bisect.bisect_right(cum, int(row))
        if r >= len(cum):
            raise ValueError(f"row {row} is past T_live = {cum[-1] if cum else 0}: no request stashes it")
        first = max(cum[r - 1] if r > 0 else 0, cum[r] - int(ring_capacity))
        if int(row) < first:
            raise ValueError(f"row {row} is not among request {r}'s last {ring_capacity} rows")
        launch = plan.ring_write_plan(len(cum), ring_capacity, head_dim, on)
        return launch.program_of_tile(plan.ring_write_tile(r, int(row) - first, ring_capacity,
                                                           launch.constexprs["BLOCK_T"]))
    launch = plan.compress_plan(rows, head_dim, index_kpool, on)
    per_tile = launch.constexprs["BLOCK_J"] * launch.constexprs["P"]
    split = launch.constexprs["D_SPLIT"]
    chunks = -(-int(head_dim) // split)
    return launch.program_of_tile((int(row) // per_tile) * chunks + int(channel) // split)


def expand_program(row: int, column: int, *, num_rows: int, width: int, backend: str,
                   package: str = "kpool", device=None) -> int:
    """Program of the expansion kernel that writes output element ``(row, column)`` of a
    ``[T, width]`` output (``width`` = caller buffer width, else ``W``)."""
    launch = _plan(package).expand_plan(num_rows, width, _on(backend, device))
    br, bc = launch.constexprs["BLOCK_ROWS"], launch.constexprs["BLOCK_COLS"]
    n_col_blocks = -(-int(width) // bc)
    return launch.program_of_tile((int(row) // br) * n_col_blocks + int(column) // bc)


def score_program(row: int, pool: int, *, cum_query_lens: Sequence[int], num_rows: int, max_pool_seq_len: int,
                  num_heads: int, head_dim: int, score_mode: str, backend: str,
                  max_score_rows: Optional[int] = None, package: str = "kpool", device=None):
    """``(chunk, program)`` of the score launch that scores pool ``pool`` of live row ``row``:
    ``chunk`` is the index of the score chunk (``kpool.indexer.forward`` splits the ``T`` rows
    into chunks of the key scratch), ``program`` the program id within the decode or prefill
    kernel of that chunk (which of the two: :func:`score_kernel`).

    Args:
        cum_query_lens: the step's exclusive query ends (``R`` ints, no leading zero).
        num_rows: ``T``; head_dim: ``D``; num_heads: ``H`` (the merged mode scores 3 split heads).
        max_score_rows: the forward's ``max_score_rows`` (chunked scoring), if it was given.
    """
    orchestration = __import__(f"{package}.indexer", fromlist=["SCORE_SCRATCH_BYTES"])
    plan = _plan(package)
    cum = [int(c) for c in cum_query_lens]
    T = int(num_rows)
    per_chunk = plan.score_scratch_rows(max_pool_seq_len, orchestration.SCORE_SCRATCH_BYTES, max_score_rows)
    chunk = int(row) // per_chunk
    row_start, n = chunk * per_chunk, min(per_chunk, T - chunk * per_chunk)
    on = _on(backend, device)
    r = bisect.bisect_right(cum, int(row))
    q_lo = cum[r - 1] if r else 0
    heads = 3 if score_mode == "merged" else num_heads
    if cum[r] - q_lo <= plan.DECODE_ROWS:
        launch = plan.score_decode_plan(len(cum), max_pool_seq_len, heads, head_dim, on, num_rows=n,
                                        merged=score_mode == "merged")     # the launch's own plan (score_keys)
        segments = plan.decode_segments(launch, len(cum), max_pool_seq_len)
        per = -(-(-(-max_pool_seq_len // launch.constexprs["BLOCK_N"])) // segments)
        return chunk, launch.program_of_tile(r * segments + int(pool) // launch.constexprs["BLOCK_N"] // per)
    launch = plan.score_prefill_plan(n, len(cum), T, max_pool_seq_len, head_dim, on)
    bm, bn = launch.constexprs["BLOCK_M"], launch.constexprs["BLOCK_N"]
    blocks, block_of = 0, {}
    for i, end in enumerate(cum):          # the prefill blocks, aligned to request starts
        start = cum[i - 1] if i else 0
        block_of[i] = blocks
        if end - start > plan.DECODE_ROWS:
            blocks += -(-(end - start) // bm)
    first = block_of[bisect.bisect_right(cum, row_start)] if bisect.bisect_right(cum, row_start) < len(cum) else blocks
    rs = bisect.bisect_right(cum, row_start)
    if rs < len(cum) and cum[rs] - (cum[rs - 1] if rs else 0) > plan.DECODE_ROWS:
        first += (row_start - (cum[rs - 1] if rs else 0)) // bm
    v = block_of[r] + (int(row) - q_lo) // bm
    n_pb = -(-max_pool_seq_len // bn)
    return chunk, launch.program_of_tile((v - first) * n_pb + int(pool) // bn)


def score_kernel(row: int, cum_query_lens: Sequence[int], *, package: str = "kpool") -> str:
    """``"_score_decode_kernel"`` or ``"_score_prefill_kernel"``: which kernel scores ``row``
    (by its request's query length, kpool.ops.plan.DECODE_ROWS)."""
    cum = list(cum_query_lens)
    r = bisect.bisect_right(cum, int(row))
    q_lo = cum[r - 1] if r else 0
    return "_score_decode_kernel" if cum[r] - q_lo <= _plan(package).DECODE_ROWS else "_score_prefill_kernel"
