"""Compiled execution (schema.compiled): which documents get a plan, and differential tests against graphql-core.

Every query of the schema tests already runs both ways (``Api.run`` compares the two responses); these add
the README's queries, the demo's example query, and a hypothesis-generated set over the shop schema,
valid and invalid, with variables, aliases and staleness bounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from graphql import build_schema as build_sdl
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from iqgraph.app.dev.example_query import example_query
from iqgraph.schema import build_schema
from tests.schema.conftest import Api, response_json
from tests.support.apps import ShopTruth, shop_app
from tests.support.readme_blocks import readme_queries

ROOT = Path(__file__).resolve().parents[2]


def _readme_documents() -> list[str]:
    return [document for app, document in readme_queries() if app is None]  # the others: test_schema_cli


def _plan(api: Api, query: str, operation: str | None = None) -> Any:
    return api.schema.compiled.plan(query, operation)  # type: ignore[attr-defined]


async def test_the_readmes_queries_run_compiled_and_answer_as_graphql_core(shop: Api) -> None:
    documents = _readme_documents()
    assert len(documents) >= 2
    for document in documents:
        variables = {"after": None} if "$after" in document else None
        result = await shop.run(document, variables)  # compared with graphql-core inside
        assert result.data is not None, document
        assert _plan(shop, document) is not None, document


async def test_the_demos_example_query_runs_compiled(shop: Api, truth: ShopTruth) -> None:
    sdl = build_sdl(shop.schema.as_str())
    customer = next(iter(truth.counts()))
    query = example_query(sdl, shop_app(), {s.name: customer for s in shop_app().stores})
    assert _plan(shop, query) is not None, query
    data = await shop.data(query)
    assert data["orderCount"]["get"] == truth.counts()[customer]


async def test_what_a_plan_does_not_cover_runs_on_graphql_core(shop: Api) -> None:
    uncovered = {
        "introspection": "{ __schema { queryType { name } } }",
        "fragment": 'query { ...F } fragment F on Query { orderCount { get(key: "customer-00") } }',
        "inline fragment": '{ orderCount { ... on OrderCountStore { get(key: "customer-00") } } }',
        "directive": '{ orderCount { get(key: "customer-00") @include(if: true) } }',
        "merged fields": '{ orderCount { get(key: "customer-00") } orderCount { count } }',
        "internal field": '{ _count(store: "order_count", partitions: [0]) }',
        "invalid": "{ orderCount { nope } }",
        "syntax error": "{ orderCount { get(key: ",
        "mutation": "mutation { orderCount }",
    }
    for why, query in uncovered.items():
        assert _plan(shop, query) is None, why
        await shop.run(query)  # and still answers as graphql-core does


async def test_variables_that_do_not_coerce_are_reported_as_graphql_core_reports_them(shop: Api) -> None:
    query = "query($k: String!) { orderCount { get(key: $k) } }"
    assert _plan(shop, query) is not None
    for variables in ({}, {"k": 5}, {"k": None}):
        result = await shop.run(query, variables)
        assert result.errors and result.data is None


async def test_compiled_can_be_turned_off(shop: Api) -> None:
    off = build_schema(shop.queries.stores(), shop.limits, compiled=False)
    assert off.compiled is None  # type: ignore[attr-defined]


# -- hypothesis: generated documents over the shop schema -------------------------------------------------

KEYS = ["customer-00", "customer-03", "customer-07", "nobody", ""]
_key = st.sampled_from(KEYS)
_keys = st.lists(_key, max_size=7)
_times = st.sampled_from(["0", '"2026-01-01T00:00:00Z"', '"not a time"', "-1"])


def _literal(value: Any) -> str:
    return orjson.dumps(value).decode()


@st.composite
def _store_selection(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["kv", "latest", "window", "bloom", "scan", "meta"]))
    typename = " __typename" if draw(st.booleans()) else ""
    if kind == "kv":
        store = draw(st.sampled_from(["orderCount", "totalSpend", "averageOrder", "largestOrder"]))
        parts = draw(
            st.lists(
                st.sampled_from(
                    [
                        f"get(key: {_literal(draw(_key))})",
                        "getMany(keys: $keys)",
                        f"many: getMany(keys: {_literal(draw(_keys))})",
                        "count",
                        "approximateCount",
                        "one: get(key: $key)",
                    ]
                ),
                min_size=1,
                max_size=4,
                unique=True,
            )
        )
        return f"{store}{_bound(draw)} {{ {' '.join(parts)}{typename} }}"
    if kind == "latest":
        fields = draw(
            st.lists(st.sampled_from(["orderId", "customer", "item", "quantity", "amount", "ts"]), min_size=1)
        )
        selection = " ".join(dict.fromkeys(fields))
        many = f"getMany(keys: {_literal(draw(_keys))}) {{ {selection} }}" if draw(st.booleans()) else ""
        return f"latestOrder{_bound(draw)} {{ get(key: {_literal(draw(_key))}) {{ {selection}{typename} }} {many} }}"
    if kind == "window":
        fields = " ".join(dict.fromkeys(draw(st.lists(st.sampled_from(["key", "start", "end", "value"]), min_size=1))))
        return (
            f"ordersPerMinute{_bound(draw)} {{ fetch(key: {_literal(draw(_key))}, from: {draw(_times)}, "
            f"to: {draw(_times)}) {{ {fields} }} count{typename} }}"
        )
    if kind == "bloom":
        return (
            f"itemsSold{_bound(draw)} {{ mightContain(key: {_literal(draw(st.sampled_from(['widget', 'nope', ''])))}) "
            f"mightContainMany(keys: {_literal(draw(st.lists(st.sampled_from(['gizmo', 'x', '']), max_size=4)))}) "
            f"falsePositiveRate approximateCount{typename} }}"
        )
    if kind == "scan":
        first = draw(st.sampled_from([1, 2, 5, 0, 2000]))
        after = draw(st.sampled_from(["", ', after: "garbage"', ", after: $after"]))
        return (
            f"totalSpend{_bound(draw)} {{ all(first: {first}{after}) {{ edges {{ cursor node {{ key value }} }} "
            f"pageInfo {{ hasNextPage endCursor{typename} }} }} }}"
        )
    key = _literal(draw(_key))
    return draw(
        st.sampled_from(
            [
                "stores { name kind keyType partitions coPartitioned }",
                f'keyMetadata(store: "order_count", key: {key}) {{ store partition activeNode standbyNodes }}',
                f'keyMetadata(store: "no_such_store", key: {key}) {{ partition }}',
                "node { id state }",
            ]
        )
    )


def _bound(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(["", "", "(maxLag: 10)", "(maxLag: -1)", "(maxLag: $lag)"]))


@st.composite
def _documents(draw: st.DrawFn) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    roots = draw(st.lists(_store_selection(), min_size=1, max_size=4))
    body = " ".join(f"r{i}: {root}" if draw(st.booleans()) or i else root for i, root in enumerate(roots))
    declared = {"key": '$key: String = "customer-00"', "keys": "$keys: [String!] = []", "lag": "$lag: Long"}
    declared["after"] = "$after: String"
    used = [d for name, d in declared.items() if f"${name}" in body]
    query = f"query Q{'(' + ', '.join(used) + ')' if used else ''} {{ {body} }}"
    variables = {
        "key": draw(_key),
        "keys": draw(_keys),
        "lag": draw(st.sampled_from([None, 0, 5, -3])),
        "after": draw(st.sampled_from([None, "x"])),
    }
    extensions = draw(st.sampled_from([None, {"maxLag": 3}, {"positions": True}, {"maxLag": "nope"}]))
    return query, variables, extensions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=_documents())
async def test_generated_documents_answer_the_same_compiled_and_on_graphql_core(
    shop: Api, document: tuple[str, dict[str, Any], dict[str, Any] | None]
) -> None:
    query, variables, extensions = document
    compiled = await shop.execute(shop.schema, query, variables, extensions)
    reference = await shop.execute(shop.reference, query, variables, extensions)
    assert response_json(compiled) == response_json(reference), query
    event("compiled" if _plan(shop, query) is not None else "graphql-core only")


def test_most_generated_documents_get_a_plan(shop: Api) -> None:
    # the differential test above compares compiled with graphql-core only where a plan exists
    import warnings

    from hypothesis.errors import NonInteractiveExampleWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        queries = [_documents().example()[0] for _ in range(100)]
    planned = sum(_plan(shop, query) is not None for query in queries)
    assert planned >= 60, f"only {planned} of 100 generated documents compiled"
