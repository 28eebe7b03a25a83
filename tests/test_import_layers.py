"""The adaspec package imports as a clean layering: no module reaches, even lazily, a module that reaches it back.

The graph is built statically with ``ast`` over src/adaspec/**/*.py. Every ``import adaspec...`` and
``from adaspec... import`` (relative ones resolved) counts, at module level or inside a function, so a circle
hidden behind a function-level import still fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "adaspec"

# Cycles known and accepted, each as the sorted tuple of its modules, with the reason; any other cycle fails.
ALLOWED_CYCLES: set[tuple[str, ...]] = set()


def module_names(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under src/adaspec (packages as their ``__init__``)."""
    names = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` (a dotted path, maybe naming an attribute) lies in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_sites(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """``(imported adaspec module, line)`` for every import in ``module``'s file, top level or inside functions."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from a.b import c``: the submodule a.b.c when there is one, else (an attribute of) a.b
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem for alias in node.names]
        for target in targets:
            if target != PACKAGE and not target.startswith(PACKAGE + "."):
                continue
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                found.append((resolved, node.lineno))
    return sorted(found, key=lambda site: site[1])


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The adaspec modules that ``module`` imports anywhere in its file (top level or inside functions)."""
    return {target for target, _ in import_sites(module, path, modules)}


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the adaspec modules it imports."""
    modules = module_names(src)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:  # recursion depth is bounded by the ~150 modules
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _path_within(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    """One concrete circle through the component's first module, e.g. ``[a, b, a]``, for the message."""
    start, allowed = members[0], set(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for succ in sorted(graph[node] & allowed):
                if succ == start:
                    return paths[node] + [start]
                if succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    nxt.append(succ)
        frontier = nxt
    return members


def test_graph_sees_the_package():
    graph = import_graph()
    assert "adaspec.engine" in graph and "adaspec.backends.select" in graph
    assert "adaspec.errors" in graph["adaspec.engine"]


def test_no_import_cycle():
    graph = import_graph()
    new = [c for c in cycles(graph) if tuple(c) not in ALLOWED_CYCLES]
    assert not new, "import circles in adaspec:\n" + "\n".join(
        f"  {' -> '.join(_path_within(graph, c))}  (component: {', '.join(c)})" for c in new)


def test_cycle_detection_on_a_made_up_package(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from adaspec.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")  # relative, inside a function
    (pkg / "c.py").write_text("import adaspec.a\n")
    graph = import_graph(tmp_path)
    assert graph["adaspec.sub.b"] == {"adaspec.a"}
    assert cycles(graph) == [["adaspec.a", "adaspec.sub.b"]]
