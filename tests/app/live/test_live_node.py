"""One real node (`iqgraph serve`: Spark, the runner's sinks publishing to the node's change feed) followed over
graphql-transport-ws while orders are produced: each key's count arrives in offset order and ends equal to what a
query reads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from tests.conftest import MakeTopic
from tests.support.nodes import NodeProcess, start_node, wait_ready, write_app_module
from tests.support.transport_ws import TransportWS, websocket

pytestmark = pytest.mark.slow
PARTITIONS = 2
KEYS = [f"customer-{i:04d}" for i in range(4)]
WATCH = """subscription($keys: [String!]!) {
  orderCountWatch(keys: $keys) { key value snapshot position { partition offset } }
}"""


@pytest.fixture(scope="module")
def node(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NodeProcess, str]]:
    topic = make_topic(PARTITIONS, prefix="live")
    home = tmp_path_factory.mktemp("live-node")
    write_app_module(home, "liveapp", topic, PARTITIONS, broker.bootstrap_servers)
    started = start_node(home, "liveapp", "node-0", free_port())
    try:
        wait_ready([started])
        yield started, topic
    finally:
        started.kill()


def order(i: int, key: str) -> tuple[bytes, bytes, None]:
    value = {"order_id": f"o-{i}", "customer": key, "item": "pen", "quantity": 1, "amount": 2.5}
    return key.encode(), orjson.dumps({**value, "ts": "2026-01-01T00:00:00.000Z"}), None


def test_produced_orders_reach_a_subscriber_in_offset_order(node: tuple[NodeProcess, str], broker: KafkaBroker) -> None:
    served, topic = node
    with websocket(served.url.removeprefix("http://")) as raw:
        ws = TransportWS(raw)
        assert ws.init()["type"] == "connection_ack"
        ws.subscribe("1", WATCH, {"keys": KEYS})
        first = [ws.receive()["payload"]["data"]["orderCountWatch"] for _ in KEYS]
        assert {e["key"]: e["value"] for e in first} == dict.fromkeys(KEYS)
        produce(broker.bootstrap_servers, topic, [order(i, KEYS[i % len(KEYS)]) for i in range(12)])
        seen: dict[str, Any] = {}
        offsets: dict[int, list[int]] = {}
        deadline = time.monotonic() + 60
        while seen != dict.fromkeys(KEYS, 3):
            assert time.monotonic() < deadline, seen
            event = ws.receive(timeout=60)["payload"]["data"]["orderCountWatch"]
            assert not event["snapshot"] and event["value"] > (seen.get(event["key"]) or 0), (event, seen, first)
            seen[event["key"]] = event["value"]
            offsets.setdefault(event["position"]["partition"], []).append(event["position"]["offset"])
    assert all(found == sorted(found) for found in offsets.values())
    answer = served.post("query($k: [String!]!) { orderCount { getMany(keys: $k) } }", {"k": KEYS})
    assert answer["data"]["orderCount"]["getMany"] == [3] * len(KEYS)
