"""Point reads go through per-request DataLoaders: one StoreQueries call per store per request."""

from __future__ import annotations

import asyncio
import importlib
from collections import Counter
from typing import Any

import pytest
from graphql import ValidationContext
from graphql.language.parser import Parser

from iqgraph.schema import context_getter
from tests.schema.conftest import Api
from tests.support.apps import ShopTruth

QUERY = """{
  orderCount { a: get(key: "customer-00") b: get(key: "customer-01") c: get(key: "nobody")
               many: getMany(keys: ["customer-02", "customer-00", "customer-03"]) }
  again: orderCount { get(key: "customer-04") }
  totalSpend { a: get(key: "customer-00") b: get(key: "customer-05") }
  latestOrder { get(key: "customer-06") { orderId } }
  ordersPerMinute { a: fetch(key: "customer-00") { value } b: fetch(key: "customer-07") { value } }
  itemsSold { a: mightContain(key: "widget") b: mightContainMany(keys: ["gizmo", "nope"]) }
}"""


async def test_n_point_reads_make_one_batched_call_per_store(shop: Api, truth: ShopTruth) -> None:
    data = await shop.data(QUERY)
    counts = truth.counts()
    assert data["orderCount"]["many"] == [counts["customer-02"], counts["customer-00"], counts["customer-03"]]
    assert data["again"]["get"] == counts["customer-04"]
    calls = sorted((kind, store, sorted(map(str, args))) for kind, store, args in shop.queries.calls)
    assert calls == [
        (
            "fetch_many",
            "orders_per_minute",
            sorted(map(str, [("customer-00", -(1 << 63), (1 << 63) - 1), ("customer-07", -(1 << 63), (1 << 63) - 1)])),
        ),
        ("get_many", "latest_order", ["customer-06"]),
        (
            "get_many",
            "order_count",
            sorted(["customer-00", "customer-01", "nobody", "customer-02", "customer-03", "customer-04"]),
        ),
        ("get_many", "total_spend", ["customer-00", "customer-05"]),
        ("might_contain_many", "items_sold", ["gizmo", "nope", "widget"]),
    ]


async def test_loaders_belong_to_one_request(shop: Api) -> None:
    await shop.data('{ orderCount { get(key: "customer-00") } }')
    await shop.data('{ orderCount { get(key: "customer-00") } }')
    assert [c[0] for c in shop.queries.calls] == ["get_many", "get_many"]  # no cache across requests


async def test_parser_and_validation_caches_are_on(shop: Api) -> None:
    from strawberry.extensions import ParserCache, ValidationCache

    extensions = [make() for make in shop.reference.extensions]  # type: ignore[operator]
    parser = next(e for e in extensions if isinstance(e, ParserCache))
    validator = next(e for e in extensions if isinstance(e, ValidationCache))
    query = '{ orderCount { get(key: "cache-check") } }'
    await shop.execute(shop.reference, query)
    parses, validations = parser.cached_parse_document.cache_info(), validator.cached_validate_document.cache_info()
    await shop.execute(shop.reference, query)
    assert parser.cached_parse_document.cache_info().hits == parses.hits + 1
    assert validator.cached_validate_document.cache_info().hits == validations.hits + 1


async def test_a_document_is_compiled_once_and_its_plan_cached(shop: Api) -> None:
    compiled = shop.schema.compiled  # type: ignore[attr-defined]
    query = '{ orderCount { get(key: "plan-check") } }'
    await shop.data(query)
    plan = compiled.plan(query, None)
    assert plan is not None and compiled.plan(query, None) is plan


async def test_a_document_no_plan_covers_is_parsed_and_validated_once_where_it_runs(
    shop: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled plans and the Strawberry path share the schema's parse and validation of a document: one that
    gets no plan (a fragment, an unknown field, introspection) is not parsed or validated again where it then
    runs — a new document, a client's bad one too, costs one parse and one validation."""
    counted: Counter[str] = Counter()
    parse_document = Parser.parse_document

    def counting_parse(parser: Parser) -> Any:
        counted["parse"] += 1
        return parse_document(parser)

    class CountingContext(ValidationContext):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            counted["validate"] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(Parser, "parse_document", counting_parse)
    monkeypatch.setattr(importlib.import_module("graphql.validation.validate"), "ValidationContext", CountingContext)
    for query in (
        '{ orderCount { ...Read } } fragment Read on OrderCountStore { get(key: "once-check") }',
        '{ orderCount { nope(key: "once-check") } }',
        "{ __schema { queryType { name } } }",
    ):
        counted.clear()
        result = await shop.execute(shop.schema, query)
        assert shop.schema.compiled.plan(query, None) is None, query  # type: ignore[attr-defined]
        assert counted == {"parse": 1, "validate": 1}, (query, result)
        await shop.execute(shop.schema, query)
        assert counted == {"parse": 1, "validate": 1}, query  # and kept for the next request


def _in_one_step(api: Api, query: str) -> Any:
    """Return the result of query's compiled execution if it finished without yielding to the event loop, else
    None (the execution then waited a turn for reads that could batch with its own)."""
    steps = api.schema.execute_compiled(query, None, context_getter(api.queries, api.limits)(), None, None)
    try:
        steps.send(None)
    except StopIteration as done:
        return done.value
    steps.close()
    return None


async def test_a_plan_with_one_field_per_level_reads_at_once_and_one_with_two_still_batches(
    shop: Api, truth: ShopTruth
) -> None:
    """Nothing can batch with the read of a document selecting one field per level (a point read, a getMany, a
    value object's fields): its request's loaders read in the same turn, so its execution finishes without
    waiting a turn of the event loop. Two reads side by side, or a list of objects, still wait and batch."""
    counts = truth.counts()
    one_at_a_time = {
        '{ orderCount { get(key: "customer-00") } }': {"orderCount": {"get": counts["customer-00"]}},
        '{ orderCount { __typename getMany(keys: ["customer-01", "customer-02"]) } }': {
            "orderCount": {"__typename": "OrderCountStore", "getMany": [counts["customer-01"], counts["customer-02"]]}
        },
    }
    for query, expected in one_at_a_time.items():
        result = _in_one_step(shop, query)
        assert result is not None, f"{query} waited a turn of the event loop"
        assert result.errors is None and result.data == expected, query
        assert result.data == (await shop.run(query)).data  # and graphql-core answers the same
    together = '{ a: orderCount { get(key: "customer-00") } b: orderCount { get(key: "customer-01") } }'
    assert _in_one_step(shop, together) is None
    await asyncio.sleep(0.01)  # the abandoned execution's batch, already scheduled, runs
    del shop.queries.calls[:]
    assert (await shop.data(together)) == {"a": {"get": counts["customer-00"]}, "b": {"get": counts["customer-01"]}}
    assert [c[0] for c in shop.queries.calls] == ["get_many"]  # the two keys in one call
