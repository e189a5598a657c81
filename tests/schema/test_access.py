"""Per-store authorization (schema.access) through the schema, and introspection turned off.

Each query runs on the compiled path and on graphql-core with the same caller and must answer the same JSON.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from iqgraph.app.catalog import entity_infos
from iqgraph.schema import build_schema
from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.schema.context import request_context
from iqgraph.schema.errors import ApiError
from tests.schema.conftest import Api, response_json


async def _as(api: Api, caller: Principal, query: str) -> dict[str, Any]:
    answers = []
    for schema in (api.schema, api.reference):
        context = request_context(api.queries, api.limits, principal=caller)
        answers.append(orjson.loads(response_json(await schema.execute(query, context_value=context))))
    assert answers[0] == answers[1], query
    return answers[0]


def test_scopes_grant_stores() -> None:
    assert Principal.from_scopes("a", ["read:order_count", "write:x", "profile"]).stores == frozenset({"order_count"})
    assert Principal.from_scopes("a", ["read:order_count", "read:*"]).stores is None
    assert Principal.from_scopes("a", []).stores == frozenset()
    assert Principal.from_json(Principal("a", frozenset({"s"})).to_json()) == Principal("a", frozenset({"s"}))
    with pytest.raises(ValueError, match="not a principal"):
        Principal.from_json({"sub": "a", "stores": "s"})
    check_read(ANONYMOUS, "anything")
    with pytest.raises(ApiError) as refused:
        check_read(Principal("a", frozenset({"s"})), "t")
    assert refused.value.extensions == {"code": "FORBIDDEN", "store": "t"}


async def test_a_store_the_caller_may_not_read_is_one_forbidden_field_and_the_rest_answers(market: Api) -> None:
    query = '{ orderCount { get(key: "c-01") } totalSpend { get(key: "c-01") } ordered { mightContain(key: "c-01") } }'
    everything = await _as(market, ANONYMOUS, query)
    assert everything["data"]["totalSpend"] is not None and "errors" not in everything
    answer = await _as(market, Principal("reader", frozenset({"order_count", "ordered"})), query)
    assert answer["data"]["orderCount"] == everything["data"]["orderCount"]
    assert answer["data"]["ordered"] == everything["data"]["ordered"]
    assert answer["data"]["totalSpend"] == {"get": None}
    assert answer["errors"] == [
        {
            "message": "not allowed to read store 'total_spend'",
            "locations": [{"line": 1, "column": 48}],
            "path": ["totalSpend", "get"],
            "extensions": {"code": "FORBIDDEN", "store": "total_spend"},
        }
    ]


async def test_an_entity_field_on_a_forbidden_store_is_forbidden_alone(market: Api) -> None:
    query = '{ customer(key: "c-01") { key orderCount totalSpend } }'
    everything = await _as(market, ANONYMOUS, query)
    caller = Principal("reader", frozenset({"customers", "order_count"}))
    answer = await _as(market, caller, query)
    customer = answer["data"]["customer"]
    assert customer["orderCount"] == everything["data"]["customer"]["orderCount"] and customer["totalSpend"] is None
    assert [(e["path"], e["extensions"]["code"]) for e in answer["errors"]] == [
        (["customer", "totalSpend"], "FORBIDDEN")
    ]


async def test_introspection_can_be_turned_off(market: Api) -> None:
    closed = build_schema(
        market.queries.stores(), market.limits, entities=entity_infos(market.app), introspection=False
    )
    context = request_context(market.queries, market.limits)
    refused = await closed.execute("{ __schema { queryType { name } } }", context_value=context)
    assert refused.errors is not None
    assert refused.errors[0].formatted["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"
    assert "introspection" in refused.errors[0].message
    answered = await closed.execute('{ orderCount { get(key: "c-01") } }', context_value=context)
    assert answered.errors is None
