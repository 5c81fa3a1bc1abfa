"""Static check that kernel sources stay inside the portable Triton subset
(platform-numerics.md §6.1, §1.4, §1.5; design.md "Canonical numerics"; docs/portable-subset.md).

A development (lint) tool: ``tests/test_portable_subset.py`` runs it over ``kpool/ops``; no runtime
package imports it. ``python tools/portability.py [ROOT]`` prints the violations of a tree.

The kernels in ``kpool/ops/`` must compile on triton-ascend 3.2.x (A2/A3/A5), upstream Triton on
CUDA and the CPU interpreter, and reproduce ``reference/numerics.py`` bit for bit. Most ways of
breaking that are visible in the source, so this module parses it (``ast``, no import, no
Triton needed) and reports each construct that is outside the subset.

Rules (``Violation.rule``, :data:`RULES`): ``extra-libdevice``, ``sort-topk``, ``tf32``,
``dot-precision``, ``dot-accumulator``, ``dot-interpreter``, ``inline-asm``, ``npu-option``,
``reduction``, ``bf16-rounding``, ``transcendental``, ``float-division``; what each rejects and
why: docs/portable-subset.md "Checker rules".

Suppression: a comment ``# portable-ok: <rule>[, <rule>] -- <reason>`` on the line a violation
is reported at silences exactly those rules on that line (e.g. an exact int32 ``tl.max`` used
as a loop bound); :func:`suppressions` lists them so a test can print every one.

What this cannot see (needs the runtime tests): the dtype of a tensor (a ``tl.sum`` over a
selected float ``-0.0`` returns ``+0.0`` under the interpreter), implicit fp32 -> bf16
conversion by ``tl.store`` into a bf16 pointer, and names reached through ``getattr``.
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

if __package__ in (None, ""):       # python tools/portability.py: the repository root first
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.portable_rules import (BAD_PRECISION, DOT_SWITCH, JIT_DECORATORS, NON_RN_DIVISION, NPU_ONLY_OPTIONS,
                                  PRAGMA, ROUND_HELPER, RULES, SORT, TENSOR_REDUCTIONS, TRANSCENDENTAL, Violation,
                                  dotted, import_aliases, parse_source, tl_short)

__all__ = ["Violation", "RULES", "NPU_ONLY_OPTIONS", "check_portable_subset", "sum_calls", "suppressions",
           "check_tree"]


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.AST, filename: str, rules: Set[str]):
        self.filename = filename
        self.rules = rules
        self.aliases = import_aliases(tree)
        self.out: List[Violation] = []
        self.jit_depth = 0
        self.func_stack: List[ast.AST] = []
        self.stmt_stack: List[ast.stmt] = []
        self.sums: List[Tuple[int, bool]] = []

    # ---- helpers -----------------------------------------------------------------------
    def report(self, rule: str, node: ast.AST, message: str) -> None:
        if rule in self.rules:
            self.out.append(Violation(rule, self.filename, getattr(node, "lineno", 0),
                                      getattr(node, "col_offset", 0), message))

    def resolve(self, node: ast.AST) -> Optional[str]:
        """Fully dotted name of a name chain, first component resolved through the imports."""
        parts = dotted(node)
        if parts is None:
            return None
        head = self.aliases.get(parts[0], parts[0])
        return ".".join([head] + parts[1:])

    def tl_name(self, node: ast.AST) -> Optional[str]:
        """``"sum"`` for ``tl.sum``/``triton.language.math.sum``/an imported ``sum``; else None."""
        full = self.resolve(node)
        return None if full is None else tl_short(full)

    def is_jit(self, fn: ast.AST) -> bool:
        for dec in getattr(fn, "decorator_list", ()):
            target = dec.func if isinstance(dec, ast.Call) else dec
            if self.resolve(target) in JIT_DECORATORS:
                return True
        return False

    # ---- scopes ------------------------------------------------------------------------
    def visit_FunctionDef(self, node):  # also AsyncFunctionDef
        jit = self.is_jit(node)
        self.jit_depth += jit
        self.func_stack.append(node)
        self.generic_visit(node)
        self.func_stack.pop()
        self.jit_depth -= jit

    visit_AsyncFunctionDef = visit_FunctionDef

    def generic_visit(self, node):
        is_stmt = isinstance(node, ast.stmt)
        if is_stmt:
            self.stmt_stack.append(node)
        super().generic_visit(node)
        if is_stmt:
            self.stmt_stack.pop()

    # ---- imports -----------------------------------------------------------------------
    def visit_Import(self, node):
        for a in node.names:
            if "libdevice" in a.name or a.name.startswith("triton.language.extra"):
                self.report("extra-libdevice", node, f"import of {a.name!r} (libdevice / tl.extra is not portable)")
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        for a in node.names:
            # `from triton.language import sort` is as non-portable as using tl.sort.
            self.check_full(node, f"{mod}.{a.name}", f"from {mod} import {a.name}",
                            mod.split(".") + [a.name])
            self.check_part(node, a.name)
        self.generic_visit(node)

    # ---- names -------------------------------------------------------------------------
    def visit_Attribute(self, node):
        parts = dotted(node)
        if parts is None:  # chain rooted at a call/subscript, e.g. tl.load(p).to(...)
            self.check_part(node, node.attr)
            self.visit(node.value)
            return
        # A whole name chain is checked once (tl.extra.cann.x must not be reported per level).
        self.check_name(node)
        for part in parts:
            self.check_part(node, part)

    def visit_Name(self, node):
        self.check_name(node)
        self.check_part(node, node.id)

    def check_part(self, node: ast.AST, part: str) -> None:
        if part in NPU_ONLY_OPTIONS:
            self.report("npu-option", node, f"name {part!r} is an NPU-only option")
        if "inline_asm" in part:
            self.report("inline-asm", node, f"{part!r}: inline assembly is not portable")

    def check_name(self, node: ast.AST) -> None:
        parts = dotted(node)
        if parts is not None:
            self.check_full(node, self.resolve(node) or "", ".".join(parts), parts)

    def check_full(self, node: ast.AST, full: str, shown: str, parts: List[str]) -> None:
        """Rules that depend only on what a (resolved) dotted name refers to."""
        if "libdevice" in parts or "libdevice" in full.split(".") or full.startswith("triton.language.extra"):
            self.report("extra-libdevice", node, f"{shown}: libdevice / tl.extra is not portable")
            return
        name = tl_short(full)
        if name is None:
            return
        if name in SORT:
            self.report("sort-topk", node, f"tl.{name}: not proven on triton-ascend 3.2 (do top-k in torch)")
        elif name in TRANSCENDENTAL:
            self.report("transcendental", node, f"tl.{name}: libm/fused result differs per backend; "
                        "use the software exp_fp32 / explicit mul+add")
        elif name in NON_RN_DIVISION:
            self.report("float-division", node, f"tl.{name}: not round-to-nearest; use tl.math.div_rn")
        elif name in ("max", "min"):
            self.report("reduction", node, f"tl.{name}: tree reduction outside the portable subset (§6.1); use an "
                        "explicit loop, or mark an exact integer use `# portable-ok: reduction -- why`")
        elif name == "dot_scaled":
            self.report("dot-precision", node, "tl.dot_scaled: not supported on A2/A3")

    def visit_Constant(self, node):
        if isinstance(node.value, str) and node.value in NPU_ONLY_OPTIONS:
            self.report("npu-option", node, f"string {node.value!r} names an NPU-only option")

    # ---- calls -------------------------------------------------------------------------
    def visit_Call(self, node):
        for kw in node.keywords:
            if kw.arg is None:
                continue
            if kw.arg in NPU_ONLY_OPTIONS:
                self.report("npu-option", kw.value, f"keyword {kw.arg}= is an NPU-only option")
            if kw.arg == "allow_tf32":
                self.report("tf32", kw.value, "allow_tf32= is rejected on Ascend and not bit-exact")
            if (kw.arg == "input_precision" and isinstance(kw.value, ast.Constant)
                    and str(kw.value.value).lower() in BAD_PRECISION):
                self.report("tf32", kw.value, f"input_precision={kw.value.value!r} is not IEEE fp32")
        name = self.tl_name(node.func)
        if name == "dot":
            self.check_dot(node)
        elif name == "sum":
            self.check_sum(node)
        elif name == "cast":
            dtype = node.args[1] if len(node.args) > 1 else self.keyword(node, "dtype")
            self.check_bf16(node, dtype)
        if isinstance(node.func, ast.Attribute) and name is None:
            self.check_method(node)
        full = self.resolve(node.func) or ""
        if full in ("importlib.import_module", "__import__") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and (
                    "libdevice" in arg.value or arg.value.startswith("triton.language.extra")):
                self.report("extra-libdevice", node, f"dynamic import of {arg.value!r}")
        self.generic_visit(node)

    @staticmethod
    def keyword(node: ast.Call, arg: str) -> Optional[ast.AST]:
        return next((kw.value for kw in node.keywords if kw.arg == arg), None)

    def check_dot(self, node: ast.Call) -> None:
        out_dtype = self.keyword(node, "out_dtype")
        if out_dtype is not None and self.tl_name(out_dtype) != "float32":
            self.report("dot-accumulator", node, "tl.dot out_dtype must be tl.float32 (fp32 accumulation)")
        if self.keyword(node, "max_num_imprecise_acc") is not None:
            self.report("dot-accumulator", node, "tl.dot max_num_imprecise_acc: accumulation must stay full fp32")
        fn = self.func_stack[-1] if self.func_stack else None
        params = [a.arg for a in fn.args.args + fn.args.kwonlyargs] if fn is not None else []
        if DOT_SWITCH not in params:
            self.report("dot-interpreter", node, f"tl.dot in a function without a {DOT_SWITCH} parameter: the "
                        "interpreter needs fp32 (ieee) operands, compiled backends bf16 ones")
        prec = self.keyword(node, "input_precision")
        if len(node.args) > 3:
            self.report("dot-precision", node, "tl.dot with positional input_precision/allow_tf32: "
                        "pass input_precision=\"ieee\" by keyword")
        elif not (isinstance(prec, ast.Constant) and prec.value == "ieee"):
            self.report("dot-precision", node, "tl.dot must pass input_precision=\"ieee\" literally")

    def check_sum(self, node: ast.Call) -> None:
        first = node.args[0] if node.args else self.keyword(node, "input")
        # `>>` takes integers only (Triton rejects float operands), so a sum of a shift is an
        # exact integer sum, as one over tl.where(c, 1, 0) is
        shift = isinstance(first, ast.BinOp) and isinstance(first.op, ast.RShift)
        ok = shift or (isinstance(first, ast.Call) and self.tl_name(first.func) == "where")
        self.sums.append((node.lineno, ok))
        if not ok:
            self.report("reduction", node, "tl.sum is allowed only over tl.where(...) (a one-element select, an "
                        "exact integer sum or a certified-order score sum) or an integer shift `a >> b` (an "
                        "exact integer sum); else use an explicit loop")

    def check_method(self, node: ast.Call) -> None:
        attr = node.func.attr
        if attr in ("to", "cast"):
            dtype = node.args[0] if node.args else self.keyword(node, "dtype")
            self.check_bf16(node, dtype)
        if not self.jit_depth:
            return  # host code: x.sum() / x.exp() there are torch, not Triton
        if attr in SORT:
            self.report("sort-topk", node, f".{attr}(): tensor sort/top-k not proven on triton-ascend 3.2")
        elif attr in TENSOR_REDUCTIONS:
            self.report("reduction", node, f".{attr}(): tensor reduction in jit code (order is backend-specific)")
        elif attr in TRANSCENDENTAL:
            self.report("transcendental", node, f".{attr}(): libm result differs per backend")

    def check_bf16(self, node: ast.Call, dtype: Optional[ast.AST]) -> None:
        if dtype is None or self.tl_name(dtype) != "bfloat16":
            return
        bitcast = self.keyword(node, "bitcast")
        if isinstance(bitcast, ast.Constant) and bitcast.value is True:
            return          # reinterpreting int16 bits as bf16 rounds nothing
        scope = self.func_stack[-1] if self.func_stack else (self.stmt_stack[-1] if self.stmt_stack else node)
        for sub in ast.walk(scope):
            if isinstance(sub, ast.Call):
                parts = dotted(sub.func)
                if parts and parts[-1] == ROUND_HELPER:
                    return
        self.report("bf16-rounding", node, "conversion to tl.bfloat16 without round_to_bf16_bits in the same "
                    "statement/function (the interpreter truncates instead of rounding to nearest even)")

    # ---- operators ---------------------------------------------------------------------
    def visit_BinOp(self, node):
        if isinstance(node.op, ast.Div) and self.jit_depth:
            self.report("float-division", node, "'/' inside a @triton.jit function; use tl.math.div_rn "
                        "(or '//' for integers)")
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        if isinstance(node.op, ast.Div) and self.jit_depth:
            self.report("float-division", node, "'/=' inside a @triton.jit function; use tl.math.div_rn")
        self.generic_visit(node)

def check_portable_subset(source: str, filename: str = "<string>",
                          rules: Optional[Iterable[str]] = None) -> List[Violation]:
    """Every construct of ``source`` outside the portable Triton subset (platform-numerics.md §6.1).

    Args:
        source: Python source text of one kernel module (``kpool/ops/*.py``).
        filename: used only in the returned violations.
        rules: restrict to these rule ids (default: all of :data:`RULES`).
    Returns:
        Violations sorted by (line, column, rule); empty when the file is portable. A file that
        does not parse yields one ``"syntax"`` violation.
    Raises:
        ValueError: an unknown rule id in ``rules``.
    """
    selected = set(RULES if rules is None else rules)
    unknown = selected - set(RULES)
    if unknown:
        raise ValueError(f"unknown rules {sorted(unknown)}; known: {RULES}")
    tree, errors = parse_source(source, filename)
    if tree is None:
        return errors
    checker = _Checker(tree, filename, selected)
    checker.visit(tree)
    allowed = suppressions(source)
    kept = {v for v in checker.out if v.rule not in allowed.get(v.line, ())}
    return sorted(kept, key=lambda v: (v.line, v.col, v.rule, v.message))


def suppressions(source: str) -> Dict[int, Set[str]]:
    """Line -> rule ids silenced there by a ``# portable-ok: rule[, rule]`` comment.

    Raises:
        tokenize.TokenError / SyntaxError: ``source`` does not tokenize.
    """
    out: Dict[int, Set[str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            match = PRAGMA.search(tok.string)
            if match:
                out.setdefault(tok.start[0], set()).update(r.strip() for r in match.group(1).split(","))
    return out


def sum_calls(source: str, filename: str = "<string>") -> List[Tuple[int, bool]]:
    """``(line, first_argument_is_tl_where_or_a_shift)`` for every ``tl.sum(...)`` call of ``source``.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    tree = ast.parse(source, filename=filename)
    checker = _Checker(tree, filename, set())
    checker.visit(tree)
    return sorted(checker.sums)


def check_tree(root: Path, package: str = "kpool/ops") -> List[Violation]:
    """:func:`check_portable_subset` over every ``*.py`` under ``root/package`` (recursive).

    Filenames in the result are relative to ``root``.
    """
    out: List[Violation] = []
    for path in sorted((root / package).rglob("*.py")):
        rel = str(path.relative_to(root))
        out.extend(check_portable_subset(path.read_text(encoding="utf-8"), rel))
    return out


if __name__ == "__main__":  # python tools/portability.py [ROOT]: print violations, exit 1 if any
    from tools.launch_options import check_launch_options

    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    found = check_tree(root) + check_launch_options((root / "kpool/platform.py").read_text(), "kpool/platform.py")
    for v in found:
        print(v)
    sys.exit(1 if found else 0)
