"""Codegen round trip: the SDL printed by `iqgraph schema` loads with graphql-core and validates the
example queries of the README and the one `iqgraph dev` generates for any app."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from graphql import GraphQLSchema, build_schema, parse, validate

from iqgraph.app.example_query import example_query, sample_keys
from iqgraph.examples import shop
from iqgraph.examples import weblog as weblog_example
from iqgraph.streaming.definitions import App
from tests.app.test_cli import iqgraph

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shop_sdl() -> str:
    result = iqgraph("schema", "--app", "iqgraph.examples.shop:app")
    assert result.returncode == 0, result.stderr
    return result.stdout


def _readme_queries() -> list[str]:
    return re.findall(r"```graphql\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def _generated_query(schema: GraphQLSchema, app: App) -> str:
    assert app.generator is not None
    events = app.generator(7, 1_767_225_600_000)
    samples = [(app.topics[0].name, key, value) for (key, value), _ in zip(events, range(50), strict=False)]
    return example_query(schema, app, sample_keys(app, samples))


def _assert_valid(schema: GraphQLSchema, query: str) -> None:
    errors = validate(schema, parse(query))
    assert not errors, (query, errors)


def test_the_printed_sdl_is_the_snapshot(shop_sdl: str) -> None:
    assert shop_sdl.strip() == (ROOT / "tests/schema/snapshots/shop.graphql").read_text().strip()


def test_readme_queries_validate_against_the_printed_sdl(shop_sdl: str) -> None:
    schema = build_schema(shop_sdl)
    assert len(_readme_queries()) >= 2
    for query in _readme_queries():
        _assert_valid(schema, query)


def test_the_generated_example_query_reads_every_store_and_validates(shop_sdl: str) -> None:
    query = _generated_query(build_schema(shop_sdl), shop.app)
    _assert_valid(build_schema(shop_sdl), query)
    assert 'orderCount { get(key: "customer-' in query
    assert "latestOrder { get(key: " in query and "orderId" in query  # an object value selects its scalars
    assert "ordersPerMinute { fetch(key: " in query and "start end value" in query
    assert 'itemsSold { mightContain(key: "' in query  # keyed by the item column, not the record key
    assert query.count("(key:") == len(shop.app.stores)


def test_the_sdl_of_two_apps_differ() -> None:
    weblog = iqgraph("schema", "--app", "iqgraph.examples.weblog:app")
    assert weblog.returncode == 0, weblog.stderr
    schema = build_schema(weblog.stdout)
    assert "accessCount" in schema.query_type.fields and "orderCount" not in schema.query_type.fields
    _assert_valid(schema, _generated_query(schema, weblog_example.app))
