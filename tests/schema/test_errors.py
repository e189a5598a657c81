"""Every error code, and masking: unexpected failures reach the client as a bare INTERNAL error."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from iqgraph.schema import Limits
from iqgraph.stores import Key, PartitionState
from tests.schema.conftest import Api, Hosted, MakeApi, RecordingQueries
from tests.support.apps import LAB_TOPIC, SHOP_TOPIC, ShopTruth, shop_partition


def codes(errors: list[dict[str, Any]]) -> list[str]:
    """Return the extensions.code of each error."""
    return [e["extensions"]["code"] for e in errors]


async def test_store_not_ready_says_the_state_and_when_to_retry(
    own_shop: Api, own_shop_hosted: Hosted, truth: ShopTruth
) -> None:
    own_shop_hosted[SHOP_TOPIC][shop_partition("customer-01")].db.set_state(PartitionState.RESTORING)
    result = await own_shop.run(
        '{ orderCount { getMany(keys: ["customer-00", "customer-01"]) all { pageInfo { hasNextPage } } } }'
    )
    assert result.data == {
        "orderCount": {"getMany": [truth.counts()["customer-00"], None], "all": {"pageInfo": {"hasNextPage": False}}}
    }  # the rest of the answer stands: a scan pages what it can read and names what it could not
    errors = [e.formatted for e in result.errors or []]
    by_path = {tuple(e.get("path") or ()): e["extensions"] for e in errors}
    assert by_path[("orderCount", "getMany", 1)] == {
        "code": "STORE_NOT_READY",
        "retryAfterMs": 1000,
        "state": "RESTORING",
    }
    partial = by_path[()]
    assert partial["code"] == "PARTIAL_RESULT"
    assert partial["missingPartitions"] == [shop_partition("customer-01")]
    assert "RESTORING" in partial["reasons"][0]


async def test_a_key_of_another_partition_owner_is_store_migrated(make_shop: MakeApi, shop_hosted: Hosted) -> None:
    missing = shop_partition("customer-01")
    api = make_shop(partitions={SHOP_TOPIC: {p: s for p, s in shop_hosted[SHOP_TOPIC].items() if p != missing}})
    result = await api.run('{ orderCount { getMany(keys: ["customer-01"]) } }')
    [error] = [e.formatted for e in result.errors or []]
    assert error["extensions"] == {"code": "STORE_MIGRATED", "retryAfterMs": 1000, "state": "MIGRATED"}


async def test_unknown_store_in_key_metadata(shop: Api) -> None:
    errors = await shop.errors('{ keyMetadata(store: "no_such_store", key: "x") { partition } }')
    assert codes(errors) == ["UNKNOWN_STORE"]
    assert "order_count" in errors[0]["message"]


async def test_invalid_keys(lab: Api) -> None:
    too_big = await lab.errors("{ labCount { get(key: 9223372036854775808) } }")
    assert codes(too_big) == ["INVALID_KEY"]
    not_a_number = await lab.errors('{ keyMetadata(store: "lab_count", key: "abc") { partition } }')
    assert codes(not_a_number) == ["INVALID_KEY"]
    many = await lab.run("{ labCount { getMany(keys: [1, 9223372036854775808]) } }")
    assert many.data == {"labCount": {"getMany": [None, None]}}
    assert [(e.path, e.extensions["code"]) for e in many.errors or []] == [  # type: ignore[index]
        (["labCount", "getMany", 1], "INVALID_KEY")
    ]


async def test_a_key_of_the_wrong_graphql_type_fails_validation(lab: Api, shop: Api) -> None:
    assert codes(await lab.errors('{ labCount { get(key: "abc") } }')) == ["GRAPHQL_VALIDATION_FAILED"]
    assert codes(await shop.errors("{ orderCount { get(key: 5) } }")) == ["GRAPHQL_VALIDATION_FAILED"]
    errors = await lab.errors("query($k: Long!) { labCount { get(key: $k) } }", {"k": "12x"})
    assert codes(errors) == ["GRAPHQL_VALIDATION_FAILED"] and "Long cannot represent" in errors[0]["message"]
    assert (await lab.data("query($k: Long!) { labCount { get(key: $k) } }", {"k": "12"})) == {
        "labCount": {"get": None}
    }


async def test_invalid_cursors(shop: Api) -> None:
    garbage = await shop.errors('{ orderCount { all(after: "not-a-cursor") { edges { cursor } } } }')
    assert codes(garbage) == ["INVALID_CURSOR"]
    page = await shop.data("{ totalSpend { all(first: 1) { pageInfo { endCursor } } } }")
    other_store = page["totalSpend"]["all"]["pageInfo"]["endCursor"]
    query = "query($a: String) { orderCount { all(after: $a) { edges { cursor } } } }"
    assert codes(await shop.errors(query, {"a": other_store})) == ["INVALID_CURSOR"]
    windows = await shop.data("{ ordersPerMinute { fetchAll(first: 1) { pageInfo { endCursor } } } }")
    by_time = windows["ordersPerMinute"]["fetchAll"]["pageInfo"]["endCursor"]
    query = "query($a: String) { ordersPerMinute { fetchRange(after: $a) { edges { cursor } } } }"
    assert codes(await shop.errors(query, {"a": by_time})) == ["INVALID_CURSOR"]


async def test_limits(make_shop: MakeApi) -> None:
    api = make_shop(Limits(max_keys=3, max_page_size=5, default_page_size=2, max_aliases=2))
    keys = await api.errors('{ orderCount { getMany(keys: ["a", "b", "c", "d"]) } }')
    assert keys[0]["extensions"] == {
        "code": "LIMIT_EXCEEDED",
        "limit": 3,
        "requested": 4,
    }
    bloom = await api.errors('{ itemsSold { mightContainMany(keys: ["a", "b", "c", "d"]) } }')
    assert codes(bloom) == ["LIMIT_EXCEEDED"]
    page = await api.errors("{ ordersPerMinute { fetchAll(first: 6) { edges { cursor } } } }")
    assert codes(page) == ["LIMIT_EXCEEDED"]
    aliases = await api.errors('{ a: orderCount { get(key: "x") } b: orderCount { get(key: "y") } c: node { id } }')
    assert codes(aliases) == ["LIMIT_EXCEEDED"] and aliases[0]["extensions"]["requested"] == 3
    zero = await api.errors("{ orderCount { all(first: 0) { edges { cursor } } } }")
    assert codes(zero) == ["INVALID_ARGUMENT"]
    default = await api.data("{ orderCount { all { edges { cursor } } } }")
    assert len(default["orderCount"]["all"]["edges"]) == 2


async def test_syntax_and_unknown_fields(shop: Api) -> None:
    assert codes(await shop.errors("{ orderCount { get(key: ")) == ["GRAPHQL_PARSE_FAILED"]
    assert codes(await shop.errors("{ orderCount { fetch } }")) == ["GRAPHQL_VALIDATION_FAILED"]


class Failing(RecordingQueries):
    """A StoreQueries with a bug: it raises something no one expects."""

    async def get_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        raise RuntimeError("secret: /var/lib/iqgraph password=hunter2")

    def node(self) -> Any:
        raise KeyError("secret-node-detail")


async def test_unexpected_errors_are_masked_for_clients_and_logged(
    make_shop: MakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    api = make_shop(cls=Failing)
    with caplog.at_level(logging.ERROR, logger="iqgraph.schema.errors"):
        result = await api.run(
            '{ orderCount { get(key: "customer-00") } node { id } totalSpend { get(key: "customer-00") } }'
        )
    assert result.data == {"orderCount": {"get": None}, "node": None, "totalSpend": {"get": None}}
    errors = [e.formatted for e in result.errors or []]
    assert codes(errors) == ["INTERNAL", "INTERNAL", "INTERNAL"]
    assert all(e["message"] == "Internal error; the server has logged the details." for e in errors)
    assert "secret" not in json.dumps(errors) and "Traceback" not in json.dumps(errors)
    assert "hunter2" in caplog.text and "Traceback" in caplog.text and "secret-node-detail" in caplog.text


async def test_a_value_format_error_in_a_stored_value_is_reported(lab: Api, lab_hosted: Hosted) -> None:
    stores = lab_hosted[LAB_TOPIC][0]
    start = stores.db.next_offset()
    with stores.db.begin(start, start + 1) as tx:
        tx.put("lab_count", b"\x80" + bytes(7), b"\x09not-our-format")  # key 0, written by a newer version
    stores.db.set_state(PartitionState.RUNNING)
    for stores in lab_hosted[LAB_TOPIC].values():
        stores.db.set_state(PartitionState.RUNNING)
    errors = await lab.errors("{ labCount { all { edges { node { key } } } } }")
    assert codes(errors) == ["VALUE_FORMAT_ERROR"]
