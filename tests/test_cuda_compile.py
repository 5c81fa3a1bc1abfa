"""Every kernel compiles for CUDA sm_90 (H200) on this CPU-only machine.

Triton's CUDA backend runs its MLIR passes and ptxas without a GPU, so layout-pass crashes
(Triton 3.6's TritonGPURemoveLayoutConversions failed on an i1 mask mixed into int math at
small head dims) are caught in CI, not first on the device. Skipped where the installed Triton
has no NVIDIA backend (triton-ascend). The compiles run in a subprocess because the test session
runs the kernels under the interpreter (``TRITON_INTERPRET=1`` is read when a kernel is decorated).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

try:
    from triton.backends import backends as _BACKENDS
except ImportError:  # pragma: no cover
    _BACKENDS = {}
pytestmark = pytest.mark.skipif("nvidia" not in _BACKENDS, reason="Triton has no NVIDIA backend here")

POINTERS = {
    # compress.py
    "k_ptr": "*fp32", "gate_ptr": "*fp32", "ape_ptr": "*fp32", "cc_ptr": "*i16", "tail_ptr": "*fp32",
    "pos_ptr": "*i64", "slot_ptr": "*i64", "tslot_ptr": "*i64", "cum_ptr": "*i32", "raw_ptr": "*i32",
    "tbt_ptr": "*i32",
    # indexer.py
    "q_ptr": "*i16", "w_ptr": "*fp32", "qbar_ptr": "*fp32", "cache_ptr": "*i16", "seq_lens_ptr": "*i32",
    "bt_ptr": "*i32", "ids_ptr": "*i32", "sc_ptr": "*fp32", "out_ptr": "*fp32",
}


def _compile(fn, constexprs, pointer_overrides=None):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = (pointer_overrides or {}).get(name, POINTERS[name])
        else:
            sig[name] = "i32"
    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": False})


def _compress_combos():
    from kpool.ops import compress
    for block_t, block_d in [(1, 16), (4, 16), (32, 16), (64, 16), (16, 128), (64, 128)]:
        _compile(compress._compress_pools_kernel, {"P": 4, "BLOCK_T": block_t, "BLOCK_D": block_d})
        _compile(compress._ring_write_kernel, {"BLOCK_T": block_t, "BLOCK_D": block_d},
                 {"k_ptr": "*i32", "gate_ptr": "*i32", "tail_ptr": "*i32"})
        yield f"compress BLOCK_T={block_t} BLOCK_D={block_d}"


def _indexer_combos():
    from kpool.ops import indexer
    for H, D, mode in [(2, 16, 0), (3, 16, 1), (32, 128, 0), (32, 128, 1)]:
        _indexer_compile(indexer, H, D, mode)
        yield f"indexer H={H} D={D} mode={mode}"


def _indexer_compile(indexer, H, D, mode):
    hp = triton.next_power_of_2(H)
    _compile(indexer._score_kernel, {"H": H, "HP": hp, "D": D, "P": 4, "MODE": mode, "W_BF16": False,
                                     "WIDE": False, "BLOCK_ROWS": 1, "BLOCK_POOLS": 32})
    _compile(indexer._merge_heads_kernel, {"H": H, "D": D, "DP": D, "W_BF16": True, "BLOCK_ROWS": 4},
             {"w_ptr": "*i16"})
    _compile(indexer._expand_kernel, {"P": 4, "PACK": bool(mode), "BLOCK_ROWS": 1, "BLOCK_COLS": 256},
             {"out_ptr": "*i32"})


def _main() -> None:
    """Subprocess entry: compile every combination, print one JSON line of results."""
    done, errors = [], []
    for combos in (_compress_combos, _indexer_combos):
        try:
            done.extend(combos())
        except Exception as exc:  # report the first failing combination of each family
            errors.append(f"{combos.__name__}: {type(exc).__name__}: {str(exc).splitlines()[-1][:300]}")
    print(json.dumps({"done": done, "errors": errors}))


def test_all_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KPOOL_DEVICE")}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", "import tests.test_cuda_compile as m; m._main()"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["errors"], result["errors"]
    assert len(result["done"]) == 10
