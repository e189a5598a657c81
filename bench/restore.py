"""Restore in proportion to the state, not the history: a new copy of the shop example restored from the changelog,
beside the replay of the input topic it replaces, for several history lengths over the same keys, in one run.

For each of ``--events`` (default 1,000,000 and 5,000,000), on one embedded Apache Kafka broker and one Spark
session: a fresh 6-partition topic gets that many orders over ``--keys`` customers (uniform); a runner on an empty
state dir ingests them all from the topic (the replay: what a new copy cost before changelogs), writing the
changelog; then a runner on another empty state dir starts and restores from the changelog, and is timed until every
partition is RUNNING (queryable, caught up with the topic). Prints per history: the replay's seconds, the restore's
seconds, the changelog records and MB it read, and the ratio between the histories' restores; the last line is one
JSON object.

Usage: ``.venv/bin/python bench/restore.py [--events 1000000,5000000] [--keys 10000]`` (minutes: the replays).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from iqgraph.examples.shop import ITEMS, build_app  # noqa: E402
from iqgraph.stores import PartitionState, StateDirectory  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import JAVA_PARTITIONER  # noqa: E402
from iqgraph.streaming.changelog import RESTORES  # noqa: E402
from iqgraph.streaming.runner import RunnerSettings, StreamRunner  # noqa: E402
from iqgraph.streaming.session import build_spark_session  # noqa: E402

PARTITIONS = 6


def produce_orders(bootstrap: str, topic: str, events: int, keys: int) -> float:
    """Produce events orders over keys customers; return the seconds it took."""
    producer = Producer({**JAVA_PARTITIONER, "bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    rng = random.Random(events)
    started = time.monotonic()
    base = 1_767_225_600_000
    for n in range(events):
        quantity = rng.randint(1, 5)
        customer = f"customer-{rng.randrange(keys):05d}"
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((base + n * 10) / 1000)) + "Z"
        value = {"order_id": f"o-{n}", "customer": customer, "item": rng.choice(ITEMS), "quantity": quantity,
                 "amount": round(quantity * rng.uniform(2.0, 80.0), 2), "ts": ts}  # fmt: skip
        while True:
            try:
                producer.produce(topic, orjson.dumps(value), customer.encode())
                break
            except BufferError:
                producer.poll(0.05)
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    return time.monotonic() - started


def ready_after(runner: StreamRunner, topic: str, timeout: float) -> float:
    """Start runner over every partition; return the seconds until each is RUNNING and caught up."""
    started = time.monotonic()
    runner.start({topic: range(PARTITIONS)})
    runner.wait_until_caught_up(timeout=timeout, poll=0.05)
    assert all(s.db.state is PartitionState.RUNNING for s in runner.partitions[topic].values())
    return time.monotonic() - started


def run(spark: Any, broker: KafkaBroker, root: Path, events: int, keys: int, timeout: float) -> dict[str, float]:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    broker.create_topics({topic: PARTITIONS})
    app = build_app(topic, PARTITIONS)
    produced = produce_orders(broker.bootstrap_servers, topic, events, keys)
    settings = RunnerSettings(broker.bootstrap_servers, max_records_per_batch=200_000)
    replaying = StreamRunner(app, spark, StateDirectory(root / f"replay-{events}", app.name), settings)
    try:
        replay = ready_after(replaying, topic, timeout)
    finally:
        replaying.stop()
    RESTORES.clear()
    restoring = StreamRunner(app, spark, StateDirectory(root / f"restore-{events}", app.name), settings)
    try:
        restore = ready_after(restoring, topic, timeout)
    finally:
        restoring.stop()
    read = [p for (name, _), p in RESTORES.items() if name.startswith(f"{app.name}-{topic}")]
    return {
        "events": events,
        "produce_s": produced,
        "replay_s": replay,
        "restore_s": restore,
        "changelog_records": sum(p.records for p in read),
        "changelog_mb": sum(p.bytes for p in read) / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", default="1000000,5000000")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    histories = [int(n) for n in args.events.split(",")]
    spark = build_spark_session("local[*]", shuffle_partitions=2)
    try:
        with tempfile.TemporaryDirectory(prefix="iqgraph-restore-") as tmp, KafkaBroker() as broker:
            runs = [run(spark, broker, Path(tmp), n, args.keys, args.timeout) for n in histories]
    finally:
        spark.stop()
    for figures in runs:
        print(
            f"{figures['events']:>10,} events: replay {figures['replay_s']:7.1f} s, "
            f"restore {figures['restore_s']:6.1f} s "
            f"({figures['changelog_records']:,} changelog records, {figures['changelog_mb']:.1f} MB)"
        )
    if len(runs) > 1:
        print(f"restore {histories[-1]:,} / {histories[0]:,}: {runs[-1]['restore_s'] / runs[0]['restore_s']:.2f}x")
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
