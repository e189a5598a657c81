"""Kafka away is a pause (issue 42): one node on one broker; the broker is killed for 20 s, then started again.

The node says once that Kafka is unreachable and since when, and once that it is back and after how long — not a
line per client per reconnect (librdkafka's, ~400 of them in 20 s before) — and applies new records within
seconds of the broker's return. (A query that dies of the outage waits for Kafka instead of a growing back-off:
tests/app/test_supervisor.py.)
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from iqgraph.examples.shop import generate_orders
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from tests.support.nodes import start_node, wait_ready, write_app_module
from tests.support.pipeline import START_MS

pytestmark = pytest.mark.slow

PARTITIONS = 3
APPLIED = "{ node { partitions { topic partition appliedOffset } } }"


def orders(seed: int, n: int) -> list[tuple[bytes, bytes, None]]:
    return [(k.encode(), orjson.dumps(v), None) for k, v in itertools.islice(generate_orders(seed, START_MS), n)]


Post = Callable[[str], dict[str, Any]]


def applied(post: Post, topic: str) -> int:
    answer = post(APPLIED)
    if answer.get("errors"):
        return -1
    return sum(p["appliedOffset"] for p in answer["data"]["node"]["partitions"] if p["topic"] == topic)


def wait_applied(post: Post, topic: str, total: int, timeout: float) -> float:
    """Wait until the node applied total records of topic; return the seconds it took."""
    started = time.monotonic()
    while applied(post, topic) < total:
        assert time.monotonic() - started < timeout, f"fewer than {total} records applied after {timeout:.0f} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_a_node_waits_for_kafka_and_goes_on_as_soon_as_it_is_back(tmp_path: Path) -> None:
    broker = KafkaBroker(data_dir=tmp_path / "kafka", port=free_port("127.0.0.1"))
    broker.start()
    node = None
    try:
        topic = "orders"
        broker.create_topics({topic: PARTITIONS})
        write_app_module(tmp_path, "away_app", topic, PARTITIONS, broker.bootstrap_servers)
        produce(broker.bootstrap_servers, topic, orders(1, 300))
        node = start_node(tmp_path, "away_app", "node-0", free_port("127.0.0.1"))
        wait_ready([node])
        wait_applied(node.post, topic, 300, 60)

        broker.kill()  # the whole of Kafka is gone
        time.sleep(20)
        broker.start()
        back = time.monotonic()
        produce(broker.bootstrap_servers, topic, orders(2, 300))
        took = wait_applied(node.post, topic, 600, 60)
        print(f"\nrecords applied {time.monotonic() - back:.1f} s after the broker was back ({took:.1f} s waiting)")
        assert time.monotonic() - back < 30, "the node did not go on within 30 s of Kafka's return"
        log = node.log.read_text()
        assert log.count("unreachable since") == 1, log[-3000:]
        assert log.count("Kafka back after") == 1, log[-3000:]
        assert "Connection refused" not in log, log[-3000:]
        assert "restarting in 60 s" not in log and "restarting in 32 s" not in log
    finally:
        if node is not None:
            node.kill()
        broker.stop()
