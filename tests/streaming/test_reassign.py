"""Restart with a different set of owned partitions: kept ones keep their data, new ones rebuild."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from iqgraph.examples.shop import build_app
from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.partitioner import partition_for
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from tests.conftest import MakeTopic
from tests.support.pipeline import START_MS, assert_equal_to_ground_truth, send
from tests.support.readback import read_back

PARTITIONS = 6


def _of(events: list[Any], owned: set[int]) -> list[Any]:
    return [(k, v) for k, v in events if partition_for(k, PARTITIONS, "string", "murmur2") in owned]


def test_reassignment_keeps_untouched_partitions_and_rebuilds_new_ones(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    generator = app.generator(31, START_MS)
    first = list(itertools.islice(generator, 2_000))
    send(broker, topic, first)
    state = StateDirectory(tmp_path / "state", app.name)
    runner = StreamRunner(app, spark, state, RunnerSettings(broker.bootstrap_servers))
    try:
        runner.start({topic: [0, 1, 2, 3]})
        runner.wait_until_caught_up(timeout=180)
        kept = {p: runner.partitions[topic][p] for p in (2, 3)}
        before = {p: (s.db.next_offset(), read_back(app, [s]).kv["order_count"]) for p, s in kept.items()}

        runner.reassign({topic: [2, 3, 4, 5]})
        assert sorted(runner.partitions[topic]) == [2, 3, 4, 5]
        assert all(runner.partitions[topic][p] is kept[p] for p in (2, 3)), "kept partitions were reopened"
        assert (tmp_path / "state" / f"{topic}-0").is_dir(), "a released partition's data stays on disk"
        runner.wait_until_caught_up(timeout=180)
        for p, (offset, counts) in before.items():
            assert kept[p].db.next_offset() == offset
            assert read_back(app, [kept[p]]).kv["order_count"] == counts
        rebuilt = read_back(app, [runner.partitions[topic][p] for p in (4, 5)])
        assert_equal_to_ground_truth(build_app(topic, PARTITIONS), rebuilt, _of(first, {4, 5}))

        more = list(itertools.islice(generator, 1_000))
        send(broker, topic, more)
        runner.wait_until_caught_up(timeout=180)
        now = read_back(app, runner.partitions[topic].values())
        assert_equal_to_ground_truth(app, now, _of(first + more, {2, 3, 4, 5}))
    finally:
        runner.stop()


def test_a_query_that_dies_is_restarted_from_the_stores(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from iqgraph.streaming.sink import StoreSink

    topic = make_topic(2, prefix="orders")
    app = build_app(topic, 2)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(37, START_MS), 500))
    send(broker, topic, events)
    original = StoreSink.apply
    calls = {"n": 0}

    def fail_once(self: StoreSink, batches: Any, read: Any = None) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected: the sink died")
        return original(self, batches, read)

    monkeypatch.setattr(StoreSink, "apply", fail_once)
    runner = StreamRunner(
        app, spark, StateDirectory(tmp_path / "state", app.name), RunnerSettings(broker.bootstrap_servers)
    )
    try:
        runner.start({topic: [0, 1]})
        deadline = time.monotonic() + 120
        while runner.failure() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "injected" in str(runner.failure())
        runner.restart()
        runner.wait_until_caught_up(timeout=180)
        assert_equal_to_ground_truth(app, read_back(app, runner.partitions[topic].values()), events)
    finally:
        runner.stop()
