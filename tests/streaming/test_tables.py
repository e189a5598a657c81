"""Table topics: the latest value per key, tombstones delete (from the store, scans and counts), exactly once."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from iqgraph.stores import StateDirectory
from iqgraph.streaming.broker import ONE_RECORD_PER_REQUEST, EmbeddedBroker, produce
from iqgraph.streaming.definitions import App, DefinitionError, Topic, count, key_value_store, table_store
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from tests.conftest import MakeTopic

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


def _produce(broker: EmbeddedBroker, topic: str, changes: list[Change]) -> None:
    records = [(key.encode(), None if value is None else orjson.dumps(value), None) for key, value in changes]
    produce(broker.bootstrap_servers, topic, records)


def _read(runner: StreamRunner, topic: str) -> tuple[dict[str, Any], int]:
    found: dict[str, Any] = {}
    counted = 0
    for stores in runner.partitions[topic].values():
        table = stores.kv("customers")
        # a null column may or may not be written out: compare without them
        found.update({k: {c: x for c, x in v.items() if x is not None} for k, v in table.all(limit=10_000).items})
        counted += table.count()
    return found, counted


def test_a_table_keeps_the_last_change_per_key_and_tombstones_delete(
    broker: EmbeddedBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(2, prefix="customers")
    app = table_app(topic)
    # the same batch: every key's changes in one micro-batch (produced before the query starts), including
    # an update then a tombstone, a tombstone then an update, and tombstones of keys never written
    first = changelog(1, 400, keys=40)
    first += [("c-900", {"name": "x", "city": "Oslo"}), ("c-900", None), ("c-901", None), ("c-901", {"name": "y"})]
    _produce(broker, topic, first)
    settings = RunnerSettings(broker.bootstrap_servers, producer_config=dict(ONE_RECORD_PER_REQUEST))
    state = StateDirectory(tmp_path / "state", "crm")
    runner = StreamRunner(app, spark, state, settings)
    try:
        runner.start({topic: [0, 1]})
        runner.wait_until_caught_up(timeout=180)
        expected = truth(first)
        assert "c-900" not in expected and expected["c-901"] == {"name": "y"}
        assert _read(runner, topic) == (expected, len(expected))
        # later batches: delete what exists, re-insert what was deleted, delete a missing key again
        deleted = sorted(expected)[:5]
        second: list[Change] = [(key, None) for key in deleted]
        second += [(deleted[0], {"name": "back", "city": "Lima"}), ("c-999", None)]
        _produce(broker, topic, second)
        runner.wait_until_caught_up(timeout=120)
        expected = truth(first + second)
        found, counted = _read(runner, topic)
        assert found == expected
        assert counted == len(expected)
        assert sum(p.db.counter("bad:customers") for p in runner.partitions[topic].values()) == 0
    finally:
        runner.stop()
    # a restart reads the same table back, and re-applies nothing
    again = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "crm"), settings)
    try:
        again.start({topic: [0, 1]})
        again.wait_until_caught_up(timeout=180)
        found, counted = _read(again, topic)
        assert found == expected
        assert counted == len(expected)
    finally:
        again.stop()


def test_a_table_topic_feeds_only_table_stores() -> None:
    with pytest.raises(DefinitionError, match="reads table topic 'customers'.*table_store"):
        App(
            name="crm",
            topics=[Topic("customers", schema="name STRING", table=True)],
            stores=[key_value_store("n", "customers", count())],
        )
