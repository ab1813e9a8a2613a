"""No import cycles: among the modules of kit/, bot/ and adapters/ (every import, also those
inside functions), and among their packages (``adapters.slurm``, ``bot.execution``...), each
import goes one way. A cycle fails here, naming its members."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_graph() -> dict[str, set[str]]:
    paths: dict[str, Path] = {}
    for base in ("kit", "bot", "adapters"):
        for path in (ROOT / base).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            paths[name] = path
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in paths else node.module
                    if target in paths:
                        graph[name].add(target)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in paths)
    return graph


def package_graph(modules: Mapping[str, set[str]]) -> dict[str, set[str]]:
    def package(name: str) -> str:
        return ".".join(name.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for name, targets in modules.items():
        graph.setdefault(package(name), set()).update(
            package(t) for t in targets if package(t) != package(name))
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                member, component = "", []
                while member != node:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back() -> None:
    assert cycles(module_graph()) == []


def test_no_package_imports_itself_back() -> None:
    assert cycles(package_graph(module_graph())) == []


def test_the_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = module_graph()
    assert "kit.hostlist" in graph["adapters.prometheus.soak"]  # it sees imports at all
    assert "adapters.kubernetes.client" in graph["adapters.kubernetes.reading"]  # in functions
