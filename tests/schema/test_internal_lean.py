"""The internal endpoint's lean path of peers' point reads (schema.internal.answer_lookups) against graphql-core's.

Each forwarded request goes to two internal apps over the same partitions — lean and graphql-core alone —
and must get the same status, Content-Type and body bytes; the requests it must answer, it answers lean.
The caller a peer carries is checked on both paths (FORBIDDEN), and the public limits bound both.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from iqgraph.schema import GraphQLApp, Limits, wire
from iqgraph.schema.access import PRINCIPAL_SCOPE_KEY, Principal
from iqgraph.schema.builder import build_internal_schema
from iqgraph.schema.internal import lookup_fields
from iqgraph.schema.wire import lookup_variables, lookups
from tests.schema.conftest import Api, DifferentialASGI, _comparable
from tests.support.apps import shop_partition

FORWARDED = [
    (b"content-type", b"application/json"),
    (b"accept", b"application/graphql-response+json"),
]


class _LeanCounting(GraphQLApp):
    lean = 0

    def _forwarded_lookups(self, *args: Any) -> Any:
        found = super()._forwarded_lookups(*args)
        self.lean += found is not None
        return found


async def _post(
    app: GraphQLApp, body: bytes, headers: list[tuple[bytes, bytes]], caller: Principal | None = None
) -> Any:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/graphql", "raw_path": b"/graphql", "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    if caller is not None:
        scope[PRINCIPAL_SCOPE_KEY] = caller
    return await DifferentialASGI._answer(app, scope, [{"type": "http.request", "body": body, "more_body": False}])


def _reads(key: str, lo: Any = None, hi: Any = None, partitions: list[int] | None = None) -> list[Any]:
    return [key, lo, hi, [shop_partition(key)] if partitions is None else partitions]


GOOD = [
    [("order_count", [_reads("customer-01"), _reads("customer-02"), _reads("nobody")])],
    [
        ("order_count", [_reads("customer-03")]),
        ("latest_order", [_reads("customer-03"), _reads("customer-04", partitions=[0, 1, 2])]),
        ("orders_per_minute", [_reads("customer-05", 0, 1 << 60)]),
        ("items_sold", [_reads("widget", partitions=[0, 1, 2]), _reads("unicorn", partitions=[0])]),
    ],
    [("order_count", [_reads("customer-01", partitions=[7])])],  # a partition not hosted: its error in place
    [("order_count", [])],
]
FALLBACK = [
    [("no_such_store", [_reads("customer-01")])],
    [("order_count", [_reads("customer-01")]), ("order_count", "not reads")],
    [("order_count", [["customer-01", None, None]])],
    [("orders_per_minute", [_reads("customer-05", "soon", None)])],
]


@pytest.fixture
def apps(shop: Api) -> tuple[_LeanCounting, GraphQLApp]:
    local = shop.queries.local
    lean = _LeanCounting(build_internal_schema(shop.limits), shop.queries, shop.limits, local=local)
    reference = GraphQLApp(build_internal_schema(shop.limits), shop.queries, shop.limits, local=local, compiled=False)
    return lean, reference


@pytest.mark.parametrize("batches", GOOD + FALLBACK)
async def test_forwarded_lookups_answer_as_graphql_core(
    apps: tuple[_LeanCounting, GraphQLApp], batches: list[tuple[str, Any]]
) -> None:
    lean, reference = apps
    variables, _ = lookup_variables(batches)
    body = orjson.dumps({"query": lookups(len(batches)), "variables": variables})
    answered, expected = await _post(lean, body, FORWARDED), await _post(reference, body, FORWARDED)
    assert _comparable(answered) == _comparable(expected)
    assert lean.lean == (batches in GOOD)


async def test_other_documents_are_not_lean_and_the_public_schema_has_no_internal_fields(
    apps: tuple[_LeanCounting, GraphQLApp], shop: Api
) -> None:
    variables, _ = lookup_variables(GOOD[0])
    body = orjson.dumps({"query": lookups(1), "variables": variables})
    public = _LeanCounting(shop.schema, shop.queries, shop.limits)
    start, answer = await _post(public, body, FORWARDED)
    assert start["status"] == 400 and public.lean == 0  # a validation error: no such field
    assert b"Cannot query field '_lookup'" in answer["body"]
    assert lookup_fields(lookups(1) + " ") is None
    assert lookup_fields(lookups(51)) is None
    assert [f.alias.value for f in lookup_fields(lookups(3)) or () if f.alias] == ["l0", "l1", "l2"]


async def test_the_carried_caller_and_the_limits_bound_both_paths(apps: tuple[_LeanCounting, GraphQLApp]) -> None:
    lean, reference = apps
    variables, _ = lookup_variables([("order_count", [_reads("customer-01")]), ("latest_order", [_reads("c-2")])])
    body = orjson.dumps({"query": lookups(2), "variables": variables})
    reader = Principal("reader", frozenset({"latest_order"}))
    answered, expected = await _post(lean, body, FORWARDED, reader), await _post(reference, body, FORWARDED, reader)
    assert _comparable(answered) == _comparable(expected)
    response = orjson.loads(answered[1]["body"])
    assert response["data"]["l0"] is None and response["data"]["l1"] is not None
    assert [e["extensions"]["code"] for e in response["errors"]] == ["FORBIDDEN"]
    assert lean.lean == 0  # a forbidden store leaves it to graphql-core, which says so per field
    few = Limits(max_keys=2)
    small = _LeanCounting(build_internal_schema(few), lean._queries, few, local=lean._local)
    variables, _ = lookup_variables([("order_count", [_reads(f"customer-0{i}") for i in range(1, 4)])])
    _, over = await _post(small, orjson.dumps({"query": lookups(1), "variables": variables}), FORWARDED)
    assert orjson.loads(over["body"])["errors"][0]["extensions"]["code"] == "LIMIT_EXCEEDED"
    assert small.lean == 0


async def test_arguments_no_peer_sends_are_bad_request_never_internal(shop: Api) -> None:
    from iqgraph.schema.context import request_context

    schema = build_internal_schema(shop.limits)
    context = request_context(shop.queries, shop.limits, local=shop.queries.local)
    bad = [
        (wire.LOOKUP, {"store": "order_count", "reads": [["customer-01", "x", None, [0]]]}),
        (wire.LOOKUP, {"store": "order_count", "reads": [[True, None, None, [0]]]}),
        (wire.LOOKUP, {"store": "order_count", "reads": [["customer-01", None, None, [-1]]]}),
        (wire.SCAN, _scan("orders_per_minute", "range", {"from_key": None, "to_key": None})),
        (wire.SCAN, _scan("orders_per_minute", "fetch_all", {"time_from": "a", "time_to": 1})),
        (wire.SCAN, _scan("order_count", "top", {"group": None})),
        (wire.SCAN, _scan("order_count", "range", {"from_key": ["a"], "to_key": None})),
        (wire.SCAN, _scan("order_count", "nope", {})),
    ]
    for query, variables in bad:
        result = await schema.execute(query, variable_values=variables, context_value=context)
        assert result.errors is not None, variables
        assert result.errors[0].formatted["extensions"]["code"] == "BAD_REQUEST", (variables, result.errors)
    # a page resumed from an edge's cursor asks for up to twice the page size: answered
    resumed = _scan("order_count", "range", {"from_key": None, "to_key": None}, first=2 * shop.limits.max_page_size)
    result = await schema.execute(wire.SCAN, variable_values=resumed, context_value=context)
    assert result.errors is None, result.errors


def _scan(store: str, kind: str, args: dict[str, Any], first: int = 10) -> dict[str, Any]:
    return {"store": store, "scan": {"kind": kind, "args": args}, "positions": {}, "first": first, "partitions": [0]}
