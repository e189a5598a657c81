"""Latest of a store keyed by a column: the record with the greatest event time over every partition.

Such a store holds one key's partial states in several partitions; ``latest`` must then mean the greatest
(event time, partition, offset), not whichever partition merges last. Produced out of event-time order,
with ties in event time within one partition and across partitions; read through the production query path.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from pathlib import Path
from typing import Any

import orjson

from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import App, Topic, key_value_store, latest, tumbling, window_store
from iqgraph.streaming.partitioner import partition_for
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from iqgraph.streaming.value_types import value_types
from tests.conftest import MakeTopic
from tests.support.queries import single_node

START_MS = 1_767_225_600_000
ITEMS = [f"item-{i}" for i in range(12)]


def _app(topic: str) -> App:
    return App(
        name="latest",
        topics=[Topic(topic, schema="customer STRING, item STRING, n INT, ts LONG", event_time="ts", partitions=3)],
        stores=[
            key_value_store("last_sale", topic, latest("customer", "n", "ts"), key="item"),
            window_store("last_sale_per_hour", topic, latest("customer", "n"), tumbling(minutes=60), key="item"),
        ],
    )


def _orders(seed: int, n: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    orders = []
    for i in range(n):
        customer = f"c-{rng.randrange(30)}"
        # coarse event times (whole minutes within 20 minutes, in random order) make ties common
        ts = START_MS + rng.randrange(20) * 60_000
        orders.append((customer, {"customer": customer, "item": rng.choice(ITEMS), "n": i, "ts": ts}))
    return orders


def _truth(orders: list[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], dict[tuple[str, int], Any]]:
    offsets = [0, 0, 0]
    best: dict[str, tuple[int, int, int, dict[str, Any]]] = {}
    hourly: dict[tuple[str, int], tuple[int, int, int, dict[str, Any]]] = {}
    for customer, order in orders:
        partition = partition_for(customer, 3, "string", "murmur2")
        rank = (order["ts"], partition, offsets[partition])
        offsets[partition] += 1
        item, hour = order["item"], order["ts"] // 3_600_000 * 3_600_000
        if order["item"] not in best or rank > best[item][:3]:
            best[item] = (*rank, {k: order[k] for k in ("customer", "n", "ts")})
        if (item, hour) not in hourly or rank > hourly[item, hour][:3]:
            hourly[item, hour] = (*rank, {k: order[k] for k in ("customer", "n")})
    return {k: v[3] for k, v in best.items()}, {k: v[3] for k, v in hourly.items()}


def test_latest_of_a_column_keyed_store_is_the_greatest_event_time_over_partitions(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(3, prefix="sales")
    app = _app(topic)
    orders = _orders(3, 600)
    records = [(customer.encode(), orjson.dumps(order), None) for customer, order in orders]
    produce(broker.bootstrap_servers, topic, records[:300])
    settings = RunnerSettings(broker.bootstrap_servers)
    runner = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "latest"), settings)
    try:
        runner.start({topic: [0, 1, 2]})
        runner.wait_until_caught_up(timeout=180)
        produce(broker.bootstrap_servers, topic, records[300:])  # later batches merge into stored states
        runner.wait_until_caught_up(timeout=120)
        queries = single_node(app, value_types(app, spark), runner.partitions)
        expected, hourly = _truth(orders)
        assert len({v["ts"] for v in expected.values()}) > 1
        found = asyncio.run(queries.get_many("last_sale", ITEMS))
        assert dict(zip(ITEMS, found, strict=True)) == {item: expected.get(item) for item in ITEMS}
        page = asyncio.run(queries.range("last_sale", None, None, 100, None))
        assert dict(page.items) == expected
        hour = START_MS // 3_600_000 * 3_600_000
        requests = [(item, hour, hour) for item in ITEMS]
        windows = asyncio.run(queries.fetch_many("last_sale_per_hour", requests))
        got = {(w.key, w.start): w.value for found_windows in windows for w in found_windows}
        assert got == hourly
    finally:
        runner.stop()


def test_ties_in_event_time_go_to_the_greater_partition_then_offset() -> None:
    from iqgraph.stores.aggregations import LATEST_BY_TIME, merge_state

    t = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
    a, b, c = [t, 0, 9, "a"], [t, 2, 1, "b"], [t, 2, 3, "c"]
    assert LATEST_BY_TIME.finalize(merge_state(LATEST_BY_TIME, merge_state(LATEST_BY_TIME, a, c), b)) == "c"
    assert LATEST_BY_TIME.finalize(merge_state(LATEST_BY_TIME, [t + 1, 0, 0, "later"], c)) == "later"
