"""The REST path over the production query path: values, 404, coded errors, key metadata — each REST request a
GraphQL query of the node's own public app, so its values and times are GraphQL's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from iqgraph.stores import PartitionState
from tests.schema.conftest import Hosted, close_hosted, open_hosted
from tests.support.apps import SHOP_TOPIC, SHOP_TYPES, ShopTruth, fill_shop, make_orders, shop_app, shop_partition
from tests.support.queries import rest_client, single_node


@pytest.fixture
def hosted(tmp_path: Path) -> Iterator[Hosted]:
    found = open_hosted(tmp_path, shop_app(), SHOP_TOPIC)
    fill_shop(found[SHOP_TOPIC], make_orders())
    yield found
    close_hosted(found)


@pytest.fixture
def client(hosted: Hosted) -> httpx.AsyncClient:
    return rest_client(single_node(shop_app(), SHOP_TYPES, hosted))


TRUTH = ShopTruth(make_orders())


async def test_a_key_answers_its_value_and_a_missing_key_is_404(client: httpx.AsyncClient) -> None:
    customer, count = sorted(TRUTH.counts().items())[0]
    found = await client.get(f"/stores/order_count/keys/{customer}")
    assert (found.status_code, found.json()) == (200, {"store": "order_count", "key": customer, "value": count})
    missing = await client.get("/stores/order_count/keys/nobody")
    assert missing.status_code == 404
    assert missing.json()["errors"][0]["extensions"]["code"] == "NOT_FOUND"


async def test_window_and_bloom_stores(client: httpx.AsyncClient) -> None:
    customer = sorted(TRUTH.counts())[0]
    windows = (await client.get(f"/stores/orders_per_minute/keys/{customer}")).json()["windows"]
    assert sum(w["value"] for w in windows) == TRUTH.counts()[customer]
    assert all(w["start"].endswith("Z") and w["end"].endswith("Z") for w in windows)  # ISO 8601, as GraphQL's
    first = windows[0]["start"]
    iso = (await client.get(f"/stores/orders_per_minute/keys/{customer}?from={first}&to={first}")).json()["windows"]
    ms = int(datetime.fromisoformat(first).timestamp() * 1000)
    as_ms = (await client.get(f"/stores/orders_per_minute/keys/{customer}?from={ms}&to={ms}")).json()["windows"]
    assert iso == as_ms == windows[:1]  # from/to: ISO 8601 or epoch ms, both
    item = TRUTH.orders[0]["item"]
    assert (await client.get(f"/stores/items_sold/keys/{item}")).json()["mightContain"] is True
    assert (await client.get("/stores/items_sold/keys/no-such-item")).json()["mightContain"] is False


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/stores/nope/keys/a", 404, "UNKNOWN_STORE"),
        ("/stores/order_count/keys/a?maxLag=-3", 400, "INVALID_ARGUMENT"),
        ("/stores/order_count/keys/a?maxLag=soon", 400, "INVALID_ARGUMENT"),
        ("/stores/orders_per_minute/keys/a?from=yesterday", 400, "GRAPHQL_VALIDATION_FAILED"),  # GraphQL's DateTime
    ],
)
async def test_bad_requests_get_a_coded_error(client: httpx.AsyncClient, path: str, status: int, code: str) -> None:
    response = await client.get(path)
    assert response.status_code == status
    assert response.json()["errors"][0]["extensions"]["code"] == code


async def test_a_partition_not_ready_is_503_with_retry_after(client: httpx.AsyncClient, hosted: Hosted) -> None:
    customer = sorted(TRUTH.counts())[0]
    hosted[SHOP_TOPIC][shop_partition(customer)].db.set_state(PartitionState.RESTORING)
    response = await client.get(f"/stores/order_count/keys/{customer}")
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["errors"][0]["extensions"]["code"] == "STORE_NOT_READY"


async def test_positions_when_asked(client: httpx.AsyncClient, hosted: Hosted) -> None:
    customer = sorted(TRUTH.counts())[0]
    partition = shop_partition(customer)
    body: dict[str, Any] = (await client.get(f"/stores/order_count/keys/{customer}?positions=true")).json()
    applied = hosted[SHOP_TOPIC][partition].db.next_offset()
    assert body["extensions"] == {"positions": {SHOP_TOPIC: {str(partition): applied}}}


async def test_key_metadata_names_partition_and_urls(client: httpx.AsyncClient) -> None:
    customer = sorted(TRUTH.counts())[0]
    body = (await client.get(f"/stores/order_count/keys/{customer}/metadata")).json()
    assert body["partition"] == shop_partition(customer) and body["partitions"] == [shop_partition(customer)]
    assert (body["activeNode"], body["activeUrl"], body["standbyNodes"]) == ("node-0", "http://127.0.0.1:8000", [])
    column = (await client.get("/stores/items_sold/keys/widget/metadata")).json()
    assert column["partition"] is None and "keyed by a column" in column["note"]


async def test_max_lag_reaches_the_query_as_given_zero_included(
    hosted: Hosted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """?maxLag=0 (only copies fully caught up may answer) is the GraphQL argument 0, not "no bound"."""
    from iqgraph.schema.asgi import GraphQLApp

    seen: list[Any] = []
    execute = GraphQLApp.execute_document

    async def recording(self: GraphQLApp, request: Any, query: str, variables: dict[str, Any], *more: Any) -> Any:
        seen.append(variables.get("maxLag"))
        return await execute(self, request, query, variables, *more)

    monkeypatch.setattr(GraphQLApp, "execute_document", recording)
    customer = sorted(TRUTH.counts())[0]
    async with rest_client(single_node(shop_app(), SHOP_TYPES, hosted)) as client:
        for given in ("0", "5", ""):
            assert (await client.get(f"/stores/order_count/keys/{customer}?maxLag={given}")).status_code == 200
    assert seen == [0, 5, None]
