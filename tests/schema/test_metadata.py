"""Metadata fields: stores, node, nodes, keyMetadata; store descriptions in introspection."""

from __future__ import annotations

from iqgraph.stores import PartitionState
from tests.schema.conftest import Api, Hosted
from tests.support.apps import PARTITIONS, SHOP_TOPIC, shop_partition


async def test_stores_describe_every_store(shop: Api) -> None:
    data = await shop.data(
        """{ stores { name field kind topic partitions coPartitioned keyType valueType sparkValueType
                    aggregation windowSizeMs windowAdvanceMs falsePositiveRate description } }"""
    )
    stores = {s["name"]: s for s in data["stores"]}
    assert list(stores) == [s.name for s in shop.app.stores]
    assert stores["order_count"] == {
        "name": "order_count",
        "field": "orderCount",
        "kind": "KEY_VALUE",
        "topic": SHOP_TOPIC,
        "partitions": PARTITIONS,
        "coPartitioned": True,
        "keyType": "String",
        "valueType": "Long",
        "sparkValueType": "bigint",
        "aggregation": "count",
        "windowSizeMs": None,
        "windowAdvanceMs": None,
        "falsePositiveRate": None,
        "description": "Number of orders per customer",
    }
    assert stores["latest_order"]["valueType"] == "LatestOrder"
    assert stores["latest_order"]["sparkValueType"].startswith("struct<order_id:string,customer:string")
    assert (stores["spend_per_minute"]["windowSizeMs"], stores["spend_per_minute"]["windowAdvanceMs"]) == (
        120_000,
        60_000,
    )
    bloom = stores["items_sold"]
    assert (bloom["kind"], bloom["coPartitioned"], bloom["falsePositiveRate"]) == ("BLOOM", False, 0.001)


async def test_node_reports_its_partitions_with_state_and_lag(own_shop: Api, own_shop_hosted: Hosted) -> None:
    own_shop_hosted[SHOP_TOPIC][1].db.set_state(PartitionState.RESTORING)
    data = await own_shop.data(
        "{ node { id url state partitions { topic partition role state appliedOffset endOffset lag } } nodes { id } }"
    )
    node = data["node"]
    assert (node["id"], node["url"], node["state"]) == ("node-0", "http://127.0.0.1:8000", "RUNNING")
    assert [(p["partition"], p["role"], p["state"], p["lag"]) for p in node["partitions"]] == [
        (0, "active", "RUNNING", 0),
        (1, "active", "RESTORING", 0),
        (2, "active", "RUNNING", 0),
    ]
    assert all(p["appliedOffset"] == 1 == p["endOffset"] for p in node["partitions"])
    assert data["nodes"] == [{"id": "node-0"}]


async def test_key_metadata_names_the_partition_and_active_node(shop: Api) -> None:
    query = """query($s: String!, $k: String!) {
      keyMetadata(store: $s, key: $k) { store key partition activeNode standbyNodes }
    }"""
    by_name = await shop.data(query, {"s": "order_count", "k": "customer-05"})
    assert by_name["keyMetadata"] == {
        "store": "order_count",
        "key": "customer-05",
        "partition": shop_partition("customer-05"),
        "activeNode": "node-0",
        "standbyNodes": [],
    }
    by_field = await shop.data(query, {"s": "orderCount", "k": "customer-05"})
    assert by_field == by_name
    not_co_partitioned = await shop.data(
        '{ keyMetadata(store: "items_sold", key: "widget") { partition partitions note } }'
    )
    assert not_co_partitioned["keyMetadata"]["partition"] is None
    assert not_co_partitioned["keyMetadata"]["partitions"] == [0, 1, 2]
    assert "keyed by a column" in not_co_partitioned["keyMetadata"]["note"]


async def test_key_metadata_of_a_long_key(lab: Api) -> None:
    data = await lab.data('{ keyMetadata(store: "lab_count", key: "42") { key partition } }')
    assert data["keyMetadata"]["key"] == "42" and 0 <= data["keyMetadata"]["partition"] < PARTITIONS


async def test_introspection_shows_store_descriptions(shop: Api) -> None:
    data = await shop.data(
        """{
          __schema { queryType { description fields { name description } } }
          store: __type(name: "OrderCountStore") { description fields { name description } }
          value: __type(name: "LatestOrder") { description }
          window: __type(name: "OrdersPerMinuteStore") { description }
        }"""
    )
    fields = {f["name"]: f["description"] for f in data["__schema"]["queryType"]["fields"]}
    assert data["__schema"]["queryType"]["description"] == "A shop: orders keyed by customer"
    assert fields["orderCount"] == "Number of orders per customer"
    assert fields["itemsSold"] == "Has this item ever been sold?"
    assert data["store"]["description"] == "Key-value store order_count (count per key): Number of orders per customer"
    assert data["value"]["description"] == "A value of store latest_order: The latest order of each customer"
    assert "windows of 60000 ms" in data["window"]["description"]
    assert {"get", "getMany", "range", "prefix", "all", "approximateCount"} <= {
        f["name"] for f in data["store"]["fields"]
    }
