"""The apps the schema tests serve: shop and weblog (the examples), lab (integer keys, rich values) and market
(entities over two table topics and an orders topic, with relations).

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
from iqgraph.examples.shop import ORDER_SCHEMA, build_app
from iqgraph.stores import PartitionState, PartitionStores
from iqgraph.streaming.definitions import (
    App,
    Entity,
    Relation,
    Topic,
    bloom_store,
    count,
    key_value_store,
    latest,
    sum_,
    table_store,
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
    "item_orders_per_minute": LongType(),
    "top_customers": DoubleType(),
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
#: A reading with a value of every type the lab's reading store holds.
READING = {
    "sensor_id": "s-7",
    "value": 12.345,
    "taken_at": "2026-01-01T00:00:00.005Z",
    "local_time": "2026-01-01T10:30:00.000",
    "day": "2026-01-01",
    "raw": "hello",
    "samples": [1, 2, 3],
    "tags": {"a": 1, "b": 2},
    "place": {"lat": 1.5, "lon": -2.25},
    "history": [{"at": "2026-01-01T00:00:01+01:00", "ok": True}, None],
    "span": "INTERVAL '1' DAY",
    "URL_path": "/x",
}


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


def fill_lab(hosted: Mapping[str, Mapping[int, PartitionStores]], writes: dict[int, Any]) -> None:
    """Apply one batch per partition to the lab's stores: each (key, reading) of writes, routed by key; RUNNING."""
    by_partition: dict[int, list[tuple[int, Any]]] = {}
    for key, value in writes.items():
        by_partition.setdefault(partition_for(key, PARTITIONS, "long", "murmur2"), []).append((key, value))
    for p, items in by_partition.items():
        stores = hosted[LAB_TOPIC][p]
        start = stores.db.next_offset()
        with stores.db.begin(start, start + 1) as tx:
            for key, value in items:
                stores.kv("reading").put(tx, key, value)
                stores.kv("lab_count").merge(tx, [(key, 1)])
                stores.window("lab_per_second").aggregate(tx, [(key, START_MS + 1_500, 1)])
                stores.bloom("lab_seen").add(tx, [key])
        stores.db.set_state(PartitionState.RUNNING)


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


def begin_batch(stores: PartitionStores) -> Any:
    """Return a transaction of the one offset after what the partition has applied."""
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
        with begin_batch(stores) as tx:
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


# -- market: entities and relations ------------------------------------------------------------------------

MARKET_TOPICS = ("orders", "customers", "products")
CUSTOMER_TYPE = _nullable(("name", StringType()), ("city", StringType()), ("favorite", StringType()))
PRODUCT_TYPE = _nullable(("name", StringType()), ("price", DoubleType()))
MARKET_TYPES: dict[str, DataType] = {
    "customers": CUSTOMER_TYPE,
    "products": PRODUCT_TYPE,
    "order_count": LongType(),
    "total_spend": DoubleType(),
    "latest_order": ORDER_TYPE,
    "orders_per_minute": LongType(),
    "ordered": BooleanType(),
}
#: The customers table: most customers who ordered, one who did not (customer-20); customer-10 and -11 lack a row.
#: Their favorite product: a product with a row, one without (gizmo), or none.
MARKET_CUSTOMERS: dict[str, dict[str, Any]] = {
    **{
        f"customer-{i:02d}": {
            "name": f"Customer {i}",
            "city": ["Oslo", "Lyon", "Porto"][i % 3],
            "favorite": ["widget", "gadget", "gizmo", None][i % 4],
        }
        for i in range(10)
    },
    "customer-20": {"name": "Newcomer", "city": None, "favorite": "sprocket"},
}
#: The products table: gizmo is sold but has no row.
MARKET_PRODUCTS: dict[str, dict[str, Any]] = {
    "widget": {"name": "Widget", "price": 2.5},
    "gadget": {"name": "Gadget", "price": 4.0},
    "sprocket": {"name": "Sprocket", "price": 7.25},
}
CUSTOMER_STORES = ("customers", "order_count", "total_spend", "latest_order", "orders_per_minute", "ordered")


def market_app() -> App:
    """Return an app with entities Customer (a table and the order stores) and Product (a table), and relations."""
    return App(
        name="market",
        description="A market: customers, products and their orders",
        topics=[
            Topic("orders", schema=ORDER_SCHEMA, event_time="ts", partitions=PARTITIONS),
            Topic("customers", schema="name STRING, city STRING, favorite STRING", table=True, partitions=PARTITIONS),
            Topic("products", schema="name STRING, price DOUBLE", table=True, partitions=PARTITIONS),
        ],
        stores=[
            table_store(
                "customers",
                "customers",
                description="Who the customers are",
                relations=[Relation("favorite", "Product", column="favorite")],
            ),
            table_store("products", "products", description="What is for sale"),
            key_value_store(
                "order_count", "orders", count(), relations=[Relation("customer", "Customer")], description="Orders"
            ),
            key_value_store("total_spend", "orders", sum_("amount"), description="Total spend"),
            key_value_store(
                "latest_order",
                "orders",
                latest(),
                relations=[Relation("customer", "Customer", column="customer"), Relation("product", "Product", "item")],
                description="The latest order",
            ),
            window_store(
                "orders_per_minute",
                "orders",
                count(),
                tumbling(minutes=1),
                relations=[Relation("customer", "Customer")],
                description="Orders per minute",
            ),
            bloom_store("ordered", "orders", description="Customers who ordered"),
        ],
        entities=[
            Entity("Customer", CUSTOMER_STORES, table="customers", plural="customerList"),
            Entity("Product", ["products"], table="products", plural="productList", description="A product"),
        ],
    )


def market_orders() -> list[dict[str, Any]]:
    """Return the shop's orders, the last one without an item (its product relation is null)."""
    orders = make_orders()
    orders[-1] = {**orders[-1], "item": None}
    return orders


def _partition(key: str) -> int:
    return partition_for(key, PARTITIONS, "string", "murmur2")


def fill_market(hosted: Mapping[str, Mapping[int, PartitionStores]], orders: Iterable[dict[str, Any]]) -> None:
    """Apply the tables and the orders to the market's stores, as the sink would; every partition RUNNING."""
    for topic, table in (("customers", MARKET_CUSTOMERS), ("products", MARKET_PRODUCTS)):
        for p, stores in hosted[topic].items():
            with begin_batch(stores) as tx:
                stores.kv(topic).merge(tx, [(k, v) for k, v in table.items() if _partition(k) == p])
            stores.db.set_state(PartitionState.RUNNING)
    for p, stores in hosted["orders"].items():
        rows = [o for o in orders if _partition(o["customer"]) == p]
        with begin_batch(stores) as tx:
            stores.kv("order_count").merge(tx, [(o["customer"], 1) for o in rows])
            stores.kv("total_spend").merge(tx, [(o["customer"], o["amount"]) for o in rows])
            latest_rows = [(o["customer"], {k: v for k, v in o.items() if k != "ms"}) for o in rows]
            stores.kv("latest_order").merge(tx, latest_rows)
            stores.window("orders_per_minute").aggregate(tx, [(o["customer"], o["ms"], 1) for o in rows])
            stores.bloom("ordered").add(tx, [o["customer"] for o in rows])
        stores.db.set_state(PartitionState.RUNNING)


@dataclass(frozen=True)
class MarketTruth:
    """What the market's entities must answer, computed from the tables and the orders in plain Python."""

    orders: list[dict[str, Any]]

    def customer_keys(self) -> list[str]:
        """Return every customer key anything knows of, sorted."""
        return sorted({o["customer"] for o in self.orders} | set(MARKET_CUSTOMERS))

    def product(self, key: str | None) -> dict[str, Any] | None:
        """Return a Product as the API shows it (name, price); None for a null key."""
        if key is None:
            return None
        row = MARKET_PRODUCTS.get(key, {})
        return {"key": key, "name": row.get("name"), "price": row.get("price")}

    def customer(self, key: str) -> dict[str, Any]:
        """Return a Customer as the API shows it: key, columns, favorite, and every store's value."""
        mine = [o for o in self.orders if o["customer"] == key]
        row = MARKET_CUSTOMERS.get(key, {})
        last = mine[-1] if mine else None
        minutes: dict[int, int] = defaultdict(int)
        for order in mine:
            minutes[order["ms"] - order["ms"] % 60_000] += 1
        return {
            "key": key,
            "name": row.get("name"),
            "city": row.get("city"),
            "favorite": self.product(row.get("favorite")),
            "orderCount": len(mine) or None,
            "totalSpend": sum(o["amount"] for o in mine) if mine else None,
            "latestOrder": None if last is None else {"orderId": last["order_id"], "item": last["item"]},
            "ordersPerMinute": [{"start": iso(start), "value": n} for start, n in sorted(minutes.items())],
            "ordered": bool(mine),
        }
