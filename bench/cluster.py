"""Cluster query speed: one getMany of 1,000 keys spread over 3 nodes, against all-local and per-key forwarding.

One run, all on this machine:

1. produce ``--events`` generated shop orders, batched, into a 6-partition topic of an embedded Apache Kafka
   broker (``streaming.apache_kafka.KafkaBroker``);
2. start 3 nodes of one static cluster (``iqgraph serve`` subprocesses, ``local[1]`` Spark each, as the
   cluster tests do; node i is active for the partitions p with p % 3 == i) and wait until node-0 answers
   every customer's order count as the events give;
3. time sequential requests, after a few warm-ups, each answer checked:
   - cluster: ONE ``getMany`` of 1,000 keys sent to node-0 — the 500 shop customers ``customer-0000``..
     ``customer-0499`` (existing or not) and 500 that never exist (``customer-0500``..``customer-0999``);
     murmur2 spreads them over the 3 nodes, so node-0 forwards one sub-request to each peer;
   - all-local: the same query of 1,000 keys that all live on node-0 (its shop customers, then absent
     ``customer-NNNN`` keys past 0999 whose partition is node-0's); cluster and all-local alternate, so
     that both see the same background load (the nodes' streaming queries keep polling the broker);
   - naive per-key forwarding, as a hand-built layer would do it: node-0's own keys in one getMany to
     node-0, and ONE request per remote key to its owner (``{ orderCount { get(key: …) } }``, marked as
     forwarded so that the owner answers from its own partitions), three ways: sequentially over the
     standard library's ``http.client`` (the lightest client: a lower bound of the naive cost),
     sequentially over one long-lived ``httpx.AsyncClient`` (what a Python layer — and our own peer
     client — forwards with), and over httpx with ``--naive-concurrency`` requests in flight (gather);
4. check with GET /metrics on every node that one cluster query made exactly one forwarded request per
   peer (and none else), and that the timed series did the same per query;
5. a summary, and as the last line one JSON object with every figure.

The cluster and all-local queries go over keep-alive ``http.client`` connections: little client work, so
that what is timed is the servers. The naive clients talk to the owners directly — one hop fewer than a
layer inside node-0 would make — which flatters them.

Targets (printed, not asserted; the query-speed issue's): cluster p50 ≤ 1.5× all-local p50; per-key
forwarding (sequential) p50 ≥ 100× cluster p50 — judged on httpx, and shown for the lean client too;
cluster p50 ≤ 15 ms.

Usage: ``make bench-cluster`` or ``.venv/bin/python bench/cluster.py [--events N] [--samples S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; put the repository ahead of it.
sys.path.insert(0, str(ROOT))

from iqgraph.examples.shop import CUSTOMERS, generate_orders  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import produce  # noqa: E402
from iqgraph.streaming.partitioner import partition_for  # noqa: E402
from tests.support.nodes import NodeProcess, Scrape, start_nodes, wait_ready, write_app_module  # noqa: E402

PARTITIONS = 6
NODES = 3
KEYS = 1_000
SEED = 11
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FIELD = "orderCount"
GET_MANY = f"query($k: [String!]!) {{ {FIELD} {{ getMany(keys: $k) }} }}"
GET_ONE = f"query($k: String!) {{ {FIELD} {{ get(key: $k) }} }}"
APP_MODULE = "bench_cluster_app"
TARGET_LOCAL_RATIO = 1.5
TARGET_NAIVE_RATIO = 100.0
TARGET_P50_MS = 15.0

Values = list[int | None]


# -- keys ------------------------------------------------------------------------------------------------


def owner(key: str) -> int:
    """Return the index of the node active for key's partition."""
    return partition_for(key, PARTITIONS, "string", "murmur2") % NODES


def spread_keys() -> list[str]:
    """Return the shop customers (existing or not), then 500 keys that never exist: over every node."""
    return [f"customer-{i:04d}" for i in range(2 * CUSTOMERS)]


def local_keys(node: int) -> list[str]:
    """Return 1,000 keys that all live on node: its shop customers first, then absent ones past 0999."""
    names = (f"customer-{i:04d}" for i in itertools.count())
    return list(itertools.islice((k for k in names if owner(k) == node), KEYS))


# -- the cluster -----------------------------------------------------------------------------------------


def produce_orders(bootstrap: str, topic: str, events: int) -> Counter[str]:
    """Produce the bench's orders; return the order count per customer they give."""
    orders = [(str(k), v) for k, v in itertools.islice(generate_orders(SEED, START_MS), events)]
    produce(bootstrap, topic, ((k.encode(), orjson.dumps(v), None) for k, v in orders))
    return Counter(k for k, _ in orders)


def wait_caught_up(client: Client, url: str, counts: Counter[str], timeout: float) -> None:
    """Wait until the cluster answers every customer's order count as the events give."""
    keys = spread_keys()
    expected = [counts.get(k) for k in keys]
    deadline = time.monotonic() + timeout
    answer: Any = None
    while time.monotonic() < deadline:
        answer = client.graphql(url, GET_MANY, {"k": keys})
        if not answer.get("errors") and answer["data"][FIELD]["getMany"] == expected:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the cluster did not catch up in {timeout:.0f} s: {str(answer)[:500]}")


def stop_nodes(nodes: Sequence[NodeProcess], timeout: float = 45.0) -> None:
    """Stop every node gracefully (SIGINT: the node stops Spark and closes RocksDB); kill one that hangs."""
    for node in nodes:
        if node.process.poll() is None:
            node.process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + timeout
    for node in nodes:
        try:
            node.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.kill()


def log_tail(node: NodeProcess, lines: int = 25) -> str:
    """Return the end of a node's log without its repeated restore-progress lines."""
    text = node.log.read_text(errors="replace").splitlines()
    return "\n".join([line for line in text if "iqgraph: restoring" not in line][-lines:])


# -- the client ------------------------------------------------------------------------------------------


class Client:
    """Keep-alive HTTP/1.1 connections, one per node, over the standard library (little client overhead)."""

    def __init__(self) -> None:
        self._connections: dict[str, http.client.HTTPConnection] = {}

    def post(self, url: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
        """Return the decoded JSON answer of a POST to url's /graphql (reconnecting once if the server hung up)."""
        headers = {"content-type": "application/json", **(headers or {})}
        for attempt in (1, 2):
            connection = self._connections.get(url)
            if connection is None:
                host, port = url.removeprefix("http://").split(":")
                connection = self._connections[url] = http.client.HTTPConnection(host, int(port), timeout=60)
            try:
                connection.request("POST", "/graphql", body, headers)
                return orjson.loads(connection.getresponse().read())
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # uvicorn closes keep-alive connections idle for 5 s
                connection.close()
                del self._connections[url]
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def graphql(self, url: str, query: str, variables: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        """Return the answer of one GraphQL request."""
        return self.post(url, orjson.dumps({"query": query, "variables": variables}), headers)

    def close(self) -> None:
        """Close every connection."""
        for connection in self._connections.values():
            connection.close()


def get_many(client: Client, url: str, keys: list[str]) -> Values:
    """Return the order count of each key, asking url once; raise on errors."""
    answer = client.graphql(url, GET_MANY, {"k": keys})
    if answer.get("errors"):
        raise RuntimeError(f"getMany answered errors: {str(answer['errors'])[:500]}")
    values: Values = answer["data"][FIELD]["getMany"]
    return values


def naive_sequential(client: Client, urls: list[str], keys: list[str]) -> Values:
    """Return the order count of each key: node-0's keys in one request, then each other key from its owner."""
    owners = [owner(k) for k in keys]
    values: Values = [None] * len(keys)
    local = [i for i, o in enumerate(owners) if o == 0]
    for i, value in zip(local, get_many(client, urls[0], [keys[i] for i in local]), strict=True):
        values[i] = value
    for i, key in enumerate(keys):
        if owners[i] != 0:
            answer = client.graphql(urls[owners[i]], GET_ONE, {"k": key}, {})
            if answer.get("errors"):
                raise RuntimeError(f"get({key}) answered errors: {answer['errors']}")
            values[i] = answer["data"][FIELD]["get"]
    return values


class HttpxLayer:
    """A hand-built forwarding layer in Python: one long-lived httpx.AsyncClient (as our peer client), one loop."""

    def __init__(self, urls: list[str], concurrency: int) -> None:
        self.urls = urls
        self.concurrency = concurrency
        self.loop = asyncio.new_event_loop()
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.AsyncClient(limits=limits, timeout=60)

    def fetch(self, keys: list[str]) -> Values:
        """Return the order count of each key: node-0's in one getMany, every other key from its owner."""
        return self.loop.run_until_complete(self._fetch(keys))

    async def _ask(self, gate: asyncio.Semaphore, url: str, query: str, key: Any, headers: dict[str, str]) -> Any:
        async with gate:
            body = {"query": query, "variables": {"k": key}}
            response = await self.client.post(f"{url}/graphql", json=body, headers=headers)
        answer = orjson.loads(response.content)
        if answer.get("errors"):
            raise RuntimeError(f"{str(key)[:80]} answered errors: {answer['errors']}")
        return answer["data"][FIELD]

    async def _fetch(self, keys: list[str]) -> Values:
        """Await one request after the other with concurrency 1, else gather them, that many in flight."""
        owners = [owner(k) for k in keys]
        local = [i for i, o in enumerate(owners) if o == 0]
        remote = [i for i, o in enumerate(owners) if o != 0]
        gate = asyncio.Semaphore(self.concurrency)
        mine = self._ask(gate, self.urls[0], GET_MANY, [keys[i] for i in local], {})
        theirs = (self._ask(gate, self.urls[owners[i]], GET_ONE, keys[i], {}) for i in remote)
        if self.concurrency == 1:
            answers = [await mine, *[await ask for ask in theirs]]
        else:
            answers = await asyncio.gather(mine, *theirs)
        values: Values = [None] * len(keys)
        for i, value in zip(local, answers[0]["getMany"], strict=True):
            values[i] = value
        for i, answer in zip(remote, answers[1:], strict=True):
            values[i] = answer["get"]
        return values

    def close(self) -> None:
        """Close the client and the loop."""
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


# -- timing ----------------------------------------------------------------------------------------------


def timed(fetch: Callable[[], Values], expected: Values) -> float:
    """Return the ms one fetch took; raise when it answered wrongly."""
    started = time.perf_counter()
    values = fetch()
    took = (time.perf_counter() - started) * 1000
    if values != expected:
        wrong = [(i, v, e) for i, (v, e) in enumerate(zip(values, expected, strict=True)) if v != e]
        raise RuntimeError(f"wrong answers (index, got, expected): {wrong[:5]} of {len(wrong)}")
    return took


def series(
    fetches: dict[str, tuple[Callable[[], Values], Values]], samples: int, warmups: int
) -> dict[str, list[float]]:
    """Time each fetch samples times, alternating between them, after warmups each; return ms per fetch."""
    for fetch, expected in fetches.values():
        for _ in range(warmups):
            timed(fetch, expected)
    times: dict[str, list[float]] = {name: [] for name in fetches}
    for _ in range(samples):
        for name, (fetch, expected) in fetches.items():
            times[name].append(timed(fetch, expected))
    return times


def forwarded(nodes: Sequence[NodeProcess]) -> list[Scrape]:
    """Return every node's /metrics."""
    return [node.metrics() for node in nodes]


def _received(scrape: Scrape) -> float:
    name = "iqgraph_forwarded_received_total"
    return sum(scrape.value(name, **labels) for labels in scrape.labels(name))


def forwarded_delta(before: list[Scrape], after: list[Scrape], urls: list[str]) -> dict[str, Any]:
    """Return what node-0 sent to each peer and what each node received from anyone, between two scrapes."""
    name = "iqgraph_forwarded_sent_total"
    sent = {
        f"node-{i}": after[0].value(name, peer=f"node-{i}") - before[0].value(name, peer=f"node-{i}")
        for i in range(1, len(urls))
    }
    received = {f"node-{i}": _received(a) - _received(b) for i, (a, b) in enumerate(zip(after, before, strict=True))}
    return {"sent_by_node_0": sent, "received": received}


def one_request_per_peer(delta: dict[str, Any], queries: int) -> bool:
    """Return whether queries cluster queries made exactly one forwarded request per peer each, and no other."""
    peers = [f"node-{i}" for i in range(1, NODES)]
    return all(delta["sent_by_node_0"][p] == queries for p in peers) and delta["received"] == {
        "node-0": 0,
        **{p: queries for p in peers},
    }


# -- report ----------------------------------------------------------------------------------------------


def percentile(values: list[float], q: int) -> float:
    """Return the q-th percentile of values (inclusive method)."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def latency(values: list[float]) -> dict[str, Any]:
    """Return p50, p99 and mean of values in ms."""
    return {
        "p50_ms": round(percentile(values, 50), 2),
        "p99_ms": round(percentile(values, 99), 2),
        "mean_ms": round(statistics.fmean(values), 2),
        "samples": len(values),
    }


def machine() -> dict[str, object]:
    """Return what the figures depend on besides the code."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_1min": round(os.getloadavg()[0], 2),
    }


NAIVE = {
    "naive_sequential": "naive per key, sequential, lean client (http.client): the lower bound",
    "naive_httpx_sequential": "naive per key, sequential, httpx (as a Python layer forwards)",
    "naive_httpx_concurrent": "naive per key, httpx, {n} in flight",
}


def ratios_and_targets(lat: dict[str, Any]) -> tuple[dict[str, float], dict[str, bool]]:
    """Return the ratios between the p50s, and which targets they meet."""
    cluster = lat["cluster"]["p50_ms"]
    ratios = {"cluster_over_all_local": round(cluster / lat["all_local"]["p50_ms"], 2)}
    ratios |= {f"{name}_over_cluster": round(lat[name]["p50_ms"] / cluster, 1) for name in NAIVE}
    met = {
        "cluster_over_all_local": ratios["cluster_over_all_local"] <= TARGET_LOCAL_RATIO,
        "naive_httpx_sequential_over_cluster": ratios["naive_httpx_sequential_over_cluster"] >= TARGET_NAIVE_RATIO,
        "naive_sequential_over_cluster": ratios["naive_sequential_over_cluster"] >= TARGET_NAIVE_RATIO,
        "cluster_p50": cluster <= TARGET_P50_MS,
    }
    return ratios, met


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Print the human-readable summary, then the JSON summary as the last line."""
    lat, keys, fwd = figures["latency"], figures["keys"], figures["forwarded"]
    ratios, met = ratios_and_targets(lat)
    met["one_forwarded_request_per_peer"] = fwd["one_query_ok"] and fwd["series_ok"]
    print(f"\ncluster bench: {args.events:,} shop orders, {PARTITIONS} partitions, {NODES} nodes (local[1] each), "
          f"{machine()}")  # fmt: skip
    print(f"getMany of {KEYS:,} keys sent to node-0: spread {keys['spread_per_node']} over the nodes "
          f"({keys['spread_existing']} existing); all-local: {keys['local_existing']} existing")  # fmt: skip
    labels = {"cluster": "cluster: ONE getMany", "all_local": "all-local: ONE getMany"}
    labels |= {name: label.format(n=args.naive_concurrency) for name, label in NAIVE.items()}
    print(f"{'':<68}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'n':>5}")
    for name, label in labels.items():
        row = lat[name]
        print(f"{label:<68}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['mean_ms']:>9.2f}{row['samples']:>5}")
    print(f"cluster / all-local               {ratios['cluster_over_all_local']:>7.2f}×  target ≤ "
          f"{TARGET_LOCAL_RATIO:g}×")  # fmt: skip
    for name in NAIVE:
        print(f"{name + ' / cluster':<34}{ratios[name + '_over_cluster']:>7.1f}×  target ≥ {TARGET_NAIVE_RATIO:g}×")
    print(f"cluster p50                       {lat['cluster']['p50_ms']:>7.2f} ms target ≤ {TARGET_P50_MS:g} ms")
    print(f"forwarded requests of one cluster query: {fwd['one_query']}")
    print(f"  … of the {fwd['series_queries']} timed and warm-up cluster queries: {fwd['series']}")
    print("met: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in met.items()))
    summary = {
        "events": args.events,
        "partitions": PARTITIONS,
        "nodes": NODES,
        "keys": KEYS,
        **figures,
        "ratios": ratios,
        "targets": {
            "cluster_over_all_local_max": TARGET_LOCAL_RATIO,
            "naive_over_cluster_min": TARGET_NAIVE_RATIO,
            "cluster_p50_ms_max": TARGET_P50_MS,
        },
        "met": met,
        "machine": machine(),
        "seconds": round(time.perf_counter() - args.started, 1),
    }
    print(json.dumps(summary, separators=(",", ":")))


# -- the run ---------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Return the command line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3_000, help="orders to produce before the nodes start")
    parser.add_argument("--samples", type=int, default=40, help="timed cluster and all-local queries")
    parser.add_argument("--naive-samples", type=int, default=10, help="timed naive fetches (each ~700 requests)")
    parser.add_argument("--naive-concurrency", type=int, default=16, help="naive requests in flight at once")
    parser.add_argument("--warmups", type=int, default=5, help="untimed requests of each kind first")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the nodes to start and catch up")
    parser.add_argument("--keep-serving", type=float, default=0.0, help="serve this many more seconds (profiling)")
    parser.add_argument("--workdir", type=Path, help="keep the nodes' logs and state here (default: a temporary one)")
    args = parser.parse_args()
    args.started = time.perf_counter()
    return args


def time_queries(
    args: argparse.Namespace, client: Client, nodes: list[NodeProcess], keys: dict[str, list[str]], truth: Counter[str]
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Time the cluster and all-local queries, alternating; return their ms and the forwarded-request check."""
    urls = [node.url for node in nodes]
    expected = {name: [truth.get(k) for k in ks] for name, ks in keys.items()}
    before = forwarded(nodes)
    get_many(client, urls[0], keys["spread"])
    one_query = forwarded_delta(before, forwarded(nodes), urls)
    before = forwarded(nodes)
    times = series(
        {
            "cluster": (lambda: get_many(client, urls[0], keys["spread"]), expected["spread"]),
            "all_local": (lambda: get_many(client, urls[0], keys["local"]), expected["local"]),
        },
        args.samples,
        args.warmups,
    )
    series_delta = forwarded_delta(before, forwarded(nodes), urls)
    queries = args.samples + args.warmups
    check = {
        "one_query": one_query,
        "one_query_ok": one_request_per_peer(one_query, 1),
        "series": series_delta,
        "series_queries": queries,
        "series_ok": one_request_per_peer(series_delta, queries),
    }
    return times, check


def time_naive(
    args: argparse.Namespace, client: Client, urls: list[str], keys: list[str], expected: Values
) -> dict[str, list[float]]:
    """Time the naive per-key fetches of keys, alternating between the three clients."""
    layers = [HttpxLayer(urls, 1), HttpxLayer(urls, args.naive_concurrency)]
    try:
        return series(
            {
                "naive_sequential": (lambda: naive_sequential(client, urls, keys), expected),
                "naive_httpx_sequential": (lambda: layers[0].fetch(keys), expected),
                "naive_httpx_concurrent": (lambda: layers[1].fetch(keys), expected),
            },
            args.naive_samples,
            1,
        )
    finally:
        for layer in layers:
            layer.close()


def measure(args: argparse.Namespace, nodes: list[NodeProcess], truth: Counter[str]) -> dict[str, Any]:
    """Wait for the cluster, then time the cluster, all-local and naive fetches and check the forwarding."""
    urls = [node.url for node in nodes]
    keys = {"spread": spread_keys(), "local": local_keys(0)}
    client = Client()
    try:
        wait_ready(nodes, timeout=args.timeout)
        wait_caught_up(client, urls[0], truth, args.timeout)
        ready_s = round(time.perf_counter() - args.started, 1)
        print(f"cluster ready and caught up {ready_s} s into the run", flush=True)
        times, check = time_queries(args, client, nodes, keys, truth)
        print("cluster and all-local timed; naive per-key forwarding next", flush=True)
        times |= time_naive(args, client, urls, keys["spread"], [truth.get(k) for k in keys["spread"]])
        if args.keep_serving:
            print(f"serving {args.keep_serving:g} s more: {[(n.id, n.url, n.process.pid) for n in nodes]}", flush=True)
            time.sleep(args.keep_serving)
    finally:
        client.close()
    return {
        "ready_s": ready_s,
        "keys": {
            "spread_per_node": [sum(owner(k) == i for k in keys["spread"]) for i in range(NODES)],
            "spread_existing": sum(k in truth for k in keys["spread"]),
            "local_existing": sum(k in truth for k in keys["local"]),
        },
        "latency": {name: latency(values) for name, values in times.items()},
        "naive_concurrency": args.naive_concurrency,
        "forwarded": check,
    }


def main() -> None:
    args = parse_args()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    with KafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="iqgraph-bench-cluster-") as tmp:
        broker.create_topics({topic: PARTITIONS})
        counts = produce_orders(broker.bootstrap_servers, topic, args.events)
        print(f"produced {args.events:,} orders; starting {NODES} nodes", flush=True)
        home = args.workdir or Path(tmp)
        home.mkdir(parents=True, exist_ok=True)
        write_app_module(home, APP_MODULE, topic, PARTITIONS, broker.bootstrap_servers)
        nodes = start_nodes(home, APP_MODULE, NODES)
        try:
            figures = measure(args, nodes, counts)
        except (httpx.HTTPError, RuntimeError, TimeoutError, AssertionError):
            for node in nodes:
                print(f"--- {node.id} log tail ---\n{log_tail(node)}", file=sys.stderr)
            raise
        finally:
            stop_nodes(nodes)
    report(args, figures)


if __name__ == "__main__":
    main()
