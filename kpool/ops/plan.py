"""Launch plans of the KPool kernels: grid, tiles and iterations per backend, in one place
(platform-numerics.md §1.3, §6.1, §6.2).

Every kernel runs a fixed grid of ``min(work, cores * programs_per_core, 65535)`` programs and
walks its tiles with a grid-stride loop (tile ``i`` -> program ``i % grid``), so the grid never
exceeds Ascend's ``coreDim <= UINT16_MAX`` and the results never depend on it: a tile decides
which program computes a cell, never the order of the cell's operations. A :class:`LaunchPlan`
says all of that for one launch; the launchers (``kpool.ops.compress``, ``.score``, ``.merged``,
``.expand``) launch exactly ``kernel[(plan.grid,)](..., **plan.constexprs, **plan.options)`` and
``parity.checking.programs`` maps an element back to the program that wrote it from the same plan.

Cores per backend:

* npu: vector kernels run one program per vector core, ``triton.runtime.driver.active.utils.
  get_device_properties(i)["num_vectorcore"]`` (``num_aicore`` if absent). The score kernels use
  ``tl.dot``, which triton-ascend compiles to a mixed cube + vector kernel launched on the AI
  cores (one cube unit and two vector units each on A2/A3), so their grid is ``num_aicore``.
  Unverified on hardware (platform-numerics.md §6.4 item 7).
* cuda: streaming multiprocessors, ``torch.cuda.get_device_properties(d).multi_processor_count``,
  times resident programs per SM (memory latency is hidden by occupancy).
* cpu (Triton interpreter): no core count; programs run one after another, so only a small cap
  applies. The Triton driver is never touched there (it raises "0 active drivers" on a host
  without GPU/NPU).

Plans are cached (:func:`clear_plan_cache`): a plan function returns the same :class:`LaunchPlan`
object for the same host ints, backend, core count, launch options, :data:`DECODE_ROWS` and
:data:`TUNING` entries of its kernels (all read at every call, so a changed table or a monkeypatched
core count takes effect at once). The key holds host ints only, never device data, so graph
capture is unchanged; a cached plan's ``constexprs`` and ``options`` are read-only.

Importing this module imports torch and :mod:`kpool.platform` only (no Triton): ``parity.checking.programs``
reads plans without loading a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, NamedTuple, Optional, Tuple

import torch

from .. import platform as _platform

GRID_LIMIT = 65535
"""Most programs in one launch: Ascend ``coreDim`` is a uint16 (platform-numerics.md §1.3)."""

DECODE_ROWS = 8
"""Requests with at most this many query rows (decode, MTP verify) are scored by the decode
kernel (one request x a block of pools per tile, the key tile reused by each row); longer
requests by the prefill kernel (a block of rows x a block of pools). The split is per request,
from its own query length, so a row's bits never depend on the rest of the batch."""

MIN_DOT = 16
"""``tl.dot`` needs M, N, K >= 16 (CUDA; triton-ascend 3.2's interpreter asserts it too):
heads, head dims and tiles are padded with exact zeros up to this."""

# Tunables per (kernel, backend). Results are bitwise independent of all of them (they pick
# tiles and programs, never an operation order inside a cell); a benchmark may change them.
# The CUDA values are the fastest of the variants measured on an H200 (docs/kernels.md).
TUNING: Dict[str, Dict[str, dict]] = {
    # BLOCK_J * BLOCK_D * P <= window: the P window tiles of K and gate stay in registers (no
    # spills on sm_90: tests/test_cuda_compile.py). BLOCK_D=0: next_pow2(D).
    # D_SPLIT: channels per tile (0: all), walked in chunks of BLOCK_D.
    # latency_rows: a launch of at most this many rows T (decode, short batches) takes the
    # latency tile instead (compress_plan): a fixed second variant, chosen from T alone.
    "compress": {"cuda": dict(BLOCK_J=32, BLOCK_D=32, D_SPLIT=0, window=1024, per_core=12, num_warps=4,
                              latency_rows=1024),
                 "npu": dict(BLOCK_J=64, BLOCK_D=64, D_SPLIT=0, window=4096, per_core=1, latency_rows=256),
                 "cpu": dict(BLOCK_J=64, BLOCK_D=0, D_SPLIT=0, window=2 ** 20, cap=4, rows_at_once=True)},
    # FUSED: a batch of queries of at most C - P + 1 rows (decode, MTP verify) runs both cache
    # launches as one (kpool.ops.compress._update_kernel; docs/kernels.md "One cache launch"). On
    # CUDA (H100: same bits, 4-6 us less a step) and the interpreter; off on NPU until an Ascend
    # parity run and a timing have passed with it.
    "ring_write": {"cuda": dict(BLOCK_T=8, per_core=8, num_warps=4, FUSED=True),
                   "npu": dict(BLOCK_T=16, per_core=1, FUSED=False),
                   # cpu: two requests a tile (C = 4) on two programs, so the interpreter suites'
                   # batches of more than 4 requests walk the grid-stride loop
                   "cpu": dict(BLOCK_T=8, cap=2, FUSED=True)},
    # per_core_key_tile_outer: programs per SM when KEY_TILE_OUTER (MTP verify, short requests);
    # maxnreg(_key_tile_outer): ptxas register cap of each loop order (0: none), so that one more
    # program fits an SM (decode 194 -> 168 registers: 2 -> 3 programs an SM, the key stream's
    # occupancy; docs/kernels.md "Register caps")
    # STACK_ROWS: key tile outer in mode (R) scores this many rows with one dot a key tile (0: a
    # loop over the rows, each its own dot), with its own tile and options (the *_stacked keys).
    # H100, MTP=3 verify graph us (docs/kernels.md "Stacked rows"): per-row loop 307; stacked
    # BLOCK_N 128, 2 programs an SM, 2 stages 244 (64: 282-286; a 128/168 register cap 251-476)
    "score_decode": {"cuda": dict(BLOCK_N=128, per_core=3, per_core_key_tile_outer=16, num_warps=4, num_stages=2,
                                  maxnreg=168, maxnreg_key_tile_outer=128,
                                  STACK_ROWS=4, BLOCK_N_stacked=128, per_core_stacked=2, num_warps_stacked=4,
                                  num_stages_stacked=2, maxnreg_stacked=0),
                     "npu": dict(BLOCK_N=64, per_core=1, STACK_ROWS=0),
                     "cpu": dict(BLOCK_N=0, cap=64, STACK_ROWS=4)},    # BLOCK_N=0: whole row (<= 4096)
    "score_prefill": {"cuda": dict(BLOCK_M=64, BLOCK_N=128, per_core=2, num_warps=4, num_stages=3),
                      "npu": dict(BLOCK_M=64, BLOCK_N=64, per_core=1),
                      "cpu": dict(BLOCK_M=64, BLOCK_N=0, cap=64)},
    # one program: the prefix sums of the prefill blocks, BLOCK_R requests at a time
    "prefill_blocks": {backend: dict(BLOCK_R=128) for backend in ("cuda", "npu", "cpu")},
    "merge_heads": {"cuda": dict(BLOCK_ROWS=4, per_core=8, num_warps=4),
                    "npu": dict(BLOCK_ROWS=4, per_core=1),
                    "cpu": dict(BLOCK_ROWS=64, cap=4)},
    # Exact top-k (kpool.ops.topk): a row of at most NT_MAX * T pools sits in registers as an
    # [NT, T] tile (NT in {NT_MIN, NT_MAX} on compiled backends: two shapes); the K selected are
    # ranked in [KB, CH] tiles: CH of a row's keys against blocks of KB of its keys, the first of
    # TILES that gives `tiles_per_core` tiles a core, else the last (a prefill chunk: wide tiles,
    # the block axis in each thread; a decode batch: 32 keys against the whole row in one block,
    # over many cores). Wider rows fall back to torch.topk on the keys (the same result). H200,
    # K 512, us (docs/kernels.md, "The top-k under Nsight Compute"): 2048 rows 205.5 -> 119.4, 256 rows
    # 30.7 -> 25.2, 64 rows 12.1 -> 10.3, 1 row 6.7 -> 6.3.
    # Every score chunk takes the kernels on the H200 since the compaction is one scan (1024 x
    # 16384, K 512: 0.35 ms against torch.topk's 0.57; docs/kernels.md).
    # A batch of fewer rows than cores splits each row into `segments` (a power of two, at most
    # MAX_SEGMENTS, so that rows x segments <= cores and every segment holds >= K keys, about
    # sqrt(width / K)): the K largest of each segment, then the K largest of those S x K, so a
    # decode row's passes run on S cores instead of one. Compaction walks CHUNK lanes at a time
    # (a short scan each; 0: the whole tile in one scan). H200 (docs/kernels.md "Split rows"):
    # batch 1 48.1 us one segment -> 41.6 at 4-8; CHUNK 2048 40.7, 1024 41.6, 512 42.4, 0 40.9, but
    # the many-row selects pay for the re-reads (MTP=3 select 47.6 -> 55.1 us at 1024), so one scan
    # (192 bytes spilled at 16384 lanes on sm_90, bounded in tests/test_cuda_compile.py).
    # (NPU: unmeasured, one segment; the interpreter has no cores: SPLIT_CORES stands in, None there
    # so a CPU run takes one segment and one chunk, as tests that set them exercise both paths.)
    "topk_select": {"cuda": dict(T=128, NT_MIN=16, NT_MAX=128, per_core=2, MAX_SEGMENTS=8, CHUNK=0),
                    "npu": dict(T=64, NT_MIN=16, NT_MAX=64, per_core=1, MAX_SEGMENTS=1, CHUNK=0),
                    "cpu": dict(T=0, NT_MIN=16, NT_MAX=1024, cap=GRID_LIMIT, MAX_SEGMENTS=1, CHUNK=0,
                                SPLIT_CORES=None)},
    # RANK_MERGE: split rows skip the merge launch when rows x (S x K)^2 compares fit (the ranking
    # keeps the K highest-ranked candidates); 0: always a merge launch. H100, graph us (docs/kernels.md
    # "The ranking as the merge"): batch 1 41.7 -> 39.4 at 2^22 (= 1 x (4 x 512)^2) or 2^26; decode 64
    # 164.4 -> 164.2 at 2^22 (not taken) but 171.4 at 2^26 (taken: 4x the compares).
    "topk_order": {"cuda": dict(TILES=((32, 512), (512, 32)), tiles_per_core=1, per_core=8, num_warps=4,
                                RANK_MERGE=2 ** 22),
                   "npu": dict(TILES=((32, 256),), tiles_per_core=1, per_core=1, RANK_MERGE=0),
                   "cpu": dict(lanes=2 ** 20, cap=GRID_LIMIT, RANK_MERGE=0)},
    "expand": {"cuda": dict(BLOCK_ROWS=1, BLOCK_COLS=256, per_core=8, num_warps=4),
               "npu": dict(BLOCK_ROWS=1, BLOCK_COLS=256, per_core=1),
               "cpu": dict(BLOCK_ROWS=16, BLOCK_COLS=256, cap=GRID_LIMIT)},
}
_INTERP_MAX_POOLS = 4096
_DOT_KERNELS = frozenset({"score_decode", "score_prefill"})

_core_cache: dict = {}

PLAN_CACHE_SIZE = 4096
"""Most cached plans (:func:`_cached_plan`); the cache is emptied when it is full (a stream of
prefill batches of ever new sizes then builds plans as without a cache)."""
_PLANS: Dict[tuple, object] = {}
_MISSING = object()


def clear_plan_cache() -> None:
    """Forget every cached plan (a later call builds it again from the current tables)."""
    _PLANS.clear()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0``."""
    return -(-int(a) // int(b))


def next_pow2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def backend_of(device) -> str:
    """``"cuda"``, ``"npu"`` or ``"cpu"`` (interpreter) from a torch device or tensor."""
    kind = getattr(device, "device", device)
    kind = getattr(kind, "type", kind)
    return kind if kind in ("cuda", "npu") else "cpu"


def _device_index(backend: str, device) -> int:
    if isinstance(device, str):
        device = torch.device(device)
    index = getattr(device, "index", None)
    if index is not None:
        return int(index)
    if backend == "cuda":
        return int(torch.cuda.current_device())
    return int(torch.npu.current_device())


def core_count(backend: str, device, *, unit: str = "vector") -> Optional[int]:
    """Parallel cores a grid is sized from, or ``None`` on the interpreter.

    Args:
        backend: ``"cuda"``, ``"npu"`` or ``"cpu"``.
        device: the torch device of the kernel's tensors (index ``None`` = current device).
        unit: npu only: ``"vector"`` (``num_vectorcore``, else ``num_aicore``) or ``"cube"``
            (``num_aicore``, else ``num_vectorcore``), for kernels with ``tl.dot``.
    Returns:
        cuda: SM count; npu: as ``unit`` says (1 if the driver reports neither); cpu: ``None``.
        Always ``>= 1`` when not ``None``. Read once per (backend, device index, unit).
    """
    if backend not in ("cuda", "npu"):
        return None
    index = _device_index(backend, device)
    key = (backend, index, unit if backend == "npu" else "sm")
    if key not in _core_cache:
        if backend == "cuda":
            cores = torch.cuda.get_device_properties(index).multi_processor_count
        else:
            import triton
            props = triton.runtime.driver.active.utils.get_device_properties(index)
            order = ("num_aicore", "num_vectorcore") if unit == "cube" else ("num_vectorcore", "num_aicore")
            cores = props.get(order[0]) or props.get(order[1]) or 1
        _core_cache[key] = max(1, int(cores))
    return _core_cache[key]


def launch_grid(work: int, backend: str, device, *, programs_per_core: int = 1, limit: int = GRID_LIMIT,
                cpu_cap: Optional[int] = None, unit: str = "vector", cores: Optional[int] = None) -> int:
    """Programs of a 1-D launch over ``work`` tiles: ``min(work, cores * programs_per_core,
    limit, 65535)`` on cuda/npu, ``min(work, cpu_cap, limit, 65535)`` on cpu; at least 1.
    ``cores``: use this core count instead of asking the device (cuda/npu only)."""
    if cores is None:
        cores = core_count(backend, device, unit=unit)
    elif backend not in ("cuda", "npu"):
        cores = None
    cap = min(int(limit), GRID_LIMIT)
    if cores is not None:
        cap = min(cap, cores * max(1, int(programs_per_core)))
    elif cpu_cap is not None:
        cap = min(cap, int(cpu_cap))
    return max(1, min(int(work), cap))


class _ReadOnlyDict(dict):
    """A dict that refuses changes: a cached plan's ``constexprs`` / ``options`` are shared by every
    launch of its key. Unpacks (``**``) and copies (``dict(d)``) like a dict."""

    __slots__ = ()

    def _read_only(self, *args, **kwargs):
        raise TypeError("a LaunchPlan's constexprs and options are read-only (plans are cached, kpool.ops.plan)")

    __setitem__ = __delitem__ = __ior__ = update = pop = popitem = clear = setdefault = _read_only

    def __reduce__(self):
        return type(self), (dict(self),)


@dataclass(frozen=True)
class LaunchPlan:
    """One 1-D grid-stride launch.

    Attributes:
        kernel: which launch (a key of :data:`TUNING`).
        tiles: logical tiles the kernel's grid-stride loop walks (tile ``i`` by program ``i % grid``).
        grid: programs launched, ``1 <= grid <= 65535``.
        constexprs: tile sizes and other compile-time constants passed to the kernel.
        options: Triton launch options (``kpool.platform.launch_options`` plus this launch's
            ``num_warps`` / ``num_stages`` on CUDA).

    The plan functions return cached plans whose ``constexprs`` and ``options`` are read-only
    dicts (a change raises TypeError); copy them (``dict(plan.options)``) to derive others.
    """

    kernel: str
    tiles: int
    grid: int
    constexprs: Mapping[str, object] = field(default_factory=dict)
    options: Mapping[str, object] = field(default_factory=dict)

    @property
    def iters(self) -> int:
        """Grid-stride iterations of the busiest program, ``cdiv(tiles, grid)``."""
        return cdiv(self.tiles, self.grid)

    def program_of_tile(self, tile: int) -> int:
        """The program that handles ``tile``."""
        return int(tile) % self.grid


def _cached_plan(build: Callable, kernels: Tuple[str, ...], args: tuple, device, launch_options,
                 cores: Optional[int]):
    """``build(backend, cores, options, explicit, *args)``, once per key (:data:`_PLANS`).

    The key is everything a plan reads: ``build``, the call's host ints ``args``, the backend, the
    core count (``cores``, else the device's, per :func:`core_count`'s unit of ``kernels[0]``; none on
    the interpreter), the launch options (``launch_options``, else the backend's from
    :func:`kpool.platform.launch_options`, and which of the two), :data:`DECODE_ROWS` and the
    :data:`TUNING` entries of ``kernels``. A launch option that cannot be hashed bypasses the cache.
    """
    backend = backend_of(device)
    if cores is None:
        cores = core_count(backend, device, unit="cube" if kernels[0] in _DOT_KERNELS else "vector")
    elif backend not in ("cuda", "npu"):
        cores = None
    explicit = launch_options is not None
    options = dict(launch_options) if explicit else _platform.launch_options(backend)
    key = (build, args, backend, cores, explicit, tuple(options.items()), DECODE_ROWS,
           tuple([tuple(TUNING[k][backend].items()) for k in kernels]))
    try:
        plan = _PLANS.get(key, _MISSING)
    except TypeError:                       # an unhashable launch option (or tunable): no cache
        return build(backend, cores, options, explicit, *args)
    if plan is _MISSING:
        plan = build(backend, cores, options, explicit, *args)
        if len(_PLANS) >= PLAN_CACHE_SIZE:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _make(kernel: str, tiles: int, backend: str, cores: Optional[int], options: dict, explicit: bool,
          constexprs: dict, per_core_key: str = "per_core", **extra_options) -> LaunchPlan:
    """The plan of one launch. ``cores``: as resolved by :func:`_cached_plan` (None on the
    interpreter); ``options``: the explicit launch options (``explicit``) or the backend's, to
    which CUDA adds the tuned ``num_warps`` / ``num_stages`` (then ``extra_options``);
    ``per_core_key``: the tunable giving programs per core (default ``per_core``)."""
    tune = TUNING[kernel][backend]
    grid = launch_grid(tiles, backend, None, programs_per_core=tune.get(per_core_key, tune.get("per_core", 1)),
                       cpu_cap=tune.get("cap"), cores=cores)
    options = dict(options)
    if not explicit:
        if backend == "cuda":
            options.update({k: tune[k] for k in ("num_warps", "num_stages") if k in tune})
        options.update(extra_options)
    return LaunchPlan(kernel, int(tiles), grid, _ReadOnlyDict(constexprs), _ReadOnlyDict(options))


def _row_block(kernel: str, name: str, num_rows: int, backend: str) -> int:
    """The tuned row block ``TUNING[kernel][backend][name]``; on the interpreter (which pays per
    operation, not per lane) shrunk to ``next_pow2(num_rows)``, so a small batch is one tile."""
    block = TUNING[kernel][backend][name]
    return max(1, min(block, next_pow2(num_rows))) if backend == "cpu" else block


def compress_plan(num_rows: int, head_dim: int, index_kpool: int, device, launch_options=None,
              cores: Optional[int] = None) -> LaunchPlan:
    """Launch 1 of the cache update (kpool-algorithm.md §5.1-§5.3): tiles of ``BLOCK_J * P``
    token rows x ``D_SPLIT`` channels (tile ``i``: row tile ``i // cdiv(D, D_SPLIT)``, channel
    chunk ``i % cdiv(D, D_SPLIT)``), channels in chunks of ``BLOCK_D``. Two tilings:

    * throughput (``T > latency_rows``, prefill): ``BLOCK_J`` pools per tile; a tile inside one
      request compresses its ``BLOCK_J`` pools (one per lane), any other tile walks its rows in
      ``P`` groups of ``BLOCK_J``;
    * latency (``T <= latency_rows``, decode): one pool's ``P`` rows x ``BLOCK_D`` channels per
      tile, all rows at once (``ROWS_AT_ONCE``, lane = row), so a decode batch's rows and
      channels spread over many programs instead of one program walking ``P`` dependent row
      groups and every channel chunk (issue 20 point 2).

    A throughput launch with fewer tiles than programs splits the channels (``D_SPLIT = BLOCK_D``).
    The interpreter always takes rows at once, its tile shrunk to ``T``. Sized by ``T`` (host),
    never by the live rows (device data): graph capture is unchanged."""
    return _cached_plan(_compress, ("compress",), (int(num_rows), int(head_dim), int(index_kpool)), device,
                        launch_options, cores)


def _compress(backend, cores, options, explicit, num_rows, head_dim, index_kpool):
    tune = TUNING["compress"][backend]
    block_d = min(tune["BLOCK_D"] or next_pow2(head_dim), next_pow2(head_dim))
    rows_at_once = bool(tune.get("rows_at_once", False))
    if int(num_rows) <= tune.get("latency_rows", 0):
        block_j, d_split, rows_at_once = 1, block_d, True
    else:
        block_j = max(1, min(tune["BLOCK_J"], tune["window"] // (block_d * int(index_kpool))))
        block_j = 1 << (block_j.bit_length() - 1)                       # a power of two
        if backend == "cpu":   # the interpreter pays per op: one tile per few rows, shrunk to T
            block_j = max(1, min(block_j, next_pow2(cdiv(num_rows, index_kpool))))
        d_split = max(block_d, min(tune.get("D_SPLIT") or next_pow2(head_dim), next_pow2(head_dim)))
        d_split = -(-d_split // block_d) * block_d
        if cores and cdiv(num_rows, block_j * index_kpool) * cdiv(head_dim, d_split) < cores * tune["per_core"]:
            # fewer tiles than programs (a prefill chunk of a few thousand rows): the channels
            # spread over programs too (H200, 4159-row mixed step: 30.1 -> 18.2 us; a 64k prefill
            # keeps whole rows, 52 us against 85 split)
            d_split = block_d
    rows_per_tile = block_j * index_kpool
    return _make("compress", cdiv(num_rows, rows_per_tile) * cdiv(head_dim, d_split), backend, cores, options,
                 explicit, dict(P=int(index_kpool), BLOCK_J=block_j, BLOCK_D=block_d, D_SPLIT=d_split,
                                ROWS_AT_ONCE=rows_at_once, BLOCK_R=next_pow2(rows_per_tile)))


def ring_write_plan(num_requests: int, ring_capacity: int, head_dim: int, device, launch_options=None,
                    cores: Optional[int] = None) -> LaunchPlan:
    """Launch 2 of the cache update (§5.4), over the rows it stashes only: with
    ``per = min(C, BLOCK_T)`` (``C`` = ``ring_capacity``), tile ``i`` holds the
    ``(i % cdiv(C, per))``-th ``per`` rows of the last ``C`` rows of each of the requests
    ``(i // cdiv(C, per)) * (BLOCK_T // per) + [0, BLOCK_T // per)``, x all channels. Sized by
    ``R`` and ``C`` (shapes), never by ``T``: a 64k-row prefill walks its last ``C`` rows, not all
    ``T`` (H200: 19.7 -> 2.5 us)."""
    return _cached_plan(_ring_write, ("ring_write",), (int(num_requests), int(ring_capacity), int(head_dim)), device,
                        launch_options, cores)


def fused_update(device) -> bool:
    """Whether this backend runs the two cache-update launches as one when the queries allow it
    (``TUNING["ring_write"]`` ``FUSED``; :func:`kpool.ops.compress.compress_and_write_cache`)."""
    return bool(TUNING["ring_write"][backend_of(device)].get("FUSED", False))


def ring_write_tile(request: int, index_in_span: int, ring_capacity: int, block_t: int) -> int:
    """Tile of :func:`ring_write_plan` that stashes row ``index_in_span`` (0-based, of the
    request's last ``C`` rows) of ``request``."""
    per = max(1, min(int(ring_capacity), int(block_t)))
    chunks = cdiv(int(ring_capacity), per)
    return (int(request) // (int(block_t) // per)) * chunks + int(index_in_span) // per


def _ring_write(backend, cores, options, explicit, num_requests, ring_capacity, head_dim):
    block_t = _row_block("ring_write", "BLOCK_T", num_requests * ring_capacity, backend)
    per = max(1, min(ring_capacity, block_t))
    tiles = cdiv(num_requests, block_t // per) * cdiv(ring_capacity, per)
    return _make("ring_write", tiles, backend, cores, options, explicit,
                 dict(BLOCK_T=block_t, BLOCK_D=next_pow2(head_dim)))


def _pool_block(tune: dict, max_pool_seq_len: int) -> int:
    if tune["BLOCK_N"]:
        return tune["BLOCK_N"]
    return max(MIN_DOT, min(_INTERP_MAX_POOLS, next_pow2(max_pool_seq_len)))


def score_decode_plan(num_requests: int, max_pool_seq_len: int, num_heads: int, head_dim: int, device,
                      launch_options=None, cores: Optional[int] = None, *, num_rows: int = 0,
                      merged: bool = False) -> LaunchPlan:
    """Decode/MTP scoring (kpool-algorithm.md §4.1-§4.3): a tile is one request x a segment of
    its ``BLOCK_N``-pool blocks (``decode_segments``: one tile per program when
    the grid allows); each row of the request (at most :data:`DECODE_ROWS`) scores each key tile
    with one ``tl.dot`` of ``[BLOCK_N, DP] x [DP, HP]`` (heads padded to ``HP``, dims to ``DP``).
    ``tiles``: the upper bound, one pool block per tile.

    ``KEY_TILE_OUTER`` (from host ints only: graph capture unchanged) picks the loop order, both
    giving the same bits: when the chunk has more rows than requests (``num_rows > num_requests``:
    some request has 2-8 rows, MTP verify or a short request) the key tile is the outer loop and is
    read once for all the request's rows; otherwise (one row a request: plain decode) the rows are
    the outer loop and the key tiles stream through the inner one, which the compiler software-
    pipelines (H200, docs/kernels.md: decode 64 x 64k 96 us this way against 108 us key tile
    outer; MTP=3 265 us key tile outer against 334 us). Key tile outer in mode (R) stacks
    ``STACK_ROWS`` rows into one dot a key tile (``TUNING`` ``STACK_ROWS``, 0: a loop over the
    rows), with its own ``BLOCK_N`` and options (the ``*_stacked`` keys; H100 MTP=3 verify graph
    307 -> 236 us, the same bits).

    On CUDA the launch options carry the loop order's register cap (``TUNING`` ``maxnreg`` /
    ``maxnreg_key_tile_outer``), except in mode (M) (``merged``), whose exact fallback would spill
    under it (sm_90: 56-64 bytes)."""
    return _cached_plan(_score_decode, ("score_decode",), (int(num_requests), int(max_pool_seq_len), int(num_heads),
                                                           int(head_dim), int(num_rows), bool(merged)), device,
                        launch_options, cores)


def _score_decode(backend, cores, options, explicit, num_requests, max_pool_seq_len, num_heads, head_dim, num_rows,
                  merged):
    tune = TUNING["score_decode"][backend]
    key_tile_outer = num_rows > num_requests
    stack = tune.get("STACK_ROWS", 0) if key_tile_outer and not merged else 0
    block_n = tune["BLOCK_N_stacked"] if stack and tune.get("BLOCK_N_stacked") else _pool_block(tune, max_pool_seq_len)
    tiles = num_requests * cdiv(max_pool_seq_len, block_n)        # at most one pool block per tile
    # H200 (docs/kernels.md): plain decode streams longer segments best (3 programs an SM, each
    # capped at 168 registers: one wave), key tile outer hides its unpipelined loads with more
    # programs (16, at 128 registers); stacked rows pipeline their key tiles again
    suffix = "_stacked" if stack else "_key_tile_outer" if key_tile_outer else ""
    cap = tune.get("maxnreg" + suffix)
    extra = {"maxnreg": cap} if cap and backend == "cuda" and not merged else {}
    if stack and backend == "cuda":     # (_make applies extra options only to its own defaults)
        extra.update(num_warps=tune["num_warps_stacked"], num_stages=tune["num_stages_stacked"])
    return _make("score_decode", tiles, backend, cores, options, explicit,
                 dict(BLOCK_N=block_n, HP=max(MIN_DOT, next_pow2(num_heads)),
                      DP=max(MIN_DOT, next_pow2(head_dim)), DECODE_ROWS=DECODE_ROWS,
                      DOT_F32=backend == "cpu", KEY_TILE_OUTER=key_tile_outer, STACK_ROWS=stack),
                 per_core_key="per_core" + suffix, **extra)


def decode_segments(decode: LaunchPlan, num_requests: int, max_pool_seq_len: int) -> int:
    """Segments of each request's pool blocks in the decode kernel (host ints only): enough
    (request, segment) tiles for one per program of the plan's grid, each at least one block.
    Tile ``r * segments + s`` scores request ``r``'s blocks ``[s * per, (s + 1) * per)``,
    ``per = cdiv(blocks, segments)``."""
    blocks = cdiv(max_pool_seq_len, decode.constexprs["BLOCK_N"])
    return max(1, min(blocks, decode.grid // max(1, num_requests)))


def score_prefill_plan(num_rows: int, num_requests: int, total_rows: int, max_pool_seq_len: int, head_dim: int,
                       device, launch_options=None, cores: Optional[int] = None) -> LaunchPlan:
    """Prefill scoring of a chunk of ``num_rows`` rows: one tile = one request's block of
    ``BLOCK_M`` rows (blocks aligned to the request start) x ``BLOCK_N`` pools, one ``tl.dot``
    of ``[BLOCK_M, DP] x [DP, BLOCK_N]`` per head reusing the key tile. The kernel walks the
    chunk's blocks (found on the device); ``tiles`` is their host-side upper bound,
    ``(cdiv(num_rows, BLOCK_M) + R) * cdiv(max_pool_seq_len, BLOCK_N)``. ``BLOCK_M`` depends on
    ``total_rows`` (``T``), never on the chunk, so every chunk uses the same blocks."""
    return _cached_plan(_score_prefill, ("score_prefill",), (int(num_rows), int(num_requests), int(total_rows),
                                                             int(max_pool_seq_len), int(head_dim)),
                        device, launch_options, cores)


def _score_prefill(backend, cores, options, explicit, num_rows, num_requests, total_rows, max_pool_seq_len, head_dim):
    tune = TUNING["score_prefill"][backend]
    block_m = tune["BLOCK_M"]
    if backend == "cpu":
        block_m = max(MIN_DOT, min(block_m, next_pow2(total_rows)))
    block_n = _pool_block(tune, max_pool_seq_len)
    tiles = (cdiv(num_rows, block_m) + num_requests) * cdiv(max_pool_seq_len, block_n)
    return _make("score_prefill", tiles, backend, cores, options, explicit,
                 dict(BLOCK_M=block_m, BLOCK_N=block_n, DP=max(MIN_DOT, next_pow2(head_dim)),
                      DECODE_ROWS=DECODE_ROWS, DOT_F32=backend == "cpu"))


def prefill_blocks_plan(prefill: LaunchPlan, device, launch_options=None) -> LaunchPlan:
    """The one-program launch that finds the prefill kernel's row blocks on the device (prefix
    sums over the requests, ``BLOCK_R`` at a time) for the ``prefill`` plan's ``BLOCK_M``. It
    takes the backend's launch options without the prefill kernel's warps and stages."""
    return _cached_plan(_prefill_blocks, ("prefill_blocks",), (int(prefill.constexprs["BLOCK_M"]),), device,
                        launch_options, None)


def _prefill_blocks(backend, cores, options, explicit, block_m):
    options = {k: v for k, v in options.items() if k not in ("num_warps", "num_stages")}
    return _make("prefill_blocks", 1, backend, cores, options, True,
                 dict(BLOCK_M=block_m, DECODE_ROWS=DECODE_ROWS, BLOCK_R=TUNING["prefill_blocks"][backend]["BLOCK_R"]))


def merge_heads_plan(num_rows: int, head_dim: int, device, launch_options=None,
                     cores: Optional[int] = None) -> LaunchPlan:
    """Score mode (M)'s head merge (kpool-algorithm.md §4.2 (M)): tiles of ``BLOCK_ROWS`` rows,
    channels padded to ``DP``."""
    return _cached_plan(_merge_heads, ("merge_heads",), (int(num_rows), int(head_dim)), device, launch_options, cores)


def _merge_heads(backend, cores, options, explicit, num_rows, head_dim):
    block_rows = _row_block("merge_heads", "BLOCK_ROWS", num_rows, backend)
    return _make("merge_heads", cdiv(num_rows, block_rows), backend, cores, options, explicit,
                 dict(BLOCK_ROWS=block_rows, DP=next_pow2(head_dim)))


def expand_plan(num_rows: int, width: int, device, launch_options=None,
              cores: Optional[int] = None) -> LaunchPlan:
    """Index expansion (§4.5): tiles of ``BLOCK_ROWS`` rows x ``BLOCK_COLS`` output columns."""
    return _cached_plan(_expand, ("expand",), (int(num_rows), int(width)), device, launch_options, cores)


def _expand(backend, cores, options, explicit, num_rows, width):
    tune = TUNING["expand"][backend]
    tiles = cdiv(num_rows, tune["BLOCK_ROWS"]) * cdiv(width, tune["BLOCK_COLS"])
    return _make("expand", tiles, backend, cores, options, explicit,
                 dict(BLOCK_ROWS=tune["BLOCK_ROWS"], BLOCK_COLS=tune["BLOCK_COLS"]))


class TopkPlans(NamedTuple):
    """The launches of one exact top-k (:func:`topk_plans`).

    Attributes:
        select: the select launch over the keys (``segments`` tiles a live row).
        order: the ranking launch.
        merge: with ``segments > 1`` and a ranking too costly to merge them (``RANK_MERGE``), the
            select launch over the ``segments * selected`` candidates of each row (their
            ``selected`` largest); else None.
        segments: segments a row is split into for ``select`` (>= 1).
        segment_width: keys per segment (the last one may hold fewer, never fewer than
            ``selected``); ``width`` when ``segments == 1``.
        selected: keys kept per row.
    """

    select: LaunchPlan
    order: LaunchPlan
    merge: Optional[LaunchPlan]
    segments: int
    segment_width: int
    selected: int

    @property
    def candidates(self) -> int:
        """Keys of a work row the ranking launch ranks: ``segments * selected`` when it does the
        merge (split rows, no ``merge`` launch), else ``selected``."""
        return self.selected if self.merge is not None else self.segments * self.selected

    @property
    def work_width(self) -> int:
        """Columns of the int64 work buffer the launches need: the ``segments * selected``
        candidates, then the ``selected`` merged keys when a ``merge`` launch runs."""
        return self.selected * (self.segments + (self.merge is not None))


def topk_plans(num_rows: int, width: int, selected: int, device, launch_options=None,
               cores: Optional[int] = None, max_segments: Optional[int] = None,
               work_columns: Optional[int] = None) -> Optional[TopkPlans]:
    """The launches of the exact top-k (:mod:`kpool.ops.topk`) of ``num_rows`` rows of ``width``
    keys, ``selected`` kept, or ``None`` when the shape is outside the kernels' tiles (the caller
    then uses ``torch.topk`` on the keys: the same result).

    ``select``: one row (or one segment of a row) per tile, held as an ``[NT, T]`` register tile
    (``NT * T >= width``; compiled backends use ``T`` fixed and ``NT`` in ``{NT_MIN, NT_MAX}`` for
    whole rows, the power of two that holds a segment for split rows; the interpreter shrinks
    both to the row); compaction in ``CHUNK`` lanes at a time. Fewer rows than cores split each
    row into ``segments`` (``TUNING["topk_select"]``: ``MAX_SEGMENTS``, at most ``max_segments``
    when given; every segment holds at least ``selected`` keys), and ``merge`` selects the
    ``selected`` largest of the ``segments * selected`` candidates (the K largest of a row are
    among its segments' K largest), unless ``num_rows * (segments * selected)^2`` compares fit
    ``RANK_MERGE``: then ``order`` ranks the candidates and keeps the ``selected`` first, one
    launch fewer. ``work_columns`` (a given work buffer) bounds the segments to those whose
    ``work_width`` fits. ``order``: tiles of (row, ``CH`` candidates), each ranked
    against the row's candidates in blocks of ``KB``; compiled backends take the first
    ``(KB, CH)`` of ``TILES`` that gives ``tiles_per_core`` tiles a core, else the last (a prefill
    chunk: wide tiles; a decode batch: narrow ones over many cores), the interpreter one ``[KP,
    KP]`` block a row (``KP = next_pow2(selected)``, at most ``lanes`` compares)."""
    limit = -1 if max_segments is None else max(1, int(max_segments))
    columns = -1 if work_columns is None else int(work_columns)
    return _cached_plan(_topk, ("topk_select", "topk_order"),
                        (int(num_rows), int(width), int(selected), limit, columns), device, launch_options, cores)


def topk_segments(num_rows: int, width: int, selected: int, cores: Optional[int], max_segments: int) -> int:
    """Segments a row of ``width`` keys is split into (:func:`topk_plans`): the largest power of
    two ``S <= max_segments`` with ``num_rows * S <= cores``, ``S * S <= width / selected`` (the
    segments' ``width / S`` lanes against the merge's ``S * selected``) and every segment of
    ``cdiv(width, S)`` keys, the last included, holding at least ``selected``; 1 without cores."""
    s = 1
    while cores and selected > 0 and s * 2 <= max_segments and num_rows * s * 2 <= cores:
        nxt = s * 2
        seg = cdiv(width, nxt)
        if nxt * nxt * selected > width or width - (nxt - 1) * seg < selected:
            break
        s = nxt
    return s


def _select_tile(sel: dict, backend: str, lanes: int, exact: bool) -> Tuple[int, int]:
    """``(NT, T)`` of a select tile of ``lanes`` keys: the interpreter's shrunk to the row, compiled
    ones ``NT_MIN``/``NT_MAX`` (``exact`` False: two shapes for any width) or the power of two."""
    if backend == "cpu":
        t = max(MIN_DOT, min(128, next_pow2(cdiv(max(lanes, 1), MIN_DOT))))
        return max(sel["NT_MIN"], next_pow2(cdiv(lanes, t))), t
    t = sel["T"]
    if exact:
        return max(sel["NT_MIN"], next_pow2(cdiv(lanes, t))), t
    return (sel["NT_MIN"] if lanes <= sel["NT_MIN"] * t else sel["NT_MAX"]), t


def _select_plan(sel, backend, cores, options, explicit, tiles, nt, t) -> LaunchPlan:
    chunk = min(sel.get("CHUNK") or nt * t, nt * t)
    # cuda: a warp per 1024 resident keys, 4..16 (H200, 64 x 16384: 16 warps 39 us, 32 warps 44)
    warps = dict(num_warps=max(4, min(16, nt * t // 1024))) if backend == "cuda" else {}
    return _make("topk_select", tiles, backend, cores, options, explicit, dict(NT=nt, T=t, CHUNK=chunk), **warps)


def _topk(backend, cores, options, explicit, num_rows, width, selected, limit, columns):
    sel, order = TUNING["topk_select"][backend], TUNING["topk_order"][backend]
    nt, t = _select_tile(sel, backend, width, False)
    if nt > sel["NT_MAX"] or nt * t < width or selected < 1:
        return None
    most = sel.get("MAX_SEGMENTS", 1) if limit < 0 else min(limit, sel.get("MAX_SEGMENTS", 1))
    while True:           # the most segments whose work columns fit a given buffer
        segments = topk_segments(num_rows, width, selected, cores if cores else sel.get("SPLIT_CORES"), most)
        ranked = segments > 1 and num_rows * (segments * selected) ** 2 <= order.get("RANK_MERGE", 0)
        if columns < 0 or selected * (segments + (segments > 1 and not ranked)) <= columns:
            break
        most = segments // 2
    merge = None
    candidates = segments * selected if ranked else selected
    if segments > 1:      # segment and merge tiles: the powers of two that hold them (S * K <= width / S)
        nt, t = _select_tile(sel, backend, cdiv(width, segments), True)
        if not ranked:
            merge = _select_plan(sel, backend, cores, options, explicit, num_rows,
                                 *_select_tile(sel, backend, segments * selected, True))
    if backend == "cpu":
        kb = max(MIN_DOT, next_pow2(candidates))
        ch = max(1, min(kb, order["lanes"] // kb))
    else:
        enough = order["tiles_per_core"] * (cores or 1)
        kb, ch = next((tile for tile in order["TILES"] if num_rows * cdiv(candidates, tile[1]) >= enough),
                      order["TILES"][-1])
    first = _select_plan(sel, backend, cores, options, explicit, num_rows * segments, nt, t)
    second = _make("topk_order", num_rows * cdiv(candidates, ch), backend, cores, options, explicit,
                   dict(KB=kb, CH=ch))
    return TopkPlans(first, second, merge, segments, cdiv(width, segments), selected)


def score_scratch_rows(max_pool_seq_len: int, scratch_bytes: int, max_score_rows: Optional[int] = None) -> int:
    """Rows per score chunk: the int64 key scratch ``rows x max_pool_seq_len x 8 B`` stays within
    ``scratch_bytes`` (kpool-algorithm.md §4.6), at most ``max_score_rows`` when given, >= 1."""
    rows = max(1, int(scratch_bytes) // (8 * max(1, int(max_pool_seq_len))))
    if max_score_rows is not None:
        rows = max(1, min(rows, int(max_score_rows)))
    return rows


def vector_view(t: torch.Tensor, strides, max_vec: int):
    """``t``'s storage from its start, with ``t``'s offset and ``strides`` in units of ``vec``.

    ``vec`` is the largest power of two ``<= max_vec`` dividing the storage offset and every
    stride. A kernel that addresses ``base + (offset + i * stride) * VEC + d`` then has provably
    ``VEC``-aligned rows (the storage start comes from the allocator, and Triton specializes on
    its alignment at launch), so its loads vectorize without specializing on any runtime
    stride: one compile per ``VEC`` in {1, 2, 4, 8}, not one per stride pattern.

    Returns:
        ``(base 1-D tensor, offset // vec, [stride // vec, ...], vec)``.
    """
    values = [t.storage_offset(), *strides]
    vec = max(1, int(max_vec))
    while vec > 1 and any(int(v) % vec for v in values):
        vec //= 2
    base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    return base, t.storage_offset() // vec, [int(s) // vec for s in strides], vec


def word_view(t: torch.Tensor):
    """``t``'s storage from its start as int16 words, with ``t``'s offset and strides in words and
    its words per element (1: bf16, 2: fp32), for kernels that widen either dtype at run time
    (``kpool.ops._portable.load_weight_f32``): the storage start is aligned by the allocator, so
    one compiled variant serves both dtypes and every offset and stride (issue 20).

    Args:
        t: a bf16 or fp32 tensor (any shape and strides), e.g. head weights ``[T, H]`` (kpool-algorithm.md
            §4.2: fp32 or bf16, upcast to fp32).

    Returns:
        ``(base int16 1-D tensor, offset, [stride, ...], words)``, offset and strides in words.

    Raises:
        Nothing: the caller checks the dtype (a 1-byte dtype would give ``words == 0``).
    """
    words = t.element_size() // 2
    base, offset, strides, _ = vector_view(t, t.stride(), 1)
    return base.view(torch.int16), offset * words, [s * words for s in strides], words


def vector_rows(shape, dtype, device, vec: int = 8) -> torch.Tensor:
    """Zeros of ``shape`` whose rows (the last dim) start every ``vec`` elements: a view of a buffer
    padded past ``shape[-1]`` to a multiple of ``vec`` (never read), so :func:`vector_view` of it
    gives ``vec`` whatever the last dim. Used for the score kernels' query operands (q ``[T, H, D]``
    copies, the merged mode's bf16 split ``[T, 3, D]``; kpool-algorithm.md §4.2).

    Args:
        shape: the view's shape (last dim = row length, in elements). dtype, device: the buffer's.
        vec: the row alignment, in elements.

    Returns:
        A zero tensor of ``shape``, unit last stride, other strides multiples of ``vec``.

    Raises:
        Nothing of its own (torch's allocation errors).
    """
    padded = torch.zeros((*shape[:-1], -(-shape[-1] // vec) * vec), dtype=dtype, device=device)
    return padded[..., :shape[-1]]
