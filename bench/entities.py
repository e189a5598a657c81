"""Entities: ONE query for 1,000 customers composed from their stores, beside the same data as separate store fields.

One run, all on this machine, on the customers example (``iqgraph.examples.customers``):

1. produce the example's generated events (every customer's profile, then ``--events`` more: orders with profile
   updates, deletions and re-creations), batched, into two 6-partition topics of an embedded Apache Kafka broker
   (``streaming.apache_kafka.KafkaBroker``); compute what every store must hold from the same events (the
   ground truth);
2. two setups, one after the other (2 cores: never both at once), each ``iqgraph serve`` subprocesses with
   ``local[1]`` Spark and 768 MB of driver memory as the cluster tests have them:
   (a) ONE node serving every partition; (b) a static cluster of 3 nodes (node i active for the partitions
   p with p % 3 == i); each time wait until node-0 answers every customer's profile and order count as the
   events give, then
3. time sequential requests to node-0, after a few warm-ups, the shapes interleaved (the order rotating every
   round), each answer checked — the same 1,000 keys every time: the 300 customers ``customer-0000``..
   ``customer-0299`` (deleted or never ordering for some) and 700 that no store holds (``customer-0300``..
   ``customer-0999``); murmur2 spreads them over the 3 nodes:
   - ``entity``: ``customers(keys:)`` with ``key name orderCount totalSpend latestOrder { item amount }``;
   - ``separate``: the same data as 4 store fields, ``profiles { getMany { name } }``, ``orderCount``,
     ``totalSpend``, ``latestOrder { getMany { item amount } }``;
   - ``entity5``: the issue's query, the entity with its fifth store too, ``ordersPerMinute { start value }``;
   - ``separate5``: ``separate`` plus ``ordersPerMinute { fetchRange(fromKey: "customer-0000", toKey:
     "customer-0999", first: 1000) }`` (and its next pages, if any, in further requests);
   every answer is turned into one row per key (``key, name, orderCount, totalSpend, latestOrder[, windows]``):
   an entity answer must equal the separate one of its pair exactly, and the first equals the ground truth;
4. on each setup, scrape GET /metrics of every node before and after one query of each shape (and around the
   whole timed series): the forwarded sub-requests each node received, and node-0 sent to each peer;
5. a summary, and as the last line one JSON object with every figure.

The window store and the "5 separate store fields": a window store has no many-key fetch — ``fetch(key:)``
takes one key, and 1,000 aliased ``fetch`` fields would break the 100-alias limit of a document (10 documents
of 100 aliases would be a strawman). So the JUDGED pair is ``entity`` / ``separate`` over the four key-value
stores (the table and three aggregates), the same data by construction. The five-store pair is timed too and
reported beside it, not judged: its separate side reads the windows with ONE ``fetchRange`` over the key range
``customer-0000``..``customer-0999``, which is the same data only because the 1,000 keys are exactly that range
and the store holds no other key inside it — and a range is a scan: it fans out to every partition instead of
routing keys.

Also reported per shape: the CPU the node processes used per query (utime + stime of every node's Python
process from /proc, summed), steadier than the wall clock on a shared machine.

Targets (printed, not asserted; the entities issue's): on each setup, ``entity`` p50 ≤ 1.2× ``separate`` p50;
on 3 nodes, ONE forwarded request per peer for the entity query (one depth).

Usage: ``make bench-entities`` or, on this machine (others run Spark; the lock serialises),
``flock /tmp/iqgraph-spark.lock .venv/bin/python bench/entities.py [--events N] [--samples S]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; put the repository ahead of it.
sys.path.insert(0, str(ROOT))

from bench.cluster import machine, percentile  # noqa: E402 - the cluster bench's figures, shared
from iqgraph.examples.customers import CUSTOMERS, build_app  # noqa: E402
from iqgraph.examples.shop import _iso  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import free_port, produce  # noqa: E402
from iqgraph.streaming.partitioner import partition_for  # noqa: E402
from tests.support.nodes import NodeProcess, Scrape, start_node, start_nodes, wait_ready  # noqa: E402

PARTITIONS = 6
NODES = 3
KEYS = 1_000
SEED = 23
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
APP_MODULE = "bench_entities_app"
TARGET_RATIO = 1.2
TARGET_FORWARDED_PER_PEER = 1
FIRST_KEY, LAST_KEY = "customer-0000", f"customer-{KEYS - 1:04d}"

_KV = "key name orderCount totalSpend latestOrder { item amount }"
_SEPARATE = """profiles { getMany(keys: $k) { name } } orderCount { getMany(keys: $k) }
  totalSpend { getMany(keys: $k) } latestOrder { getMany(keys: $k) { item amount } }"""
_RANGE = """ordersPerMinute { fetchRange(fromKey: $lo, toKey: $hi, first: 1000, after: $after) {
  edges { node { key start value } } pageInfo { hasNextPage endCursor } } }"""
ENTITY = f"query($k: [String!]!) {{ customers(keys: $k) {{ {_KV} }} }}"
SEPARATE = f"query($k: [String!]!) {{ {_SEPARATE} }}"
ENTITY5 = f"query($k: [String!]!) {{ customers(keys: $k) {{ {_KV} ordersPerMinute {{ start value }} }} }}"
SEPARATE5 = f"query($k: [String!]!, $lo: String, $hi: String, $after: String) {{ {_SEPARATE} {_RANGE} }}"
WINDOW_PAGE = f"query($lo: String, $hi: String, $after: String) {{ {_RANGE} }}"
CAUGHT_UP = """query($k: [String!]!) { profiles { getMany(keys: $k) { name city tier } }
  orderCount { getMany(keys: $k) } }"""

Row = tuple[Any, ...]
Windows = list[tuple[str, Any]]

# -- the data --------------------------------------------------------------------------------------------


@dataclass
class Truth:
    """What the stores must hold after the events, per customer."""

    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    spend: dict[str, float] = field(default_factory=dict)
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    minutes: dict[str, Counter[int]] = field(default_factory=dict)
    orders: int = 0
    changes: int = 0

    def windows(self, key: str) -> Windows:
        """Return key's orders per minute as (start, count), oldest first."""
        return [(_iso(start), n) for start, n in sorted(self.minutes.get(key, Counter()).items())]


def produce_events(bootstrap: str, orders: str, customers: str, events: int) -> Truth:
    """Produce the example's profiles and events into the two topics; return the ground truth they give."""
    app = build_app(orders, customers, PARTITIONS)
    assert app.generator is not None
    addressed = [app.addressed(e) for e in itertools.islice(app.generator(SEED, START_MS), CUSTOMERS + events)]
    truth = Truth()
    profiles: dict[str, dict[str, Any] | None] = {}
    records: dict[str, list[tuple[bytes, bytes | None, None]]] = {orders: [], customers: []}
    for topic, key, value in addressed:
        k = str(key)
        records[topic.name].append((k.encode(), None if value is None else orjson.dumps(value), None))
        if topic.name == customers:
            profiles[k] = value
            truth.changes += 1
            continue
        truth.orders += 1
        truth.counts[k] += 1
        truth.spend[k] = truth.spend.get(k, 0.0) + value["amount"]
        truth.latest[k] = value
        stamp = _event_ms(value["ts"])
        truth.minutes.setdefault(k, Counter())[stamp // 60_000 * 60_000] += 1
    truth.profiles = {k: v for k, v in profiles.items() if v is not None}
    for topic_name in (customers, orders):
        produce(bootstrap, topic_name, records[topic_name])
    return truth


def _event_ms(stamp: str) -> int:
    return int(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def bench_keys() -> list[str]:
    """Return the 1,000 keys: every customer, then keys no store holds, one contiguous range."""
    return [f"customer-{i:04d}" for i in range(KEYS)]


def owner(key: str) -> int:
    """Return the index of the node active for key's partition on the 3-node cluster."""
    return int(partition_for(key, PARTITIONS, "string", "murmur2")) % NODES


def truth_rows(truth: Truth, keys: list[str], windows: bool) -> list[Row]:
    """Return the rows the ground truth gives (totalSpend to be compared approximately)."""
    rows: list[Row] = []
    for key in keys:
        latest = truth.latest.get(key)
        row: Row = (
            key,
            truth.profiles.get(key, {}).get("name"),
            truth.counts.get(key),
            truth.spend.get(key),
            None if latest is None else {"item": latest["item"], "amount": latest["amount"]},
        )
        rows.append((*row, truth.windows(key)) if windows else row)
    return rows


def check_truth(rows: list[Row], expected: list[Row]) -> None:
    """Raise unless rows equal the ground truth (sums of floats within rounding)."""
    wrong = []
    for got, want in zip(rows, expected, strict=True):
        spend_ok = (got[3] is None and want[3] is None) or (
            got[3] is not None and want[3] is not None and math.isclose(got[3], want[3], rel_tol=1e-9)
        )
        if not spend_ok or got[:3] != want[:3] or got[4:] != want[4:]:
            wrong.append((got, want))
    if wrong:
        raise RuntimeError(f"{len(wrong)} keys differ from the ground truth (got, expected): {wrong[:3]}")


# -- the nodes -------------------------------------------------------------------------------------------


def write_app_module(home: Path, orders: str, customers: str, bootstrap: str) -> None:
    """Write the module whose `app` the nodes serve: the customers example on the bench's topics."""
    home.mkdir(parents=True, exist_ok=True)
    (home / f"{APP_MODULE}.py").write_text(
        textwrap.dedent(f"""
        from iqgraph.examples.customers import build_app
        from iqgraph.streaming.definitions import KafkaSettings
        app = build_app({orders!r}, {customers!r}, {PARTITIONS}, KafkaSettings(bootstrap_servers={bootstrap!r}))
    """)
    )


def stop_nodes(nodes: Sequence[NodeProcess], timeout: float = 45.0) -> None:
    """Stop every node gracefully (SIGINT: the node stops Spark, closes RocksDB); kill what is left, whatever."""
    try:
        for node in nodes:
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout
        for node in nodes:
            try:
                node.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.kill()
    finally:  # also when interrupted while waiting
        for node in nodes:
            node.kill()


def log_tail(node: NodeProcess, lines: int = 25) -> str:
    """Return the end of a node's log without its repeated restore-progress lines."""
    text = node.log.read_text(errors="replace").splitlines()
    return "\n".join([line for line in text if "iqgraph: restoring" not in line][-lines:])


_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def cpu_ms(nodes: Sequence[NodeProcess]) -> float:
    """Return the CPU time (user + system) the nodes' Python processes have used, summed, in ms."""
    total = 0
    for node in nodes:
        fields = Path(f"/proc/{node.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of the line
    return total * _TICK_MS


# -- the client ------------------------------------------------------------------------------------------


class Client:
    """Keep-alive HTTP/1.1 connections, one per node, over the standard library (little client overhead)."""

    def __init__(self) -> None:
        self._connections: dict[str, http.client.HTTPConnection] = {}

    def graphql(self, url: str, query: str, variables: dict[str, Any]) -> Any:
        """Return the decoded answer of one GraphQL POST (reconnecting once if the server hung up)."""
        body = orjson.dumps({"query": query, "variables": variables})
        for attempt in (1, 2):
            connection = self._connections.get(url)
            if connection is None:
                host, port = url.removeprefix("http://").split(":")
                connection = self._connections[url] = http.client.HTTPConnection(host, int(port), timeout=60)
            try:
                connection.request("POST", "/graphql", body, {"content-type": "application/json"})
                return orjson.loads(connection.getresponse().read())
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()  # uvicorn closes keep-alive connections idle for 5 s
                del self._connections[url]
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def data(self, url: str, query: str, variables: dict[str, Any]) -> Any:
        """Return the data of one GraphQL request; raise on errors."""
        answer = self.graphql(url, query, variables)
        if answer.get("errors"):
            raise RuntimeError(f"the query answered errors: {str(answer['errors'])[:500]}")
        return answer["data"]

    def close(self) -> None:
        """Close every connection."""
        for connection in self._connections.values():
            connection.close()


# -- the shapes ------------------------------------------------------------------------------------------


def _windows(found: list[dict[str, Any]] | None) -> Windows:
    return [(w["start"], w["value"]) for w in found or []]


def entity_rows(data: Any, windows: bool) -> list[Row]:
    """Return one row per key of an entity answer."""
    rows: list[Row] = []
    for c in data["customers"]:
        row: Row = (c["key"], c["name"], c["orderCount"], c["totalSpend"], c["latestOrder"])
        rows.append((*row, _windows(c["ordersPerMinute"])) if windows else row)
    return rows


def separate_rows(keys: list[str], data: Any) -> list[Row]:
    """Return one row per key of an answer of the four key-value store fields."""
    columns = zip(
        keys,
        data["profiles"]["getMany"],
        data["orderCount"]["getMany"],
        data["totalSpend"]["getMany"],
        data["latestOrder"]["getMany"],
        strict=True,
    )
    return [(k, None if p is None else p["name"], n, s, o) for k, p, n, s, o in columns]


@dataclass
class Shape:
    """One way to ask for the data: how to fetch it (rows, requests made) and which pair it belongs to."""

    name: str
    pair: str  # kv4 | all5
    fetch: Callable[[Client, str, list[str]], tuple[list[Row], int]]


def fetch_entity(client: Client, url: str, keys: list[str]) -> tuple[list[Row], int]:
    return entity_rows(client.data(url, ENTITY, {"k": keys}), windows=False), 1


def fetch_separate(client: Client, url: str, keys: list[str]) -> tuple[list[Row], int]:
    return separate_rows(keys, client.data(url, SEPARATE, {"k": keys})), 1


def fetch_entity5(client: Client, url: str, keys: list[str]) -> tuple[list[Row], int]:
    return entity_rows(client.data(url, ENTITY5, {"k": keys}), windows=True), 1


def fetch_separate5(client: Client, url: str, keys: list[str]) -> tuple[list[Row], int]:
    """The four fields and the first page of the key range's windows in one request; any further page after."""
    bounds: dict[str, Any] = {"lo": keys[0], "hi": keys[-1], "after": None}
    data = client.data(url, SEPARATE5, {"k": keys, **bounds})
    rows, page, requests = separate_rows(keys, data), data["ordersPerMinute"]["fetchRange"], 1
    windows: dict[str, Windows] = {}
    while True:
        for edge in page["edges"]:
            node = edge["node"]
            windows.setdefault(node["key"], []).append((node["start"], node["value"]))
        if not page["pageInfo"]["hasNextPage"]:
            break
        bounds["after"] = page["pageInfo"]["endCursor"]
        page = client.data(url, WINDOW_PAGE, bounds)["ordersPerMinute"]["fetchRange"]
        requests += 1
    if set(windows) - set(keys):
        raise RuntimeError(f"fetchRange gave keys not asked for: {sorted(set(windows) - set(keys))[:5]}")
    return [(*row, windows.get(row[0], [])) for row in rows], requests


SHAPES = [
    Shape("entity", "kv4", fetch_entity),
    Shape("separate", "kv4", fetch_separate),
    Shape("entity5", "all5", fetch_entity5),
    Shape("separate5", "all5", fetch_separate5),
]
PAIRS = {"kv4": ("entity", "separate"), "all5": ("entity5", "separate5")}


# -- measuring -------------------------------------------------------------------------------------------


def wait_caught_up(client: Client, url: str, truth: Truth, timeout: float) -> None:
    """Wait until url answers every customer's profile and order count as the events give."""
    keys = [f"customer-{i:04d}" for i in range(CUSTOMERS)]
    profiles = [truth.profiles.get(k) for k in keys]
    counts = [truth.counts.get(k) for k in keys]
    deadline = time.monotonic() + timeout
    answer: Any = None
    while time.monotonic() < deadline:
        answer = client.graphql(url, CAUGHT_UP, {"k": keys})
        data = answer.get("data") or {}
        if (
            not answer.get("errors")
            and data["orderCount"]["getMany"] == counts
            and data["profiles"]["getMany"] == profiles
        ):
            return
        time.sleep(0.5)
    raise TimeoutError(f"node-0 did not catch up in {timeout:.0f} s: {str(answer)[:500]}")


def _received(scrape: Scrape) -> float:
    name = "iqgraph_forwarded_received_total"
    return sum(scrape.value(name, **labels) for labels in scrape.labels(name))


def forwarded_delta(before: list[Scrape], after: list[Scrape]) -> dict[str, Any]:
    """Return what each node received and node-0 sent to each peer between two scrapes of every node."""
    name = "iqgraph_forwarded_sent_total"
    peers = [f"node-{i}" for i in range(1, len(before))]
    return {
        "received": {
            f"node-{i}": int(_received(a) - _received(b)) for i, (a, b) in enumerate(zip(after, before, strict=True))
        },
        "sent_by_node_0": {p: int(after[0].value(name, peer=p) - before[0].value(name, peer=p)) for p in peers},
    }


def scrape_all(nodes: Sequence[NodeProcess]) -> list[Scrape]:
    """Return every node's /metrics."""
    return [node.metrics() for node in nodes]


@dataclass
class Samples:
    """The timed requests of one shape."""

    ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    requests: int = 0


def check_pair(shape: Shape, rows: list[Row], references: dict[str, list[Row]]) -> None:
    """Raise unless rows equal what the first answer of the shape's pair gave (exactly)."""
    reference = references.setdefault(shape.pair, rows)
    if rows != reference:
        wrong = [(got, want) for got, want in zip(rows, reference, strict=True) if got != want]
        raise RuntimeError(f"{shape.name} differs from its pair's first answer in {len(wrong)} keys: {wrong[:3]}")


def time_shapes(
    args: argparse.Namespace, client: Client, nodes: list[NodeProcess], keys: list[str], truth: Truth
) -> dict[str, Any]:
    """Check each shape against the ground truth and its pair, count its forwarded requests, then time them."""
    url = nodes[0].url
    references: dict[str, list[Row]] = {}
    per_query: dict[str, Any] = {}
    for shape in SHAPES:
        before = scrape_all(nodes)
        rows, requests = shape.fetch(client, url, keys)
        per_query[shape.name] = {**forwarded_delta(before, scrape_all(nodes)), "requests": requests}
        if shape.pair not in references:
            check_truth(rows, truth_rows(truth, keys, windows=shape.pair == "all5"))
        check_pair(shape, rows, references)
    before = scrape_all(nodes)
    for shape in SHAPES:
        for _ in range(args.warmups):
            check_pair(shape, shape.fetch(client, url, keys)[0], references)
    samples = {shape.name: Samples() for shape in SHAPES}
    for round_ in range(args.samples):
        turn = round_ % len(SHAPES)
        for shape in SHAPES[turn:] + SHAPES[:turn]:
            cpu_before = cpu_ms(nodes)
            started = time.perf_counter()
            rows, requests = shape.fetch(client, url, keys)
            took = (time.perf_counter() - started) * 1000
            spent = cpu_ms(nodes) - cpu_before
            check_pair(shape, rows, references)
            taken = samples[shape.name]
            taken.ms.append(took)
            taken.cpu_ms.append(spent)
            taken.requests += requests
    series = forwarded_delta(before, scrape_all(nodes))
    queries = args.samples + args.warmups
    expected = {node: sum(per_query[s.name]["received"][node] for s in SHAPES) * queries for node in series["received"]}
    return {
        "samples": samples,
        "forwarded": {
            "per_query": per_query,
            "series": series,
            "series_queries_per_shape": queries,
            "series_as_per_query": series["received"] == expected,
        },
    }


def latency(samples: Samples) -> dict[str, Any]:
    """Return p50, p90, p99, mean of the wall clock and the mean node CPU per query, in ms."""
    return {
        "p50_ms": round(percentile(samples.ms, 50), 2),
        "p90_ms": round(percentile(samples.ms, 90), 2),
        "p99_ms": round(percentile(samples.ms, 99), 2),
        "mean_ms": round(statistics.fmean(samples.ms), 2),
        "node_cpu_ms": round(statistics.fmean(samples.cpu_ms), 2),
        "samples": len(samples.ms),
        "requests_per_query": round(samples.requests / len(samples.ms), 2),
    }


def ratios(samples: dict[str, Samples], lat: dict[str, Any]) -> dict[str, Any]:
    """Return entity / separate per pair: of the p50s, p90s, node CPU, and the median of the paired ratios."""
    found: dict[str, Any] = {}
    for pair, (entity, separate) in PAIRS.items():
        e, s = lat[entity], lat[separate]
        paired = [a / b for a, b in zip(samples[entity].ms, samples[separate].ms, strict=True)]
        found[pair] = {
            "p50": round(e["p50_ms"] / s["p50_ms"], 3),
            "p90": round(e["p90_ms"] / s["p90_ms"], 3),
            "paired_median": round(statistics.median(paired), 3),
            "node_cpu": round(e["node_cpu_ms"] / s["node_cpu_ms"], 3) if s["node_cpu_ms"] else None,
        }
    return found


def run_setup(
    args: argparse.Namespace, home: Path, count: int, topics: tuple[str, str, str], truth: Truth
) -> dict[str, Any]:
    """Start count nodes, wait for them, time the shapes on node-0; stop the nodes whatever happens."""
    write_app_module(home, *topics)
    started = time.perf_counter()
    if count == 1:
        nodes = [start_node(home, APP_MODULE, "node-0", free_port())]
    else:
        nodes = start_nodes(home, APP_MODULE, count)
    client, keys = Client(), bench_keys()
    try:
        wait_ready(nodes, timeout=args.timeout)
        wait_caught_up(client, nodes[0].url, truth, args.timeout)
        ready_s = round(time.perf_counter() - started, 1)
        print(f"{count} node(s) ready and caught up in {ready_s} s; timing", flush=True)
        measured = time_shapes(args, client, nodes, keys, truth)
    except (httpx.HTTPError, RuntimeError, TimeoutError, AssertionError, OSError):
        for node in nodes:
            print(f"--- {node.id} log tail ---\n{log_tail(node)}", file=sys.stderr)
        raise
    finally:
        client.close()
        stop_nodes(nodes)
    samples: dict[str, Samples] = measured["samples"]
    lat = {name: latency(values) for name, values in samples.items()}
    per_node = [sum(owner(k) == i for k in keys) for i in range(NODES)] if count > 1 else [len(keys)]
    return {
        "nodes": count,
        "ready_s": ready_s,
        "keys_per_node": per_node,
        "latency": lat,
        "ratios": ratios(samples, lat),
        "forwarded": measured["forwarded"],
    }


# -- report ----------------------------------------------------------------------------------------------


LABELS = {
    "entity": "entity: customers(keys) x 4 key-value stores",
    "separate": "separate: 4 store fields, getMany each",
    "entity5": "entity5: customers(keys) x 5 stores (+ ordersPerMinute)",
    "separate5": "separate5: 4 getMany + ordersPerMinute fetchRange",
}


def met(setups: dict[str, Any]) -> dict[str, bool]:
    """Return which targets the setups meet."""
    found = {
        f"{name}_entity_over_separate_p50": s["ratios"]["kv4"]["p50"] <= TARGET_RATIO for name, s in setups.items()
    }
    cluster = setups.get("three_nodes")
    if cluster is not None:
        for shape in ("entity", "entity5"):
            received = cluster["forwarded"]["per_query"][shape]["received"]
            peers = {k: v for k, v in received.items() if k != "node-0"}
            one = received["node-0"] == 0 and all(v == TARGET_FORWARDED_PER_PEER for v in peers.values())
            found[f"three_nodes_{shape}_one_forwarded_request_per_peer"] = one
    return found


def report(args: argparse.Namespace, truth: Truth, setups: dict[str, Any]) -> None:
    """Print the human-readable summary, then the JSON summary as the last line."""
    print(
        f"\nentities bench: {len(truth.profiles)} profiles, {truth.orders:,} orders, {truth.changes:,} profile "
        f"changes, {PARTITIONS} partitions; {KEYS:,} keys per query ({CUSTOMERS} customers + "
        f"{KEYS - CUSTOMERS} no store holds), {machine()}"
    )
    for name, setup in setups.items():
        print(f"\n{name}: {setup['nodes']} node(s), keys per node {setup['keys_per_node']}, ready in "
              f"{setup['ready_s']} s")  # fmt: skip
        print(f"{'':<58}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}{'mean':>8}{'cpu ms':>8}{'req':>5}{'n':>5}")
        for shape, label in LABELS.items():
            r = setup["latency"][shape]
            print(
                f"{label:<58}{r['p50_ms']:>8.2f}{r['p90_ms']:>8.2f}{r['p99_ms']:>8.2f}{r['mean_ms']:>8.2f}"
                f"{r['node_cpu_ms']:>8.2f}{r['requests_per_query']:>5g}{r['samples']:>5}"
            )
        for pair, (entity, separate) in PAIRS.items():
            r = setup["ratios"][pair]
            target = f"  target p50 ≤ {TARGET_RATIO:g}×" if pair == "kv4" else "  (informative: a range scan)"
            print(
                f"{entity} / {separate}: p50 {r['p50']:.2f}×, p90 {r['p90']:.2f}×, paired median "
                f"{r['paired_median']:.2f}×, node CPU {r['node_cpu'] or float('nan'):.2f}×{target}"
            )
        fwd = setup["forwarded"]
        for shape in LABELS:
            one = fwd["per_query"][shape]
            print(f"forwarded by one {shape} query: received {one['received']}, node-0 sent {one['sent_by_node_0']}")
        print(
            f"forwarded over the series ({fwd['series_queries_per_shape']} of each shape): "
            f"{fwd['series']['received']} — as one query's times the count: {fwd['series_as_per_query']}"
        )
    found = met(setups)
    print("\nmet: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in found.items()))
    summary = {
        "events": args.events,
        "orders": truth.orders,
        "profile_changes": truth.changes,
        "profiles": len(truth.profiles),
        "partitions": PARTITIONS,
        "keys": KEYS,
        "samples": args.samples,
        "warmups": args.warmups,
        "setups": setups,
        "targets": {"entity_over_separate_p50_max": TARGET_RATIO, "forwarded_per_peer": TARGET_FORWARDED_PER_PEER},
        "met": found,
        "machine": machine(),
        "seconds": round(time.perf_counter() - args.started, 1),
    }
    print(json.dumps(summary, separators=(",", ":")))


# -- the run ---------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Return the command line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4_000, help="events after the profiles (orders mostly)")
    parser.add_argument("--samples", type=int, default=60, help="timed queries of each shape per setup")
    parser.add_argument("--warmups", type=int, default=5, help="untimed queries of each shape first")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for the nodes to start and catch up")
    parser.add_argument("--only", choices=["one_node", "three_nodes"], help="run one setup only")
    parser.add_argument("--workdir", type=Path, help="keep the nodes' logs and state here (default: a temporary one)")
    args = parser.parse_args()
    args.started = time.perf_counter()
    return args


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: the nodes and the broker stop


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, _terminated)
    tag = uuid.uuid4().hex[:8]
    orders, customers = f"orders-{tag}", f"customers-{tag}"
    setups: dict[str, Any] = {}
    with KafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="iqgraph-bench-entities-") as tmp:
        broker.create_topics({orders: PARTITIONS, customers: PARTITIONS})
        truth = produce_events(broker.bootstrap_servers, orders, customers, args.events)
        print(f"produced {CUSTOMERS + args.events:,} events ({truth.orders:,} orders)", flush=True)
        home = args.workdir or Path(tmp)
        topics = (orders, customers, broker.bootstrap_servers)
        for name, count in (("one_node", 1), ("three_nodes", NODES)):
            if args.only in (None, name):
                setups[name] = run_setup(args, home / name, count, topics, truth)
    report(args, truth, setups)


if __name__ == "__main__":
    main()
