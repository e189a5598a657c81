"""The apps the schema tests serve: shop and weblog (the examples) and lab (integer keys, rich values).

Value types are built by hand with pyspark.sql.types (no Spark session); a slow test checks them
against what streaming.value_types derives with Spark.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iqgraph.examples import weblog
from iqgraph.examples.shop import build_app
from iqgraph.stores import PartitionState, PartitionStores
from iqgraph.streaming.definitions import (
    App,
    Topic,
    bloom_store,
    count,
    key_value_store,
    latest,
    tumbling,
    window_store,
)
from iqgraph.streaming.partitioner import partition_for

SHOP_TOPIC, PARTITIONS = "orders", 3
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _nullable(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, data_type, True) for name, data_type in fields])


ORDER_TYPE = _nullable(
    ("order_id", StringType()),
    ("customer", StringType()),
    ("item", StringType()),
    ("quantity", IntegerType()),
    ("amount", DoubleType()),
    ("ts", TimestampType()),
)
SHOP_TYPES: dict[str, DataType] = {
    "order_count": LongType(),
    "total_spend": DoubleType(),
    "total_quantity": LongType(),
    "average_order": DoubleType(),
    "largest_order": DoubleType(),
    "smallest_order": DoubleType(),
    "latest_order": ORDER_TYPE,
    "orders_per_minute": LongType(),
    "spend_per_minute": DoubleType(),
    "items_sold": BooleanType(),
}
WEBLOG_TYPES: dict[str, DataType] = {
    "access_count": LongType(),
    "accesses_per_minute": LongType(),
    "hosts_seen": BooleanType(),
}

#: A value type with every mapping the schema has: nested struct, arrays, map, decimal, date, binary…
READING_TYPE = StructType(
    [
        StructField("sensor_id", StringType(), False, {"comment": "Which sensor read it"}),
        StructField("value", DecimalType(12, 3), True),
        StructField("taken_at", TimestampType(), True),
        StructField("local_time", TimestampNTZType(), True),
        StructField("day", DateType(), True),
        StructField("raw", BinaryType(), True),
        StructField("samples", ArrayType(LongType(), containsNull=False), True),
        StructField("tags", MapType(StringType(), IntegerType()), True),
        StructField("place", _nullable(("lat", DoubleType()), ("lon", DoubleType())), True),
        StructField("history", ArrayType(_nullable(("at", TimestampType()), ("ok", BooleanType()))), True),
        StructField("span", DayTimeIntervalType(), True),
        StructField("URL_path", StringType(), True),
    ]
)
LAB_TYPES: dict[str, DataType] = {
    "lab_count": LongType(),
    "reading": READING_TYPE,
    "lab_per_second": LongType(),
    "lab_seen": BooleanType(),
}
LAB_TOPIC = "readings"


def shop_app() -> App:
    """Return the shop example on PARTITIONS partitions."""
    return build_app(SHOP_TOPIC, PARTITIONS)


def weblog_app() -> App:
    """Return the weblog example."""
    return weblog.app


def lab_app() -> App:
    """Return an app whose topic has long keys (Long keys in the schema)."""
    topic = Topic(LAB_TOPIC, schema="sensor_id STRING", key_format="long", event_time=None, partitions=PARTITIONS)
    return App(
        name="lab",
        topics=[topic],
        stores=[
            key_value_store("lab_count", LAB_TOPIC, count(), description="Readings per sensor"),
            key_value_store("reading", LAB_TOPIC, latest(), description="The latest reading per sensor"),
            window_store("lab_per_second", LAB_TOPIC, count(), tumbling(seconds=1), description="Per second"),
            bloom_store("lab_seen", LAB_TOPIC, description="Sensors seen"),
        ],
    )


def iso(ms: int) -> str:
    """Return ms as Spark's to_json writes a timestamp."""
    stamp = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def make_orders(n: int = 60) -> list[dict[str, Any]]:
    """Return n orders of 12 customers, 7 s apart, in offset order."""
    items = ["widget", "gadget", "gizmo", "sprocket"]
    orders = []
    for i in range(n):
        quantity = 1 + i % 4
        orders.append(
            {
                "order_id": f"o-{i}",
                "customer": f"customer-{(i * 5) % 12:02d}",
                "item": items[i % 3],
                "quantity": quantity,
                "amount": round(quantity * 2.5 + i * 0.25, 2),
                "ts": iso(START_MS + i * 7_000),
                "ms": START_MS + i * 7_000,
            }
        )
    return orders


def shop_partition(customer: str) -> int:
    """Return the partition of a customer key."""
    return partition_for(customer, PARTITIONS, "string", "murmur2")


def _begin(stores: PartitionStores) -> Any:
    start = stores.db.next_offset()
    tx = stores.db.begin(start, start + 1)
    assert tx is not None
    return tx


def fill_shop(partitions: Mapping[int, PartitionStores], orders: Iterable[dict[str, Any]]) -> None:
    """Apply orders to the shop stores (as the sink would: per partition, in offset order); RUNNING."""
    by_partition: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for order in orders:
        by_partition[shop_partition(order["customer"])].append(order)
    for p, stores in partitions.items():
        rows = by_partition.get(p, [])
        with _begin(stores) as tx:
            for name, partial in (
                ("order_count", lambda o: 1),
                ("total_spend", lambda o: o["amount"]),
                ("total_quantity", lambda o: o["quantity"]),
                ("average_order", lambda o: [o["amount"], 1]),
                ("largest_order", lambda o: o["amount"]),
                ("smallest_order", lambda o: o["amount"]),
                ("latest_order", lambda o: {k: v for k, v in o.items() if k != "ms"}),
            ):
                stores.kv(name).merge(tx, [(o["customer"], partial(o)) for o in rows])
            stores.window("orders_per_minute").aggregate(tx, [(o["customer"], o["ms"], 1) for o in rows])
            stores.window("spend_per_minute").aggregate(tx, [(o["customer"], o["ms"], o["amount"]) for o in rows])
            stores.bloom("items_sold").add(tx, [o["item"] for o in rows])
        stores.db.set_state(PartitionState.RUNNING)


@dataclass(frozen=True)
class ShopTruth:
    """What the shop stores must answer, computed from the orders in plain Python."""

    orders: list[dict[str, Any]]

    def per_customer(self, value: Any) -> dict[str, list[Any]]:
        """Return value(order) of each customer's orders, in order."""
        found: dict[str, list[Any]] = defaultdict(list)
        for order in self.orders:
            found[order["customer"]].append(value(order))
        return dict(found)

    def counts(self) -> dict[str, int]:
        """Return the order count per customer."""
        return {c: len(v) for c, v in self.per_customer(lambda o: 1).items()}

    def spend(self) -> dict[str, float]:
        """Return the total spend per customer."""
        return {c: sum(v) for c, v in self.per_customer(lambda o: o["amount"]).items()}

    def latest(self) -> dict[str, dict[str, Any]]:
        """Return the latest order per customer."""
        return {c: v[-1] for c, v in self.per_customer(lambda o: o).items()}

    def minute_counts(self) -> dict[tuple[str, int], int]:
        """Return the order count per (customer, minute start)."""
        found: dict[tuple[str, int], int] = defaultdict(int)
        for order in self.orders:
            found[(order["customer"], order["ms"] - order["ms"] % 60_000)] += 1
        return dict(found)
