"""Rules of the repository's shape that a review would otherwise have to remember."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.slow
def test_no_test_file_imports_another() -> None:
    """What two test files share lives in tests/support/ (or conftest.py)."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            offenders += [
                f"{path.relative_to(TESTS)}:{node.lineno} imports {n}"
                for n in names
                if n.split(".")[-1].startswith("test_")
            ]
    assert offenders == []


@pytest.mark.slow
def test_the_library_and_the_tests_type_check() -> None:
    """`mypy` as a developer runs it: pyproject.toml's `[tool.mypy]` checks src/
    and tests/ (and the bench modules the tests import), strict."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout


# --- import cycles in src/duragent ------------------------------------------
#
# The graph's nodes are the modules of src/duragent (a package is its
# __init__); `from a.b import c` is an edge to a.b.c when that is a module,
# else to a.b (as grimp counts it). Importing a.b.c also runs a/__init__ and
# a/b/__init__, but that is no edge of a.b.c's own, so it is not counted.
# Each import is one of three kinds:
# - "module": run when the module is imported (top level, also in try/if);
# - "typing": under `if TYPE_CHECKING:`, never run, so it cannot make a cycle
#   at import time, but a cycle through it is a cycle of the design;
# - "lazy": inside a function, run when the function is; a duragent import
#   there is usually a cycle hidden from the import system.
# The package has no cycle even counting all three kinds, and runtime/ has no
# lazy duragent import; keep both true (no allow-list is needed today).

SRC = TESTS.parent / "src" / "duragent"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(kind, imported duragent module, line) for each import in the module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, "typing")
                for stmt in child.orelse:
                    visit_stmt(stmt, kind)
            else:
                visit_stmt(child, kind)

    def visit_stmt(node: ast.AST, kind: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            kind = "lazy" if kind == "module" else kind
        elif isinstance(node, ast.Import):
            found.extend((kind, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((kind, sub if sub in known else base, node.lineno))
        visit(node, kind)

    visit(ast.parse(path.read_text(), str(path)), "module")
    out = []
    for kind, target, line in found:
        while target and target not in known:  # a name in a module: the module
            target = target.rpartition(".")[0]
        if target and target != module:
            out.append((kind, target, line))
    return out


def _import_graph(kinds: set[str]) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first such import}."""
    known = _module_names()
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        edges = graph.setdefault(module, {})
        for kind, target, line in _imports(module, path, known):
            if kind in kinds:
                edges.setdefault(target, line)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_one_cycle(graph, set(group)) for group in groups]


def _one_cycle(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """A path start -> ... -> start inside the group (breadth first: a shortest one)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w in group and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in {sorted(group)}")


def _say(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return (
        " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
    )


@pytest.mark.slow
def test_no_import_cycle_at_import_time() -> None:
    graph = _import_graph({"module"})
    assert [_say(graph, c) for c in _cycles(graph)] == []


@pytest.mark.slow
def test_no_import_cycle_counting_type_checking_and_lazy_imports() -> None:
    """A cycle of the design, even if no import runs it: a module that needs a
    narrow view of another (as tools need of their task's runner) says so with a
    protocol (runtime/_host.py) rather than importing it."""
    graph = _import_graph({"module", "typing", "lazy"})
    assert [_say(graph, c) for c in _cycles(graph)] == []


def test_runtime_has_no_lazy_duragent_import() -> None:
    """An import inside a function is how a cycle hides from the import system."""
    known = _module_names()
    lazy = [
        f"{path.relative_to(SRC.parent)}:{line} imports {target}"
        for module, path in known.items()
        if module.startswith("duragent.runtime")
        for kind, target, line in _imports(module, path, known)
        if kind == "lazy"
    ]
    assert lazy == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7, "d": 1}, "d": {}}
    assert [_say(graph, c) for c in _cycles(graph)] == [
        "a (line 3) -> b (line 5) -> c (line 7) -> a"
    ]


# --- size limits in src/duragent (issue 39) -----------------------------------

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80  # from the `def` line to the function's last line


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method, nested ones too."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            found.append((prefix + node.name, node.end_lineno - node.lineno + 1))
            found += _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
        else:
            found += _functions(node, prefix)
    return found


def test_no_module_or_function_in_src_is_too_long() -> None:
    """A module past 700 lines, or a function past 80, is asking to be split along
    a seam it already has (STYLE.md)."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{where}: {lines} lines (limit {MAX_MODULE_LINES})")
        for name, length in _functions(ast.parse(text, str(path))):
            if length > MAX_FUNCTION_LINES:
                offenders.append(f"{where}:{name}: {length} lines (limit {MAX_FUNCTION_LINES})")
    assert not offenders, "too long:\n" + "\n".join(offenders)
