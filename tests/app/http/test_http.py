"""One HTTP suite against a real `iqgraph serve` process: real uvicorn, real Spark, the real broker.

The events are produced as a new user would: confluent-kafka with its DEFAULT partitioner
(consistent_random, CRC32 — not the Java client's murmur2), and the app leaves its partitioner at
``auto``. Values read over HTTP equal a Python computation over the produced events; bad requests get GraphQL
errors with codes, never a 500 or a traceback; SIGTERM shuts the node down cleanly.
"""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from iqgraph.examples.shop import build_app
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from iqgraph.streaming.partitioner import crc32_partition
from tests.conftest import MakeTopic
from tests.support.ground_truth import Expected, expected
from tests.support.nodes import start_serve, wait_ready, write_app_module
from tests.support.pipeline import START_MS

LIBRDKAFKA_DEFAULT_PARTITIONER = "consistent_random"

ROOT = Path(__file__).resolve().parents[3]
PARTITIONS = 3
EVENTS = 3_000


@dataclass
class Served:
    url: str
    process: subprocess.Popen[str]
    events: list[tuple[str, dict[str, Any]]]
    truth: Expected
    log: Path

    def post(self, query: str, variables: dict[str, Any] | None = None) -> httpx.Response:
        return httpx.post(f"{self.url}/graphql", json={"query": query, "variables": variables or {}}, timeout=30)

    def data(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        body = self.post(query, variables).json()
        assert "errors" not in body, body
        return body["data"]


@pytest.fixture(scope="module")
def served(broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(41, START_MS), EVENTS))
    # librdkafka's default partitioner (no setting): produce() otherwise sets the Java client's murmur2
    records = [(k.encode(), orjson.dumps(v), None) for k, v in events]
    produce(broker.bootstrap_servers, topic, records, {"partitioner": LIBRDKAFKA_DEFAULT_PARTITIONER})
    home = tmp_path_factory.mktemp("served")
    write_app_module(home, "httpapp", topic, PARTITIONS, broker.bootstrap_servers)
    flags = [
        "--state-dir", str(home / "state"), "--spark-master", "local[2]", "--max-keys", "600", "--max-page-size", "200",
    ]  # fmt: skip
    node = start_serve(home, "httpapp", free_port(), flags, log=home / "serve.log")
    try:
        wait_ready([node], timeout=240)
        yield Served(node.url, node.process, events, expected(app, events), node.log)
    finally:
        node.kill()


def test_values_over_http_equal_the_ground_truth(served: Served) -> None:
    counts = served.truth.kv["order_count"]
    keys = sorted(counts)
    data = served.data(
        "query($keys: [String!]!) { orderCount { getMany(keys: $keys) } totalSpend { getMany(keys: $keys) }"
        " averageOrder { getMany(keys: $keys) } largestOrder { getMany(keys: $keys) } }",
        {"keys": keys},
    )
    assert data["orderCount"]["getMany"] == [counts[k] for k in keys]
    spend = served.truth.kv["total_spend"]
    assert data["totalSpend"]["getMany"] == pytest.approx([spend[k] for k in keys], rel=1e-9)
    average = served.truth.kv["average_order"]
    assert data["averageOrder"]["getMany"] == pytest.approx([average[k] for k in keys], rel=1e-9)
    assert data["largestOrder"]["getMany"] == [served.truth.kv["largest_order"][k] for k in keys]


def test_the_producers_partitioner_is_detected_and_routes_every_key(served: Served) -> None:
    stores = served.data("{ stores { name partitioner } }")["stores"]
    assert {s["name"]: s["partitioner"] for s in stores}["order_count"] == "consistent_random"
    key = sorted(served.truth.kv["order_count"])[0]
    meta = served.data(f'{{ keyMetadata(store: "order_count", key: "{key}") {{ partition }} }}')
    assert meta["keyMetadata"]["partition"] == crc32_partition(key.encode(), PARTITIONS)
    rest = httpx.get(f"{served.url}/stores/order_count/keys/{key}", timeout=30)
    assert rest.json()["value"] == served.truth.kv["order_count"][key]
    assert httpx.get(f"{served.url}/stores/order_count/keys/nobody", timeout=30).status_code == 404


def test_windows_and_latest_over_http(served: Served) -> None:
    key = sorted(served.truth.kv["order_count"])[0]
    data = served.data(
        "query($k: String!) { ordersPerMinute { fetch(key: $k) { start value } }"
        " latestOrder { get(key: $k) { orderId amount } } }",
        {"k": key},
    )
    windows = {(k, s): v for (k, s), v in served.truth.windows["orders_per_minute"].items() if k == key}
    assert [w["value"] for w in data["ordersPerMinute"]["fetch"]] == [windows[w] for w in sorted(windows)]
    latest = served.truth.kv["latest_order"][key]
    assert data["latestOrder"]["get"] == {"orderId": latest["order_id"], "amount": latest["amount"]}


def test_range_pages_over_http_cover_every_key_once(served: Served) -> None:
    seen: list[str] = []
    after = None
    while True:
        page = served.data(
            "query($after: String) { orderCount { all(first: 37, after: $after) {"
            " edges { node { key } } pageInfo { hasNextPage endCursor } } } }",
            {"after": after},
        )["orderCount"]["all"]
        seen += [e["node"]["key"] for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == sorted(served.truth.kv["order_count"])


def test_get_queries_graphiql_and_probes(served: Served) -> None:
    response = httpx.get(f"{served.url}/graphql", params={"query": "{ node { id state } }"})
    assert response.json() == {"data": {"node": {"id": "node-0", "state": "RUNNING"}}}
    assert "GraphiQL" in httpx.get(f"{served.url}/graphql", headers={"accept": "text/html"}).text
    assert httpx.get(f"{served.url}/healthz").json()["status"] == "alive"
    assert httpx.get(f"{served.url}/readyz").status_code == 200


def test_long_steps_show_progress(served: Served) -> None:
    deadline = time.monotonic() + 30
    while "partitions are queryable" not in served.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    output = served.log.read_text()
    for step in ("checking Kafka", "starting Spark", "Spark ready in", "partitions are queryable", "serving shop"):
        assert step in output, output
    assert re.search(r"partitions are queryable: ready \d+\.\d s after start", output), output


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "BAD_REQUEST"),
        (b'{"query": "{ orderCount { get(key: "}', "GRAPHQL_PARSE_FAILED"),
        (b'{"query": "{ nope }"}', "GRAPHQL_VALIDATION_FAILED"),
        (b'{"query": "{ orderCount { get(key: 5) } }"}', "GRAPHQL_VALIDATION_FAILED"),
        (b'{"query": "{ orderCount { all(first: 5000) { pageInfo { hasNextPage } } } }"}', "LIMIT_EXCEEDED"),
        (
            b'{"query": "{ orderCount { all(first: 5, after: \\"forged\\") { pageInfo { hasNextPage } } } }"}',
            "INVALID_CURSOR",
        ),
    ],
)
def test_bad_requests_get_graphql_errors_with_codes(served: Served, body: bytes, code: str) -> None:
    response = httpx.post(f"{served.url}/graphql", content=body, headers={"content-type": "application/json"})
    assert response.status_code < 500
    payload = response.json()
    assert [e["extensions"]["code"] for e in payload["errors"]] == [code], payload
    assert "Traceback" not in response.text


def test_too_many_keys_is_limit_exceeded(served: Served) -> None:
    body = served.post(
        "query($k: [String!]!) { orderCount { getMany(keys: $k) } }", {"k": [f"c-{i}" for i in range(601)]}
    ).json()
    assert body["errors"][0]["extensions"]["code"] == "LIMIT_EXCEEDED"


def test_sigterm_stops_the_node_cleanly(served: Served) -> None:
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(timeout=60) == 0
    output = served.log.read_text()
    assert "Traceback" not in output, output[-3000:]
