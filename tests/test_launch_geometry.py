"""Launch geometry and launch kwargs of every kernel launcher on every backend, with a fake
Triton driver (NPU vector cores), fake CUDA device properties (SM count) and captured launches
(platform-numerics.md §1.3, §6.1, §6.2; kpool.ops._launch).

No accelerator here: the launchers' ``_backend_of`` is patched to report ``cuda``/``npu`` for
CPU tensors, the ``@triton.jit`` kernel objects are replaced by :class:`Capture` (records the
grid, the positional args and the kwargs of ``kernel[grid](*args, **kwargs)``), and the NPU
launch options come from a cached :class:`kpool.hardware.HardwareProfile`. Nothing is
interpreted, so every case runs in milliseconds.

What must hold:
* npu: grid = min(tiles, num_vectorcore) (num_aicore if the driver gives no vector count),
  options ``multibuffer`` (False on A5) and ``enable_fp_fusion=False``;
* cuda: grid = min(tiles, SMs * programs per SM), options ``num_warps=4``,
  ``enable_fp_fusion=False`` and no NPU-only key;
* every backend: grid <= 65535, the kernel grid-strides over the rest (compress: ``iters``).
"""
import os

os.environ.setdefault("KPOOL_DEVICE", "cpu")
from kpool.platform import resolve_device  # noqa: E402

DEVICE = resolve_device()

import types  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from kpool import hardware  # noqa: E402
from kpool.hardware import HardwareProfile  # noqa: E402
from kpool.ops import _launch  # noqa: E402
from kpool.ops import compress as cm  # noqa: E402
from kpool.ops import indexer as ix  # noqa: E402

NPU_ONLY_KEYS = {"multibuffer", "force_simt_only", "set_workspace_multibuffer", "compile_mode",
                 "enable_ubuf_saving", "enable_auto_bind_sub_block"}
# Bare "cuda"/"npu" test ids would be skipped by conftest's device markers: name them apart.
ACCELERATORS = pytest.mark.parametrize("backend", ["cuda", "npu"], ids=["on-cuda", "on-npu"])
PROFILES = {"A2": HardwareProfile("npu", "A2", 223, "Ascend910B3"),
            "A3": HardwareProfile("npu", "A3", 250, "Ascend910_9392"),
            "A5": HardwareProfile("npu", "A5", 260, "Ascend950PR")}


class Capture:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` is recorded."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((tuple(grid), args, kwargs))
        return launch


@pytest.fixture
def hw(monkeypatch):
    """Fake hardware: ``hw.sms`` (CUDA SMs), ``hw.props`` (the Triton NPU driver's properties),
    query logs, and ``hw.use(backend, family)`` to make the launchers see that backend."""
    state = types.SimpleNamespace(sms=3, props={"max_shared_mem": 1, "num_aicore": 2, "num_vectorcore": 4},
                                  cuda_queries=[], npu_queries=[])

    def cuda_props(device):
        state.cuda_queries.append(device)
        return types.SimpleNamespace(multi_processor_count=state.sms, name="Fake GPU")

    def npu_props(device):
        state.npu_queries.append(device)
        return dict(state.props)

    monkeypatch.setattr(_launch, "_core_cache", {})
    monkeypatch.setattr(cm, "_grid_cap_cache", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", cuda_props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(current_device=lambda: 0), raising=False)
    driver = types.SimpleNamespace(active=types.SimpleNamespace(utils=types.SimpleNamespace(
        get_device_properties=npu_props)))
    monkeypatch.setattr(triton.runtime, "driver", driver)
    monkeypatch.setattr(hardware, "_PROFILE", None)

    def use(backend, family="A2"):
        monkeypatch.setattr(ix, "_backend_of", lambda t: backend)
        monkeypatch.setattr(cm, "_backend_of", lambda t: backend)
        if backend == "npu":
            monkeypatch.setattr(hardware, "_PROFILE", PROFILES[family])
        kernels = {}
        for mod, name in ((ix, "_score_kernel"), (ix, "_merge_heads_kernel"), (ix, "_expand_kernel"),
                          (cm, "_compress_pools_kernel"), (cm, "_ring_write_kernel")):
            kernels[name] = Capture()
            monkeypatch.setattr(mod, name, kernels[name])
        return kernels

    state.use = use
    return state


def _assert_options(kwargs, backend, family="A2"):
    """The launch options among ``kwargs`` are exactly the backend's."""
    if backend == "cuda":
        assert kwargs["num_warps"] == 4 and kwargs["enable_fp_fusion"] is False
        assert not NPU_ONLY_KEYS & set(kwargs)
    elif backend == "npu":
        assert kwargs["multibuffer"] is (family != "A5") and kwargs["enable_fp_fusion"] is False
        assert "num_warps" not in kwargs
    else:
        assert not ({"num_warps", "enable_fp_fusion"} | NPU_ONLY_KEYS) & set(kwargs)


# ------------------------------------------------------------------------------ kpool.ops._launch

def test_core_count_cuda_reads_sm_count_once_per_device(hw):
    assert _launch.core_count("cuda", torch.device("cuda", 1)) == 3
    assert _launch.core_count("cuda", torch.device("cuda", 1)) == 3
    assert hw.cuda_queries == [1]                              # cached per (backend, index)
    hw.sms = 7
    assert _launch.core_count("cuda", torch.device("cuda")) == 7   # no index: current device 0
    assert hw.cuda_queries == [1, 0] and hw.npu_queries == []


@pytest.mark.parametrize("props, cores", [
    ({"num_aicore": 24, "num_vectorcore": 48}, 48),            # A2 910B3: vector cores = 2 x AI cores
    ({"num_aicore": 20}, 20),                                  # no vector count: AI cores
    ({"max_shared_mem": 1}, 1),                                # neither: one program
])
def test_core_count_npu_reads_vector_cores_from_triton_driver(hw, props, cores):
    hw.props = props
    npu = types.SimpleNamespace(type="npu", index=None)       # torch.device("npu") needs torch_npu
    assert _launch.core_count("npu", npu) == cores
    assert _launch.core_count("npu", npu) == cores
    assert hw.npu_queries == [0] and hw.cuda_queries == []    # current device, queried once


def test_core_count_cpu_never_touches_the_driver(hw, monkeypatch):
    monkeypatch.setattr(triton.runtime, "driver", None)       # any driver access would raise
    assert _launch.core_count("cpu", torch.device("cpu")) is None
    assert _launch.launch_grid(10, "cpu", torch.device("cpu")) == 10


@pytest.mark.parametrize("backend, cores, work, per_core, limit, cpu_cap, expected", [
    ("cuda", 132, 10, 8, 65535, None, 10),          # little work: one program per tile
    ("cuda", 132, 5000, 8, 65535, None, 1056),      # SMs x programs per SM
    ("cuda", 132, 5000, 1, 65535, None, 132),
    ("cuda", 100000, 70000, 1, 65535, None, 65535),  # never above the coreDim limit
    ("cuda", 100000, 70000, 1, 10 ** 9, None, 65535),  # not even when the caller asks
    ("npu", 48, 1000, 1, 65535, None, 48),          # vector cores
    ("npu", 48, 1000, 1, 3, None, 3),               # caller's smaller limit
    ("cpu", None, 70000, 1, 65535, None, 65535),
    ("cpu", None, 70000, 1, 65535, 4, 4),           # interpreter cap
    ("cuda", 132, 0, 8, 65535, None, 1),            # at least one program
])
def test_launch_grid(hw, backend, cores, work, per_core, limit, cpu_cap, expected):
    hw.sms, hw.props = cores, {"num_vectorcore": cores}
    dev = types.SimpleNamespace(type=backend, index=0)
    assert _launch.launch_grid(work, backend, dev, programs_per_core=per_core, limit=limit,
                               cpu_cap=cpu_cap) == expected


# ------------------------------------------------------------------------------ indexer launchers

P, H, D, K_TOK, ROWS, MPS = 4, 2, 16, 8, 8, 64


def _score_inputs():
    g = torch.Generator().manual_seed(0)
    return dict(
        q=torch.randn(ROWS, H, D, generator=g).bfloat16(), weights=torch.randn(ROWS, H, generator=g),
        compressed_cache=torch.zeros(4, 16, 1, D, dtype=torch.bfloat16),
        positions=torch.arange(100, 100 + ROWS), cum_query_lens=torch.tensor([ROWS], dtype=torch.int32),
        seq_lens=torch.tensor([MPS], dtype=torch.int32), block_table=torch.arange(4, dtype=torch.int32)[None],
        max_pool_seq_len=MPS, index_kpool=P, row_start=0, num_rows=ROWS,
        out=torch.empty(ROWS, MPS))


def _expand(rows, sel=2):
    out = torch.empty(rows, K_TOK + P - 1, dtype=torch.int32)
    ix.expand_indices(pool_ids=torch.zeros(rows, sel, dtype=torch.int32), pool_scores=torch.zeros(rows, sel),
                      positions=torch.zeros(rows, dtype=torch.int64), num_live_tokens=rows,
                      index_topk=K_TOK, index_kpool=P, pack_tail=True, out=out)


@pytest.mark.parametrize("family", ["A2", "A3", "A5"])
def test_indexer_npu_grid_is_vector_cores_and_options_are_npu(hw, family):
    kernels = hw.use("npu", family)
    for mode in ("relu", "merged"):
        ix.score_pools(score_mode=mode, **_score_inputs())
    _expand(ROWS)
    (g_relu, _, kw_relu), (g_merged, _, kw_merged) = kernels["_score_kernel"].calls
    # NPU tiles (1 row x 32 pools): 8 x 2 = 16 tiles on 4 vector cores (not 2 AI cores).
    assert (kw_relu["BLOCK_ROWS"], kw_relu["BLOCK_POOLS"]) == (1, 32)
    assert g_relu == g_merged == (4,)
    (g_merge, _, kw_merge), = kernels["_merge_heads_kernel"].calls
    assert g_merge == (4,)                               # 8 rows on 4 vector cores
    (g_exp, _, kw_exp), = kernels["_expand_kernel"].calls
    assert g_exp == (4,)
    for kw in (kw_relu, kw_merged, kw_merge, kw_exp):
        _assert_options(kw, "npu", family)
    assert hw.npu_queries == [0] and hw.cuda_queries == []   # one driver query, cached


def test_indexer_cuda_grid_is_sm_count_times_programs_per_sm_and_options_are_cuda(hw):
    hw.sms = 1
    kernels = hw.use("cuda")
    ix.score_pools(score_mode="relu", **_score_inputs())
    ix.score_pools(score_mode="merged", **_score_inputs())
    _expand(ROWS * 3)
    per_sm = ix._PROGRAMS_PER_CORE["cuda"]
    assert per_sm > 1
    (g_relu, _, kw_relu), (g_merged, _, kw_merged) = kernels["_score_kernel"].calls
    assert g_relu == g_merged == (min(16, per_sm),)          # 16 tiles, 1 SM
    (g_merge, _, kw_merge), = kernels["_merge_heads_kernel"].calls
    assert g_merge == (min(ROWS, per_sm),)
    (g_exp, _, kw_exp), = kernels["_expand_kernel"].calls
    assert g_exp == (min(ROWS * 3, per_sm),)
    for kw in (kw_relu, kw_merged, kw_merge, kw_exp):
        _assert_options(kw, "cuda")
    assert hw.npu_queries == []                              # the NPU driver is never asked


def test_indexer_cpu_grid_is_all_tiles_and_no_options(hw, monkeypatch):
    monkeypatch.setattr(triton.runtime, "driver", None)
    kernels = hw.use("cpu")
    ix.score_pools(score_mode="relu", block_rows=1, block_pools=32, **_score_inputs())
    _expand(ROWS)
    (g, _, kw), = kernels["_score_kernel"].calls
    assert g == (16,)
    _assert_options(kw, "cpu")
    (g, _, kw), = kernels["_expand_kernel"].calls
    rows, cols = ix._EXPAND_TILES["cpu"]
    assert g == (triton.cdiv(ROWS, rows) * triton.cdiv(K_TOK + P - 1, cols),)
    _assert_options(kw, "cpu")


@ACCELERATORS
def test_indexer_grid_never_exceeds_65535(hw, backend):
    hw.sms, hw.props = 100000, {"num_vectorcore": 100000}
    kernels = hw.use(backend)
    _expand(70000, sel=1)                                     # 70000 tiles of one row
    (g, _, _), = kernels["_expand_kernel"].calls
    assert g == (65535,)


def test_indexer_explicit_launch_options_pass_through_unchanged(hw):
    kernels = hw.use("cuda")
    ix.score_pools(score_mode="relu", launch_options={"num_warps": 2, "enable_fp_fusion": False},
                   **_score_inputs())
    (_, _, kw), = kernels["_score_kernel"].calls
    assert kw["num_warps"] == 2 and kw["enable_fp_fusion"] is False


# ------------------------------------------------------------------------------ compress launcher

def _compress(num_live, D_=16):
    T = num_live
    cm.compress_and_write_cache(
        k=torch.zeros(T, D_), gate=torch.zeros(T, D_), ape=torch.zeros(P, D_),
        compressed_cache=torch.zeros(8, 4, 1, D_, dtype=torch.bfloat16), tail_cache=torch.zeros(3, 2, 7, D_),
        positions=torch.arange(T), cum_query_lens=torch.tensor([T], dtype=torch.int32),
        raw_seq_lens=torch.tensor([T], dtype=torch.int32), slot_mapping=torch.full((T,), -1),
        tail_block_table=torch.zeros(1, 1, dtype=torch.int32), tail_slot_mapping=torch.full((T,), -1),
        num_live_tokens=T, index_kpool=P)


def _compress_geometry(kernels):
    """(grid, block_t, iters) of both launches (they must agree)."""
    (g1, a1, kw1), = kernels["_compress_pools_kernel"].calls
    (g2, a2, kw2), = kernels["_ring_write_kernel"].calls
    assert g1 == g2 and kw1["BLOCK_T"] == kw2["BLOCK_T"]
    iters1, iters2 = a1[12], a2[8]                        # the `iters` parameter of each kernel
    assert iters1 == iters2
    return g1, kw1["BLOCK_T"], iters1, kw1, kw2


@pytest.mark.parametrize("family", ["A2", "A5"])
def test_compress_npu_grid_is_vector_cores_with_grid_stride(hw, family):
    kernels = hw.use("npu", family)
    _compress(1000)
    grid, block_t, iters, kw1, kw2 = _compress_geometry(kernels)
    work = -(-1000 // block_t)
    assert grid == (min(work, 4),) and grid[0] * iters >= work > grid[0] * (iters - 1)
    _assert_options(kw1, "npu", family)
    _assert_options(kw2, "npu", family)


def test_compress_cuda_grid_is_sm_count_with_grid_stride(hw):
    kernels = hw.use("cuda")
    _compress(1000)
    grid, block_t, iters, kw1, kw2 = _compress_geometry(kernels)
    work = -(-1000 // block_t)
    assert work > 3 and grid == (3,) and grid[0] * iters >= work > grid[0] * (iters - 1)
    _assert_options(kw1, "cuda")
    _assert_options(kw2, "cuda")
    assert hw.npu_queries == []


@ACCELERATORS
def test_compress_grid_never_exceeds_65535(hw, backend, monkeypatch):
    hw.sms, hw.props = 100000, {"num_vectorcore": 100000}
    kernels = hw.use(backend)
    monkeypatch.setattr(cm, "_MAX_BLOCK_T", 1)             # one row per block: 70000 blocks
    _compress(70000)
    grid, block_t, iters, _, _ = _compress_geometry(kernels)
    assert block_t == 1 and grid == (65535,) and iters == 2
