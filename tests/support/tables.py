"""The crm table app (customers by id on a table topic), a random changelog of updates and tombstones, and the
table it must leave."""

from __future__ import annotations

import random
from typing import Any

from iqgraph.streaming.definitions import App, Topic, table_store

Change = tuple[str, dict[str, Any] | None]


def table_app(topic: str, partitions: int = 2) -> App:
    """Return an app reading topic as a table of customers."""
    return App(
        name="crm",
        topics=[Topic(topic, schema="name STRING, city STRING", partitions=partitions, table=True)],
        stores=[table_store("customers", topic, description="Customers by id")],
    )


def changelog(seed: int, n: int, keys: int) -> list[Change]:
    """Return n random changes over keys: updates, and tombstones (some for keys never written)."""
    rng = random.Random(seed)
    changes: list[Change] = []
    for i in range(n):
        key = f"c-{rng.randrange(keys + 5):03d}"  # the last 5 keys appear only as tombstones, if at all
        deleted = rng.random() < 0.3 or int(key[2:]) >= keys
        changes.append((key, None if deleted else {"name": f"name-{i}", "city": rng.choice(["Oslo", "Lima"])}))
    return changes


def truth(changes: list[Change]) -> dict[str, dict[str, Any]]:
    """Return the table after the changes: the last value per key, a key whose last change is a tombstone gone."""
    table: dict[str, dict[str, Any] | None] = {}
    for key, value in changes:
        table[key] = value
    return {key: value for key, value in table.items() if value is not None}
