"""The launch-plan cache of ``kpool.ops.plan`` (issue 20 point 4, "a light launcher").

A plan function returns the same :class:`kpool.ops.plan.LaunchPlan` object for the same key and
a fresh one whenever anything the plan reads changes: each host int, the backend, the core
count, the launch options (explicit or the backend's, hence the NPU hardware profile),
:data:`kpool.ops.plan.DECODE_ROWS` and the :data:`kpool.ops.plan.TUNING` entries (replaced or
changed in place). A cached plan equals the one built without the cache, and cannot be changed
through its ``constexprs`` / ``options``. No kernel runs here (plans only): milliseconds.
"""
import copy
import os
import pickle

import pytest

os.environ.setdefault("KPOOL_DEVICE", "cpu")

from kpool import hardware  # noqa: E402
from kpool.hardware import HardwareProfile  # noqa: E402
from kpool.ops import plan  # noqa: E402

pytestmark = pytest.mark.interpreter_ok

# (plan function, positional host ints, keyword host ints): one call of every plan function.
CALLS = {
    "compress": (plan.compress_plan, (64, 128, 4), {}),
    "ring_write": (plan.ring_write_plan, (64, 4, 128), {}),
    "score_decode": (plan.score_decode_plan, (64, 16384, 32, 128), {"num_rows": 64}),
    "score_prefill": (plan.score_prefill_plan, (64, 64, 64, 16384, 128), {}),
    "merge_heads": (plan.merge_heads_plan, (64, 128), {}),
    "expand": (plan.expand_plan, (64, 2051), {}),
    "topk": (plan.topk_plans, (64, 4096, 512), {}),        # inside the register tiles of every backend
}
# Which TUNING entries each call reads.
TUNED = {"compress": ("compress",), "ring_write": ("ring_write",), "score_decode": ("score_decode",),
         "score_prefill": ("score_prefill",), "merge_heads": ("merge_heads",), "expand": ("expand",),
         "topk": ("topk_select", "topk_order")}
BACKENDS = ("cpu", "cuda", "npu")
# Bare "cpu"/"cuda"/"npu" test ids would be skipped by conftest's device markers: name them apart.
ON_BACKENDS = pytest.mark.parametrize("backend", BACKENDS, ids=[f"on-{b}" for b in BACKENDS])
ON_ACCELERATORS = pytest.mark.parametrize("backend", ["cuda", "npu"], ids=["on-cuda", "on-npu"])


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    """An empty cache, a fake NPU profile and fixed core counts (no device is asked)."""
    monkeypatch.setattr(plan, "_PLANS", {})
    monkeypatch.setattr(plan, "_core_cache", {("cuda", 0, "sm"): 132, ("npu", 0, "vector"): 48,
                                              ("npu", 0, "cube"): 24})
    monkeypatch.setattr(hardware, "_PROFILE", HardwareProfile("npu", "A2", 223, "Ascend910B3"))


def _device(backend):
    return "cpu" if backend == "cpu" else _Device(backend)


class _Device:
    """A device of ``backend`` with index 0 (``kpool.ops.plan.backend_of`` reads ``.type``)."""

    def __init__(self, kind):
        self.type, self.index = kind, 0


def _call(name, backend, *, ints=None, kw=None, **extra):
    fn, args, kwargs = CALLS[name]
    return fn(*(ints or args), _device(backend), **{**kwargs, **(kw or {}), **extra})


def _prefill_blocks(backend, **extra):
    prefill = _call("score_prefill", backend)
    return plan.prefill_blocks_plan(prefill, _device(backend), **extra)


def _same(a, b):
    """Two results of a plan function are one cached object (a plan, a pair of plans or None)."""
    if isinstance(a, tuple):
        return all(x is y for x, y in zip(a, b))
    return a is b


@ON_BACKENDS
@pytest.mark.parametrize("name", sorted(CALLS))
def test_same_key_same_plan_object(name, backend):
    first = _call(name, backend)
    assert first is not None
    assert _same(_call(name, backend), first)
    assert _same(_call(name, backend, ints=tuple(CALLS[name][1])), first)


@ON_BACKENDS
def test_prefill_blocks_plan_cached_per_block_rows(backend):
    assert _prefill_blocks(backend) is _prefill_blocks(backend)


@ON_BACKENDS
@pytest.mark.parametrize("name", sorted(CALLS))
def test_cached_plan_equals_the_uncached_one(name, backend, monkeypatch):
    cached = _call(name, backend)
    _call(name, backend)
    plan.clear_plan_cache()
    assert not plan._PLANS
    fresh = _call(name, backend)
    assert not _same(fresh, cached) and fresh == cached


@ON_BACKENDS
@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_host_int_is_in_the_key(name, backend):
    fn, args, kwargs = CALLS[name]
    first = _call(name, backend)
    for i in range(len(args)):
        changed = list(args)
        changed[i] += 1
        other = _call(name, backend, ints=tuple(changed))
        assert not _same(other, first), f"argument {i} of {fn.__name__} is not in the key"
        assert other == _call(name, backend, ints=tuple(changed))
    for key in kwargs:
        assert not _same(_call(name, backend, kw={key: kwargs[key] + 1}), first)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_backend_is_in_the_key(name):
    plans = [_call(name, backend) for backend in BACKENDS]
    for i in range(len(plans)):
        for j in range(i):
            assert not _same(plans[i], plans[j])


@ON_ACCELERATORS
@pytest.mark.parametrize("name", sorted(CALLS))
def test_core_count_is_in_the_key(name, backend, monkeypatch):
    first = _call(name, backend)
    assert not _same(_call(name, backend, cores=7), first)
    assert _same(_call(name, backend, cores=7), _call(name, backend, cores=7))
    # the device's core count (another device, or a test's fake one) is read at every call
    monkeypatch.setattr(plan, "_core_cache", {k: 5 for k in plan._core_cache})
    fewer = _call(name, backend)
    assert not _same(fewer, first)
    lead = fewer[0] if isinstance(fewer, tuple) else fewer
    assert lead.grid <= 5 * plan.TUNING[lead.kernel][backend].get("per_core", 1)


@ON_BACKENDS
@pytest.mark.parametrize("name", sorted(CALLS))
def test_launch_options_are_in_the_key(name, backend):
    default = _call(name, backend)
    explicit = _call(name, backend, launch_options={"num_warps": 2})
    assert not _same(explicit, default)
    assert _same(_call(name, backend, launch_options={"num_warps": 2}), explicit)
    assert not _same(_call(name, backend, launch_options={"num_warps": 8}), explicit)
    lead = explicit[0] if isinstance(explicit, tuple) else explicit
    assert dict(lead.options) == {"num_warps": 2}
    assert not _same(_prefill_blocks(backend, launch_options={"num_stages": 1}), _prefill_blocks(backend))


def test_unhashable_launch_options_bypass_the_cache():
    a = plan.expand_plan(64, 2051, "cpu", {"extern_libs": {"libdevice": "x"}})
    b = plan.expand_plan(64, 2051, "cpu", {"extern_libs": {"libdevice": "x"}})
    assert a is not b and a == b and not plan._PLANS


@pytest.mark.parametrize("family", ["A2", "A5"])
def test_npu_profile_is_in_the_key(family, monkeypatch):
    """The NPU launch options come from the hardware profile (``multibuffer`` off on A5)."""
    a2 = plan.expand_plan(64, 2051, _device("npu"))
    monkeypatch.setattr(hardware, "_PROFILE", HardwareProfile("npu", family, 260 if family == "A5" else 223, "x"))
    now = plan.expand_plan(64, 2051, _device("npu"))
    assert now.options["multibuffer"] is (family != "A5")
    assert (now is a2) is (family == "A2")


@ON_BACKENDS
@pytest.mark.parametrize("name", sorted(CALLS))
def test_tuning_is_in_the_key(name, backend, monkeypatch):
    """A replaced TUNING entry (monkeypatch.setitem) and one changed in place (a tuning
    script's ``.update``) both give a new plan, and restoring the entry the old one."""
    first = _call(name, backend)
    for kernel in TUNED[name]:
        entry = plan.TUNING[kernel][backend]
        monkeypatch.setitem(plan.TUNING[kernel], backend, dict(entry, _probe=1))
        replaced = _call(name, backend)
        assert not _same(replaced, first)
        plan.TUNING[kernel][backend]["_probe"] = 2               # in place
        assert not _same(_call(name, backend), replaced)
        monkeypatch.setitem(plan.TUNING[kernel], backend, entry)
        assert _same(_call(name, backend), first)


def test_a_changed_tunable_changes_the_plan(monkeypatch):
    before = plan.expand_plan(64, 2051, "cpu")
    plan.TUNING["expand"]["cpu"]["BLOCK_COLS"] *= 2
    try:
        after = plan.expand_plan(64, 2051, "cpu")
        assert after.constexprs["BLOCK_COLS"] == 2 * before.constexprs["BLOCK_COLS"]
    finally:
        plan.TUNING["expand"]["cpu"]["BLOCK_COLS"] //= 2
    assert plan.expand_plan(64, 2051, "cpu") is before


@ON_BACKENDS
def test_decode_rows_is_in_the_key(backend, monkeypatch):
    decode, prefill = _call("score_decode", backend), _call("score_prefill", backend)
    blocks = _prefill_blocks(backend)
    monkeypatch.setattr(plan, "DECODE_ROWS", 4)
    assert _call("score_decode", backend).constexprs["DECODE_ROWS"] == 4 != decode.constexprs["DECODE_ROWS"]
    assert _call("score_prefill", backend).constexprs["DECODE_ROWS"] == 4 != prefill.constexprs["DECODE_ROWS"]
    assert _prefill_blocks(backend).constexprs["DECODE_ROWS"] == 4 != blocks.constexprs["DECODE_ROWS"]


def test_cached_plans_are_read_only_and_copyable():
    p = plan.compress_plan(64, 128, 4, "cuda", cores=132)
    for change in (lambda d: d.__setitem__("P", 8), lambda d: d.update(P=8), lambda d: d.pop("P"),
                   lambda d: d.clear(), lambda d: d.setdefault("X", 1), lambda d: d.__delitem__("P"),
                   lambda d: d.popitem()):
        with pytest.raises(TypeError, match="read-only"):
            change(p.constexprs)
        with pytest.raises(TypeError, match="read-only"):
            change(p.options)
    assert p.constexprs["P"] == 4 and plan.compress_plan(64, 128, 4, "cuda", cores=132) is p
    derived = dict(p.options, num_warps=1)
    assert derived["num_warps"] == 1 and p.options["num_warps"] != 1
    for clone in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert clone == p and dict(clone.constexprs) == dict(p.constexprs)
    assert {**p.constexprs} == dict(p.constexprs)


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(plan, "PLAN_CACHE_SIZE", 3)
    for rows in range(1, 20):
        plan.expand_plan(rows, 2051, "cpu")
        assert len(plan._PLANS) <= 3
    again = plan.expand_plan(19, 2051, "cpu")
    assert again is plan.expand_plan(19, 2051, "cpu")


@pytest.mark.parametrize("explicit_first", [False, True], ids=["defaults-first", "explicit-first"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_explicit_options_equal_to_the_defaults_are_not_the_defaults(name, explicit_first):
    """CUDA adds the tuned warps and stages to the backend's options only when none are given:
    explicit options equal to ``kpool.platform.launch_options("cuda")`` are another key."""
    from kpool.platform import launch_options
    given = launch_options("cuda")
    calls = [lambda: _call(name, "cuda", launch_options=given), lambda: _call(name, "cuda")]
    if not explicit_first:
        calls.reverse()
    results = [call() for call in calls]
    explicit, default = results if explicit_first else results[::-1]
    lead_e, lead_d = (p[0] if isinstance(p, tuple) else p for p in (explicit, default))
    assert dict(lead_e.options) == given
    tuned = {k: plan.TUNING[lead_d.kernel]["cuda"][k] for k in ("num_warps", "num_stages")
             if k in plan.TUNING[lead_d.kernel]["cuda"]}
    if name == "topk":
        tuned["num_warps"] = max(4, min(16, lead_d.constexprs["NT"] * lead_d.constexprs["T"] // 1024))
    if name == "score_decode":      # the register cap of the plan's loop order
        tuned["maxnreg"] = plan.TUNING["score_decode"]["cuda"][
            "maxnreg_key_tile_outer" if lead_d.constexprs["KEY_TILE_OUTER"] else "maxnreg"]
    assert dict(lead_d.options) == {**given, **tuned}


class _Capture:
    """Stands in for a ``@triton.jit`` kernel: records the grid and arguments of each launch."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((tuple(grid), args, kwargs))


def _score_launches(monkeypatch, rows, qlens):
    import torch

    from kpool.ops import score as sc
    kernels = {name: _Capture() for name in ("_score_decode_kernel", "_prefill_blocks_kernel", "_score_prefill_kernel")}
    for name, capture in kernels.items():
        monkeypatch.setattr(sc, name, capture)
    H, D, M = 2, 16, 64
    ends = torch.tensor(qlens, dtype=torch.int32).cumsum(0).to(torch.int32)
    sc.score_keys(q=torch.zeros(rows, H, D, dtype=torch.bfloat16), weights=torch.zeros(rows, H),
                  compressed_cache=torch.zeros(4, 16, 1, D, dtype=torch.bfloat16),
                  positions=torch.arange(rows), cum_query_lens=ends,
                  seq_lens=torch.full((len(qlens),), M, dtype=torch.int32),
                  block_table=torch.zeros(len(qlens), 4, dtype=torch.int32), max_pool_seq_len=M, index_kpool=4,
                  score_mode="relu", row_start=0, num_rows=rows, keys=torch.empty(rows, M, dtype=torch.int64))
    return {name: len(capture.calls) for name, capture in kernels.items()}


@pytest.mark.parametrize("rows, qlens", [(1, [1]), (8, [1] * 8), (8, [8]), (8, [3, 0, 2]), (9, [1] * 9), (9, [9]),
                                         (64, [1] * 64)])
def test_prefill_launches_only_when_a_request_can_be_longer_than_decode_rows(monkeypatch, rows, qlens):
    """A batch of at most DECODE_ROWS rows (padding included) has no request longer than
    DECODE_ROWS, whatever its metadata: the prefill kernel and its row-block helper would write
    nothing, so they are not launched (issue 20 point 4). Decided from the shape alone."""
    launches = _score_launches(monkeypatch, rows, qlens)
    prefill = int(rows > plan.DECODE_ROWS)
    assert launches == {"_score_decode_kernel": 1, "_prefill_blocks_kernel": prefill, "_score_prefill_kernel": prefill}
    monkeypatch.setattr(plan, "DECODE_ROWS", 0)       # every request a prefill's: both pairs again
    assert _score_launches(monkeypatch, rows, qlens)["_score_prefill_kernel"] == 1


def test_skipping_the_prefill_pair_keeps_the_keys(torch_device):
    """The same 8 live rows scored as a batch of 8 rows (prefill pair skipped) and of 9 rows (one
    padding row: the pair launched, finding no request longer than DECODE_ROWS): the same keys."""
    import torch

    from kpool.ops import score as sc
    g = torch.Generator().manual_seed(5)
    H, D, M = 2, 16, 64
    batch = dict(q=torch.randn(9, H, D, generator=g).bfloat16(), weights=torch.randn(9, H, generator=g),
                 positions=torch.tensor([160, 161, 162, 251, 252, 253, 254, 255, 0]))
    fixed = dict(compressed_cache=torch.randn(4, 16, 1, D, generator=g).bfloat16(),
                 cum_query_lens=torch.tensor([3, 3, 8], dtype=torch.int32),          # 3, 0 and 5 rows
                 seq_lens=torch.tensor([40, 0, 64], dtype=torch.int32),
                 block_table=torch.tensor([[2, 0, 1, 3], [0, 0, 0, 0], [3, 1, 0, 2]], dtype=torch.int32))
    keys = {}
    for rows in (8, 9):
        args = {**{k: v[:rows] for k, v in batch.items()}, **fixed}
        keys[rows] = sc.score_keys(**{k: v.to(torch_device) for k, v in args.items()}, max_pool_seq_len=M,
                                   index_kpool=4, score_mode="relu", row_start=0, num_rows=rows,
                                   keys=torch.zeros(rows, M, dtype=torch.int64, device=torch_device)).cpu()
    assert torch.equal(keys[8], keys[9][:8]) and (keys[9][8] == 0).all()
