"""Kernel arguments follow one naming convention across ``kpool/ops`` (the Triton tutorials' and
vllm-ascend's style; the convention is written in ``kpool/ops/__init__.py``).

Read from the source with ``ast`` (no Triton import): every ``@triton.jit`` function's argument
that addresses memory ends in ``_ptr`` (``_ptrs`` for a block of pointers), and every stride is
``stride_<tensor>_<axis>`` where ``<tensor>_ptr`` (or the ``<tensor>_offset`` of a vector view)
is an argument of the same function and ``<axis>`` one of the documented axis names. A renamed
pointer without its strides, or an abbreviation (``stride_w_t`` for ``weights_ptr``), fails.
"""
import ast
import pathlib

import pytest

OPS = pathlib.Path(__file__).resolve().parents[1] / "kpool" / "ops"
AXES = {"t", "d", "h", "n", "b", "r", "m", "c", "k", "p", "blk", "plane"}
"""Axis names: t token row, d channel, h head, n page (compressed cache), b row in a page, r request,
m block-table column, c ring slot, k selected-key column, p APE slot, blk ring block, plane K / gate."""


def _jit_functions():
    for path in sorted(OPS.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                    "triton.jit" in ast.unparse(d) for d in node.decorator_list):
                yield f"{path.name}:{node.name}", [a.arg for a in node.args.args]


JIT = dict(_jit_functions())


def stride_problems(params):
    """The stride arguments of one signature that break the convention, with the reason."""
    stems = {p[:-len(suffix)] for p in params for suffix in ("_ptr", "_ptrs", "_offset") if p.endswith(suffix)}
    bad = []
    for p in params:
        if not p.startswith("stride_"):
            continue
        tensor, _, axis = p[len("stride_"):].rpartition("_")
        if axis not in AXES:
            bad.append(f"{p}: axis {axis!r} not in {sorted(AXES)}")
        elif tensor not in stems:
            bad.append(f"{p}: no {tensor}_ptr argument")
    return bad


def test_every_ops_module_was_read():
    assert {"compress.py:_compress_kernel", "compress.py:_ring_write_kernel", "score.py:_score_decode_kernel",
            "score.py:_score_prefill_kernel", "merged.py:_merge_heads_kernel",
            "expand.py:_expand_kernel"} <= set(JIT)


@pytest.mark.interpreter_ok
@pytest.mark.parametrize("name", sorted(JIT))
def test_strides_name_their_pointer_and_axis(name):
    assert stride_problems(JIT[name]) == []


@pytest.mark.interpreter_ok
def test_the_check_rejects_the_old_abbreviations():
    """Names this convention replaced (``weights_ptr`` strides as ``stride_w_t``, a bare
    ``stride_positions``, the block table as ``stride_bt_r``) are each reported."""
    assert len(stride_problems(["weights_ptr", "stride_w_t", "positions_ptr", "stride_positions",
                                "block_table_ptr", "stride_bt_r", "stride_weights_t"])) == 3
