"""Prose that cannot go stale: every module, name and file that product docstrings, comments and
docs/architecture.md refer to exists.

Two kinds of reference are checked:
- dotted, `iqgraph.<package>.<module>[.<name>[.<member>]]` or the same from the package (`app.cluster.peers`):
  the longest prefix that is a module is found by its file (the package-dir mapping of pyproject.toml), and a
  name after it must be defined in that module (read from its source, nothing is imported), a member after a
  class name in that class;
- a path, `app/live/watch.py`, `query/routing.py`, `stores/`: found from the repository root, from each package
  folder, or from a folder of one (a room-relative path: `cluster/peers.py` is app/cluster/peers.py). In
  docs/architecture.md every backquoted name ending in `.py` (a table's `state_dir.py` is relative to its section's
  package) and every path with a folder counts.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("app", "schema", "stores", "streaming", "iqgraph")
PACKAGE_DIRS = {
    name: ROOT / folder
    for name, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].items()
}
# Where a relative path may start: the root, each top-level folder, each room of a package.
BASES = [ROOT, *(ROOT / f for f in (*PRODUCTION, "examples", "tests", "docs", "bench"))]
BASES += [d for b in BASES[1:] if b.is_dir() for d in b.iterdir() if d.is_dir() and d.name != "__pycache__"]

# `iqgraph.store`, `iqgraph.node`, … are span attributes and `[iqgraph.kafka]` a TOML table: a dotted reference
# names a package of ours or a public class.
DOTTED = re.compile(r"\biqgraph\.(?:app|schema|stores|streaming|examples|[A-Z]\w*)\b(?:\.[A-Za-z_]\w*)*")
# The same without `iqgraph.` (``app.security.gate.AuthGate``); followed by "(" it is a call on a variable
# (``schema.execute(query)``), by ":" a user's `module:attribute` (`--app app.main:app`), not a reference.
BARE = re.compile(r"(?<![\w.])(?:app|schema|stores|streaming)(?:\.[A-Za-z_]\w*)+(?![\w(:])")
# A path: at least one folder, ending in a file with an extension or in a folder's slash; not part of a URL or of
# a longer path outside the repository (`../shared/…`, `<root>/…`).
EXTENSIONS = "py|md|toml|xml|lock|ya?ml|html|js"
PATH = re.compile(rf"(?<![\w./<>:~-])((?:[A-Za-z_][\w.-]*/)+(?:[A-Za-z_][\w-]*\.(?:{EXTENSIONS}))?)")
BACKQUOTED = re.compile(r"`([^`\s]+)`")
# Paths in other projects that prose names as examples to follow (STYLE.md's anchors), not ours.
FOREIGN = tuple("quixstreams/ faust/ strawberry/ httpx/ subscriptions/ extensions/ guides/ spec/ pyspark/".split())
# A path of folders only names one of ours when it starts with a top-level folder or a room: `text/plain`,
# `RS256/ES256` and `topic/partition/offset` are not paths.
FOLDERS = {b.name for b in BASES[1:]}
# Files of a user's project that the page names (a user's `schema.py` is not shadowed by ours).
USERS = {"schema.py"}


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (line, text) of every comment and docstring of a module."""
    source = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    for offset, line in enumerate(first.value.value.splitlines()):
                        yield first.lineno + offset, line


def module_file(dotted: str) -> Path | None:
    """Return the file of module `dotted` (iqgraph.x.y), or None when there is none."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in PACKAGE_DIRS:
            folder = PACKAGE_DIRS[head].joinpath(*parts[n:])
            for candidate in (folder / "__init__.py", folder.with_suffix(".py")):
                if candidate.is_file():
                    return candidate
            return None
    return None


@cache
def defined_names(path: Path) -> dict[str, set[str] | None]:
    """Return the names a module defines at its top level, each class's with the names defined in its body."""
    names: dict[str, set[str] | None] = {}
    for node in ast.parse(path.read_text()).body:
        for sub in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(sub, ast.ClassDef):
                names[sub.name] = {
                    t.id if isinstance(t, ast.Name) else getattr(t, "name", "")
                    for item in sub.body
                    for t in (item.targets if isinstance(item, ast.Assign) else [item])
                    if isinstance(t, ast.Name | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                } | {
                    item.target.id
                    for item in sub.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
            elif isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                names[sub.name] = None
            elif isinstance(sub, ast.Assign | ast.AnnAssign):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                names.update({t.id: None for t in targets if isinstance(t, ast.Name)})
            elif isinstance(sub, ast.Import | ast.ImportFrom):
                names.update({(a.asname or a.name).split(".")[0]: None for a in sub.names})
    return names


def dotted_refs(text: str) -> list[str]:
    """Return the dotted references in text, each from `iqgraph.`; a file name (``schema.py``) is none."""
    refs = DOTTED.findall(text) + [f"iqgraph.{m}" for m in BARE.findall(text)]
    return [r for r in refs if not r.endswith(".py")]


def dotted_resolves(ref: str) -> bool:
    parts = ref.split(".")
    for n in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:n]))
        if path is None:
            continue
        rest = parts[n:]
        if not rest:
            return True
        names = defined_names(path)
        if rest[0] not in names:
            return False
        members = names[rest[0]]
        return len(rest) == 1 or members is None or rest[1] in members
    return False


def is_path(ref: str) -> bool:
    return not ref.startswith(FOREIGN) and (not ref.endswith("/") or ref.split("/")[0] in FOLDERS)


def path_resolves(ref: str) -> bool:
    ref = ref.rstrip("/")
    return any((base / ref).exists() for base in BASES)


def product_modules() -> Iterator[Path]:
    for folder in PRODUCTION:
        yield from sorted((ROOT / folder).rglob("*.py"))


def unresolved_in_code() -> list[str]:
    found = []
    for path in product_modules():
        where = path.relative_to(ROOT)
        for line, text in prose(path):
            found += [f"{where}:{line}: {m}" for m in dotted_refs(text) if not dotted_resolves(m)]
            for ref in PATH.findall(text):
                if is_path(ref) and not path_resolves(ref):
                    found.append(f"{where}:{line}: {ref}")
    return found


def unresolved_in_architecture() -> list[str]:
    """Return the stale references of docs/architecture.md; a bare `name.py` under "As built: `stores/`" is one
    of stores/ (not of a room of it), elsewhere one of any top-level folder."""
    found, folders = [], [ROOT / f for f in (*PRODUCTION, "examples", "tests", "bench")]
    for line, text in enumerate((ROOT / "docs" / "architecture.md").read_text().splitlines(), 1):
        if heading := re.match(r"## As built: `(\w+)/`", text):
            folders = [ROOT / heading[1]]
        elif text.startswith("## "):
            folders = [ROOT / f for f in (*PRODUCTION, "examples", "tests", "bench")]
        paths = {r for r in PATH.findall(text) if is_path(r) and not path_resolves(r)}
        bare = {r for r in BACKQUOTED.findall(text) if r.endswith(".py") and "/" not in r and r not in USERS}
        paths |= {r for r in bare if not any((folder / r).is_file() for folder in folders)}
        found += [f"docs/architecture.md:{line}: {r}" for r in sorted(paths)]
        found += [f"docs/architecture.md:{line}: {r}" for r in dotted_refs(text) if not dotted_resolves(r)]
    return found


def test_every_module_reference_in_product_prose_resolves() -> None:
    found = unresolved_in_code()
    assert not found, f"{len(found)} stale references:\n" + "\n".join(found)


def test_every_path_in_the_architecture_page_resolves() -> None:
    found = unresolved_in_architecture()
    assert not found, f"{len(found)} stale references:\n" + "\n".join(found)


def test_the_architecture_page_names_every_module_of_app_and_of_the_schema_rooms() -> None:
    """The app/ tree lists each module in its room's lines; each module of schema/'s rooms has its line."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    tree = page.split("## As built: `app/`", 1)[1].split("```", 2)[1]
    rooms: dict[str, str] = {}
    room = ""
    for line in tree.splitlines():
        if heading := re.match(r"  (\w+)/ ", line):
            room = heading[1]
        elif not line.startswith("   "):
            room = ""
        rooms[room] = rooms.get(room, "") + line + "\n"
    missing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "app").rglob("*.py"))
        if path.stem != "__init__"
        and not re.search(rf"\b{path.stem}\b", rooms.get("" if path.parent.name == "app" else path.parent.name, ""))
    ]
    missing += [
        f"schema/{path.parent.name}/{path.name}"
        for room in ("entities", "live")
        for path in sorted((ROOT / "schema" / room).glob("*.py"))
        if path.stem != "__init__" and f"  - `{room}/{path.name}`:" not in page
    ]
    assert not missing, missing


def test_the_checks_catch_a_stale_reference() -> None:
    assert dotted_resolves("iqgraph.app.live.watch") and not dotted_resolves("iqgraph.app.live.nowhere")
    assert dotted_resolves("iqgraph.stores.exceptions.StoreError")
    assert not dotted_resolves("iqgraph.stores.exceptions.NoSuchError")
    assert path_resolves("cluster/peers.py") and path_resolves("schema/live/")
    assert not path_resolves("app/query/nowhere.py")
