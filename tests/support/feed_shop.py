"""The change feed tests' shop, without Spark: two partitions of one topic, a count, a window, a bloom filter and a
ranking (or a table), the partition a key is in, and orders built as the sink's batches (as Spark's partials would
bring them). The live tests (tests.support.live_shop) run on it too."""

from __future__ import annotations

from collections.abc import Sequence

from iqgraph.streaming.definitions import (
    App,
    Topic,
    bloom_store,
    count,
    key_value_store,
    ranking_store,
    table_store,
    tumbling,
    window_store,
)
from iqgraph.streaming.partitioner import partition_for
from iqgraph.streaming.sink import PartitionBatch

TOPIC = "orders"
MINUTE = 60_000
START_MS = 1_700_000_040_000 // MINUTE * MINUTE
KEYS = [f"c{i}" for i in range(12)]


def shop_app(table: bool = False) -> App:
    if table:
        return App(
            "shop", [Topic(TOPIC, schema="name STRING", partitions=2, table=True)], [table_store("names", TOPIC)]
        )
    per_key = key_value_store("per_key", TOPIC, count())
    return App(
        "shop",
        [Topic(TOPIC, schema="amount DOUBLE, item STRING", partitions=2)],
        [
            per_key,
            window_store("per_minute", TOPIC, count(), tumbling(minutes=1)),
            bloom_store("items", TOPIC, key="item"),
            ranking_store("top", per_key),
        ],
    )


def where(key: str) -> int:
    return partition_for(key, 2, "string", "murmur2")


class Orders:
    """Builds the sink's batches of orders (key, item, minute) as Spark's partials would bring them."""

    def __init__(self) -> None:
        self.offsets = {0: 0, 1: 0}
        self.changed_at: dict[str, int] = {}  # per key: the offset of its last order (its per_key position)

    def batches(self, orders: Sequence[tuple[str, str, int]]) -> dict[int, PartitionBatch]:
        batches: dict[int, PartitionBatch] = {}
        for p in sorted({where(key) for key, _, _ in orders}):
            mine = [order for order in orders if where(order[0]) == p]
            batch = batches[p] = PartitionBatch(self.offsets[p], self.offsets[p] + len(mine) - 1)
            self.offsets[p] += len(mine)
            keys = [key for key, _, _ in mine]
            windows = [(key, START_MS + minute * MINUTE) for key, _, minute in mine]
            at = {key: batch.first_offset + i for i, key in enumerate(keys)}  # each key's last record
            window_at = {w: batch.first_offset + i for i, w in enumerate(windows)}
            item_at = {item: batch.first_offset + i for i, (_, item, _) in enumerate(mine)}
            self.changed_at.update(at)
            batch.partials["per_key"] = [(k, None, keys.count(k), keys.count(k), at[k]) for k in dict.fromkeys(keys)]
            batch.partials["top"] = [(k, None, None, keys.count(k), at[k]) for k in dict.fromkeys(keys)]
            batch.partials["per_minute"] = [(k, s, windows.count((k, s)), 1, window_at[(k, s)]) for k, s in window_at]
            batch.partials["items"] = [(item, None, None, 1, item_at[item]) for item in item_at]
            batch.stream_time["per_minute"] = max(s for _, s in windows)
        return batches
