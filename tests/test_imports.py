"""The package's modules import one another without a circle: the tree reads as the pipeline, each layer below
the ones that use it. Every import counts, at module level or inside a function (a lazy import hides a circle,
it does not remove one), read with `ast` from the source, never by importing it."""

from __future__ import annotations

import ast
from pathlib import Path

import gradian

ROOT = Path(gradian.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The gradian modules `name` imports: `import a.b`, `from a import b` (module b or a name of a), relative too."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in ROOT.rglob("*.py")}
    modules = set(paths)
    return {name: imported(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
            for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each as one circle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(circle(graph, set(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One circle inside a strongly connected component: a → … → a, by breadth-first search back to the start."""
    start = min(component)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if target not in came:
                    came[target] = node
                    following.append(target)
        frontier = following
    return sorted(component)


def test_the_reader_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_reader_sees_lazy_and_relative_imports():
    source = "from . import b\ndef f():\n    from gradian.c import thing\n    import gradian.d\n"
    modules = {"gradian.a", "gradian.b", "gradian.c", "gradian.d"}
    assert imported(ast.parse(source), "gradian.a", False, modules) == {"gradian.b", "gradian.c", "gradian.d"}


def test_no_import_circle_in_gradian():
    graph = import_graph()
    assert len(graph) > 50, "the reader found too few modules"
    found = cycles(graph)
    assert not found, "import circles: " + "; ".join(" → ".join(c) for c in found)


def test_the_public_api_is_what_a_plug_in_and_a_notebook_need():
    """Every name `gradian` exports resolves, and a plug-in needs nothing private (no leading underscore)."""
    from gradian.audit.registry import check as registered_check
    from gradian.audit.registry import unregister_check
    from gradian.capabilities.registry import register_capability as registered_capability
    from gradian.capabilities.registry import unregister_capability

    for name in gradian.__all__:
        assert getattr(gradian, name) is not None, name
    assert set(gradian.__all__) == set(gradian._EXPORTS)
    assert {"attribute", "diagnose", "verify", "VerifySettings", "register_capability", "unregister_capability",
            "check", "unregister_check", "Capability", "AuditContext", "Finding"} <= set(gradian.__all__)
    assert gradian.check is registered_check and gradian.register_capability is registered_capability
    assert gradian.unregister_check is unregister_check and gradian.unregister_capability is unregister_capability
    assert callable(gradian.attribute) and not any(name.startswith("_") for name in gradian.__all__)
