"""End to end: generated shop orders through the real broker and Spark into the stores."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iqgraph.examples.shop import ITEMS, build_app
from iqgraph.stores import PartitionState, StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.definitions import App
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from tests.conftest import MakeTopic
from tests.support.ground_truth import expected
from tests.support.pipeline import START_MS, assert_equal_to_ground_truth, send
from tests.support.readback import read_back

EVENTS = 10_000
PARTITIONS = 6


@pytest.fixture(scope="module")
def shop(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[App, list[Any], StreamRunner]]:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(11, START_MS), EVENTS))
    send(broker, topic, events)
    state = StateDirectory(Path(tmp_path_factory.mktemp("shop")) / "state", "shop")
    runner = StreamRunner(app, spark, state, RunnerSettings(broker.bootstrap_servers, max_records_per_batch=4000))
    runner.start({topic: range(PARTITIONS)})
    runner.wait_until_caught_up(timeout=300)
    yield app, events, runner
    runner.stop()


def test_every_store_equals_a_python_computation_over_the_events(shop: Any) -> None:
    app, events, runner = shop
    actual = read_back(app, runner.partitions[app.topics[0].name].values())
    assert_equal_to_ground_truth(app, actual, events)


def test_late_events_are_counted_not_applied(shop: Any) -> None:
    app, events, runner = shop
    actual = read_back(app, runner.partitions[app.topics[0].name].values())
    assert actual.late["orders_per_minute"] > 0
    assert actual.late["orders_per_minute"] == expected(app, events).late["orders_per_minute"]


def test_bloom_has_every_item_sold_and_not_unsold_ones(shop: Any) -> None:
    app, events, runner = shop
    partitions = runner.partitions[app.topics[0].name].values()
    sold = {v["item"] for _, v in events}
    assert sold == set(ITEMS)
    for item in sold:
        assert any(p.bloom("items_sold").might_contain(item) for p in partitions), item
    unsold = [f"never-{i}" for i in range(200)]
    false_positives = sum(any(p.bloom("items_sold").might_contain(u) for p in partitions) for u in unsold)
    assert false_positives <= 2


def test_status_reports_every_partition_running_without_lag(shop: Any) -> None:
    app, events, runner = shop
    status = runner.status()
    assert [s.partition for s in status] == list(range(PARTITIONS))
    assert all(s.state == PartitionState.RUNNING.value and s.lag == 0 for s in status)
    assert sum(s.applied_offset for s in status) == EVENTS


def test_the_jvm_connector_is_selected_with_equivalent_options() -> None:
    from iqgraph.streaming.runner import source_options

    settings = RunnerSettings("b:9092", {"security.protocol": "SSL"}, source="iqkafka")
    ours = source_options(settings, "orders", [1, 3], {1: 10, 3: 0})
    assert ours == {
        "kafka.security.protocol": "SSL",
        "kafka.bootstrap.servers": "b:9092",
        "topic": "orders",
        "partitions": "1,3",
        "startingOffsets": '{"1": 10, "3": 0}',
        "maxRecordsPerBatch": "200000",
    }
    jvm = source_options(
        RunnerSettings("b:9092", source="kafka", max_records_per_batch=5), "orders", [1, 3], {1: 10, 3: 0}
    )
    assert jvm["assign"] == '{"orders": [1, 3]}'
    assert jvm["startingOffsets"] == '{"orders": {"1": 10, "3": 0}}'
    assert jvm["maxOffsetsPerTrigger"] == "5" and jvm["kafka.bootstrap.servers"] == "b:9092"
    assert jvm["kafka.isolation.level"] == "read_committed"
    # a batch's read does not wait on the fetch its consumer left at the log end for the Java default of 500 ms
    assert jvm["kafka.fetch.max.wait.ms"] == "10"
    mine = RunnerSettings("b:9092", {"fetch.wait.max.ms": "200"}, source="kafka")  # librdkafka's name: it wins
    assert source_options(mine, "orders", [1], {1: 0})["kafka.fetch.max.wait.ms"] == "200"
    assert RunnerSettings("b:9092").source == "kafka"  # Spark's own connector is the default
