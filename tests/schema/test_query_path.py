"""The production query path as GraphQL sees it: exact counts, maxLag, positions, key and cursor errors."""

from __future__ import annotations

from typing import Any

from iqgraph.stores import PartitionState
from tests.schema.conftest import Api, Hosted
from tests.support.apps import SHOP_TOPIC, ShopTruth, fill_shop, shop_partition


async def test_count_is_exact_after_updates_where_the_estimate_grows(
    own_shop: Api, own_shop_hosted: Hosted, orders: list[dict[str, Any]], truth: ShopTruth
) -> None:
    for _ in range(30):  # the same customers again and again: no new key
        fill_shop(own_shop_hosted[SHOP_TOPIC], orders)
    data = await own_shop.data("{ orderCount { count approximateCount } ordersPerMinute { count } }")
    assert data["orderCount"]["count"] == len(truth.counts())
    windows = {(o["customer"], o["ms"] // 60_000) for o in orders}
    assert data["ordersPerMinute"]["count"] == len(windows)


async def test_delete_lowers_the_exact_count(own_shop: Api, own_shop_hosted: Hosted, truth: ShopTruth) -> None:
    customer = sorted(truth.counts())[0]
    stores = own_shop_hosted[SHOP_TOPIC][shop_partition(customer)]
    tx = stores.db.begin(stores.db.next_offset(), stores.db.next_offset() + 1)
    assert tx is not None
    with tx:
        stores.kv("order_count").delete(tx, customer)
    data = await own_shop.data("{ orderCount { count } }")
    assert data["orderCount"]["count"] == len(truth.counts()) - 1


async def test_positions_are_the_applied_offsets_of_the_partitions_read(
    own_shop: Api, own_shop_hosted: Hosted, truth: ShopTruth
) -> None:
    customer = sorted(truth.counts())[0]
    partition = shop_partition(customer)
    result = await own_shop.run(f'{{ orderCount {{ get(key: "{customer}") }} }}', None, {"positions": True})
    applied = own_shop_hosted[SHOP_TOPIC][partition].db.next_offset()
    assert result.extensions == {"positions": {SHOP_TOPIC: {str(partition): applied}}}
    plain = await own_shop.run(f'{{ orderCount {{ get(key: "{customer}") }} }}')
    assert not plain.extensions  # only when asked
    scan = await own_shop.run(
        "{ orderCount { all(first: 1) { pageInfo { hasNextPage } } } }", None, {"positions": True}
    )
    assert scan.extensions is not None
    assert scan.extensions["positions"][SHOP_TOPIC] == {
        str(p): s.db.next_offset() for p, s in own_shop_hosted[SHOP_TOPIC].items()
    }


async def test_max_lag_must_be_a_number_of_records(shop: Api) -> None:
    errors = await shop.errors('{ orderCount(maxLag: -1) { get(key: "customer-00") } }')
    assert errors[0]["extensions"]["code"] == "INVALID_ARGUMENT"
    result = await shop.run('{ orderCount { get(key: "customer-00") } }', None, {"maxLag": "soon"})
    assert result.errors and result.errors[0].extensions == {
        "code": "INVALID_ARGUMENT",
        "argument": "extensions.maxLag",
    }
    fine = await shop.run('{ orderCount(maxLag: 0) { get(key: "customer-00") } }', None, {"maxLag": 5})
    assert fine.errors is None


async def test_an_empty_key_is_invalid_not_null(shop: Api) -> None:
    errors = await shop.errors('{ orderCount { get(key: "") } }')
    assert [e["extensions"]["code"] for e in errors] == ["INVALID_KEY"]


async def test_a_cursor_from_another_field_is_one_invalid_cursor_error(shop: Api) -> None:
    page = await shop.data("{ orderCount { all(first: 2) { pageInfo { endCursor } } } }")
    cursor = page["orderCount"]["all"]["pageInfo"]["endCursor"]
    errors = await shop.errors(
        "query($c: String) { totalSpend { all(first: 2, after: $c) { pageInfo { hasNextPage } } } }", {"c": cursor}
    )
    assert [e["extensions"]["code"] for e in errors] == ["INVALID_CURSOR"]
    windows = await shop.data("{ ordersPerMinute { fetchAll(first: 2) { pageInfo { endCursor } } } }")
    window_cursor = windows["ordersPerMinute"]["fetchAll"]["pageInfo"]["endCursor"]
    errors = await shop.errors(
        "query($c: String) { orderCount { all(first: 2, after: $c) { pageInfo { hasNextPage } } } }",
        {"c": window_cursor},
    )
    assert [e["extensions"]["code"] for e in errors] == ["INVALID_CURSOR"]


async def test_a_restoring_partition_fails_not_ready_after_the_deadline_never_null(
    own_shop: Api, own_shop_hosted: Hosted, truth: ShopTruth
) -> None:
    customer = sorted(truth.counts())[0]
    own_shop_hosted[SHOP_TOPIC][shop_partition(customer)].db.set_state(PartitionState.RESTORING)
    errors = await own_shop.errors(f'{{ orderCount {{ get(key: "{customer}") count }} }}')
    assert {e["extensions"]["code"] for e in errors} == {"STORE_NOT_READY"}
