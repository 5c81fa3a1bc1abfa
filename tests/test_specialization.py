"""Compilation variants of the kernels stay bounded by the configuration, not by the batch.

Triton compiles one variant per pattern of its integer arguments ("== 1", "% 16 == 0") and per
16-byte alignment of its pointers, unless they are listed in ``do_not_specialize`` /
``do_not_specialize_on_alignment``. A stream of batches varies sizes, page sizes, paddings and
guard offsets all the time; on an H200 the generated ``device`` profile spent most of its time
compiling before these lists were complete. Each kernel's specialized integer arguments are
pinned here exactly, so a new argument needs a decision, and the cache-update tile of the
compiled backends does not depend on the number of live rows.
"""
import inspect
import os

import pytest

os.environ.setdefault("KPOOL_DEVICE", "cpu")

from kpool.ops import compress, expand, merged, plan, score  # noqa: E402

# Integer arguments that stay specialized: head dims and unit inner strides (constant in practice).
SPECIALIZED_INTS = {
    "_compress_kernel": {"D", "stride_k_d", "stride_gate_d", "stride_ape_d", "stride_cache_d", "stride_tail_d"},
    "_ring_write_kernel": {"D", "stride_k_d", "stride_gate_d", "stride_tail_d"},
    "_update_kernel": {"D", "stride_k_d", "stride_gate_d", "stride_ape_d", "stride_cache_d", "stride_tail_d"},
    "_merge_heads_kernel": {"stride_q_d"},
    "_score_decode_kernel": {"stride_q_d", "stride_cache_d"},
    "_prefill_blocks_kernel": set(),
    "_score_prefill_kernel": {"stride_q_d", "stride_cache_d"},
    "_expand_kernel": set(),
}
# Pointers whose alignment varies with guard bands / caller buffers. The score kernels get q and
# the cache as their storage start (kpool.ops.plan.vector_view), aligned, so they specialize on it.
UNALIGNED_POINTERS = {
    "_compress_kernel": {"cache_ptr", "tail_ptr"},
    "_ring_write_kernel": {"tail_ptr"},
    "_update_kernel": {"cache_ptr", "tail_ptr", "ring_tail_ptr"},
    "_merge_heads_kernel": set(),
    "_score_decode_kernel": set(),
    "_prefill_blocks_kernel": set(),
    "_score_prefill_kernel": set(),
    "_expand_kernel": {"out_ptr"},
}
MODULES = (compress, score, merged, expand)
KERNELS = {name: next(getattr(m, name) for m in MODULES if hasattr(m, name)) for name in SPECIALIZED_INTS}


def _options(name):
    """The decorator's two lists, read from the kernel's source (interpreters may drop them)."""
    import ast
    module = next(m for m in MODULES if hasattr(m, name))
    tree = ast.parse(inspect.getsource(module))
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    names = {n: list(v) for n, v in vars(module).items() if n.startswith("_") and isinstance(v, list)}
    lists = {"do_not_specialize": set(), "do_not_specialize_on_alignment": set()}
    for deco in fn.decorator_list:
        for kw in getattr(deco, "keywords", []):
            if kw.arg in lists:
                lists[kw.arg] = set(eval(compile(ast.Expression(kw.value), "<list>", "eval"), {}, names))
    return lists["do_not_specialize"], lists["do_not_specialize_on_alignment"]


@pytest.mark.interpreter_ok
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_only_intended_arguments_are_specialized(name):
    params = inspect.signature(KERNELS[name].fn).parameters.values()
    runtime = [p.name for p in params if "constexpr" not in str(p.annotation)]
    ints = {n for n in runtime if not n.endswith("_ptr")}
    pointers = {n for n in runtime if n.endswith("_ptr")}
    no_spec, no_align = _options(name)
    assert no_spec <= ints and no_align <= pointers, (no_spec - ints, no_align - pointers)
    assert ints - no_spec == SPECIALIZED_INTS[name]
    assert no_align == UNALIGNED_POINTERS[name]
    if name.startswith("_score_"):   # heads, head dim, pool size: runtime, one variant per padded shape
        assert {"H", "D", "P"} <= no_spec


@pytest.mark.interpreter_ok
@pytest.mark.parametrize("backend", ["cuda", "npu"])
@pytest.mark.parametrize("head_dim", [16, 64, 128, 576])
def test_compiled_tiles_ignore_the_batch(backend, head_dim):
    """On compiled backends every constexpr of every plan depends on the configuration only
    (P, D, H), never on the rows, requests or pool counts of a batch: one compile per
    configuration. The compression has at most three fixed variants, picked by ``T`` alone: the
    latency tile up to ``latency_rows`` rows, the throughput tile above, its channels split
    (``D_SPLIT = BLOCK_D``) while it has fewer tiles than programs."""
    def constexprs(make, sizes=(1, 7, 299, 4096)):
        return {tuple(sorted(make(n).constexprs.items())) for n in sizes}
    edge = plan.TUNING["compress"][backend]["latency_rows"]
    compress = lambda n: plan.compress_plan(n, head_dim, 4, backend, cores=8)  # noqa: E731
    (latency,) = constexprs(compress, (1, 7, edge // 2, edge))
    throughputs = [dict(c) for c in constexprs(compress, (edge + 1, 4096, 10 ** 5, 10 ** 6, 10 ** 7))]
    assert len(throughputs) <= 2
    assert len({tuple(sorted((k, v) for k, v in c.items() if k != "D_SPLIT")) for c in throughputs}) == 1
    split = [c for c in throughputs if c["D_SPLIT"] == c["BLOCK_D"]]
    assert split and (len(throughputs) == 1 or split[0] == dict(compress(edge + 1).constexprs))
    throughput = max(throughputs, key=lambda c: c["D_SPLIT"])
    latency = dict(latency)
    assert latency["ROWS_AT_ONCE"] and latency["BLOCK_J"] == 1 and latency["D_SPLIT"] == latency["BLOCK_D"]
    assert latency["BLOCK_R"] * latency["BLOCK_D"] <= plan.TUNING["compress"][backend]["window"]
    assert not dict(throughput)["ROWS_AT_ONCE"]
    assert len(constexprs(lambda n: plan.ring_write_plan(n, n % 13 + 1, head_dim, backend, cores=8))) == 1
    assert len(constexprs(lambda n: plan.score_decode_plan(n, n + 5, 32, head_dim, backend, cores=8))) == 1
    assert len(constexprs(lambda n: plan.score_prefill_plan(n, n, 3 * n, n + 5, head_dim, backend, cores=8))) == 1
    assert len(constexprs(lambda n: plan.expand_plan(n, 2051, backend, cores=8))) == 1
    tiles = dict(throughput)
    assert tiles["BLOCK_D"] <= head_dim and tiles["BLOCK_J"] * tiles["BLOCK_D"] * 4 <= plan.TUNING["compress"][backend]["window"]


@pytest.mark.interpreter_ok
def test_interpreter_tiles_shrink_to_the_batch():
    assert plan.compress_plan(1, 16, 4, "cpu").constexprs["BLOCK_J"] == 1
    assert plan.compress_plan(9, 16, 4, "cpu").constexprs["BLOCK_J"] == 4
    assert plan.compress_plan(10 ** 5, 16, 4, "cpu").constexprs["BLOCK_J"] == plan.TUNING["compress"]["cpu"]["BLOCK_J"]
    assert plan.score_prefill_plan(3, 1, 3, 10, 16, "cpu").constexprs["BLOCK_M"] == plan.MIN_DOT
