"""Key-value store fields: get, getMany, range, prefix, all (Relay connections), approximateCount."""

from __future__ import annotations

from typing import Any

import pytest

from iqgraph.stores import PartitionState
from tests.schema.conftest import Api, Hosted
from tests.support.apps import SHOP_TOPIC, ShopTruth, fill_shop, shop_partition

ENTRIES = "edges { cursor node { key value } } pageInfo { hasNextPage hasPreviousPage startCursor endCursor }"


async def test_get_returns_each_aggregate_and_null_for_a_missing_key(shop: Api, truth: ShopTruth) -> None:
    data = await shop.data(
        """{
          orderCount { a: get(key: "customer-00") missing: get(key: "nobody") }
          totalSpend { get(key: "customer-00") }
          totalQuantity { get(key: "customer-00") }
          averageOrder { get(key: "customer-00") }
          largestOrder { get(key: "customer-00") }
          smallestOrder { get(key: "customer-00") }
        }"""
    )
    amounts = truth.per_customer(lambda o: o["amount"])["customer-00"]
    quantities = truth.per_customer(lambda o: o["quantity"])["customer-00"]
    assert data["orderCount"] == {"a": truth.counts()["customer-00"], "missing": None}
    assert data["totalSpend"]["get"] == pytest.approx(sum(amounts))
    assert data["totalQuantity"]["get"] == sum(quantities)
    assert data["averageOrder"]["get"] == pytest.approx(sum(amounts) / len(amounts))
    assert data["largestOrder"]["get"] == max(amounts)
    assert data["smallestOrder"]["get"] == min(amounts)


async def test_get_of_a_struct_value_is_typed(shop: Api, truth: ShopTruth) -> None:
    data = await shop.data('{ latestOrder { get(key: "customer-03") { orderId customer item quantity amount ts } } }')
    latest = truth.latest()["customer-03"]
    assert data["latestOrder"]["get"] == {
        "orderId": latest["order_id"],
        "customer": "customer-03",
        "item": latest["item"],
        "quantity": latest["quantity"],
        "amount": latest["amount"],
        "ts": latest["ts"],
    }


async def test_get_many_answers_in_key_order_with_null_for_missing(shop: Api, truth: ShopTruth) -> None:
    keys = ["customer-07", "nobody", "customer-01", "customer-07"]
    data = await shop.data("query($k: [String!]!) { orderCount { getMany(keys: $k) } }", {"k": keys})
    counts = truth.counts()
    assert data["orderCount"]["getMany"] == [counts["customer-07"], None, counts["customer-01"], counts["customer-07"]]


async def page_through(api: Api, field: str, first: int, args: str = "") -> list[dict[str, Any]]:
    """Return every node of a connection, following endCursor with pages of first."""
    nodes: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(100):
        selection = f"{field}({args} first: {first}, after: $after) {{ {ENTRIES} }}"
        query = f"query($after: String) {{ orderCount {{ {selection} }} }}"
        page = (await api.data(query, {"after": after}))["orderCount"][field]
        nodes += [edge["node"] for edge in page["edges"]]
        assert len(page["edges"]) <= first
        assert page["pageInfo"]["hasPreviousPage"] is (after is not None)
        if not page["pageInfo"]["hasNextPage"]:
            return nodes
        after = page["pageInfo"]["endCursor"]
    raise AssertionError("pagination does not end")


async def test_all_pages_through_every_partition_in_key_order(shop: Api, truth: ShopTruth) -> None:
    nodes = await page_through(shop, "all", 5)
    assert [(n["key"], n["value"]) for n in nodes] == sorted(truth.counts().items())


async def test_range_is_inclusive_and_prefix_filters(shop: Api, truth: ShopTruth) -> None:
    ranged = await page_through(shop, "range", 2, 'from: "customer-03", to: "customer-08",')
    assert [n["key"] for n in ranged] == [f"customer-{i:02d}" for i in range(3, 9)]
    prefixed = await page_through(shop, "prefix", 3, 'prefix: "customer-1",')
    assert [n["key"] for n in prefixed] == ["customer-10", "customer-11"]
    open_ended = await page_through(shop, "range", 50, 'from: "customer-10",')
    assert [n["key"] for n in open_ended] == ["customer-10", "customer-11"]


async def test_every_edge_cursor_resumes_right_after_its_edge(shop: Api, truth: ShopTruth) -> None:
    everything = sorted(truth.counts())
    page = (await shop.data(f"{{ orderCount {{ all(first: 6) {{ {ENTRIES} }} }} }}"))["orderCount"]["all"]
    for i, edge in enumerate(page["edges"]):
        query = "query($a: String) { orderCount { all(first: 3, after: $a) { edges { node { key } } } } }"
        resumed = (await shop.data(query, {"a": edge["cursor"]}))["orderCount"]["all"]["edges"]
        assert [e["node"]["key"] for e in resumed] == everything[i + 1 : i + 4]
    assert page["pageInfo"]["startCursor"] == page["edges"][0]["cursor"]
    assert page["pageInfo"]["endCursor"] == page["edges"][-1]["cursor"]


async def test_pages_neither_skip_nor_repeat_when_keys_arrive_between_them(
    own_shop: Api, own_shop_hosted: Hosted, orders: list[dict[str, Any]]
) -> None:
    shop, shop_hosted = own_shop, own_shop_hosted
    query = "query($a: String) { orderCount { all(first: 4, after: $a) { edges { cursor node { key } } } } }"
    first = (await shop.data(query, {"a": None}))["orderCount"]["all"]["edges"]
    middle = first[1]["cursor"]  # a cursor inside a page, not the page's end
    assert [e["node"]["key"] for e in first] == ["customer-00", "customer-01", "customer-02", "customer-03"]
    newcomers = [{**orders[0], "customer": c} for c in ("customer-005", "customer-015", "a-first")]
    fill_shop(shop_hosted[SHOP_TOPIC], newcomers)
    resumed = (await shop.data(query, {"a": middle}))["orderCount"]["all"]["edges"]
    assert [e["node"]["key"] for e in resumed] == ["customer-015", "customer-02", "customer-03", "customer-04"]


async def test_approximate_count_estimates_the_keys(shop: Api, truth: ShopTruth) -> None:
    data = await shop.data("{ orderCount { approximateCount } }")
    assert data["orderCount"]["approximateCount"] == len(truth.counts())


async def test_a_value_that_does_not_fit_its_type_fails_only_its_key(
    own_shop: Api, own_shop_hosted: Hosted, truth: ShopTruth
) -> None:
    shop, stores = own_shop, own_shop_hosted[SHOP_TOPIC][shop_partition("customer-00")]
    start = stores.db.next_offset()
    with stores.db.begin(start, start + 1) as tx:
        stores.kv("latest_order").put(tx, "customer-00", {"amount": "a lot", "ts": "yesterday"})
    result = await shop.run('{ latestOrder { getMany(keys: ["customer-00", "customer-01"]) { amount } } }')
    assert result.data == {"latestOrder": {"getMany": [None, {"amount": truth.latest()["customer-01"]["amount"]}]}}
    assert result.errors is not None
    [error] = [e.formatted for e in result.errors]
    assert error["extensions"]["code"] == "VALUE_FORMAT_ERROR"
    assert error["path"] == ["latestOrder", "getMany", 0]


async def test_a_restoring_partition_fails_its_keys_with_store_not_ready(
    own_shop: Api, own_shop_hosted: Hosted
) -> None:
    own_shop_hosted[SHOP_TOPIC][shop_partition("customer-00")].db.set_state(PartitionState.RESTORING)
    errors = await own_shop.errors('{ orderCount { get(key: "customer-00") } }')
    assert errors[0]["extensions"]["code"] == "STORE_NOT_READY"
    assert errors[0]["extensions"]["state"] == "RESTORING"
    assert errors[0]["extensions"]["retryAfterMs"] > 0
