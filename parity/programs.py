"""Which kernel program wrote an element: pure functions of each launcher's tiling
(parity-contract.md §6 "the program id of the kernel instance that wrote it").

Every KPool launcher uses a fixed grid of ``min(work, cap)`` programs and a grid-stride loop over
its tiles (platform-numerics.md §6.1), so tile ``i`` is handled by program ``i % grid``. The
functions below recompute the launcher's tile sizes and grid from the same constants
(:mod:`kpool.ops.compress`, :mod:`kpool.ops.indexer`, :mod:`kpool.indexer`), read lazily so that
importing this module never imports Triton. They describe the launch; they never change it.

* compression (launch 1) and ring write (launch 2), ``kpool/ops/compress.py``: tiles of
  ``BLOCK_T`` token rows; both launches share ``BLOCK_T`` and the grid;
* scoring, ``kpool/ops/indexer.py`` ``_score_kernel``: tiles of ``BLOCK_ROWS`` rows x
  ``BLOCK_POOLS`` pools of one score chunk (``kpool.indexer`` splits the live rows into chunks of
  the score scratch; each chunk is its own launch);
* expansion, ``_expand_kernel``: tiles of ``BLOCK_ROWS`` rows x ``BLOCK_COLS`` output columns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _ops(package: str, name: str):
    import importlib
    return importlib.import_module(f"{package}.{name}")


def grid_cap(backend: str, device=None, *, package: str = "kpool") -> Optional[int]:
    """Programs a cache-update launch may use at most (its grid is ``min(work, cap)``), from the
    launcher's own helper: ``kpool.ops.compress._grid_cap`` (SM count on cuda, vector cores on
    npu, a few on the interpreter), or ``kpool.ops._launch.launch_grid`` where the launcher
    sizes its grid with it. ``None`` when neither exists (then no program id is reported).

    Args:
        backend: ``"cpu"``, ``"cuda"`` or ``"npu"``; device: a torch device of that backend.
        package: ``"kpool"`` or a planted-fault copy of it (:mod:`parity.mutants`).
    """
    import torch
    compress = _ops(package, "ops.compress")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if hasattr(compress, "_grid_cap"):
        if backend == "cpu":
            return int(compress._CPU_GRID_CAP)
        return int(compress._grid_cap(backend, torch.empty(0, device=dev)))
    try:
        launch = _ops(package, "ops._launch")
    except ImportError:
        return None
    per_core = getattr(compress, "_PROGRAMS_PER_CORE", {}).get(backend, 1)
    return int(launch.launch_grid(2 ** 31 - 1, backend, dev, programs_per_core=per_core,
                                  cpu_cap=getattr(compress, "_CPU_GRID_CAP", None)))


def _indexer_grid(indexer, tiles: int, backend: str, device) -> int:
    """Grid of an indexer launch over ``tiles`` tiles: the launcher's ``_grid`` helper when it has
    one (core-count based), else ``min(tiles, MAX_GRID)``."""
    if hasattr(indexer, "_grid"):
        import torch
        dev = torch.device(device) if device is not None else torch.device("cpu")
        return int(indexer._grid(tiles, torch.empty(0, device=dev))[0])
    return max(1, min(tiles, indexer.MAX_GRID))


@dataclass(frozen=True)
class Launch:
    """A 1-D grid-stride launch: ``tiles`` tiles over ``grid`` programs (tile ``i`` -> program
    ``i % grid``)."""

    tiles: int
    grid: int

    def program_of_tile(self, tile: int) -> int:
        """The program that handles ``tile``."""
        return int(tile) % self.grid


def cache_update_tiling(num_live: int, head_dim: int, backend: str, cap: int, *, package: str = "kpool"):
    """``(BLOCK_T, Launch)`` of ``compress_and_write_cache`` for ``num_live`` live rows.

    Uses the launcher's own ``cache_update_tiles`` (``BLOCK_T``), and ``grid = min(cdiv(num_live,
    BLOCK_T), cap)`` as the launcher does.
    """
    compress = _ops(package, "ops.compress")
    block_t, _ = compress.cache_update_tiles(num_live, head_dim, backend)
    work = _cdiv(num_live, block_t)
    return block_t, Launch(tiles=work, grid=max(1, min(work, cap)))


def cache_update_program(row: int, *, num_live: int, head_dim: int, backend: str, cap: int,
                         package: str = "kpool") -> int:
    """Program of launch 1 (compression) and launch 2 (ring write) that handles token ``row``."""
    block_t, launch = cache_update_tiling(num_live, head_dim, backend, cap, package=package)
    return launch.program_of_tile(row // block_t)


def expand_program(row: int, column: int, *, num_rows: int, width: int, backend: str,
                   package: str = "kpool", device=None) -> int:
    """Program of ``_expand_kernel`` that writes output element ``(row, column)`` of a ``[T, width]``
    output (``width`` = caller buffer width, else ``W``)."""
    indexer = _ops(package, "ops.indexer")
    br, bc = indexer._EXPAND_TILES[backend]
    n_col_blocks = _cdiv(width, bc)
    tiles = _cdiv(num_rows, br) * n_col_blocks
    launch = Launch(tiles=tiles, grid=_indexer_grid(indexer, tiles, backend, device))
    return launch.program_of_tile((row // br) * n_col_blocks + column // bc)


def score_program(row: int, pool: int, *, num_live: int, max_pool_seq_len: int, num_heads: int,
                  score_mode: str, backend: str, max_score_rows: Optional[int] = None,
                  package: str = "kpool", device=None):
    """``(chunk, program)`` of ``_score_kernel`` that scores pool ``pool`` of live row ``row``:
    ``chunk`` is the index of the score launch (row chunk of ``kpool.indexer.forward``),
    ``program`` the program id within it."""
    orchestration = _ops(package, "indexer")
    indexer = _ops(package, "ops.indexer")
    per_chunk = max(1, orchestration.SCORE_SCRATCH_BYTES // (4 * max_pool_seq_len))
    if max_score_rows is not None:
        per_chunk = max(1, min(per_chunk, max_score_rows))
    chunk, local = divmod(row, per_chunk)
    n = min(per_chunk, num_live - chunk * per_chunk)
    cells = _next_pow2(num_heads) if score_mode == "relu" else 1
    br, bp = indexer._score_tiles(backend, n, max_pool_seq_len, cells)
    n_pool_blocks = _cdiv(max_pool_seq_len, bp)
    tiles = _cdiv(n, br) * n_pool_blocks
    launch = Launch(tiles=tiles, grid=_indexer_grid(indexer, tiles, backend, device))
    return chunk, launch.program_of_tile((local // br) * n_pool_blocks + pool // bp)
