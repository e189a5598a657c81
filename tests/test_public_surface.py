"""One public surface: what a user writes comes from ``iqgraph``, and the examples and the README prove it.

httpx's rule: every module is private and the package is the door. The examples (examples/*.py) and every
Python block of the README and of the docs pages import only the top-level ``iqgraph`` (never
``iqgraph.streaming.definitions`` or a relative import), each name they take from it is exported, and every
error a user can fix at start is an ``iqgraph.UserError``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import iqgraph
from tests.support.readme_blocks import readme_python_blocks

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _sources() -> Iterator[tuple[str, int, str]]:
    """Yield (file, the line before the code's first, code) for every example and every Python block of the README
    and the docs pages."""
    for path in EXAMPLES:
        yield str(path.relative_to(ROOT)), 0, path.read_text()
    yield from readme_python_blocks()  # the README's and the docs pages'


SOURCES = list(_sources())


def _non_public_imports(file: str, offset: int, code: str) -> Iterator[str]:
    """Yield each import of an iqgraph module other than the top-level package (relative ones included)."""
    for node in ast.walk(ast.parse(code)):
        where = f"{file}:{offset + node.lineno}" if isinstance(node, ast.Import | ast.ImportFrom) else ""
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("iqgraph.")):
            yield f"{where}: from {'.' * node.level}{node.module or ''} import …"
        elif isinstance(node, ast.Import):
            yield from (f"{where}: import {a.name}" for a in node.names if a.name.startswith("iqgraph."))


def _names_from_iqgraph(code: str) -> set[str]:
    return {
        alias.name
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.ImportFrom) and node.module == "iqgraph" and not node.level
        for alias in node.names
    }


def test_there_are_examples_and_readme_blocks_to_check() -> None:
    assert len(EXAMPLES) >= 5 and sum(file == "README.md" for file, _, _ in SOURCES) >= 6


def test_examples_and_readme_blocks_import_only_the_iqgraph_package() -> None:
    found = [i for source in SOURCES for i in _non_public_imports(*source)]
    assert not found, f"{len(found)} imports of non-public iqgraph modules; import from iqgraph:\n" + "\n".join(found)


def test_what_they_import_from_iqgraph_is_exported() -> None:
    imported = {(file, name) for file, _, code in SOURCES for name in _names_from_iqgraph(code)}
    assert {(file, name) for file, name in imported if name not in iqgraph.__all__} == set()


def test_every_exported_name_exists() -> None:
    assert [name for name in iqgraph.__all__ if not hasattr(iqgraph, name)] == []
    assert len(set(iqgraph.__all__)) == len(iqgraph.__all__)


def test_the_check_sees_submodule_and_relative_imports() -> None:
    code = "import iqgraph\nfrom iqgraph import App\nfrom iqgraph.streaming import count\nimport iqgraph.app\n"
    code += "from . import x\n"
    assert list(_non_public_imports("README.md", 10, code)) == [
        "README.md:13: from iqgraph.streaming import …",
        "README.md:14: import iqgraph.app",
        "README.md:15: from . import …",
    ]


def _user_errors() -> list[Any]:
    from iqgraph.app.cluster.group_protocol import GroupConfigError
    from iqgraph.app.cluster.topics import TopicCreationError
    from iqgraph.app.dev.run import DevError
    from iqgraph.app.loading import AppLoadError
    from iqgraph.app.node import NodeStartError
    from iqgraph.app.settings import SettingsError
    from iqgraph.schema import SchemaDefinitionError
    from iqgraph.streaming.broker import BrokerError
    from iqgraph.streaming.kafka_jars import JarsError

    return [
        AppLoadError,
        SettingsError,
        iqgraph.DefinitionError,
        SchemaDefinitionError,
        NodeStartError,
        DevError,
        TopicCreationError,
        BrokerError,
        JarsError,
        GroupConfigError,
    ]


@pytest.mark.parametrize("error", _user_errors(), ids=lambda e: e.__name__)
def test_every_error_a_user_can_fix_at_start_is_a_user_error(error: type[BaseException]) -> None:
    assert issubclass(error, iqgraph.UserError)
