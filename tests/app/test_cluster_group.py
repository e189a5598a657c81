"""Kafka consumer-group membership with real nodes: a second node joins, partitions move and restore,
and every key answers with the same values on both nodes."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from iqgraph.examples.shop import build_app
from iqgraph.streaming.broker import EmbeddedBroker, free_port
from tests.app.cluster_nodes import NodeProcess, start_node, wait_ready, write_app_module
from tests.conftest import MakeTopic
from tests.streaming.ground_truth import expected
from tests.streaming.test_pipeline import START_MS, send

PARTITIONS = 6
GET_MANY = "query($k: [String!]!) { orderCount { getMany(keys: $k) } }"
NODES = "{ nodes { id state partitions { partition role state appliedOffset endOffset } } }"


def _start(home: Path, node_id: str) -> NodeProcess:
    port = free_port()
    flags = ["--advertised-url", f"http://127.0.0.1:{port}", "--membership", "kafka",
             "--group-session-timeout-ms", "2000"]  # fmt: skip
    return start_node(home, "groupapp", node_id, port, flags)


def _active(node: NodeProcess) -> dict[str, list[int]]:
    found = node.post(NODES)["data"]["nodes"]
    return {n["id"]: sorted(p["partition"] for p in n["partitions"] if p["role"] == "active") for n in found}


def test_a_second_node_takes_partitions_which_restore_and_answer_the_same(
    broker: EmbeddedBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(71, START_MS), 2_000))
    send(broker, topic, events)
    counts = expected(app, events).kv["order_count"]
    keys = sorted(counts)
    write_app_module(tmp_path, "groupapp", topic, PARTITIONS, broker.bootstrap_servers)
    first = _start(tmp_path, "node-a")
    second: NodeProcess | None = None
    try:
        wait_ready([first])
        assert _active(first) == {"node-a": list(range(PARTITIONS))}
        assert first.post(GET_MANY, {"k": keys})["data"]["orderCount"]["getMany"] == [counts[k] for k in keys]

        second = _start(tmp_path, "node-b")
        wait_ready([second])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            views = [_active(first), _active(second)]
            if views[0] == views[1] and len(views[0].get("node-b", [])) > 0 and len(views[0].get("node-a", [])) > 0:
                break
            time.sleep(1)
        else:
            pytest.fail(f"partitions did not move: {views}")
        moved = views[0]["node-b"]
        assert sorted(views[0]["node-a"] + moved) == list(range(PARTITIONS))
        wait_ready([first, second])
        restored = [p for p in second.post(NODES)["data"]["nodes"] if p["id"] == "node-b"][0]["partitions"]
        assert {p["partition"] for p in restored if p["role"] == "active"} == set(moved)
        assert all(p["state"] == "RUNNING" and p["appliedOffset"] == p["endOffset"] for p in restored)
        for node in (first, second):
            answer: dict[str, Any] = node.post(GET_MANY, {"k": keys})
            assert answer["data"]["orderCount"]["getMany"] == [counts[k] for k in keys], (node.id, answer.get("errors"))
    finally:
        for node in (first, second):
            if node is not None:
                node.kill()
