"""Live subscriptions on one node: produce → notified (push) beside produce → visible (poll), the node's CPU per
notification with 1,000 subscribers, and its memory per subscription.

One run, all on this machine:

1. produce ``--events`` generated shop orders, batched, into a 6-partition topic of an embedded Apache Kafka
   broker (``streaming.apache_kafka.KafkaBroker``); start one node (a cluster of one, ``local[1]`` Spark, as
   bench/cluster.py and the cluster tests start theirs) and wait until it answers the orders' counts;
2. latency, push beside poll, for the same records: one graphql-transport-ws client (``websockets``) follows
   ``orderCountWatch`` of ``--latency-keys`` new customers while a poller POSTs ``getMany`` of the same keys
   every ``--poll-ms``; ``--samples`` orders of those keys are produced one at a time, ``--gap-ms`` apart, by one
   long-lived producer (the usual batching and acks=all; each order flushed before the gap, so that its clock
   starts when it is sent). Per order, from just before it is produced: until a notification carries the key's
   new count (push), until a poll's answer does (poll);
3. the same orders' ingest alone: ``--fanout`` orders to keys nobody watches, the node's CPU time (user +
   system of its Python process) from just before producing until it answers their counts;
4. memory: the node process's RSS before and after opening ``--subscribers`` subscriptions over
   ``--connections`` websockets, each to ``--keys-per-sub`` keys of a pool of ``--pool`` new customers (so
   they overlap; between ``--min-keys-per-sub`` and ``--keys-per-sub`` each), every first snapshot received. The
   subscriptions live in the node's Python process; Spark's JVM is a child process, not counted;
4b. with ``--load-rate R``: push beside poll again (2's measurement, on keys of its own), now with every
   subscription open and R orders/s produced on their keys throughout, the notifications they get and the values
   conflation dropped counted;
5. cost: ``--fanout`` orders on the pool's keys produced at once; the node's CPU time from just before
   producing until every subscriber holds its keys' final counts, divided into the notifications delivered;
   less the ingest alone (3), what the notifications add;
6. a summary, and as the last line one JSON object with every figure.

Target (issue 13; printed, not asserted): push adds ≤ 50 ms to produce → visible, i.e. push p50 ≤ poll p50 + 50.
The poll figure includes half a poll period on average (the value waits for the next poll).

Usage: ``flock /tmp/iqgraph-spark.lock .venv/bin/python bench/live.py [--samples N] [--subscribers N] …``; issue 29's
10,000 subscriptions on 1–20 keys at 200 changes/s: ``--subscribers 10000 --connections 100 --min-keys-per-sub 1
--keys-per-sub 20 --pool 100000 --load-rate 200``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import websockets
from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; put the repository ahead of it.
sys.path.insert(0, str(ROOT))

from bench.cluster import Client, latency, machine, produce_orders  # noqa: E402 - the cluster bench's helpers
from bench.entities import _terminated, cpu_ms, log_tail, stop_nodes  # noqa: E402 - the entities bench's
from iqgraph.examples.shop import generate_orders  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import BATCHING, JAVA_PARTITIONER, produce  # noqa: E402
from tests.support.nodes import NodeProcess, start_nodes, wait_ready, write_app_module  # noqa: E402

PARTITIONS = 6
SEED = 11
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
APP_MODULE = "bench_live_app"
FIELD = "orderCount"
WATCH = f"subscription($keys: [String!]!) {{ {FIELD}Watch(keys: $keys) {{ key value dropped snapshot }} }}"
GET_MANY = f"query($k: [String!]!) {{ {FIELD} {{ getMany(keys: $k) }} }}"
TARGET_PUSH_ADDS_MS = 50.0
TEMPLATE = next(generate_orders(SEED, START_MS))[1]

#: One observation of a key's count: (seconds, perf_counter clock; count).
Seen = dict[str, list[tuple[float, int]]]


def order(key: str, n: int) -> bytes:
    """Return an order of customer key (the shop's generated order, re-addressed)."""
    return orjson.dumps({**TEMPLATE, "order_id": f"live-{key}-{n}", "customer": key})


# -- the node --------------------------------------------------------------------------------------------


def rss_mib(node: NodeProcess) -> float:
    """Return the node process's resident set size in MiB."""
    for line in Path(f"/proc/{node.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def wait_counts(client: Client, url: str, counts: Mapping[str, int], timeout: float = 120.0) -> None:
    """Wait until the node answers each key's order count as counts gives."""
    pending = list(counts)
    deadline = time.monotonic() + timeout
    answer: Any = None
    while time.monotonic() < deadline:
        keys = pending[:1000]  # the node's max_keys per field
        answer = client.graphql(url, GET_MANY, {"k": keys})
        if not answer.get("errors") and answer["data"][FIELD]["getMany"] == [counts[k] for k in keys]:
            pending = pending[1000:]
            if not pending:
                return
            continue
        time.sleep(0.05)
    raise TimeoutError(f"the node did not answer the counts in {timeout:.0f} s: {str(answer)[:300]}")


# -- the clients -----------------------------------------------------------------------------------------


class Socket:
    """One graphql-transport-ws connection running subscriptions; each event handed to on_event as it arrives."""

    def __init__(self, url: str, on_event: Callable[[str, dict[str, Any], float], None]) -> None:
        self.url = url.replace("http://", "ws://") + "/graphql"
        self.on_event = on_event
        self.ws: Any = None

    async def open(self) -> None:
        self.ws = await websockets.connect(self.url, subprotocols=["graphql-transport-ws"], max_size=None)
        await self.ws.send(orjson.dumps({"type": "connection_init"}).decode())
        ack = orjson.loads(await self.ws.recv())
        if ack["type"] != "connection_ack":
            raise RuntimeError(f"no connection_ack: {ack}")

    async def subscribe(self, id_: str, keys: Sequence[str]) -> None:
        payload = {"query": WATCH, "variables": {"keys": list(keys)}}
        await self.ws.send(orjson.dumps({"id": id_, "type": "subscribe", "payload": payload}).decode())

    async def read(self) -> None:
        """Hand every event to on_event until the connection closes; answer pings; raise on an error."""
        async for raw in self.ws:
            received = time.perf_counter()
            message = orjson.loads(raw)
            kind = message["type"]
            if kind == "next":
                payload = message["payload"]
                if payload.get("errors"):
                    raise RuntimeError(f"subscription {message['id']} failed: {payload['errors']}")
                self.on_event(message["id"], payload["data"][f"{FIELD}Watch"], received)
            elif kind == "ping":
                await self.ws.send('{"type":"pong"}')
            elif kind == "error":
                raise RuntimeError(f"subscription {message['id']} refused: {message['payload']}")

    async def close(self) -> None:
        await self.ws.close()


def first_at_least(seen: list[tuple[float, int]], count: int) -> float | None:
    """Return when a count of at least count was first seen (None: not yet)."""
    return next((at for at, value in seen if value >= count), None)


# -- 2. push beside poll ---------------------------------------------------------------------------------


def produce_samples(bootstrap: str, topic: str, keys: Sequence[str], samples: int, gap_s: float) -> list[Any]:
    """Produce samples orders round-robin on keys, gap_s apart; return (key, its new count, time before produce)."""
    producer = Producer({**JAVA_PARTITIONER, **BATCHING, "bootstrap.servers": bootstrap})
    counts: Counter[str] = Counter()
    produced = []
    for n in range(samples):
        key = keys[n % len(keys)]
        counts[key] += 1
        started = time.perf_counter()
        producer.produce(topic, key=key.encode(), value=order(key, n))
        if producer.flush(10.0):
            raise RuntimeError("an order was not delivered in 10 s")
        produced.append((key, counts[key], started))
        time.sleep(gap_s)
    return produced


async def poll(url: str, keys: Sequence[str], every_s: float, seen: Seen, stop: asyncio.Event) -> int:
    """POST getMany of keys every every_s until stop; record each answer's counts; return how many polls."""
    body = {"query": GET_MANY, "variables": {"k": list(keys)}}
    polls = 0
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        while not stop.is_set():
            answer = (await client.post("/graphql", json=body)).json()
            received = time.perf_counter()
            polls += 1
            for key, value in zip(keys, answer["data"][FIELD]["getMany"], strict=True):
                if value is not None and (not seen[key] or seen[key][-1][1] != value):
                    seen[key].append((received, value))
            await asyncio.sleep(every_s)
    return polls


async def push_and_poll(
    args: argparse.Namespace, url: str, bootstrap: str, topic: str, prefix: str = "live"
) -> dict[str, Any]:
    """Measure produce → notified and produce → visible by polling, for the same orders (keys prefix-NNNN)."""
    keys = [f"{prefix}-{i:04d}" for i in range(args.latency_keys)]
    pushed: Seen = {k: [] for k in keys}
    polled: Seen = {k: [] for k in keys}
    first = asyncio.get_running_loop().create_future()

    def on_event(_id: str, event: dict[str, Any], received: float) -> None:
        if event["value"] is not None:
            pushed[event["key"]].append((received, event["value"]))
        elif not first.done():
            first.set_result(None)

    socket = Socket(url, on_event)
    await socket.open()
    reader = asyncio.create_task(socket.read())
    await socket.subscribe("latency", keys)
    await asyncio.wait_for(first, 30)
    stop = asyncio.Event()
    poller = asyncio.create_task(poll(url, keys, args.poll_ms / 1000, polled, stop))
    produced = await asyncio.to_thread(produce_samples, bootstrap, topic, keys, args.samples, args.gap_ms / 1000)
    deadline = time.monotonic() + 30
    while any(first_at_least(s[k], c) is None for k, c, _ in produced for s in (pushed, polled)):
        if reader.done():
            reader.result()  # raises what ended it
        if time.monotonic() > deadline:
            raise TimeoutError("not every order was notified and polled within 30 s")
        await asyncio.sleep(0.05)
    stop.set()
    polls = await poller
    await socket.close()
    reader.cancel()
    push = [(first_at_least(pushed[k], c) or 0) - at for k, c, at in produced]
    polling = [(first_at_least(polled[k], c) or 0) - at for k, c, at in produced]
    ahead = sum(p < q for p, q in zip(push, polling, strict=True))
    return {
        "push": latency([s * 1000 for s in push]),
        "poll": latency([s * 1000 for s in polling]),
        "push_first_share": round(ahead / len(push), 3),
        "polls": polls,
    }


# -- 3-5. ingest alone, memory, fan-out ------------------------------------------------------------------


def produce_keyed(bootstrap: str, topic: str, keys: Sequence[str], count: int, rng: random.Random) -> Counter[str]:
    """Produce count orders on random keys; return the count per key."""
    chosen = [rng.choice(keys) for _ in range(count)]
    produce(bootstrap, topic, ((k.encode(), order(k, n), None) for n, k in enumerate(chosen)))
    return Counter(chosen)


def ingest_alone(args: argparse.Namespace, node: NodeProcess, bootstrap: str, topic: str) -> dict[str, float]:
    """Return the node's CPU seconds and the wall seconds to apply args.fanout orders nobody watches."""
    client = Client()
    before, started = cpu_ms([node]), time.perf_counter()
    counts = produce_keyed(bootstrap, topic, [f"base-{i:04d}" for i in range(args.pool)], args.fanout, random.Random(1))
    wait_counts(client, node.url, counts)
    client.close()
    return {"cpu_s": (cpu_ms([node]) - before) / 1000, "wall_s": time.perf_counter() - started}


def produce_steady(
    bootstrap: str, topic: str, keys: Sequence[str], rate: float, stop: threading.Event, rng: random.Random
) -> Counter[str]:
    """Produce orders on random keys at rate per second until stop; return the count per key."""
    producer = Producer({**JAVA_PARTITIONER, **BATCHING, "bootstrap.servers": bootstrap})
    counts: Counter[str] = Counter()
    started, n = time.perf_counter(), 0
    while not stop.is_set():
        delay = started + n / rate - time.perf_counter()
        if delay > 0 and stop.wait(delay):
            break
        key = rng.choice(keys)
        producer.produce(topic, key=key.encode(), value=order(key, n))
        producer.poll(0)
        counts[key] += 1
        n += 1
    if producer.flush(30.0):
        raise RuntimeError("the steady load's orders were not all delivered in 30 s")
    return counts


class Fan:
    """The subscribers' view: per subscription its keys' counts, the notifications, whether each is done."""

    def __init__(self, sets: Sequence[Sequence[str]]) -> None:
        self.sets = sets
        self.values: list[dict[str, int | None]] = [{} for _ in sets]
        self.events = self.changes = self.snapshots = 0
        self.truth: Mapping[str, int] = {}
        self.waiting = set(range(len(sets)))
        self.done = asyncio.Event()

    def on_event(self, id_: str, event: dict[str, Any], _received: float) -> None:
        i = int(id_)
        self.events += 1
        self.changes += 1 + event["dropped"]
        self.snapshots += event["snapshot"]
        self.values[i][event["key"]] = event["value"]
        if self.truth:
            self._check(i)

    def _check(self, i: int) -> None:
        if i in self.waiting and all(self.values[i].get(k) == self.truth.get(k) for k in self.sets[i]):
            self.waiting.discard(i)
            if not self.waiting:
                self.done.set()

    def count_from_now(self) -> None:
        """Count the notifications from now on."""
        self.events = self.changes = self.snapshots = 0

    def expect(self, truth: Mapping[str, int]) -> None:
        """Wait for every subscription to hold truth for its keys (done: ``self.done``)."""
        self.truth = truth
        for i in list(self.waiting):  # some may hold them already
            self._check(i)


async def fan_out(args: argparse.Namespace, node: NodeProcess, bootstrap: str, topic: str) -> dict[str, Any]:
    """Open the subscriptions (RSS before and after), then produce on their keys and time the notifications."""
    rng = random.Random(SEED)
    pool = [f"fan-{i:06d}" for i in range(args.pool)]
    fewest = args.min_keys_per_sub or args.keys_per_sub
    fan = Fan([rng.sample(pool, rng.randint(fewest, args.keys_per_sub)) for _ in range(args.subscribers)])
    rss_before = rss_mib(node)
    sockets = [Socket(node.url, fan.on_event) for _ in range(args.connections)]
    for socket in sockets:
        await socket.open()
    readers = [asyncio.create_task(s.read()) for s in sockets]
    for i, keys in enumerate(fan.sets):
        await sockets[i % len(sockets)].subscribe(str(i), keys)
    opened = time.perf_counter()
    deadline = time.monotonic() + 600
    while fan.events < sum(map(len, fan.sets)):  # every key's first snapshot (no count yet)
        for reader in readers:
            if reader.done():
                reader.result()  # raises what ended it
        if time.monotonic() > deadline:
            raise TimeoutError(f"{fan.events} first events of {sum(map(len, fan.sets))} in 600 s")
        await asyncio.sleep(0.05)
    opened_s = time.perf_counter() - opened
    await asyncio.sleep(1.0)  # let the node's allocator settle before reading its RSS
    rss_after = rss_mib(node)
    loaded: Counter[str] = Counter()
    under_load = None
    if args.load_rate:  # push beside poll again, while every subscription is open and args.load_rate orders/s land
        fan.count_from_now()
        stop = threading.Event()
        steady = asyncio.create_task(
            asyncio.to_thread(produce_steady, bootstrap, topic, pool, args.load_rate, stop, random.Random(SEED + 1))
        )
        under_load = await push_and_poll(args, node.url, bootstrap, topic, prefix="loaded")
        stop.set()
        loaded = await steady
        under_load |= {
            "orders_per_s": args.load_rate,
            "orders": sum(loaded.values()),
            "notifications": fan.events,
            "dropped": fan.changes - fan.events,  # conflated: counted in each event's dropped
        }
    fan.count_from_now()
    cpu_before, started = cpu_ms([node]), time.perf_counter()
    fan.expect(loaded + await asyncio.to_thread(produce_keyed, bootstrap, topic, pool, args.fanout, rng))
    await asyncio.wait_for(fan.done.wait(), 300)
    took, cpu_s = time.perf_counter() - started, (cpu_ms([node]) - cpu_before) / 1000
    for socket in sockets:
        await socket.close()
    for reader in readers:
        reader.cancel()
    return {
        "subscriptions": args.subscribers,
        "keys_watched": sum(map(len, fan.sets)),
        "opened_s": round(opened_s, 1),
        "under_load": under_load,
        "rss_before_mib": round(rss_before, 1),
        "rss_after_mib": round(rss_after, 1),
        "kib_per_subscription": round((rss_after - rss_before) * 1024 / args.subscribers, 1),
        "orders": args.fanout,
        "notifications": fan.events,
        "changes_in_them": fan.changes,
        "wall_s": round(took, 2),
        "cpu_s": round(cpu_s, 2),
    }


# -- the run ---------------------------------------------------------------------------------------------


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Print the human-readable summary, then the JSON summary as the last line."""
    push, polled, fan, alone = figures["push"], figures["poll"], figures["fan_out"], figures["ingest_alone"]
    adds = push["p50_ms"] - polled["p50_ms"]
    net_cpu = fan["cpu_s"] - alone["cpu_s"]  # what the notifications add (None: within the noise of the ingest)
    figures["push_adds_p50_ms"] = round(adds, 1)
    figures["ratios"] = {
        "push_over_poll_p50": round(push["p50_ms"] / polled["p50_ms"], 3),
        "push_over_poll_p99": round(push["p99_ms"] / polled["p99_ms"], 3),
    }
    figures["notifications_per_cpu_s"] = round(fan["notifications"] / fan["cpu_s"])
    figures["notifications_per_cpu_s_net"] = round(fan["notifications"] / net_cpu) if net_cpu > 0.05 else None
    figures["met"] = {"push_adds_le_50ms": adds <= TARGET_PUSH_ADDS_MS}
    print(f"\nlive bench: one node, {PARTITIONS} partitions, {machine()}")
    print(f"produce → visible, {args.samples} orders {args.gap_ms:g} ms apart on {args.latency_keys} keys:")
    for label, m in (("push (notified)", push), (f"poll every {args.poll_ms:g} ms", polled)):
        print(f"  {label:<18} p50 {m['p50_ms']:7.1f} ms  p99 {m['p99_ms']:7.1f} ms  mean {m['mean_ms']:7.1f} ms")
    ratios = figures["ratios"]
    print(f"  push / poll: p50 {ratios['push_over_poll_p50']:.2f}×, p99 {ratios['push_over_poll_p99']:.2f}×; "
          f"push first for {figures['push_first_share']:.0%} of the orders; "
          f"push adds {adds:+.1f} ms at p50 (target ≤ {TARGET_PUSH_ADDS_MS:g})")  # fmt: skip
    print(f"{fan['subscriptions']:,} subscriptions ({args.keys_per_sub} of {args.pool} keys each, "
          f"{args.connections} websockets): RSS {fan['rss_before_mib']} → {fan['rss_after_mib']} MiB, "
          f"{fan['kib_per_subscription']} KiB per subscription")  # fmt: skip
    loaded = fan.get("under_load")
    if loaded:
        adds_99 = loaded["push"]["p99_ms"] - loaded["poll"]["p99_ms"]
        figures["under_load_push_adds_ms"] = {
            "p50": round(loaded["push"]["p50_ms"] - loaded["poll"]["p50_ms"], 1),
            "p99": round(adds_99, 1),
        }
        print(
            f"with every subscription open and {loaded['orders_per_s']:g} orders/s on their keys "
            f"({loaded['orders']:,} orders, {loaded['notifications']:,} notifications, {loaded['dropped']} dropped):"
        )
        for label, m in (("push (notified)", loaded["push"]), (f"poll every {args.poll_ms:g} ms", loaded["poll"])):
            print(f"  {label:<18} p50 {m['p50_ms']:7.1f} ms  p99 {m['p99_ms']:7.1f} ms  mean {m['mean_ms']:7.1f} ms")
        print(f"  push adds {figures['under_load_push_adds_ms']['p50']:+.1f} ms at p50 (target ≤ 50), "
              f"{adds_99:+.1f} ms at p99 (target ≤ 200); subscriptions opened in {fan['opened_s']} s")  # fmt: skip
    print(f"{fan['orders']:,} orders on their keys: {fan['notifications']:,} notifications ({fan['changes_in_them']:,} "
          f"changes) in {fan['wall_s']} s, node CPU {fan['cpu_s']} s → {figures['notifications_per_cpu_s']:,} "
          f"notifications per CPU-second; ingest alone {alone['cpu_s']:.2f} CPU-s → "
          f"{figures['notifications_per_cpu_s_net'] or 'n/a'} per CPU-second of what they add")  # fmt: skip
    summary = {**figures, "args": {k: v for k, v in vars(args).items() if k != "started"}, "machine": machine()}
    summary["seconds"] = round(time.perf_counter() - args.started, 1)
    print(json.dumps(summary, separators=(",", ":")))


def parse_args() -> argparse.Namespace:
    """Return the command line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000, help="generated orders before the node starts")
    parser.add_argument("--samples", type=int, default=100, help="orders timed push beside poll")
    parser.add_argument("--gap-ms", type=float, default=250.0, help="between two timed orders")
    parser.add_argument("--poll-ms", type=float, default=20.0, help="between two polls")
    parser.add_argument("--latency-keys", type=int, default=20)
    parser.add_argument("--subscribers", type=int, default=1_000)
    parser.add_argument("--connections", type=int, default=10, help="websockets the subscriptions share")
    parser.add_argument("--keys-per-sub", type=int, default=2, help="keys per subscription (at most, with --min-...)")
    parser.add_argument("--min-keys-per-sub", type=int, default=0, help="fewest keys per subscription (0: as many)")
    parser.add_argument(
        "--load-rate", type=float, default=0.0,
        help="orders/s on the subscriptions' keys while push beside poll is measured again with every one open",
    )  # fmt: skip
    parser.add_argument("--pool", type=int, default=500, help="keys the subscriptions choose from")
    parser.add_argument("--fanout", type=int, default=5_000, help="orders produced on the subscriptions' keys")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the node to start and catch up")
    args = parser.parse_args()
    args.started = time.perf_counter()
    return args


async def measure(args: argparse.Namespace, node: NodeProcess, bootstrap: str, topic: str) -> dict[str, Any]:
    figures = await push_and_poll(args, node.url, bootstrap, topic)
    print(f"push p50 {figures['push']['p50_ms']} ms, poll p50 {figures['poll']['p50_ms']} ms", flush=True)
    figures["ingest_alone"] = await asyncio.to_thread(ingest_alone, args, node, bootstrap, topic)
    figures["fan_out"] = await fan_out(args, node, bootstrap, topic)
    return figures


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, _terminated)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    with KafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="iqgraph-bench-live-") as tmp:
        bootstrap = broker.bootstrap_servers
        broker.create_topics({topic: PARTITIONS})
        counts = produce_orders(bootstrap, topic, args.events)
        home = Path(tmp)
        write_app_module(home, APP_MODULE, topic, PARTITIONS, bootstrap)
        nodes = start_nodes(home, APP_MODULE, 1)
        try:
            wait_ready(nodes, args.timeout)
            client = Client()
            wait_counts(client, nodes[0].url, dict(itertools.islice(counts.items(), 200)), args.timeout)
            client.close()
            print(f"node ready at {nodes[0].url}", flush=True)
            figures = asyncio.run(measure(args, nodes[0], bootstrap, topic))
        except BaseException:
            print(log_tail(nodes[0]), file=sys.stderr)
            raise
        finally:
            stop_nodes(nodes)
    report(args, figures)


if __name__ == "__main__":
    main()
