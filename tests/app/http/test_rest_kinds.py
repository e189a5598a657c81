"""The REST key route reads what its store's GraphQL type answers (``get``, ``fetch`` or ``mightContain``), and a
stored value that is falsy (0, an empty list) is a value, never a 404."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from iqgraph.stores import PartitionState
from tests.schema.conftest import Hosted, close_hosted, open_hosted
from tests.support.apps import SHOP_TOPIC, SHOP_TYPES, begin_batch, fill_shop, make_orders, shop_app, shop_partition
from tests.support.queries import rest_client, single_node

FREE = "customer-free"  # a customer whose only order cost nothing


@pytest.fixture
def hosted(tmp_path: Path) -> Iterator[Hosted]:
    found = open_hosted(tmp_path, shop_app(), SHOP_TOPIC)
    fill_shop(found[SHOP_TOPIC], make_orders())
    stores = found[SHOP_TOPIC][shop_partition(FREE)]
    with begin_batch(stores) as tx:
        stores.kv("smallest_order").put(tx, FREE, 0.0)
    stores.db.set_state(PartitionState.RUNNING)
    yield found
    close_hosted(found)


@pytest.fixture
def client(hosted: Hosted) -> httpx.AsyncClient:
    return rest_client(single_node(shop_app(), SHOP_TYPES, hosted))


async def test_a_stored_zero_is_a_value_not_a_404(client: httpx.AsyncClient) -> None:
    found = await client.get(f"/stores/smallest_order/keys/{FREE}")
    assert (found.status_code, found.json()) == (200, {"store": "smallest_order", "key": FREE, "value": 0.0})
    assert (await client.get("/stores/smallest_order/keys/nobody")).status_code == 404


async def test_each_kind_answers_by_the_field_its_type_has(client: httpx.AsyncClient) -> None:
    window = (await client.get(f"/stores/orders_per_minute/keys/{FREE}")).json()
    assert window["errors"][0]["extensions"]["code"] == "NOT_FOUND"  # no window: 404, as a missing key
    bloom = await client.get("/stores/items_sold/keys/no-such-item")
    assert (bloom.status_code, bloom.json()) == (
        200,
        {"store": "items_sold", "key": "no-such-item", "mightContain": False},
    )
    assert set((await client.get("/stores/items_sold/count")).json()) == {"store", "approximateCount"}
    assert set((await client.get("/stores/order_count/count")).json()) == {"store", "count"}
    top = (await client.get("/stores/order_count/top")).json()["errors"][0]
    assert top["extensions"]["code"] == "INVALID_ARGUMENT" and "is not a ranking" in top["message"]
