"""Check the one place NPU-only launch options may live: ``kpool/platform.py``'s
``launch_options`` (platform-numerics.md §1.4, §6.2). A development (lint) tool beside
:mod:`tools.portability` (vocabulary: :mod:`tools.portable_rules`), run by ``tests/test_portable_subset.py``."""
from __future__ import annotations

import ast
from typing import List, Set, Tuple

from tools.portable_rules import NPU_ONLY_OPTIONS, Violation, parse_source

__all__ = ["check_launch_options"]


def _is_device_branch(test: ast.AST, device: str) -> bool:
    """``device == "<device>"`` (either operand order)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "device" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == device for s in sides))


def _npu_mentions(tree: ast.AST) -> List[Tuple[ast.AST, str]]:
    """(node, option) for each NPU-only option named by a keyword, exact string, attribute or name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in NPU_ONLY_OPTIONS:
            found.append((node.value, node.arg))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NPU_ONLY_OPTIONS:
            found.append((node, node.value))
        elif isinstance(node, ast.Attribute) and node.attr in NPU_ONLY_OPTIONS:
            found.append((node, node.attr))
        elif isinstance(node, ast.Name) and node.id in NPU_ONLY_OPTIONS:
            found.append((node, node.id))
    return found


def _sets_fp_fusion_off(body: List[ast.stmt]) -> bool:
    """The branch sets ``enable_fp_fusion`` to the literal ``False`` (dict key or keyword)."""
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and key.value == "enable_fp_fusion"
                        and isinstance(value, ast.Constant) and value.value is False):
                    return True
        if isinstance(node, ast.keyword) and node.arg == "enable_fp_fusion":
            if isinstance(node.value, ast.Constant) and node.value.value is False:
                return True
    return False


def check_launch_options(source: str, filename: str = "kpool/platform.py") -> List[Violation]:
    """Check the one place NPU-only options may live (platform-numerics.md §1.4, §6.2).

    ``source`` must define a module-level ``launch_options`` function with an ``if device ==
    "cuda"`` branch that sets ``enable_fp_fusion`` to ``False`` (no FMA contraction: bit parity)
    and names no NPU-only option, and an ``if device == "npu"`` branch; every NPU-only option
    (:data:`NPU_ONLY_OPTIONS`) anywhere in the module must sit inside that npu branch.

    Returns:
        ``"launch-options"`` violations (empty when all holds), or one ``"syntax"`` violation.
    """
    tree, errors = parse_source(source, filename)
    if tree is None:
        return errors
    out: List[Violation] = []

    def bad(node, message):
        out.append(Violation("launch-options", filename, getattr(node, "lineno", 0),
                             getattr(node, "col_offset", 0), message))

    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "launch_options"), None)
    if func is None:
        bad(tree, "no module-level function launch_options")
        return out
    branches = {dev: [n for n in ast.walk(func) if isinstance(n, ast.If) and _is_device_branch(n.test, dev)]
                for dev in ("npu", "cuda")}
    allowed: Set[int] = set()
    for branch in branches["npu"]:
        for stmt in branch.body:
            allowed.update(id(n) for n in ast.walk(stmt))
    for node, label in _npu_mentions(tree):
        if id(node) not in allowed:
            bad(node, f"NPU-only option {label!r} outside launch_options' device == \"npu\" branch")
    if not branches["npu"]:
        bad(func, "launch_options has no `if device == \"npu\"` branch")
    if not branches["cuda"]:
        bad(func, "launch_options has no `if device == \"cuda\"` branch")
    elif not any(_sets_fp_fusion_off(b.body) for b in branches["cuda"]):
        bad(branches["cuda"][0], "the cuda branch of launch_options does not set enable_fp_fusion=False")
    return sorted(out, key=lambda v: (v.line, v.col, v.message))
