"""A stop writes nothing alarming: SIGTERM to a node in the middle of its micro-batches, subscribers connected over
a websocket and over SSE, leaves no traceback, warning or Java stack trace in its log, and the SSE stream ends with
its `complete` event (Ctrl-C of `iqgraph dev`: tests/app/dev/test_dev.py)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from tests.conftest import MakeTopic
from tests.support.nodes import start_node, stop_noise, wait_ready, write_app_module
from tests.support.transport_ws import TransportWS, websocket

pytestmark = pytest.mark.slow
KEYS = [f"customer-{i:04d}" for i in range(4)]
WATCH = "subscription($keys: [String!]!) { orderCountWatch(keys: $keys) { key value } }"


def orders(count: int) -> list[tuple[bytes, bytes, None]]:
    """Return count orders over KEYS."""
    found = []
    for i in range(count):
        key = KEYS[i % len(KEYS)]
        value = {"order_id": f"o-{i}", "customer": key, "item": "pen", "quantity": 1, "amount": 2.5}
        found.append((key.encode(), orjson.dumps({**value, "ts": "2026-01-01T00:00:00.000Z"}), None))
    return found


def test_sigterm_in_the_middle_of_batches_with_a_subscriber_logs_no_traceback_and_no_warning(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    # small batches over a backlog: the signal finds a micro-batch in flight (a Spark job, a checkpoint write,
    # the sink), where StreamingQuery.stop() alone interrupted it (Hadoop's "Interrupted while joining" with a
    # Java stack trace, "Lost task … TaskKilled")
    topic = make_topic(2, prefix="stop")
    write_app_module(tmp_path, "stopapp", topic, 2, broker.bootstrap_servers)
    node = start_node(tmp_path, "stopapp", "node-0", free_port(), ["--max-records-per-batch", "400"])
    try:
        wait_ready([node])
        streamed: list[str] = []  # an SSE subscriber's lines (graphql-sse's distinct connections mode)

        def follow_over_sse() -> None:
            body = {"query": WATCH, "variables": {"keys": KEYS}}
            with (
                httpx.Client(timeout=90) as client,
                client.stream("POST", f"{node.url}/graphql", json=body, headers={"accept": "text/event-stream"}) as r,
            ):
                streamed.extend(r.iter_lines())

        sse = threading.Thread(target=follow_over_sse, daemon=True)
        sse.start()
        with websocket(node.url.removeprefix("http://")) as raw:
            ws = TransportWS(raw)
            assert ws.init()["type"] == "connection_ack"
            ws.subscribe("1", WATCH, {"keys": KEYS})
            assert [ws.receive()["type"] for _ in KEYS] == ["next"] * len(KEYS)
            produce(broker.bootstrap_servers, topic, orders(20_000))
            changed = ws.receive(timeout=60)["payload"]["data"]["orderCountWatch"]  # batches are being applied
            assert changed["value"] is not None, changed
            mark = node.log.stat().st_size
            signalled = time.monotonic()
            node.process.send_signal(signal.SIGTERM)
            returncode = node.process.wait(60)
        took = time.monotonic() - signalled
        sse.join(10)
    finally:
        node.kill()
    log = node.log.read_text()
    assert returncode == 0, log[-3000:]
    assert "iqgraph: stopping: streaming queries, stores, Spark" in log[mark:], log[-3000:]
    assert stop_noise(log[mark:]) == [], log[mark:][-6000:]
    assert took < 30, f"stopped {took:.1f} s after SIGTERM"
    assert any(line.startswith("event: next") for line in streamed), streamed[:5]
    assert "event: complete" in streamed, streamed[-5:]  # the stream was ended, not cut (uvicorn's cancel)
