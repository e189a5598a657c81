"""``iqgraph demo``: the embedded broker, the shop example's orders produced continuously, one node.

It prints the GraphiQL URL and example queries to paste; Ctrl-C (or --duration) stops everything.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from iqgraph.app.node import Node
from iqgraph.app.producer import ONE_RECORD_PER_REQUEST, produce_events, producer_config
from iqgraph.app.server import build_asgi, graphql_app, run_until_signalled
from iqgraph.app.settings import Settings
from iqgraph.examples.shop import build_app
from iqgraph.streaming.broker import EmbeddedBroker
from iqgraph.streaming.definitions import App, KafkaSettings

HISTORY = 3_000  # orders produced before the node starts, so that the first queries find data
EXAMPLE_QUERIES = """\
# 1. What do we know about one customer? (point lookups, batched into one multi-get per store)
{ orderCount { get(key: "customer-0001") } totalSpend { get(key: "customer-0001") }
  latestOrder { get(key: "customer-0001") { orderId item amount ts } } }

# 2. Orders per minute for a customer, and a page of customers in key order
{ ordersPerMinute { fetch(key: "customer-0001", from: "2020-01-01T00:00:00Z", to: "2100-01-01T00:00:00Z")
    { start end value } }
  orderCount { range(from: "customer-0000", to: "customer-0099", first: 5) { edges { node { key value } }
    pageInfo { hasNextPage endCursor } } } }

# 3. Has this item been sold? And where does a key live, in Kafka Streams' nouns
{ itemsSold { mightContain(key: "widget") falsePositiveRate }
  keyMetadata(store: "orderCount", key: "customer-0001") { partition activeNode }
  node { id state partitions { partition state lag } } }
"""


def _orders(broker: EmbeddedBroker, rate: float) -> tuple[App, threading.Thread, threading.Event]:
    """Create the orders topic, produce the history, and return a producer thread (not started) and its stop."""
    app = build_app(kafka=KafkaSettings(bootstrap_servers=broker.bootstrap_servers))
    broker.create_topics({app.topics[0].name: app.topics[0].partitions})
    config = producer_config(app, broker.bootstrap_servers, ONE_RECORD_PER_REQUEST)
    print(f"iqgraph demo: broker at {broker.bootstrap_servers}; producing {HISTORY} orders of history", flush=True)
    produce_events(app, config, count=HISTORY, rate=None, seed=7, start_ms=int(time.time() * 1000) - HISTORY * 20)
    stop = threading.Event()
    producer = threading.Thread(
        target=produce_events,
        args=(app, config),
        kwargs={"count": None, "rate": rate, "seed": 8, "stop": stop},
        name="demo-producer",
        daemon=True,
    )
    return app, producer, stop


def run_demo(*, port: int, state_dir: Path | None, rate: float, duration: float, nodes: int = 1) -> int:
    """Run the demo until Ctrl-C or duration seconds; return the exit code."""
    if nodes > 1:
        return run_cluster_demo(port=port, state_dir=state_dir, rate=rate, duration=duration, nodes=nodes)
    with EmbeddedBroker() as broker:
        app, producer, stop = _orders(broker, rate)
        directory = state_dir or Path(tempfile.mkdtemp(prefix="iqgraph-demo-"))
        settings = Settings(
            app="iqgraph.examples.shop:app",
            port=port,
            state_dir=directory,
            bootstrap_servers=broker.bootstrap_servers,
            spark_master="local[2]",
            max_records_per_batch=20_000,
        )
        node = Node(settings, app)
        node.start(progress=lambda message: print(f"iqgraph demo: {message}", flush=True))
        producer.start()
        try:
            _serve(node, port, duration)
        finally:
            stop.set()
            producer.join(timeout=10)
            node.stop()
    return 0


def run_cluster_demo(*, port: int, state_dir: Path | None, rate: float, duration: float, nodes: int) -> int:
    """Run a static cluster of node processes (one standby each) on ports port, port+1, …"""
    with EmbeddedBroker() as broker:
        _, producer, stop = _orders(broker, rate)
        root = state_dir or Path(tempfile.mkdtemp(prefix="iqgraph-demo-"))
        urls = [f"http://127.0.0.1:{port + i}" for i in range(nodes)]
        peers = ",".join(f"node-{i}={url}" for i, url in enumerate(urls))
        processes = [_node_process(i, port + i, peers, broker.bootstrap_servers, root) for i in range(nodes)]
        try:
            print(f"iqgraph demo: starting {nodes} nodes (each starts its own Spark; logs in {root})", flush=True)
            _wait_ready(urls, processes)
            producer.start()
            print("\niqgraph demo: any node answers any query — keys of other nodes are forwarded:", flush=True)
            for i, url in enumerate(urls):
                print(f"  node-{i}: {url}/graphql", flush=True)
            print("\nPaste one of these into any node's GraphiQL:\n", flush=True)
            print(EXAMPLE_QUERIES + "\n{ nodes { id state partitions { partition role lag } } }\n", flush=True)
            print("Ctrl-C stops the demo.", flush=True)
            _wait(duration, processes)
        finally:
            stop.set()
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
    return 0


def _node_process(index: int, port: int, peers: str, bootstrap: str, root: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "iqgraph.app.cli",
        "serve",
        "--app",
        "iqgraph.examples.shop:app",
        "--bootstrap-servers",
        bootstrap,
        "--node-id",
        f"node-{index}",
        "--port",
        str(port),
        "--peers",
        peers,
        "--standbys",
        "1",
        "--max-lag",
        "100000",
        "--state-dir",
        str(root / f"node-{index}"),
        "--spark-master",
        "local[1]",
        "--driver-memory",
        "768m",
        "--max-records-per-batch",
        "20000",
    ]
    log = (root / f"node-{index}.log").open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603 - our own CLI


def _wait_ready(urls: list[str], processes: list[subprocess.Popen[bytes]], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    pending = set(urls)
    while pending:
        for url, process in zip(urls, processes, strict=True):
            if process.poll() is not None:
                raise RuntimeError(f"the node at {url} exited with {process.returncode}; see its log")
            if url in pending and _ready(url):
                pending.discard(url)
                print(f"iqgraph demo: {url} is ready", flush=True)
        if time.monotonic() > deadline:
            raise RuntimeError(f"nodes not ready after {timeout:.0f} s: {sorted(pending)}")
        time.sleep(1)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(duration: float, processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + duration if duration > 0 else None
    try:
        while deadline is None or time.monotonic() < deadline:
            if any(p.poll() is not None for p in processes):
                print("iqgraph demo: a node stopped; stopping the demo", flush=True)
                return
            time.sleep(0.5)
    except KeyboardInterrupt:
        return


def _serve(node: Node, port: int, duration: float) -> None:
    server = uvicorn.Server(
        uvicorn.Config(build_asgi(node, graphql_app(node)), host="127.0.0.1", port=port, log_level="warning")
    )
    print(f"\niqgraph demo: GraphiQL at http://127.0.0.1:{port}/graphql — paste one of these:\n", flush=True)
    print(EXAMPLE_QUERIES, flush=True)
    print("Ctrl-C stops the demo.", flush=True)
    if duration > 0:
        threading.Timer(duration, lambda: setattr(server, "should_exit", True)).start()
    run_until_signalled(server)
