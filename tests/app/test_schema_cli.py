"""Codegen round trip: the SDL printed by `iqgraph schema` loads with graphql-core and validates the
example queries of the README and of the demo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from graphql import GraphQLSchema, build_schema, parse, validate

from iqgraph.app.demo import EXAMPLE_QUERIES
from tests.app.test_cli import iqgraph

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shop_sdl() -> str:
    result = iqgraph("schema", "--app", "iqgraph.examples.shop:app")
    assert result.returncode == 0, result.stderr
    return result.stdout


def _readme_queries() -> list[str]:
    return re.findall(r"```graphql\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def _demo_queries() -> list[str]:
    blocks = re.split(r"\n\s*\n", EXAMPLE_QUERIES.strip())
    return ["\n".join(line for line in block.splitlines() if not line.startswith("#")) for block in blocks]


def _assert_valid(schema: GraphQLSchema, query: str) -> None:
    errors = validate(schema, parse(query))
    assert not errors, (query, errors)


def test_the_printed_sdl_is_the_snapshot(shop_sdl: str) -> None:
    assert shop_sdl.strip() == (ROOT / "tests/schema/snapshots/shop.graphql").read_text().strip()


def test_readme_and_demo_queries_validate_against_the_printed_sdl(shop_sdl: str) -> None:
    schema = build_schema(shop_sdl)
    queries = _readme_queries() + _demo_queries()
    assert len(_readme_queries()) >= 2 and len(_demo_queries()) == 3
    for query in queries:
        _assert_valid(schema, query)


def test_the_sdl_of_two_apps_differ() -> None:
    weblog = iqgraph("schema", "--app", "iqgraph.examples.weblog:app")
    assert weblog.returncode == 0, weblog.stderr
    schema = build_schema(weblog.stdout)
    assert "accessCount" in schema.query_type.fields and "orderCount" not in schema.query_type.fields
