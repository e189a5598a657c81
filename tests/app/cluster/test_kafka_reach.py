"""Kafka's reach, surfaced (issue 42 part 4): /readyz and /metrics say when Kafka does not answer and since when, and
the partitions' lag stays the lag as of Kafka's last answer (the end offsets last read) while it does not."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from iqgraph.app.cluster.topic_watch import TopicWatch
from iqgraph.app.metrics import NodeMetrics, partition_metrics, scrape
from iqgraph.app.query.partitions import LocalPartitions
from iqgraph.examples.shop import generate_orders
from iqgraph.schema import wire
from iqgraph.stores import PartitionState, StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from iqgraph.streaming.definitions import App, Topic, count, key_value_store
from iqgraph.streaming.kafka_offsets import KafkaOffsets
from iqgraph.streaming.kafka_watch import KafkaStatus, KafkaWatch
from tests.support.nodes import Scrape, start_node, wait_ready, write_app_module
from tests.support.pipeline import START_MS

TOPIC = "orders"


def gauges(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Return each sample of a scrape by name and sorted labels."""
    families = text_string_to_metric_families(text.decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_a_watch_on_a_closed_port_says_since_when_kafka_is_unreachable_in_readyz_and_metrics() -> None:
    watch = KafkaWatch({"bootstrap.servers": f"127.0.0.1:{free_port()}"}, timeout_s=1.0, every_s=0.0)
    metrics = NodeMetrics(dict, lambda: None, lambda: "RUNNING")
    assert ("iqgraph_kafka_reachable", ()) not in gauges(scrape(metrics))  # not watched yet: nothing said
    metrics.kafka.watch(watch.status)
    assert watch.status() == KafkaStatus(True)  # the node checked Kafka before it started watching
    assert gauges(scrape(metrics))[("iqgraph_kafka_reachable", ())] == 1
    before = time.time()
    assert not watch.reachable()  # a real librdkafka metadata request to a port nobody listens on
    assert not watch.reachable()
    status = watch.status()
    assert not status.reachable and status.unreachable_since is not None
    assert before <= status.unreachable_since <= time.time()
    body = wire.encode_ready(False, "RUNNING", "node-0", None, status)
    assert body["kafka"]["reachable"] is False
    assert body["kafka"]["unreachableSinceSeconds"] == status.unreachable_since
    since = datetime.fromisoformat(body["kafka"]["unreachableSince"])
    assert since.utcoffset() is not None and abs(since.timestamp() - status.unreachable_since) < 1
    scraped = gauges(scrape(metrics))
    assert scraped[("iqgraph_kafka_reachable", ())] == 0
    assert scraped[("iqgraph_kafka_unreachable_since_seconds", ())] == status.unreachable_since
    assert wire.encode_ready(True, "RUNNING", "node-0", None)["kafka"] is None  # before the node watches Kafka


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A broker of this test's own, to stop and start (the session's serves every other test)."""
    broker = KafkaBroker(data_dir=tmp_path / "kafka", port=free_port())
    broker.start()
    yield broker
    broker.stop()


def test_lags_stay_those_of_the_end_offsets_last_read_while_kafka_is_away(
    tmp_path: Path, own_broker: KafkaBroker
) -> None:
    own_broker.create_topics({TOPIC: 2})
    produce(own_broker.bootstrap_servers, TOPIC, [(b"k", b"1", p) for p in (0, 1) for _ in range(50)])
    topic = Topic(TOPIC, schema="amount INT", partitions=2)
    app = App(name="reach", topics=[topic], stores=[key_value_store("per_key", TOPIC, count())])
    state = StateDirectory(tmp_path / "state", app.name)
    hosted = {TOPIC: {p: state.open(TOPIC, p, app.specs(TOPIC)) for p in range(2)}}
    config = {"bootstrap.servers": own_broker.bootstrap_servers}
    offsets = KafkaOffsets(config, TOPIC, timeout=3.0)
    kafka = KafkaWatch(config, timeout_s=1.0, every_s=0.0)
    try:
        for stores in hosted[TOPIC].values():
            stores.db.set_state(PartitionState.RUNNING)
        tx = hosted[TOPIC][0].db.begin(0, 10)  # partition 0 applied 10 of its 50 records, partition 1 none
        assert tx is not None
        tx.commit()
        ends = lambda topic, partitions: offsets.latest(partitions)  # noqa: E731 - as the node reads them
        watch = TopicWatch(hosted, ends, "murmur2", partition_count=lambda topic: len(offsets.partitions()))
        local = LocalPartitions(app, hosted, end_offset=watch.end_offset)
        watch.refresh()
        assert [(p.end_offset, p.lag) for p in local.node().partitions] == [(50, 40), (50, 50)]
        assert local.replica(TOPIC, 0) == ("RUNNING", 40)

        own_broker.kill()
        assert not kafka.reachable()
        started = time.monotonic()
        watch.refresh()  # both reads fail (each within its 3 s timeout): the last values stay
        assert time.monotonic() - started < 15
        info = local.node()
        assert [(p.end_offset, p.lag) for p in info.partitions] == [(50, 40), (50, 50)]
        assert local.replica(TOPIC, 1) == ("RUNNING", 50)
        lags = {tuple(s.labels.values()): s.value for f in partition_metrics(info) for s in f.samples}
        assert lags[(TOPIC, "0", "active")] == 40 and lags[(TOPIC, "1", "active")] == 50
        body = wire.encode_ready(True, "RUNNING", "node-0", info, kafka.status())
        assert [p["lag"] for p in body["partitions"]] == [40, 50] and body["kafka"]["reachable"] is False

        own_broker.start()
        produce(own_broker.bootstrap_servers, TOPIC, [(b"k", b"1", 1) for _ in range(5)])
        back = time.monotonic()
        while [(p.end_offset, p.lag) for p in local.node().partitions] != [(50, 40), (55, 55)]:
            assert time.monotonic() - back < 30, "the end offsets were not read again within 30 s of Kafka's return"
            watch.refresh()  # the node's watch: every 0.5 s
        assert kafka.reachable()
    finally:
        for stores in hosted[TOPIC].values():
            stores.close()


APPLIED = "{ node { partitions { topic partition appliedOffset endOffset } } }"
LOOKUP = '{ orderCount { get(key: "customer-0001") } }'


@pytest.mark.slow
def test_a_node_says_at_readyz_and_metrics_that_kafka_is_away_since_when_and_keeps_its_lags(
    tmp_path: Path, own_broker: KafkaBroker
) -> None:
    own_broker.create_topics({TOPIC: 3})
    write_app_module(tmp_path, "reach_app", TOPIC, 3, own_broker.bootstrap_servers)
    orders = itertools.islice(generate_orders(1, START_MS), 300)
    produce(own_broker.bootstrap_servers, TOPIC, [(k.encode(), orjson.dumps(v), None) for k, v in orders])
    node = start_node(tmp_path, "reach_app", "node-0", free_port())
    try:
        wait_ready([node])
        deadline = time.monotonic() + 60
        while sum(p["appliedOffset"] for p in node.post(APPLIED)["data"]["node"]["partitions"]) < 300:
            assert time.monotonic() < deadline, "300 records not applied in 60 s"
            time.sleep(0.2)
        ready = httpx.get(f"{node.url}/readyz", timeout=10).json()
        assert ready["kafka"] == {"reachable": True, "unreachableSince": None, "unreachableSinceSeconds": None}
        before = node.metrics()
        assert before.value("iqgraph_kafka_reachable") == 1
        assert before.labels("iqgraph_kafka_unreachable_since_seconds") == []
        assert _ends(before) == 300
        assert "staleness" not in node.post(LOOKUP).get("extensions", {})

        own_broker.kill()
        killed = time.time()
        statuses: list[int] = []
        deadline = time.monotonic() + 15
        while (kafka := httpx.get(f"{node.url}/readyz", timeout=10)).json()["kafka"]["reachable"]:
            assert time.monotonic() < deadline, "/readyz did not say Kafka is away within 15 s"
            time.sleep(0.2)
        since = kafka.json()["kafka"]["unreachableSinceSeconds"]
        assert killed - 1 <= since <= killed + 15
        assert datetime.fromisoformat(kafka.json()["kafka"]["unreachableSince"]).timestamp() == int(since)
        for _ in range(20):  # 10 s of the outage: what a readiness probe and a scrape see
            statuses.append(httpx.get(f"{node.url}/readyz", timeout=10).status_code)
            time.sleep(0.5)
        away = node.metrics()
        assert away.value("iqgraph_kafka_reachable") == 0
        assert away.value("iqgraph_kafka_unreachable_since_seconds") == since
        assert _ends(away) == 300, "the end offsets last read are kept"
        assert _lags(away) == _lags(before)
        # a query answers from the last state the node knew, and says so (issue 42 part 2)
        answered = node.post(LOOKUP)
        assert "errors" not in answered and answered["data"]["orderCount"]["get"] is not None, answered
        staleness = answered["extensions"]["staleness"]
        assert [(e["store"], e["node"], e["kafkaUnreachableSinceSeconds"]) for e in staleness] == [
            ("order_count", "node-0", since)
        ], staleness
        print(f"\n/readyz during the outage: {statuses}")

        own_broker.start()
        deadline = time.monotonic() + 30
        while not httpx.get(f"{node.url}/readyz", timeout=10).json()["kafka"]["reachable"]:
            assert time.monotonic() < deadline, "/readyz did not say Kafka is back within 30 s"
            time.sleep(0.2)
        back = node.metrics()
        assert back.value("iqgraph_kafka_reachable") == 1
        assert back.labels("iqgraph_kafka_unreachable_since_seconds") == []
        assert "staleness" not in node.post(LOOKUP).get("extensions", {})
    finally:
        node.kill()


def _ends(scraped: Scrape) -> float:
    return sum(scraped.value("iqgraph_partition_end_offset", **labels) for labels in _partitions(scraped))


def _lags(scraped: Scrape) -> dict[str, float]:
    found = scraped.labels("iqgraph_partition_lag_records")
    return {labels["partition"]: scraped.value("iqgraph_partition_lag_records", **labels) for labels in found}


def _partitions(scraped: Scrape) -> list[dict[str, str]]:
    return scraped.labels("iqgraph_partition_end_offset")
