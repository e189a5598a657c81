"""Bad input against a real `iqgraph serve` node (issue 11, "Bad input"): each gets its coded error in bounded
time and memory while a background client keeps querying and keeps being answered; a request past its
deadline is 504 TIMEOUT; a client that goes away has its work cancelled; and one keep-alive connection
answers every request with its own response while other clients abandon theirs around it (the regression
test of the "HTTP 294" seen in the failover test).

The node's app is the shop with one owner-side field, ``slow``, that sleeps SLOW_S seconds: a request held
for longer than the node's deadline (``--request-timeout-ms``).
"""

from __future__ import annotations

import hashlib
import itertools
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from iqgraph.examples.shop import build_app
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from tests.conftest import MakeTopic
from tests.support.nodes import NodeProcess, start_node, wait_ready
from tests.support.pipeline import START_MS

PARTITIONS = 2
TIMEOUT_MS = 2_000
SLOW_S = 3.0
SLOW = '{ slow(key: "customer-01") }'
QUERY = "{ orderCount { count } }"
MB = 1 << 20
API_KEY = "bad-input-test-key"


def _write_app(home: Path, topic: str, bootstrap: str) -> None:
    (home / "guardapp.py").write_text(
        textwrap.dedent(f"""
        import dataclasses, time
        from iqgraph.examples.shop import build_app
        from iqgraph.streaming.definitions import KafkaSettings
        from iqgraph.streaming.owner_fields import owner_field

        @owner_field("order_count", returns="bigint", timeout_s=4.0)
        def slow(key, views):
            time.sleep({SLOW_S})
            return 1

        shop = build_app({topic!r}, {PARTITIONS}, KafkaSettings(bootstrap_servers={bootstrap!r}))
        app = dataclasses.replace(shop, fields=[slow])
        """)
    )


@pytest.fixture(scope="module")
def node(broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    topic = make_topic(PARTITIONS, prefix="orders")
    generator = build_app(topic, PARTITIONS).generator
    assert generator is not None
    events = itertools.islice(generator(11, START_MS), 200)
    produce(broker.bootstrap_servers, topic, [(k.encode(), orjson.dumps(v), None) for k, v in events])
    home = tmp_path_factory.mktemp("bad-input")
    _write_app(home, topic, broker.bootstrap_servers)
    flags = ["--request-timeout-ms", str(TIMEOUT_MS), "--verbose"]  # --verbose: the cancelled work's INFO line
    keys = home / "keys.toml"
    keys.write_text(f'[keys.tests]\nsha256 = "{hashlib.sha256(API_KEY.encode()).hexdigest()}"\nscopes = ["read:*"]\n')
    env = {"IQGRAPH_AUTH": "api-key", "IQGRAPH_API_KEYS": str(keys)}  # clients authenticate: bad tokens are 401
    process = start_node(home, "guardapp", "node-b", free_port(), flags, env, {"x-api-key": API_KEY})
    try:
        wait_ready([process])
        yield process
    finally:
        process.kill()


def rss_mb(node: NodeProcess) -> float:
    """Return the node process's resident memory in MB."""
    for line in Path(f"/proc/{node.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@dataclass
class Background:
    """A client thread querying the node all along: what it got and how long each answer took."""

    node: NodeProcess
    answers: list[tuple[int, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Background:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.node.url, timeout=30, headers=self.node.headers) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    status = client.post("/graphql", json={"query": QUERY}).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((status, time.monotonic() - started))
                self._stop.wait(0.02)


def code(response: httpx.Response) -> str:
    return str(response.json()["errors"][0]["extensions"]["code"])


def _chunks(total: int) -> Iterator[bytes]:
    yield b'{"query": "'
    for _ in range(total // (64 << 10)):
        yield b"x" * (64 << 10)
    yield b'"}'


def _query(text: str) -> dict[str, Any]:
    return {"json": {"query": text}}


def bad_inputs() -> list[tuple[str, dict[str, Any], int, str | None]]:
    """Return each bad input: its name, the POST's arguments, and the status and code it must get."""
    json_type = {"content-type": "application/json"}
    deep_json = b'{"query": "{ node { id } }", "variables": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    nested = "{" + "orderCount { " * 10_000 + "count" + " }" * 10_000 + "}"
    aliased = "{ " + " ".join(f"a{i}: orderCount {{ count }}" for i in range(10_000)) + " }"
    malformed = {"x-api-key": b"\xff\xfe.!.@"}  # in place of the client's valid key
    parse_failed = (400, "GRAPHQL_PARSE_FAILED")
    return [
        ("malformed key", {**_query(QUERY), "headers": malformed}, 401, "UNAUTHENTICATED"),
        ("1 MB of headers", {**_query(QUERY), "headers": {"x-huge": "x" * MB}}, 431, "LIMIT_EXCEEDED"),
        ("50 MB body", {"content": b"x" * (50 * MB), "headers": json_type}, 413, "LIMIT_EXCEEDED"),
        ("50 MB chunked", {"content": _chunks(50 * MB), "headers": json_type}, 413, "LIMIT_EXCEEDED"),
        ("10,000 levels", _query(nested), *parse_failed),
        ("10,000 aliases", _query(aliased), *parse_failed),  # more tokens than a document may have
        ("30,000 tokens", _query("{ orderCount { " + "count " * 30_000 + "} }"), *parse_failed),
        ("20,000 tokens", _query("{ orderCount { " + "count " * 19_990 + "} }"), 400, "GRAPHQL_VALIDATION_FAILED"),
        ("JSON 100,000 deep", {"content": deep_json, "headers": json_type}, 400, "BAD_REQUEST"),
    ]


@pytest.mark.slow
def test_bad_input_is_refused_coded_and_bounded_while_queries_answer(node: NodeProcess) -> None:
    timings: dict[str, float] = {}
    grown: dict[str, float] = {}
    spec = {**node.headers, "accept": "application/graphql-response+json"}  # a legacy client's errors are 200s
    with Background(node) as background, httpx.Client(base_url=node.url, timeout=60, headers=spec) as client:
        time.sleep(1)
        for name, request, status, error in bad_inputs():
            before, started = rss_mb(node), time.monotonic()
            response = client.post("/graphql", **request)
            timings[name] = time.monotonic() - started
            grown[name] = rss_mb(node) - before
            assert response.status_code == status, (name, response.text[:300])
            if error is not None:
                assert "data" not in response.json() and code(response) == error, (name, response.text[:300])
        time.sleep(1)
    print("\nbad input (s, RSS MB):", {n: (round(timings[n], 3), round(grown[n], 1)) for n in timings})
    assert all(t < 5 for t in timings.values()), timings
    assert sum(grown.values()) < 200, grown
    statuses = {s for s, _ in background.answers}
    assert statuses == {200} and len(background.answers) > 20, statuses
    assert max(t for _, t in background.answers) < 5


@pytest.mark.slow
def test_distinct_documents_do_not_pile_up_in_memory(node: NodeProcess) -> None:
    """Each different, ~16 KB and 2,600 tokens: ~3 MB as a syntax tree, which the caches of documents keep
    (it parses; its validation stops at the merging budget): 150 of them 240 MB, a thousand 1.6 GB."""
    before = rss_mb(node)
    spec = {**node.headers, "accept": "application/graphql-response+json"}
    with httpx.Client(base_url=node.url, timeout=60, headers=spec) as client:
        for i in range(150):
            query = "{ orderCount { " + "count " * 2_600 + f"}} }} # {i}"
            response = client.post("/graphql", json={"query": query})
            assert response.status_code == 400 and code(response) == "GRAPHQL_VALIDATION_FAILED", response.text
    assert rss_mb(node) - before < 100


@pytest.mark.slow
def test_a_request_past_its_deadline_is_504_timeout(node: NodeProcess) -> None:
    started = time.monotonic()
    response = httpx.post(f"{node.url}/graphql", json={"query": SLOW}, timeout=30, headers=node.headers)
    took = time.monotonic() - started
    assert response.status_code == 504 and code(response) == "TIMEOUT", response.text
    assert TIMEOUT_MS / 1000 <= took < TIMEOUT_MS / 1000 + 1
    assert httpx.post(f"{node.url}/graphql", json={"query": QUERY}, headers=node.headers).status_code == 200


def _post_raw(url: str, query: str, extra: bytes = b"") -> socket.socket:
    """Send a POST of query on a new connection; return the socket (the answer unread)."""
    host, port = url.removeprefix("http://").split(":")
    body = orjson.dumps({"query": query})
    raw = socket.create_connection((host, int(port)))
    head = (
        f"POST /graphql HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"x-api-key: {API_KEY}\r\n"
    )
    raw.sendall(head.encode() + extra + b"\r\n" + body)
    return raw


@pytest.mark.slow
def test_a_client_gone_has_its_work_cancelled_and_others_are_answered(node: NodeProcess) -> None:
    logged = node.log.read_text().count("the client went away before the answer")
    raw = _post_raw(node.url, SLOW)
    time.sleep(0.5)
    raw.close()
    deadline = time.monotonic() + 10
    while node.log.read_text().count("the client went away before the answer") == logged:
        assert time.monotonic() < deadline, "the node did not log the cancelled work"
        time.sleep(0.1)
    assert "POST /graphql: the client went away before the answer: its work cancelled" in node.log.read_text()
    with httpx.Client(base_url=node.url, headers=node.headers) as client:
        assert all(client.post("/graphql", json={"query": QUERY}).status_code == 200 for _ in range(5))


def _abandon(url: str, stop: threading.Event) -> None:
    """Keep starting requests and going away before their answer, each on a new connection (a slow one a second:
    its function sleeps on in a worker thread, and the node has four)."""
    for i in itertools.count():
        if stop.is_set():
            return
        raw = _post_raw(url, SLOW if i % 10 == 0 else QUERY)
        time.sleep(0.3 if i % 10 == 0 else 0.0)
        raw.close()
        stop.wait(0.07)


@pytest.mark.slow
def test_one_keep_alive_connection_gets_each_request_its_own_response(node: NodeProcess) -> None:
    """Every answer parses and is the one asked for (its alias), around 504s and clients going away."""
    stop = threading.Event()
    abandoning = [threading.Thread(target=_abandon, args=(node.url, stop), daemon=True)]
    for thread in abandoning:
        thread.start()
    ports: set[int] = set()
    try:
        limits = httpx.Limits(max_connections=1)
        with httpx.Client(base_url=node.url, timeout=30, limits=limits, headers=node.headers) as client:
            for i in range(400):
                query = SLOW if i % 100 == 50 else f"{{ r{i}: __typename n{i}: orderCount {{ count }} }}"
                response = client.post("/graphql", json={"query": query})
                stream = response.extensions["network_stream"]
                ports.add(stream.get_extra_info("socket").getsockname()[1])
                if query == SLOW:
                    assert response.status_code == 504 and code(response) == "TIMEOUT", response.text
                else:
                    assert response.status_code == 200, response.text
                    data = response.json()["data"]
                    assert data[f"r{i}"] == "Query" and data[f"n{i}"]["count"] > 0, response.text
    finally:
        stop.set()
        for thread in abandoning:
            thread.join(10)
    assert len(ports) == 1, f"the connection was not kept alive: {len(ports)} connections"
