"""The package layout: one import name, nothing else at the top of site-packages, examples kept out of
production code."""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("app", "schema", "stores", "streaming", "iqgraph")


def test_only_iqgraph_is_importable_outside_the_source_tree(tmp_path: Path) -> None:
    probe = (
        "import importlib.util, iqgraph, iqgraph.app.cli, iqgraph.examples.shop\n"
        "print([n for n in ('app', 'schema', 'stores', 'streaming', 'examples') if importlib.util.find_spec(n)])\n"
        "print(iqgraph.App is iqgraph.streaming.definitions.App)"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True"]


def test_production_code_does_not_import_the_examples() -> None:
    for folder in PRODUCTION:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                assert not any(n.startswith("iqgraph.examples") for n in names), path


def test_no_file_under_tests_imports_a_test_module() -> None:
    """What tests share lives in tests/support (or a conftest.py fixture): a test_*.py module is pytest's to import."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # `from tests.x import test_y` imports the module test_y too
                modules = [node.module or "", *(f"{node.module or ''}.{a.name}" for a in node.names)]
            else:
                continue
            imported = [m for m in modules if m.rsplit(".", 1)[-1].startswith("test_")]
            found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {m}" for m in imported]
    assert not found, "\n".join(found)


def test_every_folder_and_data_file_of_the_package_is_declared() -> None:
    """setuptools prints some 40 lines per folder it finds importable but undeclared, at every install (once ~150
    lines before `make demo` said anything): every folder under package-dir is in `packages`, and every file in it
    that is not Python matches its package-data."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    undeclared, unshipped = [], []
    for name, folder in config["package-dir"].items():
        for path in [ROOT / folder, *(ROOT / folder).rglob("*")]:
            files = [f for f in path.iterdir() if f.is_file()] if path.is_dir() and path.name != "__pycache__" else []
            package = ".".join([name, *path.relative_to(ROOT / folder).parts])
            if files and package not in config["packages"]:
                undeclared.append(package)
            globs = config["package-data"].get(package, [])
            shipped = [f for f in files if f.suffix == ".py" or any(fnmatch.fnmatch(f.name, g) for g in globs)]
            unshipped += sorted(str(f.relative_to(ROOT)) for f in set(files) - set(shipped))
    assert undeclared == [] and unshipped == []
