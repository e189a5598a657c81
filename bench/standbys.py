"""What standbys cost: the CPU of two nodes ingesting the same orders, without standbys and with one per partition.

One run, all on this machine, against one embedded Apache Kafka broker:

1. for each of ``--standbys`` (default ``0,1``), in order: a fresh 6-partition topic; two nodes of one static
   cluster (``iqgraph serve`` subprocesses, ``local[1]`` Spark each; node i is active for the partitions p with
   p % 2 == i, and with one standby it also mirrors the other node's) started on the empty topic and waited
   for until ready;
2. the CPU seconds of each node's process tree (the node, its Spark JVM and Python workers) read from /proc;
   ``--events`` shop orders produced, batched; the nodes waited for until each has applied every record of every
   partition it hosts, active and standby (``node { partitions { appliedOffset endOffset } }``); the CPU seconds
   read again;
3. the ingest rate: ``--events`` over the time from the first produce until both nodes caught up;
4. produce → visible at light load: with the nodes caught up, one order at a time at ``--rate`` per second for
   ``--seconds``, each with a customer key of its own, produced with librdkafka's Java-compatible partitioner
   and no linger; node-0 is asked for every pending key's order count (one ``getMany`` every 5 ms, routed to the
   key's active node as any client's query is) until the key is visible: p50 and p99 in ms;
5. per setting: each node's CPU for the ingest, the cluster's total, and the ratio with standbys / without; the
   last line one JSON object with every figure.

What one standby costs, measured directly (the two-node totals above differ by less than their run-to-run noise):
in the run without standbys, a third process follows the six partitions' changelogs the way a standby node does
(``ChangelogFollower`` over fresh ``PartitionStores``, no Spark), started before the orders are produced and
stopped once it applied every batch; its CPU seconds (every thread: librdkafka's fetchers, the decoding, RocksDB's
writes) per event, divided by the active nodes' CPU seconds per event, is a standby's cost in an active's terms.

Usage: ``.venv/bin/python bench/standbys.py [--events N] [--standbys 0,1] [--rate R] [--seconds S]`` (~2 minutes
per setting). ``bench/standbys.py follow HOME MODULE TOPIC EVENTS`` is the follower process (run by the bench).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; put the repository ahead of it.
sys.path.insert(0, str(ROOT))

from bench.cluster import FIELD as COUNT_FIELD  # noqa: E402
from bench.cluster import GET_MANY, Client, produce_orders, stop_nodes  # noqa: E402
from bench.ingest import _proc_stat, latency_events, percentile, visible_after_produce  # noqa: E402
from iqgraph.stores import PartitionStores, StateDirectory  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.changelog import Changelogs  # noqa: E402
from iqgraph.streaming.changelog_follower import ChangelogFollower  # noqa: E402
from tests.support.nodes import NodeProcess, start_nodes, wait_ready, write_app_module  # noqa: E402

PARTITIONS = 6
NODES = 2
PARTITIONS_QUERY = "{ node { partitions { topic partition role appliedOffset endOffset } } }"


def tree_cpu(pid: int) -> float:
    """Return the CPU seconds of pid and every process under it (the node, its JVM, its Python workers)."""
    stats = {int(d): s for d in os.listdir("/proc") if d.isdigit() and (s := _proc_stat(int(d))) is not None}
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(child)
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        if current in stats:
            total += stats[current][2]
            pending.extend(children.get(current, []))
    return total


def hosted(client: Client, node: NodeProcess, topic: str) -> dict[int, tuple[int, int]]:
    """Return each partition of topic the node hosts (active or standby): (applied offset, end offset)."""
    answer: Any = client.graphql(node.url, PARTITIONS_QUERY, {})
    if answer.get("errors"):
        return {}
    found = answer["data"]["node"]["partitions"]
    return {p["partition"]: (p["appliedOffset"], p["endOffset"]) for p in found if p["topic"] == topic}


def caught_up(client: Client, nodes: list[NodeProcess], topic: str, events: int, standbys: int) -> bool:
    """Return whether every node applied every record of each partition it hosts, and the partitions hold all."""
    views = [hosted(client, node, topic) for node in nodes]
    if any(len(view) != PARTITIONS // NODES * (1 + standbys) for view in views):
        return False
    ends = {p: end for view in views for p, (_, end) in view.items()}
    return sum(ends.values()) == events and all(a >= e for view in views for a, e in view.values())


def follow(home: Path, module: str, topic: str, events: int, timeout: float = 600.0) -> int:
    """Follow every partition's changelog of module's app as a standby node does until events are applied; print
    the follower's own CPU seconds and the seconds it took as JSON (the standby's side of the bench)."""
    sys.path.insert(0, str(home))
    app = importlib.import_module(module).app
    changelogs = Changelogs({"bootstrap.servers": app.kafka.bootstrap_servers}, app.name)
    follower = ChangelogFollower(changelogs)
    state = StateDirectory(home / "follower-state", app.name)
    copies: list[PartitionStores] = [state.open(topic, p, app.specs(topic)) for p in range(PARTITIONS)]
    for stores in copies:
        follower.follow(topic, stores)
    started, deadline = time.perf_counter(), time.monotonic() + timeout
    while sum(stores.db.next_offset() for stores in copies) < events:
        if time.monotonic() > deadline:
            raise TimeoutError("the follower did not apply every batch")
        time.sleep(0.05)
    took = time.perf_counter() - started
    follower.stop()
    cpu = os.times()
    print(json.dumps({"cpu_s": round(cpu.user + cpu.system, 2), "seconds": round(took, 1)}), flush=True)
    return 0


def visible_ms(
    client: Client, url: str, bootstrap: str, topic: str, events: int, rate: float, seconds: float
) -> list[float]:
    """Produce an order a key at rate per second for seconds; return ms from produce() until url answers its count."""

    def visible(keys: list[str]) -> list[str]:
        answer: Any = client.graphql(url, GET_MANY, {"k": keys})
        if answer.get("errors"):
            return []
        return [k for k, count in zip(keys, answer["data"][COUNT_FIELD]["getMany"], strict=True) if count is not None]

    orders = latency_events(events, max(int(rate * seconds), 1))
    found = visible_after_produce(bootstrap, topic, orders, rate, visible)
    if len(found) < len(orders):
        raise TimeoutError(f"{len(orders) - len(found)} of {len(orders)} light-load orders never became visible")
    return found


def run(
    broker: KafkaBroker, home: Path, events: int, standbys: int, timeout: float, rate: float, seconds: float
) -> dict[str, Any]:
    """Measure the two nodes' CPU for ingesting events with standbys standbys per partition, the ingest rate, and
    produce → visible at light load after it."""
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    broker.create_topics({topic: PARTITIONS})
    module = f"bench_standbys_{standbys}"
    home.mkdir(parents=True)
    write_app_module(home, module, topic, PARTITIONS, broker.bootstrap_servers)
    nodes = start_nodes(home, module, NODES, [["--standbys", str(standbys)]] * NODES)
    try:
        wait_ready(nodes)
        follower = None
        if standbys == 0:  # a standby's work alone, in a process of its own (see the module's docstring)
            command = [sys.executable, __file__, "follow", str(home), module, topic, str(events)]
            follower = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)  # noqa: S603
        time.sleep(5)  # the nodes' start-up CPU settles
        before = [tree_cpu(node.process.pid) for node in nodes]
        started = time.perf_counter()
        produce_orders(broker.bootstrap_servers, topic, events)
        client, deadline = Client(), time.monotonic() + timeout
        while not caught_up(client, nodes, topic, events, standbys):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the nodes did not catch up in {timeout:.0f} s")
            time.sleep(0.5)
        took = time.perf_counter() - started
        cpu = [round(tree_cpu(node.process.pid) - b, 1) for node, b in zip(nodes, before, strict=True)]
        followed = json.loads(follower.communicate(timeout=timeout)[0].splitlines()[-1]) if follower else None
        light = visible_ms(client, nodes[0].url, broker.bootstrap_servers, topic, events, rate, seconds)
    finally:
        stop_nodes(nodes)
    standby = None
    if followed is not None:
        active_per_event, standby_per_event = sum(cpu) / events, followed["cpu_s"] / events
        standby = {
            "follower_cpu_s": followed["cpu_s"],
            "active_us_per_event": round(active_per_event * 1e6, 1),
            "standby_us_per_event": round(standby_per_event * 1e6, 1),
            "standby_to_active": round(standby_per_event / active_per_event, 3),
        }
    return {
        "standbys": standbys,
        "seconds": round(took, 1),
        "events_per_s": round(events / took),
        "node_cpu_s": cpu,
        "total_cpu_s": round(sum(cpu), 1),
        "standby_cost": standby,
        "light_load": {
            "rate": rate,
            "orders": len(light),
            "p50_ms": round(percentile(light, 50) or 0, 1),
            "p99_ms": round(percentile(light, 99) or 0, 1),
        },
    }


def main() -> None:
    if sys.argv[1:2] == ["follow"]:
        home, module, topic, events = sys.argv[2:6]
        sys.exit(follow(Path(home), module, topic, int(events)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--standbys", default="0,1", help="the settings to measure, in order, comma-separated")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--rate", type=float, default=20.0, help="light-load step: orders per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="light-load step: how long")
    args = parser.parse_args()
    settings = [int(s) for s in args.standbys.split(",")]
    with KafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="iqgraph-bench-standbys-") as tmp:
        runs = [
            run(broker, Path(tmp) / f"s{s}", args.events, s, args.timeout, args.rate, args.seconds) for s in settings
        ]
    base = next((r for r in runs if r["standbys"] == 0), None)
    for r in runs:
        ratio = round(r["total_cpu_s"] / base["total_cpu_s"], 2) if base and base["total_cpu_s"] else None
        r["ratio_to_no_standbys"] = ratio
        print(
            f"standbys {r['standbys']}: {args.events:,} orders caught up on both nodes in {r['seconds']} s "
            f"({r['events_per_s']:,} events/s); CPU s per node {r['node_cpu_s']}, total {r['total_cpu_s']} "
            f"(× {ratio} of no standbys); produce → visible at {args.rate:g}/s p50 {r['light_load']['p50_ms']} ms, "
            f"p99 {r['light_load']['p99_ms']} ms"
        )
        if r["standby_cost"]:
            c = r["standby_cost"]
            print(
                f"one standby of every partition (a changelog follower, {c['follower_cpu_s']} CPU s): "
                f"{c['standby_us_per_event']} µs CPU per event against the actives' {c['active_us_per_event']} µs: "
                f"{c['standby_to_active']} of an active"
            )
    print(json.dumps({"events": args.events, "partitions": PARTITIONS, "nodes": NODES, "runs": runs}))


if __name__ == "__main__":
    main()
