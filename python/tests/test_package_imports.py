"""The package's import graph (issue 45): no module imports, at run time,
one that imports it back — directly or through others. Imports under
`if TYPE_CHECKING:` are for annotations only and do not count."""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[1] / "kvtier"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def runtime_imports(path: pathlib.Path) -> set[str]:
    """The kvtier modules a file imports when it runs (function bodies
    included), TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for n in node.orelse:
                visit(n)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("kvtier"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvtier"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def test_no_import_cycle() -> None:
    modules = {module_name(p): p for p in PKG.rglob("*.py") if "/v1/" not in str(p)}
    graph = {m: {d for d in runtime_imports(p) if d in modules and d != m} for m, p in modules.items()}
    # A package's __init__ importing its own modules is how packages are
    # made; a cycle through it would still show between the modules.
    for m in graph:
        graph[m] = {d for d in graph[m] if not m.startswith(d + ".")}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for d in graph[node]:
                if d == start:
                    return path + [d]
                if d not in path:
                    stack.append((d, path + [d]))
        return None

    cycles = [c for m in sorted(graph) if (c := cycle_from(m))]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
    assert len(graph) >= 15, sorted(graph)
