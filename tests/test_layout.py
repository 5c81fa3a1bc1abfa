"""Package layout: imports go one way and no module reaches itself through its imports
(docs/design.md "Packages").

Every import of every module of ``kpool``, ``reference``, ``cases`` and ``parity`` is read with
``ast``, at module level and inside functions alike (a lazy import is still an edge: it runs the
moment the function does). Allowed edges between the packages:

* ``cases``     -> ``kpool.config``, ``kpool.metadata``, ``kpool.errors`` (data only: nothing that runs)
* ``parity``    -> ``cases``, ``kpool``, ``reference``
* ``reference`` -> nothing of ours
* ``kpool``     -> ``kpool`` only

and no cycle between modules. Inside ``parity`` the stage folders (docs/design.md "Layout") go
one way too: a folder imports only the folders before it in :data:`STAGES` (and ``cases``,
``kpool``, ``reference``); the package root (``python -m parity``, the CLI, the public API, the
pytest plugin: :data:`ROOT_MODULES`) may import every folder and no folder imports the root; every
other module sits in a stage folder, and none is over :data:`MAX_LINES` lines. The checker itself
is tested on planted trees (a forbidden edge, a lazy cycle, an upward folder edge, a stray root
module), so a checker that finds nothing cannot pass.
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

STAGES = ("findings", "implementations", "checking", "running", "oracles", "reporting", "sessions",
          "selection", "api", "verbs", "bench")
"""The folders of ``parity/``, bottom first: each may import only the ones before it."""
ROOT_MODULES = ("parity", "parity.__main__", "parity.cli", "parity.pytest_plugin")
"""The modules at the root of ``parity/`` (users type or import these names)."""
MAX_LINES = 400
"""Small modules (the project's standard): no module of ``parity`` is longer."""

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


def stage_of(module: str) -> str:
    """The stage folder of a ``parity`` module, ``"root"`` for the package root, else ``""``
    (a module outside ``parity``)."""
    parts = module.split(".")
    if parts[0] != "parity":
        return ""
    return "root" if module in ROOT_MODULES else parts[1]


def stage_violations(root: Path, modules, edges) -> List[str]:
    """``"src -> dst (file:line)"`` of every edge between ``parity``'s folders against
    :data:`STAGES` (a folder reaching a later one or the root), and ``"src: not in a stage folder"``
    for a module outside both the folders and :data:`ROOT_MODULES`."""
    out = [f"{m}: not in a stage folder" for m in sorted(modules)
           if stage_of(m) not in ("", "root") + STAGES]
    for src, targets in sorted(edges.items()):
        s = stage_of(src)
        if s not in STAGES:
            continue
        for dst, line in sorted(targets.items()):
            d = stage_of(dst)
            if d in ("", s) or dst == "parity":
                continue
            if d not in STAGES or STAGES.index(d) > STAGES.index(s):
                out.append(f"{src} -> {dst} ({modules[src].relative_to(root)}:{line})")
    return out


def long_modules(modules, limit: int = MAX_LINES) -> List[str]:
    """``"module: N lines"`` of every ``parity`` module over ``limit`` lines."""
    out = []
    for mod, path in sorted(modules.items()):
        n = len(path.read_text().splitlines())
        if mod.split(".")[0] == "parity" and n > limit:
            out.append(f"{mod}: {n} lines")
    return out


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


def test_stage_folders_go_one_way():
    modules = module_files(REPO)
    bad = stage_violations(REPO, modules, import_edges(modules))
    assert not bad, "imports against parity's stage order (docs/design.md \"Layout\"):\n" + "\n".join(bad)


def test_every_stage_folder_exists_and_says_what_it_may_import():
    """Each folder of :data:`STAGES` is a package whose ``__init__`` docstring names its stage
    (so the order here and the folders' own words cannot drift apart unnoticed)."""
    for i, stage in enumerate(STAGES, 1):
        init = REPO / "parity" / stage / "__init__.py"
        assert init.is_file(), f"parity/{stage}/ has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert f"Stage {i} of" in doc and "import" in doc, \
            f"parity/{stage}/__init__.py: the docstring must say 'Stage {i} of' and what it may import"


API_BYPASSES = {"parity.implementations": {"resolve"}, "parity.selection.kernel_cases": {"selected_cases"},
                "parity.sessions.session": {"resolve_kernel"}}
"""Names the verbs must reach through :mod:`parity.api` (resolving an implementation, selecting the
cases of a run), by the module that defines them."""
BUILT_ON_API = ("parity.verbs.ab", "parity.verbs.golden", "parity.verbs.replay", "parity.verbs.cases")
"""Verb modules that must import :mod:`parity.api` (the CLI's verbs are built on it)."""


def api_bypasses(root: Path) -> List[str]:
    """``"module imports name from source (file:line)"`` for every import in ``parity.verbs`` of a
    name of :data:`API_BYPASSES`, and ``"module: does not import parity.api"`` for each of
    :data:`BUILT_ON_API` that exists and does not."""
    modules = module_files(root)
    edges = import_edges(modules)
    out = []
    for mod, path in sorted(modules.items()):
        if stage_of(mod) != "verbs":
            continue
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            source = (".".join(base[:len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                      if node.level else node.module or "")
            for alias in node.names:
                if alias.name in API_BYPASSES.get(source, ()):
                    out.append(f"{mod} imports {alias.name} from {source} ({path.relative_to(root)}:{node.lineno})")
        if mod in BUILT_ON_API and "parity.api" not in edges.get(mod, {}):
            out.append(f"{mod}: does not import parity.api")
    return out


def test_verbs_are_built_on_the_api():
    bad = api_bypasses(REPO)
    assert not bad, "verbs going around the public API (use parity.api):\n" + "\n".join(bad)


@pytest.mark.parametrize("text, bad", [
    ("def f():\n    from ..implementations import resolve\n    from .. import api\n",
     ["parity.verbs.ab imports resolve from parity.implementations"]),
    ("from parity.selection.kernel_cases import selected_cases\nfrom parity import api\n",
     ["parity.verbs.ab imports selected_cases from parity.selection.kernel_cases"]),
    ("from ..implementations.semantics import resolve_semantics\n", ["parity.verbs.ab: does not import parity.api"]),
    ("from .. import api\n", []),
])
def test_checker_finds_a_planted_api_bypass(tmp_path, text, bad):
    _plant(tmp_path, {"parity/verbs/__init__.py": "", "parity/verbs/ab.py": text, "parity/api/__init__.py": "",
                      "parity/implementations/__init__.py": "", "parity/implementations/semantics.py": "",
                      "parity/selection/__init__.py": "", "parity/selection/kernel_cases.py": ""})
    assert [b.split(" (")[0] for b in api_bypasses(tmp_path)] == bad


def test_no_module_over_the_line_limit():
    long = long_modules(module_files(REPO))
    assert not long, f"modules over {MAX_LINES} lines (split them):\n" + "\n".join(long)


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



@pytest.mark.parametrize("files, bad", [
    ({"parity/checking/compare.py": "def f():\n    from ..running.runner import run_case\n",
      "parity/running/runner.py": "from ..checking import compare\n"},
     ["parity.checking.compare -> parity.running.runner"]),
    ({"parity/findings/results.py": "from parity import cli\n", "parity/cli.py": ""},
     ["parity.findings.results -> parity.cli"]),
    ({"parity/stray.py": "", "parity/verbs/ab.py": "from ..checking.compare import f\n",
      "parity/checking/compare.py": ""},
     ["parity.stray: not in a stage folder"]),
    ({"parity/cli.py": "from .verbs import ab\n", "parity/verbs/ab.py": "from ..bench import kernels\n",
      "parity/bench/kernels.py": ""}, ["parity.verbs.ab -> parity.bench.kernels"]),
])
def test_checker_finds_a_planted_stage_violation(tmp_path, files, bad):
    _plant(tmp_path, files)
    for rel in files:
        for parent in (tmp_path / rel).parents:
            if parent != tmp_path and parent.name != "parity" and parent.parent.name == "parity":
                (parent / "__init__.py").touch()
    modules = module_files(tmp_path)
    found = stage_violations(tmp_path, modules, import_edges(modules))
    assert [f.split(" (")[0] for f in found] == bad


def test_checker_finds_a_planted_long_module(tmp_path):
    _plant(tmp_path, {"parity/checking/compare.py": "x = 1\n" * (MAX_LINES + 1),
                      "parity/checking/sentinel.py": "x = 1\n" * MAX_LINES})
    assert long_modules(module_files(tmp_path)) == [f"parity.checking.compare: {MAX_LINES + 1} lines"]
