"""The REST path over the production query path: values, 404, coded errors, key metadata — each REST request a
GraphQL query of the node's own public app, so its values and times are GraphQL's."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from iqgraph.schema.naming import camel_case
from iqgraph.schema.types import StoreInfo
from iqgraph.stores import Key, PartitionState, StateDirectory, StoreKind
from iqgraph.streaming.definitions import App
from iqgraph.streaming.static_types import static_value_types
from tests.schema.conftest import Hosted, close_hosted, open_hosted
from tests.support.apps import (
    SHOP_TOPIC,
    SHOP_TYPES,
    ShopTruth,
    begin_batch,
    fill_shop,
    make_orders,
    shop_app,
    shop_partition,
)
from tests.support.filled_examples import EXAMPLES
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


def _example(name: str) -> App:
    return importlib.import_module(f"iqgraph.examples.{name}").app  # type: ignore[no-any-return]


#: the shipped examples whose stores have relations (a relation named like its column replaces the column's field)
RELATED = [name for name in EXAMPLES if any(store.relations for store in _example(name).stores)]


def _stored(data_type: DataType, column: str) -> Any:
    """Return a stored value of data_type with every column set (strings name their column: "customer-1")."""
    if isinstance(data_type, StructType):
        return {c.name: _stored(c.dataType, c.name) for c in data_type.fields}
    if isinstance(data_type, ArrayType):
        return [_stored(data_type.elementType, column)]
    atomic = {StringType: f"{column}-1", LongType: 7, IntegerType: 3, DoubleType: 1.5, BooleanType: True}
    atomic[TimestampType] = "2026-01-01T00:00:00.000Z"
    assert type(data_type) in atomic, f"{column}: give a stored {data_type.simpleString()} here"
    return atomic[type(data_type)]


def _state(aggregation: str, value: Any) -> Any:
    """Return the state a store of aggregation keeps for value (stores.aggregations, streaming.collect)."""
    states = {
        "latest": lambda: value,
        "latest_by_time": lambda: [0, 0, 0, value],  # [event_ms, partition, offset, value]
        "collect": lambda: [[None, 0, offset, row] for offset, row in enumerate(value)],  # [order, p, offset, row]
    }
    assert aggregation in states, f"give the state of a {aggregation} value here"
    return states[aggregation]()


def _unlike(data_type: DataType, rendered: Any, path: str) -> list[str]:
    """Return how rendered, a REST value, differs from data_type's columns (nested ones too): each column it
    lacks, each field it has that is no column."""
    if isinstance(data_type, ArrayType):
        return [m for item in rendered for m in _unlike(data_type.elementType, item, path + "[]")]
    if not isinstance(data_type, StructType):
        return []
    columns = {camel_case(c.name): c.dataType for c in data_type.fields}
    found = [f"{path}.{name} lacking" for name in columns if name not in rendered]
    found += [f"{path}.{name} not stored" for name in rendered if name not in columns]
    for name in columns.keys() & rendered.keys():
        found += _unlike(columns[name], rendered[name], f"{path}.{name}")
    return found


def _key(info: StoreInfo) -> Key:
    return "k-1" if info.key_type == "string" else 1


def _one_value_per_store(app: App, queries: Any, hosted: Hosted) -> dict[str, Any]:
    """Store one value, every column set, in each store whose value has columns (at _key); every partition
    RUNNING. Return the values stored, by store."""
    values: dict[str, Any] = {}
    for info in queries.stores():
        if not isinstance(info.value_type, StructType | ArrayType | MapType):
            continue  # one number or flag: no columns
        assert info.kind == StoreKind.KEY_VALUE.value, f"{info.name}: store its columns here too"
        where = queries.key_metadata(info.name, _key(info))
        stores = hosted[info.topic][where.partition if where.partition is not None else where.partitions[0]]
        values[info.name] = _stored(info.value_type, info.name)
        kept = next(d for d in app.stores if d.name == info.name).state_aggregation.name
        with begin_batch(stores) as tx:
            stores.kv(info.name).put(tx, _key(info), _state(kept, values[info.name]))
    for partitions in hosted.values():
        for stores in partitions.values():
            stores.db.set_state(PartitionState.RUNNING)
    return values


@pytest.mark.parametrize("name", RELATED)
async def test_a_rest_value_holds_every_stored_column_and_a_relations_column_as_its_stored_key(
    name: str, tmp_path: Path
) -> None:
    """Every stored column of a key-value store's value is in its REST value (camelCase, nested ones too), and
    nothing else; a relation named like its column (``Relation("customer", "Customer", column="customer")``)
    keeps the column as the key it stores: ``"customer": "customer-1"``, what GraphQL reads as
    ``customer { key }``."""
    app = _example(name)
    directory = StateDirectory(tmp_path, app.name)
    hosted = {
        t.name: {p: directory.open(t.name, p, app.specs(t.name)) for p in range(t.partitions)} for t in app.topics
    }
    queries = single_node(app, static_value_types(app), hosted)
    try:
        values = _one_value_per_store(app, queries, hosted)
        async with rest_client(queries, app) as client:
            for info in (i for i in queries.stores() if i.name in values):
                got = await client.get(f"/stores/{info.name}/keys/{_key(info)}")
                assert got.status_code == 200, got.text
                rendered = got.json()["value"]
                assert _unlike(info.value_type, rendered, info.name) == [], rendered
                for column in (r.column for r in info.relations if r.column is not None):
                    assert rendered[camel_case(column)] == values[info.name][column], (column, rendered)
    finally:
        close_hosted(hosted)
