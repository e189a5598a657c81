"""SDL snapshots of the example apps and of the market (entities, relations); two apps give two different schemas.

Regenerate the snapshots after an intended change with ``IQGRAPH_UPDATE_SNAPSHOTS=1 pytest tests/schema``
and review the diff.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import graphql
import pytest
from pyspark.sql.types import DataType

from iqgraph.app.catalog import entity_infos, store_info
from iqgraph.schema import Limits, build_schema
from iqgraph.streaming.definitions import App
from tests.support.apps import MARKET_TYPES, SHOP_TYPES, WEBLOG_TYPES, market_app, shop_app, weblog_app

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("IQGRAPH_UPDATE_SNAPSHOTS") == "1"
APPS = {"shop": (shop_app, SHOP_TYPES), "weblog": (weblog_app, WEBLOG_TYPES), "market": (market_app, MARKET_TYPES)}

SHOP_QUERY = """{
  orderCount { get(key: "customer-0001") all(first: 2) { edges { cursor node { key value } } pageInfo { endCursor } } }
  latestOrder { get(key: "customer-0001") { orderId amount ts } }
  ordersPerMinute { fetch(key: "customer-0001", from: "2026-01-01T00:00:00Z") { start end value } }
  itemsSold { mightContain(key: "widget") falsePositiveRate }
  keyMetadata(store: "order_count", key: "customer-0001") { partition activeNode }
}"""
WEBLOG_QUERY = """{
  accessCount { getMany(keys: ["10.0.0.1", "10.0.0.2"]) }
  accessesPerMinute { fetchAll(first: 10) { edges { node { key start value } } } }
  hostsSeen { mightContainMany(keys: ["10.0.0.1"]) }
}"""


def sdl_of(app: App, types: Mapping[str, DataType]) -> str:
    """Return the SDL of app's schema, as `iqgraph schema` prints it."""
    stores = [store_info(app, s, types[s.name]) for s in app.stores]
    entities = entity_infos(app)
    return build_schema(stores, Limits(), entities=entities, description=app.description).as_str() + "\n"


@pytest.mark.parametrize("name", sorted(APPS))
def test_sdl_matches_the_snapshot(name: str) -> None:
    make, types = APPS[name]
    sdl = sdl_of(make(), types)
    path = SNAPSHOTS / f"{name}.graphql"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(sdl)
    assert path.exists(), f"no snapshot {path}: run with IQGRAPH_UPDATE_SNAPSHOTS=1"
    assert sdl == path.read_text(), f"{name} SDL changed: review, then run with IQGRAPH_UPDATE_SNAPSHOTS=1"


def test_two_apps_give_two_different_valid_schemas() -> None:
    shop = graphql.build_schema(sdl_of(shop_app(), SHOP_TYPES))
    weblog = graphql.build_schema(sdl_of(weblog_app(), WEBLOG_TYPES))
    assert graphql.validate(shop, graphql.parse(SHOP_QUERY)) == []
    assert graphql.validate(weblog, graphql.parse(WEBLOG_QUERY)) == []
    assert graphql.validate(weblog, graphql.parse(SHOP_QUERY)) != []
    assert graphql.validate(shop, graphql.parse(WEBLOG_QUERY)) != []
    shop_fields = set(shop.query_type.fields)  # type: ignore[union-attr]
    weblog_fields = set(weblog.query_type.fields)  # type: ignore[union-attr]
    metadata = {"stores", "node", "nodes", "keyMetadata", "_lookup", "_scan", "_count"}
    assert shop_fields - metadata == {
        "orderCount",
        "totalSpend",
        "totalQuantity",
        "averageOrder",
        "largestOrder",
        "smallestOrder",
        "latestOrder",
        "ordersPerMinute",
        "spendPerMinute",
        "itemOrdersPerMinute",
        "topCustomers",
        "itemsSold",
    }
    assert weblog_fields - metadata == {"accessCount", "accessesPerMinute", "hostsSeen"}


@pytest.mark.slow
def test_the_hand_built_value_types_are_those_spark_derives(spark: SparkSession) -> None:
    from iqgraph.streaming.value_types import value_types

    for make, types in APPS.values():
        assert value_types(make(), spark) == types
