"""The packages of muse_launch import each other in layers: no cycle between any two of them, counting every
import (at module level, inside functions, under TYPE_CHECKING), read from the source with ast so that a
lazy import is seen as well; and nothing below the top layer (cli.py, commands/, backends.py) imports it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "muse_launch"
TOP = {"muse_launch.cli", "muse_launch.commands", "muse_launch.backends", "muse_launch.__main__"}


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every muse_launch module or name that the file imports, relative imports resolved."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join([*here, *([node.module] if node.module else [])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in out if name.startswith("muse_launch.")}


def _unit(module: str) -> str:
    """The package a module belongs to: muse_launch.local.up -> muse_launch.local; top-level modules are their
    own."""
    return ".".join(module.split(".")[:2])


def package_graph() -> dict[str, dict[str, set[str]]]:
    """package -> package it imports -> the modules that import it."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(PACKAGE.rglob("*.py")):
        module, is_package = _module_name(path)
        graph[_unit(module)]  # a package that imports nothing is a node too
        for name in _imported(ast.parse(path.read_text(), str(path)), module, is_package):
            target = _unit(name)
            if target not in (_unit(module), "muse_launch"):
                graph[_unit(module)][target].add(module)
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in graph.get(node, {}):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _explain(graph: dict[str, dict[str, set[str]]], component: list[str]) -> str:
    return "\n".join(
        f"  {a} -> {b}: imported by {', '.join(sorted(graph[a][b]))}"
        for a in component
        for b in sorted(graph[a])
        if b in component
    )


def test_the_graph_sees_every_package_and_lazy_imports():
    graph = package_graph()
    assert {
        "muse_launch.local",
        "muse_launch.supervise",
        "muse_launch.rundir",
        "muse_launch.slurm",
        "muse_launch.engines",
        "muse_launch.cli",
    } <= set(graph)
    # commands/run.py imports the runtime inside its command functions only: those imports are edges too
    assert "muse_launch.rundir" in graph["muse_launch.commands"]


def test_cycles_are_found():
    graph = {"a": {"b": {"a.x"}}, "b": {"c": {"b.y"}}, "c": {"a": {"c.z"}}, "d": {"a": {"d.w"}}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_package_imports_another_that_imports_it_back():
    graph = package_graph()
    found = cycles(graph)
    assert not found, "package cycles:\n" + "\n".join(_explain(graph, c) for c in found)


def test_nothing_below_the_command_layer_imports_it():
    graph = package_graph()
    upward = {
        f"{a} -> {b}: {', '.join(sorted(graph[a][b]))}"
        for a in graph
        if a not in TOP
        for b in graph[a]
        if b in TOP
    }
    assert not upward


def test_every_import_names_a_module_that_exists():
    """Lazy imports run only when their command does: one that names a module moved away fails here, not in a
    user's hands (`from .validate import x` left behind in commands/ when validate.py stayed in export/)."""
    import importlib.util

    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module, is_package = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom | ast.Import):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = module.split(".") if is_package else module.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                names = [base]
            for name in names:
                if name.startswith("muse_launch") and importlib.util.find_spec(name) is None:
                    missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}")
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_every_name_imported_from_the_package_is_there():
    """As above, one level down: `from muse_launch.x import name` where x no longer has `name`."""
    import importlib
    import importlib.util

    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module, is_package = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join([*here, *([node.module] if node.module else [])])
            if not base.startswith("muse_launch") or importlib.util.find_spec(base) is None:
                continue
            target = importlib.import_module(base)
            for alias in node.names:
                if not hasattr(target, alias.name) and not _is_module(f"{base}.{alias.name}"):
                    missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {base}.{alias.name}")
    assert not missing, "names imported that their module does not have:\n" + "\n".join(missing)


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False
