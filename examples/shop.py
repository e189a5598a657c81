"""The shop example: orders keyed by customer, and a products table every node holds.

Stores: order count, total / average / largest / smallest spend and the latest order per customer,
orders per customer per minute, orders per item per minute (keyed by the item column: every partition holds
some of an item's orders, merged when read), the customers ranked by total spend (``topCustomers``), and a
bloom filter of the items sold. ``/dashboard`` (``shop_dashboard.html``) follows the orders per item per minute
and the top five customers live. With a products topic (the module's
``app`` has one): the store ``catalog`` of the ``products`` topic, a global table (every node consumes all
of it) keyed by item, the ``Product`` entity over it (``product(key:)``, ``products(keys:)``), and
``latestOrder { get(key:) { item product { name price } } }``, a relation from each order's item to its
product.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from iqgraph import (
    App,
    Entity,
    Event,
    KafkaSettings,
    Relation,
    Topic,
    avg,
    bloom_store,
    count,
    hopping,
    iso_timestamp,
    key_value_store,
    latest,
    max_,
    min_,
    ranking_store,
    sum_,
    table_store,
    tumbling,
    window_store,
)

ORDER_SCHEMA = "order_id STRING, customer STRING, item STRING, quantity INT, amount DOUBLE, ts TIMESTAMP"
ITEMS = ["widget", "gadget", "gizmo", "doohickey", "sprocket", "flange", "grommet", "bracket", "lever", "spring"]
PRODUCT_SCHEMA = "name STRING, price DOUBLE, category STRING"
CUSTOMERS = 500
LATE_EVERY = 200  # one order in LATE_EVERY arrives two minutes late
DASHBOARD = Path(__file__).with_name("shop_dashboard.html")


def generate_orders(seed: int, start_ms: int) -> Iterator[Event]:
    """Yield orders forever: skewed customers, ~20 ms apart, a few of them late."""
    rng = random.Random(seed)
    now = start_ms
    for n in range(1 << 62):
        now += rng.randint(5, 35)
        customer = f"customer-{int(rng.paretovariate(1.2)) % CUSTOMERS:04d}"
        quantity = rng.randint(1, 5)
        ts = now - 120_000 if n % LATE_EVERY == LATE_EVERY - 1 else now
        order = {
            "order_id": f"o-{seed}-{n}",
            "customer": customer,
            "item": rng.choice(ITEMS),
            "quantity": quantity,
            "amount": round(quantity * rng.uniform(2.0, 80.0), 2),
            "ts": iso_timestamp(ts),
        }
        yield customer, order


def product(item: str) -> dict[str, object]:
    """Return the product record of item (the same every time: the catalogue is fixed)."""
    rng = random.Random(item)
    return {"name": item.title(), "price": round(rng.uniform(2.0, 80.0), 2), "category": rng.choice(["tools", "parts"])}


def generate_shop(seed: int, start_ms: int, products: str = "products") -> Iterator[Event]:
    """Yield the product catalogue (to the products topic), then orders forever."""
    for item in ITEMS:
        yield products, item, product(item)
    yield from generate_orders(seed, start_ms)


def build_app(
    topic: str = "orders", partitions: int = 6, kafka: KafkaSettings | None = None, products: str | None = None
) -> App:
    """Return the shop app reading orders from topic (tests give each run a topic of its own).

    products: the topic of a global products table (None: no products, as most tests run it).
    """
    catalogue = products is not None
    total_spend = key_value_store("total_spend", topic, sum_("amount"), description="Total spend per customer")
    return App(
        name="shop",
        description="A shop: orders keyed by customer",
        topics=[
            Topic(topic, schema=ORDER_SCHEMA, event_time="ts", partitions=partitions),
            *(
                [Topic(products, schema=PRODUCT_SCHEMA, partitions=2, table=True, global_table=True)]
                if products
                else []
            ),
        ],
        stores=[
            key_value_store("order_count", topic, count(), description="Number of orders per customer"),
            total_spend,
            key_value_store("total_quantity", topic, sum_("quantity"), description="Items bought per customer"),
            key_value_store("average_order", topic, avg("amount"), description="Average order value per customer"),
            key_value_store("largest_order", topic, max_("amount"), description="Largest order value per customer"),
            key_value_store("smallest_order", topic, min_("amount"), description="Smallest order per customer"),
            key_value_store(
                "latest_order",
                topic,
                latest(),
                description="The latest order of each customer",
                relations=[Relation("product", "Product", column="item")] if catalogue else [],
            ),
            window_store(
                "orders_per_minute",
                topic,
                count(),
                tumbling(minutes=1, grace_seconds=30),
                description="Orders per customer per minute (late after 30 s of grace)",
            ),
            window_store(
                "spend_per_minute",
                topic,
                sum_("amount"),
                hopping(size_seconds=120, advance_seconds=60),
                description="Spend per customer over two minutes, every minute",
            ),
            window_store(
                "item_orders_per_minute",
                topic,
                count(),
                tumbling(minutes=1, grace_seconds=30),
                key="item",
                description="Orders per item per minute, over every partition (late after 30 s of grace)",
            ),
            ranking_store("top_customers", total_spend, description="Customers by total spend"),
            bloom_store("items_sold", topic, key="item", description="Has this item ever been sold?"),
            *(
                [table_store("catalog", products, description="The product catalogue, on every node")]
                if products
                else []
            ),
        ],
        entities=[Entity("Product", stores=["catalog"], table="catalog")] if catalogue else [],
        kafka=kafka or KafkaSettings(),
        generator=partial(generate_shop, products=products) if products else generate_orders,
        dashboard=DASHBOARD,
    )


app = build_app(products="products")
