"""A restarted node serves its restored stores while its Spark session is still starting (issue 41's failover target:
serving ≤ 30 s after a restart, where Spark's start alone took ~30 s), then starts its pipeline and applies again."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import pytest

from iqgraph.examples.shop import build_app
from iqgraph.streaming.apache_kafka import KafkaBroker
from tests.conftest import MakeTopic
from tests.support.cluster_load import Ingest, ask, readyz
from tests.support.nodes import NodeProcess, restart_node, start_nodes, wait_ready, write_app_module
from tests.support.pipeline import START_MS

PARTITIONS = 3
SPARK_READY = "Spark ready in"

pytestmark = pytest.mark.slow


def wait_counts(
    client: httpx.Client, node: NodeProcess, keys: list[str], ingest: Ingest, timeout: float = 120
) -> list[Any]:
    """Wait until node answers every key's order count as produced; return the answer's values."""
    truth = [ingest.count(k, ingest.produced) for k in keys]
    deadline, values = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        values = ask(client, node, keys, True, ingest).values()
        if values == truth:
            return values
        time.sleep(0.5)
    raise AssertionError(f"{values} != {truth}")


def test_a_restarted_node_serves_its_restored_stores_while_spark_starts(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> None:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    ingest = Ingest(broker.bootstrap_servers, topic, app.generator(29, START_MS))
    ingest.produce(600)
    home = tmp_path_factory.mktemp("early")
    write_app_module(home, "earlyapp", topic, PARTITIONS, broker.bootstrap_servers)
    [node] = start_nodes(home, "earlyapp", 1)
    try:
        wait_ready([node])
        keys = sorted(set(ingest.keys))[:30]
        with httpx.Client() as client:
            truth = wait_counts(client, node, keys, ingest)
            node.process.send_signal(signal.SIGTERM)
            assert node.process.wait(timeout=90) == 0, node.log.read_text()[-3000:]
            started_before = node.log.read_text().count(SPARK_READY)

            restarted = time.monotonic()
            node = restart_node(node)
            seen = None
            while seen is None and time.monotonic() - restarted < 120:
                assert node.process.poll() is None, node.log.read_text()[-3000:]
                seen = readyz(client, node)
                time.sleep(0.1)
            serving_after = time.monotonic() - restarted
            answer = ask(client, node, keys, True, ingest)
            spark_started = node.log.read_text().count(SPARK_READY) > started_before  # read after the answer

            assert seen is not None, node.log.read_text()[-3000:]
            status, body = seen
            assert not spark_started, f"Spark was ready before the node served ({serving_after:.1f} s)"
            assert status == 503 and body["pipeline"]["state"] == "STARTING", body
            assert {p["state"] for p in body["partitions"]} == {"RUNNING"}, body  # restored to the topic's end
            assert not answer.errors and answer.values() == truth, answer.body

            wait_ready([node])  # the pipeline starts once Spark has, and applies what comes next
            ingest.produce(200)
            wait_counts(client, node, keys, ingest)
            print(f"restart to serving {serving_after:.1f} s")
    finally:
        node.kill()
