"""Measure the shape of app/: modules per folder, import arrows between its modules, import cycles, and the
longest functions. Not a speed benchmark: the figures the app/ rooms issue asks for, before and after.

    python bench/structure.py [ROOT]          # ROOT: a checkout (default: this one)
    git worktree add /tmp/before 8a756b5 && python bench/structure.py /tmp/before
"""

from __future__ import annotations

import ast
import statistics
import sys
from collections import Counter
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    """Return app/'s modules by dotted name."""
    found = {}
    for path in sorted((root / "app").rglob("*.py")):
        parts = [p for p in path.relative_to(root / "app").with_suffix("").parts if p != "__init__"]
        found[".".join(["iqgraph", "app", *parts])] = path
    return found


def arrows(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Return, per module, the app/ modules it imports (anywhere in it, TYPE_CHECKING included)."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges.setdefault(name, set()).update(t for t in targets if t in mods and t != name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def functions(mods: dict[str, Path]) -> list[tuple[int, str]]:
    """Return (lines, name) of every function in app/."""
    found = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))  # type: ignore[operator]
    return sorted(found, reverse=True)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    mods = modules(root)
    edges = arrows(mods)
    folders = Counter(str(p.parent.relative_to(root)) for p in mods.values() if p.name != "__init__.py")
    sizes = functions(mods)
    print(f"app/ of {root}")
    print(f"  modules per folder: {dict(sorted(folders.items()))}")
    print(f"  import arrows between app/ modules: {sum(len(v) for v in edges.values())}")
    print(f"  import cycles: {len(cycles(edges))} {cycles(edges)}")
    print(f"  functions: {len(sizes)}, median {statistics.median(n for n, _ in sizes)} lines; longest:")
    for n, name in sizes[:5]:
        print(f"    {n:4d}  {name}")


if __name__ == "__main__":
    main()
