"""Package layout: imports go one way and no module reaches itself through its imports
(docs/design.md "Packages").

Every import of every module of ``kpool``, ``reference``, ``cases`` and ``parity`` is read with
``ast``, at module level and inside functions alike (a lazy import is still an edge: it runs the
moment the function does). Allowed edges between the packages:

* ``cases``     -> ``kpool.config``, ``kpool.metadata``, ``kpool.errors`` (data only: nothing that runs)
* ``parity``    -> ``cases``, ``kpool``, ``reference``
* ``reference`` -> nothing of ours
* ``kpool``     -> ``kpool`` only

and no cycle between modules. The checker itself is tested on a planted tree (a forbidden edge,
a lazy cycle), so a checker that finds nothing cannot pass.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("kpool", "reference", "cases", "parity")
CASES_MAY_IMPORT = ("kpool.config", "kpool.metadata", "kpool.errors")

TEMPORARY_EDGES: Dict[Tuple[str, str], str] = {}
"""Edges against the rules, each with the reason it still exists."""
TEMPORARY_CYCLES: Dict[frozenset, str] = {}
"""Cycles still present, each with the reason (the files involved are another branch's)."""


def module_files(root: Path, packages=PACKAGES) -> Dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` file under ``root/<package>``."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _target(name: str, modules: Dict[str, Path]):
    """The longest prefix of ``name`` that is one of our modules, else ``None``."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_edges(modules: Dict[str, Path]) -> Dict[str, Dict[str, int]]:
    """``{module: {imported module: first line}}`` over every import statement, at any depth.

    ``from a import b`` names ``a.b`` when that is a module, else ``a``; relative imports are
    resolved against the importing module's package."""
    edges: Dict[str, Dict[str, int]] = defaultdict(dict)
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
            for name in names:
                target = _target(name, modules)
                if target is not None and target != mod:
                    edges[mod].setdefault(target, node.lineno)
    return edges


def _allowed(src: str, dst: str) -> bool:
    pkg, dst_pkg = src.split(".")[0], dst.split(".")[0]
    if pkg == dst_pkg:
        return True
    if pkg == "cases":
        return any(dst == m or dst.startswith(m + ".") for m in CASES_MAY_IMPORT)
    if pkg == "parity":
        return dst_pkg in ("cases", "kpool", "reference")
    return False            # reference and kpool import nothing outside themselves


def direction_violations(root: Path, modules, edges) -> List[str]:
    """``"src -> dst (file:line)"`` of every edge the rules refuse."""
    out = []
    for src, targets in sorted(edges.items()):
        for dst, line in sorted(targets.items()):
            if not _allowed(src, dst) and (src, dst) not in TEMPORARY_EDGES:
                out.append(f"{src} -> {dst} ({modules[src].relative_to(root)}:{line})")
    return out


def cycles(edges) -> List[Set[str]]:
    """Strongly connected components of more than one module (Tarjan), each a set of names."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[Set[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(set(edges) | {w for t in edges.values() for w in t}):
        if v not in index:
            visit(v)
    return found


def _layout(root: Path) -> Tuple[List[str], List[Set[str]]]:
    modules = module_files(root)
    edges = import_edges(modules)
    return direction_violations(root, modules, edges), [c for c in cycles(edges) if frozenset(c) not in TEMPORARY_CYCLES]


def test_imports_go_one_way():
    bad, _ = _layout(REPO)
    assert not bad, "imports against docs/design.md's package rules:\n" + "\n".join(bad)


def test_no_import_cycles():
    _, found = _layout(REPO)
    assert not found, "import cycles (lazy imports count):\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


def test_temporary_exceptions_still_exist():
    """Each allow-listed edge and cycle is still there (remove it from the list once it is gone)."""
    modules = module_files(REPO)
    edges = import_edges(modules)
    for src, dst in TEMPORARY_EDGES:
        assert dst in edges.get(src, {}), f"{src} -> {dst} is gone: drop it from TEMPORARY_EDGES"
    present = {frozenset(c) for c in cycles(edges)}
    for cyc in TEMPORARY_CYCLES:
        assert cyc in present, f"the cycle {sorted(cyc)} is gone: drop it from TEMPORARY_CYCLES"


def _plant(root: Path, files: Dict[str, str]) -> None:
    for pkg in PACKAGES:
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text("")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.mark.parametrize("files, edge", [
    ({"cases/spec.py": "from parity.runner import run_case\n", "parity/runner.py": ""}, "cases.spec -> parity.runner"),
    ({"cases/values.py": "def f():\n    from kpool.cache import allocate_caches\n", "kpool/cache.py": ""},
     "cases.values -> kpool.cache"),
    ({"reference/stateful.py": "def f():\n    import kpool.errors\n", "kpool/errors.py": ""},
     "reference.stateful -> kpool.errors"),
    ({"kpool/indexer.py": "from .. import parity\n"}, None),       # beyond the top level: not ours
    ({"kpool/indexer.py": "from parity import compare\n", "parity/compare.py": ""}, "kpool.indexer -> parity.compare"),
])
def test_checker_finds_a_planted_forbidden_edge(tmp_path, files, edge):
    _plant(tmp_path, files)
    bad, _ = _layout(tmp_path)
    assert [b.split(" (")[0] for b in bad] == ([edge] if edge else [])


def test_checker_finds_a_planted_lazy_cycle(tmp_path):
    _plant(tmp_path, {"parity/bundle.py": "from . import report\n",
                      "parity/report.py": "def f():\n    from .session import x\n",
                      "parity/session.py": "def g():\n    from parity.bundle import y\n",
                      "parity/cli.py": "from .report import f\n"})
    _, found = _layout(tmp_path)
    assert found == [{"parity.bundle", "parity.report", "parity.session"}]
