"""Table topics: the latest value per key, tombstones delete (from the store, scans and counts), exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import App, DefinitionError, Topic, count, key_value_store
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from tests.conftest import MakeTopic
from tests.support.tables import Change, changelog, table_app, truth


def _produce(broker: KafkaBroker, topic: str, changes: list[Change]) -> None:
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
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(2, prefix="customers")
    app = table_app(topic)
    # the same batch: every key's changes in one micro-batch (produced before the query starts), including
    # an update then a tombstone, a tombstone then an update, and tombstones of keys never written
    first = changelog(1, 400, keys=40)
    first += [("c-900", {"name": "x", "city": "Oslo"}), ("c-900", None), ("c-901", None), ("c-901", {"name": "y"})]
    _produce(broker, topic, first)
    settings = RunnerSettings(broker.bootstrap_servers)
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
