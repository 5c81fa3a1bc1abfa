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

from kpool.ops import compress, indexer  # noqa: E402

# Integer arguments that stay specialized: head dims and unit inner strides (constant in practice).
SPECIALIZED_INTS = {
    "_compress_pools_kernel": {"D", "k_s1", "g_s1", "ape_s1", "cc_s3", "t_s3"},
    "_ring_write_kernel": {"D", "k_s1", "g_s1", "t_s3"},
    "_merge_heads_kernel": {"stride_qd"},
    "_score_kernel": {"stride_qd", "stride_cd"},
    "_expand_kernel": set(),
}
# Pointers whose alignment varies with guard bands / caller buffers.
UNALIGNED_POINTERS = {
    "_compress_pools_kernel": {"cc_ptr", "tail_ptr"},
    "_ring_write_kernel": {"tail_ptr"},
    "_merge_heads_kernel": set(),
    "_score_kernel": {"cache_ptr"},
    "_expand_kernel": {"out_ptr"},
}
KERNELS = {name: getattr(compress, name, None) or getattr(indexer, name) for name in SPECIALIZED_INTS}


def _options(name):
    """The decorator's two lists, read from the kernel's source (interpreters may drop them)."""
    import ast
    module = compress if hasattr(compress, name) else indexer
    tree = ast.parse(inspect.getsource(module))
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    lists = {"do_not_specialize": set(), "do_not_specialize_on_alignment": set()}
    for deco in fn.decorator_list:
        for kw in getattr(deco, "keywords", []):
            if kw.arg in lists:
                lists[kw.arg] = set(ast.literal_eval(kw.value))
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


@pytest.mark.interpreter_ok
@pytest.mark.parametrize("backend", ["cuda", "npu"])
@pytest.mark.parametrize("head_dim", [16, 64, 128, 576])
def test_compiled_cache_update_tile_ignores_the_number_of_live_rows(backend, head_dim):
    tiles = {compress.cache_update_tiles(n, head_dim, backend) for n in range(1, 300)}
    assert len(tiles) == 1
    (block_t, block_d), = tiles
    assert block_d >= head_dim and block_t * block_d <= compress._TILE_ELEMS[backend]


@pytest.mark.interpreter_ok
def test_interpreter_tile_shrinks_to_the_live_rows():
    assert compress.cache_update_tiles(1, 16, "cpu") == (1, 16)
    assert compress.cache_update_tiles(3, 16, "cpu") == (4, 16)
    assert compress.cache_update_tiles(1000, 16, "cpu")[0] == compress._MAX_BLOCK_T
