"""One node's query path over real partition databases: routing, cross-partition merges, pages, retries."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql.types import BooleanType, DoubleType, LongType, StructType

from iqgraph.app.query.store_queries import ClusterStoreQueries
from iqgraph.examples.shop import build_app
from iqgraph.schema import wire
from iqgraph.schema.errors import ApiError
from iqgraph.schema.reports import Reports
from iqgraph.stores import (
    InvalidCursorError,
    InvalidKeyError,
    PartitionState,
    PartitionStores,
    StateDirectory,
)
from iqgraph.stores.distinct import distinct_count
from iqgraph.streaming.definitions import App, Topic, count, key_value_store
from iqgraph.streaming.partitioner import partition_for
from tests.support.queries import single_node

TOPIC, PARTITIONS = "orders", 6
TYPES: dict[str, Any] = {
    "order_count": LongType(),
    "total_spend": DoubleType(),
    "total_quantity": LongType(),
    "average_order": DoubleType(),
    "largest_order": DoubleType(),
    "smallest_order": DoubleType(),
    "latest_order": StructType([]),
    "orders_per_minute": LongType(),
    "spend_per_minute": DoubleType(),
    "item_orders_per_minute": LongType(),
    "top_customers": DoubleType(),
    "items_sold": BooleanType(),
    "item_count": LongType(),
}


def _app() -> App:
    shop = build_app(TOPIC, PARTITIONS)
    by_item = key_value_store("item_count", TOPIC, count(), key="item", description="Orders per item")
    return App("shop", [Topic(TOPIC, schema="item STRING")], [*shop.stores, by_item])


@pytest.fixture
def hosted(tmp_path: Path) -> Iterator[dict[str, dict[int, PartitionStores]]]:
    app = _app()
    directory = StateDirectory(tmp_path / "state", "shop")
    partitions = {p: directory.open(TOPIC, p, app.specs(TOPIC)) for p in range(PARTITIONS)}
    yield {TOPIC: partitions}
    for stores in partitions.values():
        stores.close()


def _fill(partitions: dict[int, PartitionStores], counts: dict[str, int]) -> None:
    by_partition: dict[int, list[tuple[str, int]]] = {}
    for key, n in counts.items():
        by_partition.setdefault(partition_for(key, PARTITIONS, "string", "murmur2"), []).append((key, n))
    for p, stores in partitions.items():
        tx = stores.db.begin(stores.db.next_offset(), stores.db.next_offset() + 1)
        assert tx is not None
        with tx:
            stores.kv("order_count").merge(tx, by_partition.get(p, []))
            stores.kv("item_count").merge(tx, [("widget", p + 1), (f"only-{p}", 1)])
            stores.bloom("items_sold").add(tx, [f"item-{p}"])
            stores.window("orders_per_minute").merge(
                tx, [(k, 60_000 * p, n) for k, n in by_partition.get(p, [])], 60_000 * p
            )
        stores.db.set_state(PartitionState.RUNNING)


def _queries(hosted: dict[str, dict[int, PartitionStores]], deadline_ms: int = 200) -> ClusterStoreQueries:
    queries: ClusterStoreQueries = single_node(_app(), TYPES, hosted, deadline_ms)
    return queries.bind(Reports())


COUNTS = {f"customer-{i:03d}": i + 1 for i in range(40)}


async def test_get_many_routes_each_key_to_its_partition(hosted: Any) -> None:
    _fill(hosted[TOPIC], COUNTS)
    queries = _queries(hosted)
    keys = [*COUNTS, "nobody"]
    assert await queries.get_many("order_count", keys) == [*COUNTS.values(), None]
    result = await queries.get_many("order_count", ["customer-001", 5])
    assert result[0] == 2 and isinstance(result[1], InvalidKeyError)


async def test_a_store_not_keyed_by_the_record_key_merges_every_partition(hosted: Any) -> None:
    _fill(hosted[TOPIC], COUNTS)
    queries = _queries(hosted)
    assert await queries.get_many("item_count", ["widget", "only-3", "none"]) == [sum(range(1, 7)), 1, None]
    assert await queries.might_contain_many("items_sold", ["item-0", "item-5", "item-9"]) == [True, True, False]
    assert queries.key_metadata("item_count", "widget").partition is None
    page = await queries.range("item_count", None, None, 100, None)
    assert dict(page.items)["widget"] == 21 and len(page.items) == 7


async def test_range_pages_over_all_partitions_without_gaps_or_duplicates(hosted: Any) -> None:
    _fill(hosted[TOPIC], COUNTS)
    queries = _queries(hosted)
    seen: list[Any] = []
    after = None
    while True:
        page = await queries.range("order_count", "customer-005", "customer-030", 4, after)
        seen += page.items
        if page.next_cursor is None:
            break
        after = page.next_cursor
    expected = sorted((k, v) for k, v in COUNTS.items() if "customer-005" <= k <= "customer-030")
    assert seen == expected
    prefixed = await queries.prefix("order_count", "customer-01", 100, None)
    assert [k for k, _ in prefixed.items] == [f"customer-01{i}" for i in range(10)]


async def test_window_pages_across_partitions(hosted: Any) -> None:
    _fill(hosted[TOPIC], COUNTS)
    queries = _queries(hosted)
    found, after = [], None
    while True:
        page = await queries.fetch_all("orders_per_minute", 0, 10**12, 7, after)
        found += page.items
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert len(found) == len(COUNTS)
    assert [(w.start, w.key) for w in found] == sorted((w.start, w.key) for w in found)
    key = "customer-007"
    [windows] = await queries.fetch_many("orders_per_minute", [(key, 0, 10**12)])
    assert [(w.key, w.value) for w in windows] == [(key, 8)]
    ranged = await queries.fetch_range("orders_per_minute", "customer-010", "customer-012", 0, 10**12, 10, None)
    assert [w.key for w in ranged.items] == ["customer-010", "customer-011", "customer-012"]


async def test_a_partition_restoring_is_retried_until_ready(hosted: Any) -> None:
    _fill(hosted[TOPIC], COUNTS)
    key = "customer-001"
    db = hosted[TOPIC][partition_for(key, PARTITIONS, "string", "murmur2")].db
    db.set_state(PartitionState.RESTORING)
    queries = _queries(hosted, deadline_ms=2_000)

    async def ready_soon() -> None:
        await asyncio.sleep(0.2)
        db.set_state(PartitionState.RUNNING)

    waiter = asyncio.create_task(ready_soon())
    assert await queries.get_many("order_count", [key]) == [2]
    await waiter
    db.set_state(PartitionState.RESTORING)
    [error] = await _queries(hosted, deadline_ms=100).get_many("order_count", [key])
    assert isinstance(error, ApiError) and error.code == "STORE_NOT_READY"
    assert (error.extensions or {})["state"] == "RESTORING"


async def test_a_partition_not_hosted_here_is_reported_as_migrated(hosted: Any) -> None:
    _fill(hosted[TOPIC], COUNTS)
    key = "customer-001"
    partition = partition_for(key, PARTITIONS, "string", "murmur2")
    without = {TOPIC: {p: s for p, s in hosted[TOPIC].items() if p != partition}}
    [error] = await _queries(without).get_many("order_count", [key])
    assert isinstance(error, ApiError) and error.code == "STORE_MIGRATED"
    queries = _queries(without)
    page = await queries.range("order_count", None, None, 100, None)
    assert sorted(k for k, _ in page.items) == sorted(
        k for k in COUNTS if k != key and partition_for(k, PARTITIONS, "string", "murmur2") != partition
    )
    [missing] = queries.reports.partial
    assert missing["missingPartitions"] == [partition] and "not hosted" in missing["reasons"][0]


async def test_a_forged_cursor_is_refused(hosted: Any) -> None:
    _fill(hosted[TOPIC], COUNTS)
    with pytest.raises(InvalidCursorError):
        await _queries(hosted).range("order_count", None, None, 10, "not-a-cursor")


def test_node_reports_every_hosted_partition(hosted: Any) -> None:
    _fill(hosted[TOPIC], COUNTS)
    node = _queries(hosted).node()
    assert [(p.partition, p.state, p.lag) for p in node.partitions] == [(p, "RUNNING", 0) for p in range(PARTITIONS)]


async def test_count_of_a_store_keyed_by_a_column_counts_each_key_once(hosted: Any) -> None:
    """item_count holds "widget" in all 6 partitions and one "only-p" in each: 7 keys, not 12 entries; the bloom
    holds "shared" in every partition besides one item each: its union's estimate, not the filters' sum."""
    _fill(hosted[TOPIC], COUNTS)
    for stores in hosted[TOPIC].values():
        tx = stores.db.begin(stores.db.next_offset(), stores.db.next_offset() + 1)
        assert tx is not None
        with tx:
            stores.bloom("items_sold").add(tx, ["shared"])
    queries = _queries(hosted)
    assert await queries.count("item_count") == 7
    assert await queries.count("items_sold") == 7
    assert await queries.count("order_count") == len(COUNTS)  # keyed by the record key: the kept counters' sum
    assert await queries.approximate_count("item_count") >= 7  # RocksDB's estimate, per partition
    for store in ("item_count", "items_sold"):  # what a peer answers comes across the wire whole
        answer = queries.local.count(store, range(PARTITIONS))
        sent = wire.decode_count(orjson.loads(orjson.dumps(wire.encode_count(answer))))
        assert sent.value == answer.value and distinct_count(sent.value.values()) == 7
