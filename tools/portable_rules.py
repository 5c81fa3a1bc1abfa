"""The vocabulary of the portable-subset checker (:mod:`tools.portability`) and of
:mod:`tools.launch_options`: rule ids, the NPU-only option names, the Triton names each rule
rejects, :class:`Violation`, and the ``ast`` name helpers both checkers share
(platform-numerics.md §1.4, §6.1; docs/portable-subset.md "Checker rules"). A development
(lint) module: no runtime package imports it.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

__all__ = ["Violation", "RULES", "NPU_ONLY_OPTIONS", "SORT", "TRANSCENDENTAL", "NON_RN_DIVISION", "BAD_PRECISION",
           "TENSOR_REDUCTIONS", "JIT_DECORATORS", "TL_SUBMODULES", "ROUND_HELPER", "DOT_SWITCH", "PRAGMA",
           "parse_source", "import_aliases", "dotted", "tl_short"]

RULES = ("extra-libdevice", "sort-topk", "tf32", "dot-precision", "dot-accumulator", "dot-interpreter",
         "inline-asm", "npu-option", "reduction", "bf16-rounding", "transcendental", "float-division")

# NPUOptions fields of triton-ascend 3.2.x (platform-numerics.md §1.4) that upstream Triton
# rejects as launch kwargs, plus the Ascend-only op kwargs of §6.1. num_warps, num_stages and
# enable_fp_fusion are shared with CUDA and therefore not listed.
NPU_ONLY_OPTIONS = frozenset({
    "multibuffer", "enable_ubuf_saving", "enable_auto_bind_sub_block", "enable_hivm_auto_cv_balance",
    "sync_solver", "unit_flag", "inject_barrier_all", "inject_block_all",
    "limit_auto_multi_buffer_only_for_local_buffer", "limit_auto_multi_buffer_of_local_buffer",
    "set_workspace_multibuffer", "tile_mix_vector_loop", "tile_mix_cube_loop",
    "disable_auto_inject_block_sync", "enable_linearize", "enable_nd2nz_on_vector", "compile_mode",
    "force_simt_only", "allowed_dot_input_precisions", "care_padding", "propagate_nan",
})

SORT = frozenset({"sort", "topk"})
TRANSCENDENTAL = frozenset({"exp", "exp2", "log", "log2", "sqrt", "sqrt_rn", "rsqrt", "sigmoid",
                            "softmax", "sin", "cos", "erf", "fma"})
NON_RN_DIVISION = frozenset({"fdiv", "div_rz", "div_rd", "div_ru"})
BAD_PRECISION = frozenset({"tf32", "tf32x3", "hf32", "bf16x3", "bf16x6"})
TENSOR_REDUCTIONS = frozenset({"sum", "max", "min"})
JIT_DECORATORS = frozenset({"triton.jit", "triton.runtime.jit", "triton.runtime.jit.jit"})
# Sub-namespaces of triton.language that re-export the same functions (tl.math.exp is tl.exp).
TL_SUBMODULES = ("math.", "standard.", "core.")
ROUND_HELPER = "round_to_bf16_bits"
DOT_SWITCH = "DOT_F32"
PRAGMA = re.compile(r"#\s*portable-ok:\s*([\w-]+(?:\s*,\s*[\w-]+)*)")


@dataclass(frozen=True)
class Violation:
    """One construct outside the portable subset.

    Attributes:
        rule: one of :data:`RULES` (or ``"launch-options"``/``"syntax"``).
        filename: the file the source came from (as passed in).
        line, col: 1-based line and 0-based column of the offending node.
        message: what was found and why it is not portable / not bit-exact.
    """

    rule: str
    filename: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.col}: [{self.rule}] {self.message}"


def import_aliases(tree: ast.AST) -> Dict[str, str]:
    """Local name -> fully dotted module/object path, from every import in the file."""
    aliases = {"tl": "triton.language", "triton": "triton"}  # defaults for import-less snippets
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    head = a.name.split(".")[0]
                    aliases[head] = head
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def dotted(node: ast.AST) -> Optional[List[str]]:
    """``a.b.c`` -> ``["a", "b", "c"]``; None for anything that is not a plain name chain."""
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def tl_short(full: str) -> Optional[str]:
    """``"triton.language.math.exp"`` -> ``"exp"``; None outside ``triton.language``."""
    if not full.startswith("triton.language."):
        return None
    rest = full[len("triton.language."):]
    for sub in TL_SUBMODULES:
        if rest.startswith(sub):
            return rest[len(sub):]
    return rest


def parse_source(source: str, filename: str) -> Tuple[Optional[ast.AST], List[Violation]]:
    """``(tree, [])``, or ``(None, [a "syntax" Violation])`` when ``source`` does not parse."""
    try:
        return ast.parse(source, filename=filename), []
    except SyntaxError as err:
        return None, [Violation("syntax", filename, err.lineno or 0, err.offset or 0, f"cannot parse: {err.msg}")]
