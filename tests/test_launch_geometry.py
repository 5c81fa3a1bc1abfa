"""Launch geometry and launch kwargs of every kernel launcher on every backend, with a fake
Triton driver (NPU vector / AI cores), fake CUDA device properties (SM count) and captured
launches (platform-numerics.md §1.3, §6.1, §6.2; ``kpool.ops.plan``).

No accelerator here: ``kpool.ops.plan.backend_of`` is patched to report ``cuda``/``npu`` for
CPU tensors, the ``@triton.jit`` kernel objects are replaced by :class:`Capture` (records the
grid, the positional args and the kwargs of ``kernel[grid](*args, **kwargs)``), and the NPU
launch options come from a cached :class:`kpool.hardware.HardwareProfile`. Nothing is
interpreted, so every case runs in milliseconds.

What must hold:
* every launcher launches exactly its :class:`kpool.ops.plan.LaunchPlan`: grid, constexprs, options;
* npu: grid = min(tiles, num_vectorcore) for vector kernels, min(tiles, num_aicore) for the
  ``tl.dot`` score kernels; options ``multibuffer`` (False on A5), ``enable_fp_fusion=False``;
* cuda: grid = min(tiles, SMs * programs per SM), options ``num_warps`` (the plan's),
  ``enable_fp_fusion=False`` and no NPU-only key;
* every backend: grid <= 65535, the kernel grid-strides over the rest.
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
from kpool.ops import compress as cm  # noqa: E402
from kpool.ops import expand as ex  # noqa: E402
from kpool.ops import merged as mg  # noqa: E402
from kpool.ops import plan  # noqa: E402
from kpool.ops import score as sc  # noqa: E402

NPU_ONLY_KEYS = {"multibuffer", "force_simt_only", "set_workspace_multibuffer", "compile_mode",
                 "enable_ubuf_saving", "enable_auto_bind_sub_block"}
# Bare "cuda"/"npu" test ids would be skipped by conftest's device markers: name them apart.
ACCELERATORS = pytest.mark.parametrize("backend", ["cuda", "npu"], ids=["on-cuda", "on-npu"])
PROFILES = {"A2": HardwareProfile("npu", "A2", 223, "Ascend910B3"),
            "A3": HardwareProfile("npu", "A3", 250, "Ascend910_9392"),
            "A5": HardwareProfile("npu", "A5", 260, "Ascend950PR")}
KERNELS = ((cm, "_compress_kernel"), (cm, "_ring_write_kernel"), (sc, "_score_decode_kernel"),
           (sc, "_prefill_blocks_kernel"), (sc, "_score_prefill_kernel"), (mg, "_merge_heads_kernel"),
           (ex, "_expand_kernel"))


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

    monkeypatch.setattr(plan, "_core_cache", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", cuda_props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(current_device=lambda: 0), raising=False)
    driver = types.SimpleNamespace(active=types.SimpleNamespace(utils=types.SimpleNamespace(
        get_device_properties=npu_props)))
    monkeypatch.setattr(triton.runtime, "driver", driver)
    monkeypatch.setattr(hardware, "_PROFILE", None)

    def use(backend, family="A2"):
        monkeypatch.setattr(plan, "backend_of", lambda device: backend)
        if backend == "npu":
            monkeypatch.setattr(hardware, "_PROFILE", PROFILES[family])
        kernels = {}
        for mod, name in KERNELS:
            kernels[name] = Capture()
            monkeypatch.setattr(mod, name, kernels[name])
        return kernels

    state.use = use
    return state


def _assert_options(kwargs, backend, family="A2", kernel=None):
    """The launch options among ``kwargs`` are exactly the backend's (and the plan's warps)."""
    if backend == "cuda":
        assert kwargs["enable_fp_fusion"] is False and not NPU_ONLY_KEYS & set(kwargs)
        if kernel is not None:
            assert kwargs["num_warps"] == plan.TUNING[kernel]["cuda"]["num_warps"]
    elif backend == "npu":
        assert kwargs["multibuffer"] is (family != "A5") and kwargs["enable_fp_fusion"] is False
        assert "num_warps" not in kwargs and "num_stages" not in kwargs
    else:
        assert not ({"num_warps", "enable_fp_fusion", "num_stages"} | NPU_ONLY_KEYS) & set(kwargs)


# ------------------------------------------------------------------------------ kpool.ops.plan

def test_core_count_cuda_reads_sm_count_once_per_device(hw):
    assert plan.core_count("cuda", torch.device("cuda", 1)) == 3
    assert plan.core_count("cuda", torch.device("cuda", 1)) == 3
    assert hw.cuda_queries == [1]                              # cached per (backend, index)
    hw.sms = 7
    assert plan.core_count("cuda", torch.device("cuda")) == 7   # no index: current device 0
    assert hw.cuda_queries == [1, 0] and hw.npu_queries == []


@pytest.mark.parametrize("props, vector, cube", [
    ({"num_aicore": 24, "num_vectorcore": 48}, 48, 24),        # A2 910B3: vector cores = 2 x AI cores
    ({"num_aicore": 20}, 20, 20),                              # no vector count: AI cores
    ({"num_vectorcore": 40}, 40, 40),                          # no AI-core count: vector cores
    ({"max_shared_mem": 1}, 1, 1),                             # neither: one program
])
def test_core_count_npu_reads_vector_and_cube_cores_from_triton_driver(hw, props, vector, cube):
    hw.props = props
    npu = types.SimpleNamespace(type="npu", index=None)       # torch.device("npu") needs torch_npu
    assert plan.core_count("npu", npu) == vector
    assert plan.core_count("npu", npu, unit="cube") == cube
    assert plan.core_count("npu", npu) == vector
    assert hw.npu_queries == [0, 0] and hw.cuda_queries == []  # current device, once per unit


def test_core_count_cpu_never_touches_the_driver(hw, monkeypatch):
    monkeypatch.setattr(triton.runtime, "driver", None)       # any driver access would raise
    assert plan.core_count("cpu", torch.device("cpu")) is None
    assert plan.launch_grid(10, "cpu", torch.device("cpu")) == 10


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
    assert plan.launch_grid(work, backend, dev, programs_per_core=per_core, limit=limit,
                            cpu_cap=cpu_cap) == expected


def test_launch_plan_iterations_and_programs():
    p = plan.LaunchPlan("expand", tiles=10, grid=4)
    assert p.iters == 3 and [p.program_of_tile(t) for t in range(10)] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    # An explicit core count needs no device: what parity.checking.programs and the sm_90 compile use.
    assert plan.compress_plan(10 ** 6, 128, 4, "cuda", cores=132).grid == 132 * plan.TUNING["compress"]["cuda"]["per_core"]


def test_compress_programs_per_shape_on_the_h200():
    """Issue 20 point 2: a decode batch's compression spreads over programs (one pool's P rows
    x BLOCK_D channels per tile) instead of one program walking P row groups; a long prefill
    keeps the throughput tile (docs/kernels.md "Compression without latency")."""
    def programs(rows):
        p = plan.compress_plan(rows, 128, 4, "cuda", cores=132)
        return p.grid, p.iters, p.constexprs["ROWS_AT_ONCE"], p.constexprs["D_SPLIT"]
    assert programs(64) == (64, 1, True, 32)                 # decode 64 rows: 16 pools x 4 channel chunks
    assert programs(1) == (4, 1, True, 32)                   # batch 1
    edge = plan.TUNING["compress"]["cuda"]["latency_rows"]
    assert programs(edge) == (edge, 1, True, 32)             # 256 pools x 4 chunks, one pass each
    # a mixed step's 4159 rows: 130 tiles of 8 pools would leave most of the 1584 programs idle,
    # so the channels split too (520 tiles); a 64k prefill has 2048 whole-row tiles
    assert programs(4159) == (520, 1, False, 32)
    assert programs(65536) == (1584, 2, False, 128)


def test_vector_view_divides_offsets_and_strides_by_the_common_alignment():
    backing = torch.zeros(1000, dtype=torch.bfloat16)
    view = backing[24:24 + 8 * 16].view(8, 16)
    base, off, strides, vec = plan.vector_view(view, view.stride()[:1], 8)      # outer strides only
    assert vec == 8 and off == 3 and strides == [2] and base.data_ptr() == backing.data_ptr()
    odd = backing[7:7 + 8 * 16].view(8, 16)
    assert plan.vector_view(odd, (16,), 8)[3] == 1                      # a guard of 7 elements: scalar
    assert plan.vector_view(backing[4:4 + 96].view(-1, 12), (12,), 8)[3] == 4


@pytest.mark.parametrize("last", [1, 3, 8, 13])
def test_vector_rows_read_as_eight_element_vectors(last):
    """Rows of any length, padded in the buffer: every row starts on an 8-element boundary, zeros."""
    t = plan.vector_rows((5, 3, last), torch.bfloat16, "cpu")
    assert t.shape == (5, 3, last) and t.stride(2) == 1 and not t.any()
    assert plan.vector_view(t, (t.stride(0), t.stride(1)), 8)[3] == 8


# ------------------------------------------------------------------------------ launchers

P, H, D, K_TOK, ROWS, MPS = 4, 2, 16, 8, 24, 64


def _score(mode="relu", **extra):
    g = torch.Generator().manual_seed(0)
    sc.score_keys(q=torch.randn(ROWS, H, D, generator=g).bfloat16(), weights=torch.randn(ROWS, H, generator=g),
                  compressed_cache=torch.zeros(4, 16, 1, D, dtype=torch.bfloat16),
                  positions=torch.arange(100, 100 + ROWS),
                  cum_query_lens=torch.tensor([2, 4, ROWS], dtype=torch.int32),
                  seq_lens=torch.tensor([MPS] * 3, dtype=torch.int32), block_table=torch.arange(4, dtype=torch.int32)[None].expand(3, 4),
                  max_pool_seq_len=MPS, index_kpool=P, score_mode=mode, row_start=0, num_rows=ROWS,
                  keys=torch.empty(ROWS, MPS, dtype=torch.int64), **extra)


def _expand(rows):
    out = torch.empty(rows, K_TOK + P - 1, dtype=torch.int32)
    ex.expand_indices(top_keys=torch.zeros(rows, 2, dtype=torch.int64), positions=torch.zeros(rows, dtype=torch.int64),
                      cum_query_lens=torch.tensor([rows], dtype=torch.int32), index_topk=K_TOK, index_kpool=P,
                      pack_tail=True, out=out)


def _compress(T, D_=16):
    cm.compress_and_write_cache(
        k=torch.zeros(T, D_), gate=torch.zeros(T, D_), ape=torch.zeros(P, D_),
        compressed_cache=torch.zeros(8, 4, 1, D_, dtype=torch.bfloat16), tail_cache=torch.zeros(3, 2, 7, D_),
        positions=torch.arange(T), cum_query_lens=torch.tensor([T], dtype=torch.int32),
        raw_seq_lens=torch.tensor([T], dtype=torch.int32), slot_mapping=torch.full((T,), -1),
        tail_block_table=torch.zeros(1, 1, dtype=torch.int32), tail_slot_mapping=torch.full((T,), -1),
        index_kpool=P)


def _only(kernels, name):
    (call,) = kernels[name].calls
    return call


@pytest.mark.parametrize("family", ["A2", "A3", "A5"])
def test_npu_grids_are_vector_cores_or_ai_cores_for_dot_kernels_and_options_are_npu(hw, family):
    hw.props = {"num_aicore": 2, "num_vectorcore": 4}
    kernels = hw.use("npu", family)
    _score("merged")
    _expand(ROWS)
    _compress(1000)
    for name, kernel, cores in (("_score_decode_kernel", "score_decode", 2), ("_score_prefill_kernel", "score_prefill", 2),
                                ("_merge_heads_kernel", "merge_heads", 4), ("_expand_kernel", "expand", 4),
                                ("_compress_kernel", "compress", 4), ("_ring_write_kernel", "ring_write", 4)):
        grid, _, kw = _only(kernels, name)
        assert grid[0] <= cores and grid[0] >= 1, (name, grid)
        _assert_options(kw, "npu", family)
    assert _only(kernels, "_prefill_blocks_kernel")[0] == (1,)
    assert _only(kernels, "_compress_kernel")[0] == (4,) and _only(kernels, "_score_decode_kernel")[0] == (2,)
    assert hw.cuda_queries == [] and len(hw.npu_queries) == 2     # one driver query per core kind, cached


def test_cuda_grids_are_sm_count_times_programs_per_sm_and_options_are_cuda(hw):
    hw.sms = 1
    kernels = hw.use("cuda")
    _score("relu")
    _expand(ROWS * 3)
    _compress(10 ** 4)
    for name, kernel in (("_score_decode_kernel", "score_decode"), ("_score_prefill_kernel", "score_prefill"),
                         ("_expand_kernel", "expand"), ("_compress_kernel", "compress"),
                         ("_ring_write_kernel", "ring_write")):
        grid, _, kw = _only(kernels, name)
        # _score's batch has more rows than requests: the decode launch is key tile outer
        per_sm = plan.TUNING[kernel]["cuda"]["per_core_key_tile_outer" if kernel == "score_decode" else "per_core"]
        assert grid[0] <= per_sm, (name, grid)
        _assert_options(kw, "cuda", kernel=kernel)
    assert _only(kernels, "_compress_kernel")[0] == (plan.TUNING["compress"]["cuda"]["per_core"],)
    assert hw.npu_queries == []                              # the NPU driver is never asked


def test_launchers_launch_exactly_their_plan(hw):
    """Grid, constexprs and options of every launch are those of the LaunchPlan that
    ``parity.checking.programs`` recomputes (one home for the launch geometry)."""
    kernels = hw.use("cuda")
    hw.sms = 5
    _compress(777)
    _expand(50)
    grid, _, kw = _only(kernels, "_compress_kernel")
    want = plan.compress_plan(777, 16, P, "cuda")
    assert grid == (want.grid,) and {k: kw[k] for k in want.constexprs} == dict(want.constexprs)
    grid, _, kw = _only(kernels, "_ring_write_kernel")
    want = plan.ring_write_plan(1, 7, 16, "cuda")
    assert grid == (want.grid,) and {k: kw[k] for k in want.constexprs} == dict(want.constexprs)
    grid, _, kw = _only(kernels, "_expand_kernel")
    want = plan.expand_plan(50, K_TOK + P - 1, "cuda")
    assert grid == (want.grid,) and {k: kw[k] for k in want.constexprs} == dict(want.constexprs)


def test_cpu_grids_and_no_options(hw, monkeypatch):
    monkeypatch.setattr(triton.runtime, "driver", None)
    kernels = hw.use("cpu")
    _score("relu")
    _expand(ROWS)
    for name in ("_score_decode_kernel", "_score_prefill_kernel", "_expand_kernel"):
        grid, _, kw = _only(kernels, name)
        _assert_options(kw, "cpu")
        assert kw["DOT_F32"] if "score" in name else True            # the interpreter dots in fp32


@ACCELERATORS
def test_grid_never_exceeds_65535(hw, backend, monkeypatch):
    hw.sms, hw.props = 100000, {"num_vectorcore": 100000, "num_aicore": 100000}
    kernels = hw.use(backend)
    _expand(70000)                                            # 70000 tiles of one row
    assert _only(kernels, "_expand_kernel")[0] == (65535,)
    monkeypatch.setitem(plan.TUNING["compress"], backend, dict(BLOCK_J=1, BLOCK_D=16, D_SPLIT=16, window=2 ** 20, per_core=1))
    _compress(70000 * P)                                      # 70000 tiles of one pool
    assert _only(kernels, "_compress_kernel")[0] == (65535,)


def test_explicit_launch_options_pass_through_unchanged(hw):
    kernels = hw.use("cuda")
    _score("relu", launch_options={"num_warps": 2, "enable_fp_fusion": False})
    for name in ("_score_decode_kernel", "_score_prefill_kernel"):
        kw = _only(kernels, name)[2]
        assert kw["num_warps"] == 2 and kw["enable_fp_fusion"] is False and "num_stages" not in kw


# ------------------------------------------------------------------------------ one layout per launch

def _score_calls(hw, q=None, weights=None, cache=None, mode="relu"):
    """The CUDA launches of one ``score_keys`` call on these inputs (the rest as ``_score``)."""
    kernels = hw.use("cuda")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(ROWS, H, D, generator=g).bfloat16() if q is None else q
    sc.score_keys(q=q, weights=torch.randn(ROWS, H, generator=g) if weights is None else weights,
                  compressed_cache=torch.zeros(4, 16, 1, D, dtype=torch.bfloat16) if cache is None else cache,
                  positions=torch.arange(100, 100 + ROWS), cum_query_lens=torch.tensor([2, 4, ROWS], dtype=torch.int32),
                  seq_lens=torch.tensor([MPS] * 3, dtype=torch.int32),
                  block_table=torch.arange(4, dtype=torch.int32)[None].expand(3, 4), max_pool_seq_len=MPS,
                  index_kpool=P, score_mode=mode, row_start=0, num_rows=ROWS,
                  keys=torch.empty(ROWS, MPS, dtype=torch.int64))
    return kernels


def _q_layouts():
    q = torch.randn(ROWS, H, D, generator=torch.Generator().manual_seed(1)).bfloat16()
    inner = torch.zeros(ROWS, H, D, 2, dtype=torch.bfloat16)
    inner[..., 0] = q
    flat = torch.zeros(3 + q.numel(), dtype=torch.bfloat16)
    flat[3:] = q.flatten()
    rows = torch.zeros(ROWS, H * D + 5, dtype=torch.bfloat16)
    rows[:, :H * D] = q.flatten(1)
    return {"contiguous": q, "inner stride 2": inner[..., 0], "offset 3": flat[3:].view(ROWS, H, D),
            "rows padded by 5": rows[:, :H * D].view(ROWS, H, D)}


@pytest.mark.parametrize("layout", ["contiguous", "inner stride 2", "offset 3", "rows padded by 5"])
@pytest.mark.parametrize("mode", ["relu", "merged"])
def test_score_kernels_see_one_query_layout(hw, layout, mode):
    """Any q view reaches both score kernels (and the head merge) as 8-element vectors with a unit
    inner stride from an aligned start, holding q's values: one compiled layout (issue 20)."""
    q = _q_layouts()[layout]
    kernels = _score_calls(hw, q=q, mode=mode)
    for name in ("_score_decode_kernel", "_score_prefill_kernel"):
        _, args, kwargs = _only(kernels, name)
        base, offset, stride_t, stride_h, stride_d = args[:5]
        assert (kwargs["VQ"], stride_d, base.data_ptr() % 16) == (8, 1, 0), (name, kwargs["VQ"], stride_d)
        if mode == "relu":
            seen = base.view(torch.bfloat16).as_strided(q.shape, (stride_t * 8, stride_h * 8, 1), offset * 8)
            assert torch.equal(seen.view(torch.int16), q.view(torch.int16))
    if mode == "merged":
        _, args, _ = _only(kernels, "_merge_heads_kernel")
        assert args[0].data_ptr() % 16 == 0 and args[3] == 1
        assert torch.equal(args[0].as_strided(q.shape, args[1:4]), q.view(torch.int16))


@pytest.mark.parametrize("pad, vc", [(0, 8), (2, 1), (4, 1), (8, 8), (1, 1)])
def test_cache_vector_width_is_one_or_eight(hw, pad, vc):
    """A cache whose pages are padded by 2 or 4 elements is read as scalars (VC = 1), not as 2- or
    4-element vectors: two compiled variants fewer; the strides then count elements."""
    pages = torch.zeros(4, 16 * D + pad, dtype=torch.bfloat16)
    cache = pages[:, :16 * D].view(4, 16, 1, D)
    kernels = _score_calls(hw, cache=cache)
    _, args, kwargs = _only(kernels, "_score_decode_kernel")
    assert kwargs["VC"] == vc
    offset, stride_n, stride_b = args[9], args[10], args[11]
    assert (offset * vc, stride_n * vc, stride_b * vc) == (0, 16 * D + pad, D)


def test_head_merge_compiles_one_variant_for_both_weight_dtypes(hw):
    """The head merge reads fp32 and bf16 weights through int16 words, their dtype a runtime int:
    the same constexprs and argument types either way (issue 20, fewer compilations)."""
    w = torch.randn(ROWS, H, generator=torch.Generator().manual_seed(2))
    seen = []
    for weights in (w, w.bfloat16(), w.t().contiguous().t()):
        _, args, kwargs = _only(_score_calls(hw, weights=weights, mode="merged"), "_merge_heads_kernel")
        base, offset, stride_t, stride_h, words = args[4:9]
        assert base.dtype == torch.int16 and base.data_ptr() % 16 == 0
        assert words == weights.element_size() // 2
        assert (offset, stride_t, stride_h) == (0, weights.stride(0) * words, weights.stride(1) * words)
        seen.append(tuple(sorted(kwargs.items())))
    assert seen[0] == seen[1] == seen[2]


def test_compression_inputs_reach_the_kernels_unit_strided_and_aligned(hw):
    """k with an inner stride of 2, gate one element past an aligned start, APE transposed: both
    kernels get unit inner strides from 16-byte aligned starts, holding the same values."""
    T, D_ = 12, 16
    g = torch.Generator().manual_seed(3)
    k = torch.randn(T, D_, 2, generator=g)[..., 0]
    gate = torch.randn(1 + T * D_, generator=g)[1:].view(T, D_)
    ape = torch.randn(D_, P, generator=g).t()
    kernels = hw.use("cuda")
    cm.compress_and_write_cache(
        k=k, gate=gate, ape=ape, compressed_cache=torch.zeros(8, 4, 1, D_, dtype=torch.bfloat16),
        tail_cache=torch.zeros(3, 2, 7, D_), positions=torch.arange(T),
        cum_query_lens=torch.tensor([T], dtype=torch.int32),
        raw_seq_lens=torch.tensor([T], dtype=torch.int32), slot_mapping=torch.full((T,), -1),
        tail_block_table=torch.zeros(1, 1, dtype=torch.int32), tail_slot_mapping=torch.full((T,), -1), index_kpool=P)
    _, args, _ = _only(kernels, "_compress_kernel")
    for seen, want, inner in ((args[0], k, args[19]), (args[1], gate, args[21]), (args[2], ape, args[23])):
        assert inner == 1 and seen.stride(1) == 1 and seen.data_ptr() % 16 == 0 and torch.equal(seen, want)
    _, args, _ = _only(kernels, "_ring_write_kernel")
    assert (args[12], args[14]) == (1, 1)
    assert torch.equal(args[0].view(torch.float32), k) and torch.equal(args[1].view(torch.float32), gate)
