"""A node's Prometheus metrics: the unit rules (peer labels, partition gauges), then one
real `iqgraph serve` node scraped over HTTP after it ingested good and bad records.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from iqgraph.app.cluster.membership import Member
from iqgraph.app.metrics import UNKNOWN_PEER, NodeMetrics
from iqgraph.examples.shop import build_app
from iqgraph.schema.types import NodeInfo, PartitionInfo
from iqgraph.schema.wire import INTERNAL_PATH
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from iqgraph.streaming.sink import BatchReport
from tests.conftest import MakeTopic
from tests.support.nodes import NodeProcess, Scrape, scrape, start_node, wait_ready, write_app_module
from tests.support.pipeline import BAD, START_MS

PARTITIONS = 2
EVENTS = 400
BAD_RECORDS = BAD[:3]  # two undecodable values and a null key: bad for every store of the shop


def _node_metrics(partitions: tuple[PartitionInfo, ...] = ()) -> NodeMetrics:
    members = {"node-0": Member("node-0", "http://a:1"), "node-1": Member("node-1", "http://b:2")}
    info = NodeInfo("node-0", "http://a:1", "RUNNING", partitions)
    return NodeMetrics(lambda: members, lambda: info, lambda: "RUNNING")


def _local_scrape(metrics: NodeMetrics) -> Scrape:
    families = text_string_to_metric_families(generate_latest(metrics.registry).decode())
    return Scrape({(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples})


def test_peer_labels_are_member_ids_or_unknown() -> None:
    metrics = _node_metrics()
    for claimed in ("node-1", "evil", "node-1", "", "http://b:2"):
        metrics.forwarded_received(claimed)
    metrics.sent_to("http://b:2")
    metrics.sent_to("http://elsewhere:3")
    metrics.failed("http://b:2", "STORE_MIGRATED")
    metrics.failed("http://b:2", "not a code")
    scraped = _local_scrape(metrics)
    assert scraped.value("iqgraph_forwarded_received_total", peer="node-1") == 2
    assert scraped.value("iqgraph_forwarded_received_total", peer=UNKNOWN_PEER) == 3
    assert {labels["peer"] for labels in scraped.labels("iqgraph_forwarded_received_total")} == {"node-1", "unknown"}
    assert scraped.value("iqgraph_forwarded_sent_total", peer="node-1") == 1
    assert scraped.value("iqgraph_forwarded_sent_total", peer=UNKNOWN_PEER) == 1
    assert scraped.value("iqgraph_peer_errors_total", peer="node-1", code="STORE_MIGRATED") == 1
    assert scraped.value("iqgraph_peer_errors_total", peer="node-1", code="OTHER") == 1


def test_partition_gauges_are_read_from_the_node_at_scrape_time() -> None:
    partitions = (
        PartitionInfo("orders", 0, "active", "RUNNING", 100, 100),
        PartitionInfo("orders", 1, "active", "RESTORING", 40, 250),
        PartitionInfo("orders", 2, "standby", "RESTORING", 0, 30),
    )
    scraped = _local_scrape(_node_metrics(partitions))
    assert scraped.value("iqgraph_node_state", state="RUNNING") == 1
    assert scraped.value("iqgraph_partitions", role="active", state="RUNNING") == 1
    assert scraped.value("iqgraph_partitions", role="active", state="RESTORING") == 1
    assert scraped.value("iqgraph_partitions", role="standby", state="RESTORING") == 1
    assert scraped.value("iqgraph_partitions", role="standby", state="RUNNING") == 0
    assert scraped.value("iqgraph_partition_lag_records", topic="orders", partition="1", role="active") == 210
    assert scraped.value("iqgraph_partition_applied_offset", topic="orders", partition="1") == 40
    assert scraped.value("iqgraph_partition_end_offset", topic="orders", partition="1") == 250
    assert scraped.value("iqgraph_restore_remaining_records") == 240


def test_batches_and_bad_records_are_observed_per_topic_and_store() -> None:
    metrics = _node_metrics()
    metrics.batch_applied(BatchReport("orders", 0.8, 1_000, {"order_count": 2}))
    metrics.batch_applied(BatchReport("orders", 1.2, 500, {"order_count": 1, "items_sold": 1}))
    scraped = _local_scrape(metrics)
    assert scraped.value("iqgraph_batch_duration_seconds_count", topic="orders") == 2
    assert scraped.value("iqgraph_batch_duration_seconds_sum", topic="orders") == pytest.approx(2.0)
    assert scraped.value("iqgraph_batch_records_sum", topic="orders") == 1_500
    assert scraped.value("iqgraph_bad_records_total", store="order_count") == 3
    assert scraped.value("iqgraph_bad_records_total", store="items_sold") == 1


@dataclass
class Ingested:
    node: NodeProcess
    topic: str
    produced: int


@pytest.fixture(scope="module")
def ingested(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ingested]:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    good = list(itertools.islice(app.generator(17, START_MS), EVENTS))
    records: list[Any] = [(k.encode(), orjson.dumps(v), None) for k, v in good[:200]]
    records += [(key, value, 0) for key, value, _ in BAD_RECORDS]
    records += [(k.encode(), orjson.dumps(v), None) for k, v in good[200:]]
    produced = produce(broker.bootstrap_servers, topic, records)
    home = tmp_path_factory.mktemp("metrics")
    write_app_module(home, "metricsapp", topic, PARTITIONS, broker.bootstrap_servers)
    node = start_node(home, "metricsapp", "node-m", free_port())
    try:
        wait_ready([node])
        yield Ingested(node, topic, produced)
    finally:
        node.kill()


def _scrape_when(url: str, done: Any, timeout: float = 60) -> Scrape:
    """Scrape until done(scrape) (the last batch is observed just after the node turns ready)."""
    deadline = time.monotonic() + timeout
    while True:
        scraped = scrape(url)
        if done(scraped) or time.monotonic() > deadline:
            return scraped
        time.sleep(0.5)


@pytest.mark.slow
def test_a_node_reports_batches_partitions_lag_and_bad_records(ingested: Ingested) -> None:
    url, topic = ingested.node.url, ingested.topic
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.headers["content-type"].startswith("text/plain; version=")
    scraped = _scrape_when(url, lambda s: s.value("iqgraph_batch_records_sum", topic=topic) >= ingested.produced)
    assert scraped.value("iqgraph_batch_records_sum", topic=topic) == ingested.produced  # each offset once
    batches = scraped.value("iqgraph_batch_duration_seconds_count", topic=topic)
    assert batches >= 1
    assert 0 < scraped.value("iqgraph_batch_duration_seconds_sum", topic=topic) < 300 * batches
    for store in build_app(topic, PARTITIONS).stores:
        assert scraped.value("iqgraph_bad_records_total", store=store.name) == len(BAD_RECORDS), store.name
    assert scraped.value("iqgraph_node_state", state="RUNNING") == 1
    assert scraped.value("iqgraph_partitions", role="active", state="RUNNING") == PARTITIONS
    assert scraped.value("iqgraph_partitions", role="active", state="RESTORING") == 0
    assert scraped.value("iqgraph_restore_remaining_records") == 0
    ends = [scraped.value("iqgraph_partition_end_offset", topic=topic, partition=str(p)) for p in range(PARTITIONS)]
    assert sum(ends) == ingested.produced
    for p in range(PARTITIONS):
        applied = scraped.value("iqgraph_partition_applied_offset", topic=topic, partition=str(p))
        assert applied == ends[p]
        assert scraped.value("iqgraph_partition_lag_records", topic=topic, partition=str(p), role="active") == 0
    assert scraped.value("process_cpu_seconds_total") > 0


@pytest.mark.slow
def test_graphql_requests_and_lookups_are_counted_over_http(ingested: Ingested) -> None:
    node = ingested.node
    before = scrape(node.url)
    body = node.post('query { orderCount { getMany(keys: ["customer-0001", "customer-0002", "nobody"]) } }')
    assert "errors" not in body, body
    node.post("{ orderCount { get(key: ")
    after = scrape(node.url)

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert delta("iqgraph_graphql_requests_total", field="orderCount", store="order_count") == 1
    assert delta("iqgraph_graphql_request_duration_seconds_count", field="orderCount", store="order_count") == 1
    assert delta("iqgraph_lookup_keys_count", store="order_count") == 1
    assert delta("iqgraph_lookup_keys_sum", store="order_count") == 3
    assert delta("iqgraph_graphql_errors_total", code="GRAPHQL_PARSE_FAILED") == 1


@pytest.mark.slow
def test_only_authenticated_peers_are_counted_as_forwarding(ingested: Ingested) -> None:
    node = ingested.node
    before = scrape(node.url)
    node.post("{ node { id } }", **{"x-iqgraph-node": "evil", "x-iqgraph-forwarded": "evil"})
    forged = httpx.post(f"{node.url}{INTERNAL_PATH}", json={"query": "{ node { id } }"}, timeout=10,
                        headers={"x-iqgraph-node": "node-m", "x-iqgraph-signature": "0" * 64})  # fmt: skip
    assert forged.status_code == 404  # a single node has no peer listener, and its clients' serves no /internal/*
    after = scrape(node.url)
    received = "iqgraph_forwarded_received_total"
    assert after.value(received, peer="node-m") == before.value(received, peer="node-m")
    assert after.value(received, peer="unknown") == before.value(received, peer="unknown")
    assert after.value(received, peer="evil") == 0
