"""The customers example (seed 003): a customers table joined with an orders stream.

Topics: ``customers`` — a table (compacted in production) keyed by customer id: profiles, updated now and
then, deleted by a tombstone (a null value) and sometimes created again; ``orders`` — orders keyed by
customer, on the same number of partitions (co-partitioned with the table).

Stores: ``profiles`` (the table: the latest profile per customer; a tombstone deletes it), the order count,
total spend, latest order and orders per minute per customer, and ``spend_per_tier`` — orders enriched at
ingest with their customer's tier (an inner join within the partition: an order of a customer the table
does not hold — deleted, or not created yet — counts under no tier).

The ``Customer`` entity composes them: ``customer(key: "customer-0001") { name city tier orderCount
totalSpend latestOrder { item amount customer { name } } ordersPerMinute(from:, to:) { start value } }`` —
the profile's columns and every order store, for one key, many keys (``customers(keys:)``) or a page
(``customersPage(first:)``). ``latestOrder.customer`` is a relation back to the entity.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import partial

from iqgraph import (
    App,
    Entity,
    Event,
    Join,
    KafkaSettings,
    Relation,
    Topic,
    count,
    iso_timestamp,
    key_value_store,
    latest,
    sum_,
    table_store,
    tumbling,
    window_store,
)

CUSTOMER_SCHEMA = "name STRING, city STRING, tier STRING"
ORDER_SCHEMA = "order_id STRING, customer STRING, item STRING, amount DOUBLE, ts TIMESTAMP"
CUSTOMERS = 300
CITIES = ["Oslo", "Lima", "Pune", "Graz", "Cork", "Kobe"]
TIERS = ["bronze", "silver", "gold"]
ITEMS = ["widget", "gadget", "gizmo", "doohickey", "sprocket", "flange", "grommet", "bracket", "lever", "spring"]
UPDATE_EVERY, DELETE_EVERY = 40, 500  # one change in UPDATE_EVERY updates a profile, one in DELETE_EVERY deletes one


def _customer(rng: random.Random, n: int) -> str:
    return f"customer-{n:04d}" if n >= 0 else f"customer-{(int(rng.paretovariate(1.1)) - 1) % CUSTOMERS:04d}"


def _profile(rng: random.Random, n: int) -> dict[str, str]:
    return {"name": f"Customer {n}", "city": rng.choice(CITIES), "tier": rng.choice(TIERS)}


def generate(seed: int, start_ms: int, orders: str = "orders", customers: str = "customers") -> Iterator[Event]:
    """Yield every customer's profile, then orders forever with profile updates, deletions and re-creations."""
    rng = random.Random(seed)
    for n in range(CUSTOMERS):
        yield customers, _customer(rng, n), _profile(rng, n)
    deleted: list[str] = []
    now = start_ms
    for i in range(1 << 62):
        now += rng.randint(5, 35)
        if i % DELETE_EVERY == DELETE_EVERY - 1:
            gone = _customer(rng, rng.randrange(CUSTOMERS))
            deleted.append(gone)
            yield customers, gone, None  # a tombstone: the customer is deleted
        elif i % UPDATE_EVERY == UPDATE_EVERY - 1:
            n = rng.randrange(CUSTOMERS)
            back = deleted.pop(0) if deleted and rng.random() < 0.5 else None  # created again
            key = back or _customer(rng, n)
            yield customers, key, _profile(rng, int(key.rsplit("-", 1)[1]))
        else:
            customer = _customer(rng, -1)
            amount = round(rng.uniform(2.0, 300.0), 2)
            order = {"order_id": f"o-{seed}-{i}", "customer": customer, "item": rng.choice(ITEMS), "amount": amount}
            yield orders, customer, {**order, "ts": iso_timestamp(now)}


def build_app(
    orders: str = "orders", customers: str = "customers", partitions: int = 6, kafka: KafkaSettings | None = None
) -> App:
    """Return the customers app on the given topics (tests give each run topics of their own)."""
    return App(
        name="customers",
        description="Customers (a table) and their orders (a stream), composed per customer",
        topics=[
            Topic(orders, schema=ORDER_SCHEMA, event_time="ts", partitions=partitions),
            Topic(customers, schema=CUSTOMER_SCHEMA, partitions=partitions, table=True),
        ],
        stores=[
            table_store("profiles", customers, description="Each customer's profile (deleted by a tombstone)"),
            key_value_store("order_count", orders, count(), description="Orders per customer"),
            key_value_store("total_spend", orders, sum_("amount"), description="Total spend per customer"),
            key_value_store(
                "latest_order",
                orders,
                latest(),
                description="Each customer's latest order",
                relations=[Relation("customer", "Customer", column="customer")],
            ),
            window_store("orders_per_minute", orders, count(), tumbling(minutes=1), description="Orders per minute"),
            key_value_store(
                "spend_per_tier",
                orders,
                sum_("amount"),
                key="tier",
                join=Join("profiles"),
                description="Spend per customer tier (orders joined with their customer's profile at ingest)",
            ),
        ],
        entities=[
            Entity(
                "Customer",
                stores=["profiles", "order_count", "total_spend", "latest_order", "orders_per_minute"],
                table="profiles",
                description="A customer: profile, orders and spend, composed at query time",
            )
        ],
        kafka=kafka or KafkaSettings(),
        generator=partial(generate, orders=orders, customers=customers),
    )


app = build_app()
