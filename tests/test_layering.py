"""The dependency direction, as a test: packages and app/'s rooms import downward only, app/ has no import
cycle (imports inside functions count), and no module imports another module's private name.

    packages:  app ─▶ {schema, streaming} ─▶ stores         (docs/architecture.md, "Layout"; schema and streaming
                                                           never import each other)
    app/:      cli ─▶ dev ─▶ http ─▶ node ─▶ {metrics, supervisor, restore_progress, pipeline_placement}
               ─▶ {live, owner} ─▶ query ─▶ cluster
               ─▶ security ─▶ {settings, catalog, loading}

Imports under ``if TYPE_CHECKING:`` are checked for direction too: a type from an upper layer is still an
upward dependency (a Protocol in the lower layer is the way).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"stores": 0, "streaming": 1, "schema": 1, "app": 2}  # schema and streaming: siblings
#: app/'s rooms and top-level modules, lowest first; a module may import its own room and lower ranks.
APP_RANKS = {
    "settings": 0,
    "catalog": 0,
    "loading": 0,
    "security": 1,
    "cluster": 2,
    "query": 3,
    "owner": 4,
    "live": 4,
    "metrics": 5,
    "supervisor": 5,
    "restore_progress": 5,
    "pipeline_placement": 5,
    "node": 6,
    "http": 7,
    "dev": 8,
    "cli": 9,
    "__init__": 9,
}
#: Private names of other libraries the code may touch (they are not ours to rename).
FOREIGN_PRIVATE = {"_PARTITION_EOF", "_replace", "_schema"}


@dataclass(frozen=True)
class Import:
    """One import statement of one of our modules."""

    source: str  # the importing module, e.g. iqgraph.app.live.watch
    target: str  # the imported module (a name imported from a package counts as its module when it is one)
    names: tuple[str, ...]
    line: int
    in_function: bool
    type_only: bool


def _module_name(path: Path) -> str:
    package = path.relative_to(ROOT).parts[0]
    parts = [p for p in path.relative_to(ROOT / package).with_suffix("").parts if p != "__init__"]
    return ".".join(["iqgraph", package, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


MODULES = _modules()


def _imports(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text())
    yield from _walk(module, tree.body, in_function=False, type_only=False)


def _walk(module: str, body: list[ast.stmt], *, in_function: bool, type_only: bool) -> Iterator[Import]:
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _walk(module, node.body, in_function=in_function, type_only=True)
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("iqgraph."):
            names = tuple(a.name for a in node.names)
            for name in names:
                target = f"{node.module}.{name}" if f"{node.module}.{name}" in MODULES else node.module
                yield Import(module, target, (name,), node.lineno, in_function, type_only)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("iqgraph."):
                    yield Import(module, alias.name, (), node.lineno, in_function, type_only)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                yield from _walk(module, [child], in_function=inner, type_only=type_only)


IMPORTS = [i for m, p in MODULES.items() for i in _imports(m, p)]


def _package(module: str) -> str:
    return module.split(".")[1]


def _app_room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def test_every_app_room_has_a_rank() -> None:
    rooms = {_app_room(m) for m in MODULES if _package(m) == "app"}
    assert rooms <= set(APP_RANKS), f"give these app/ modules or rooms a rank here: {sorted(rooms - set(APP_RANKS))}"


def test_packages_import_downward_only() -> None:
    upward = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in IMPORTS
        if i.target in MODULES
        and _package(i.target) != _package(i.source)
        and PACKAGES[_package(i.target)] >= PACKAGES[_package(i.source)]
    ]
    assert not upward, "\n".join(upward)


def test_app_rooms_import_downward_only() -> None:
    upward = []
    for i in IMPORTS:
        if _package(i.source) != "app" or _package(i.target) != "app" or i.target not in MODULES:
            continue
        here, there = _app_room(i.source), _app_room(i.target)
        if here != there and APP_RANKS[there] >= APP_RANKS[here]:
            upward.append(f"{i.source}:{i.line} imports {i.target} ({there} is not below {here})")
    assert not upward, "\n".join(upward)


def test_app_has_no_import_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if _package(i.source) == "app" and _package(i.target) == "app" and not i.type_only and i.target in MODULES:
            edges.setdefault(i.source, set()).add(i.target)
    cycles = _cycles(edges)
    assert not cycles, f"import cycles in app/ (imports inside functions count): {cycles}"


def test_no_module_imports_another_modules_private_name() -> None:
    private = [
        f"{i.source}:{i.line} imports {i.target}.{name}"
        for i in IMPORTS
        for name in i.names
        if name.startswith("_") and not name.startswith("__") and i.target != i.source
    ]
    assert not private, "\n".join(private)


@pytest.mark.parametrize("package", ["app"])
def test_app_uses_no_other_modules_private_attribute(package: str) -> None:
    found = []
    for module, path in MODULES.items():
        if _package(module) != package:
            continue
        tree = ast.parse(path.read_text())
        defined = _private_names_defined(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr) or node.attr in FOREIGN_PRIVATE:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in defined:
                found.append(f"{module}:{node.lineno} uses {ast.unparse(node)}")
    assert not found, "\n".join(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names_defined(tree: ast.Module) -> set[str]:
    """Return the private names a module defines itself (functions, classes, attributes it assigns)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and _private(node.name):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _private(node.target.id):
            names.add(node.target.id)
    return names


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checks_catch_what_they_guard(tmp_path: Path) -> None:
    """The walker sees an upward import inside a function, and a cycle."""
    code = "def f():\n    from iqgraph.app.cli import main\n"
    found = list(_walk("iqgraph.app.query.routing", ast.parse(code).body, in_function=False, type_only=False))
    assert found and found[0].in_function and found[0].target == "iqgraph.app.cli"
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
