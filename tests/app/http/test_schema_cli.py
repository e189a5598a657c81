"""Codegen round trip: the SDL printed by `iqgraph schema` loads with graphql-core and validates the
example queries of the README and the one `iqgraph dev` generates for any app."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from graphql import GraphQLSchema, build_schema, parse, validate

from iqgraph.app.dev.example_query import example_query, sample_keys
from iqgraph.examples import music as music_example
from iqgraph.examples import shop
from iqgraph.examples import weblog as weblog_example
from iqgraph.stores import StoreKind
from iqgraph.streaming.definitions import App
from tests.support.cli import iqgraph
from tests.support.readme_blocks import readme_queries

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def shop_sdl() -> str:
    result = iqgraph("schema", "--app", "iqgraph.examples.shop:app")
    assert result.returncode == 0, result.stderr
    return result.stdout


def _generated_query(schema: GraphQLSchema, app: App, events: int = 50) -> str:
    assert app.generator is not None
    generated = app.generator(7, 1_767_225_600_000)
    samples = [(t.name, k, v) for t, k, v in (app.addressed(e) for e, _ in zip(generated, range(events), strict=False))]
    return example_query(schema, app, sample_keys(app, samples))


def _assert_valid(schema: GraphQLSchema, query: str) -> None:
    errors = validate(schema, parse(query))
    assert not errors, (query, errors)


def test_the_printed_sdl_is_the_snapshot(shop_sdl: str) -> None:
    # the shop example as it ships: the schema tests' shop plus its global products table (catalog, Product)
    path = ROOT / "tests/schema/snapshots/shop_example.graphql"
    if os.environ.get("IQGRAPH_UPDATE_SNAPSHOTS") == "1":
        path.write_text(shop_sdl.strip() + "\n")
    assert shop_sdl.strip() == path.read_text().strip()
    base = (ROOT / "tests/schema/snapshots/shop.graphql").read_text()
    assert "type OrderCountStore" in base and "type Product " in shop_sdl and "type Product " not in base


def test_readme_queries_validate_against_the_printed_sdl(shop_sdl: str) -> None:
    blocks = readme_queries()
    assert len(blocks) >= 5 and {app for app, _ in blocks} == {None, "shop", "customers", "bookings", "music"}
    schemas = {None: build_schema(shop_sdl), "shop": build_schema(shop_sdl)}
    for name in ("customers", "bookings", "music"):
        result = iqgraph("schema", "--app", f"iqgraph.examples.{name}:app")
        assert result.returncode == 0, result.stderr
        schemas[name] = build_schema(result.stdout)
    for app, query in blocks:
        _assert_valid(schemas[app], query)


def test_the_generated_example_query_reads_every_store_and_validates(shop_sdl: str) -> None:
    query = _generated_query(build_schema(shop_sdl), shop.app)  # the catalog's rows come first, then orders
    _assert_valid(build_schema(shop_sdl), query)
    assert 'orderCount { get(key: "customer-' in query
    assert "latestOrder { get(key: " in query and "orderId" in query  # an object value selects its scalars
    assert "ordersPerMinute { fetch(key: " in query and "start end value" in query
    assert 'itemsSold { mightContain(key: "' in query  # keyed by the item column, not the record key
    assert 'catalog { get(key: "' in query and 'product(key: "' in query  # the global table and its entity
    assert 'itemOrdersPerMinute { fetch(key: "' in query and "topCustomers { top(first: 5)" in query
    keyed = [s for s in shop.app.stores if s.kind is not StoreKind.RANKING]  # a ranking is read by top(first:)
    assert query.count("(key:") == len(keyed) + len(shop.app.entities)


def test_the_sdl_of_two_apps_differ() -> None:
    weblog = iqgraph("schema", "--app", "iqgraph.examples.weblog:app")
    assert weblog.returncode == 0, weblog.stderr
    schema = build_schema(weblog.stdout)
    assert "accessCount" in schema.query_type.fields and "orderCount" not in schema.query_type.fields
    _assert_valid(schema, _generated_query(schema, weblog_example.app))


def test_the_music_example_query_reads_the_charts_and_validates() -> None:
    result = iqgraph("schema", "--app", "iqgraph.examples.music:app")
    assert result.returncode == 0, result.stderr
    schema = build_schema(result.stdout)
    query = _generated_query(schema, music_example.app, events=400)  # the catalogue's 240 songs, then plays
    _assert_valid(schema, query)
    assert "topSongs { top(first: 5) { member value rank cursor } }" in query
    assert 'songPlays { get(key: "song-' in query and 'song(key: "song-' in query
