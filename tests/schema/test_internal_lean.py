"""The lean path of peers' forwarded point reads (schema.internal.answer_lookups) against graphql-core's ``_lookup``.

Each forwarded request goes to two apps over the same partitions — compiled (lean) and graphql-core alone —
and must get the same status, Content-Type and body bytes; the requests it must answer, it answers lean.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from iqgraph.schema import GraphQLApp, build_schema
from iqgraph.schema.asgi import FORWARDED_HEADER
from iqgraph.schema.internal import lookup_fields
from iqgraph.schema.wire import lookup_variables, lookups
from tests.schema.apps import shop_partition
from tests.schema.conftest import Api, DifferentialASGI, _comparable

FORWARDED = [
    (b"content-type", b"application/json"),
    (b"accept", b"application/graphql-response+json"),
    (FORWARDED_HEADER.encode(), b"node-1"),
]


class _LeanCounting(GraphQLApp):
    lean = 0

    def _forwarded_lookups(self, *args: Any) -> Any:
        found = super()._forwarded_lookups(*args)
        self.lean += found is not None
        return found


async def _post(app: GraphQLApp, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/graphql", "raw_path": b"/graphql", "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
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
    lean = _LeanCounting(shop.schema, shop.queries, shop.limits, local=local)
    reference = GraphQLApp(shop.reference, shop.queries, shop.limits, local=local, compiled=False)
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


async def test_not_forwarded_or_other_documents_are_not_lean(apps: tuple[_LeanCounting, GraphQLApp]) -> None:
    lean, reference = apps
    variables, _ = lookup_variables(GOOD[0])
    body = orjson.dumps({"query": lookups(1), "variables": variables})
    not_forwarded = FORWARDED[:2]
    assert _comparable(await _post(lean, body, not_forwarded)) == _comparable(
        await _post(reference, body, not_forwarded)
    )
    assert lean.lean == 0
    assert lookup_fields(lookups(1) + " ") is None
    assert lookup_fields(lookups(51)) is None
    assert [f.alias.value for f in lookup_fields(lookups(3)) or () if f.alias] == ["l0", "l1", "l2"]


async def test_lean_lookups_need_the_compiled_schema(shop: Api) -> None:
    local = shop.queries.local
    plain = _LeanCounting(build_schema(shop.queries.stores(), shop.limits, compiled=False), shop.queries, local=local)
    variables, _ = lookup_variables(GOOD[0])
    answer = await _post(plain, orjson.dumps({"query": lookups(1), "variables": variables}), FORWARDED)
    assert answer[0]["status"] == 200
    assert plain.lean == 0
