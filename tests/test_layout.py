"""The package layout: one import name, nothing else at the top of site-packages, examples kept out of
production code."""

from __future__ import annotations

import ast
import subprocess
import sys
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
