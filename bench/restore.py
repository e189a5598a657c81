"""Restore in proportion to the state, not the history: a new copy of the shop example restored from the changelog,
beside the replay of the input topic it replaces, for several history lengths over the same keys, in one run.

For each of ``--events`` (default 1,000,000 and 5,000,000), on one embedded Apache Kafka broker and one Spark
session: a fresh 6-partition topic gets that many orders over ``--keys`` customers (uniform), ``--spacing-ms`` of
event time apart (default 1 s: a shop taking an order a second, so 1M orders are 11.6 days and 5M are 58 days, both
longer than the example's 24-hour window retention — the state is the same 10,000 customers and the last day's
windows in both); a runner on an empty state dir ingests them all from the topic (the replay: what a new copy cost
before changelogs), writing the changelog.

What a restore reads is what Kafka's cleaner leaves: the cleaned segments (one record per entry), the dirty part
(cleaning starts at 20 % dirty) and each partition's active segment (1 MiB or an hour; ``CHANGELOG_CONFIG``), plus
the tombstones younger than ``delete.retention.ms`` (1 h): here the expired windows' of most of the history. A
production changelog's history is days old, the bench's minutes: so that the bench reads what a day-old changelog
holds, it creates the changelog topic itself, with ``CHANGELOG_CONFIG`` and ``delete.retention.ms`` 0 (the last
hour's tombstones, at an order a second ~20,000 records, are then not counted), and after the replay waits until
the cleaner is done (the partitions' bytes on disk unchanged for 10 s).

Then a runner on another empty state dir starts and restores from the changelog, and is timed until every partition
is RUNNING (queryable, caught up with the topic). Prints per history: the replay's seconds, the changelog's bytes
before and after cleaning, the restore's seconds, the records and MB it read, the entries the restored copy holds,
and the ratio between the histories' restores; the last line is one JSON object. ``--no-age`` restores from the
changelog as the writes left it (the topic's own ``delete.retention.ms``, the cleaner's own pace).

Usage: ``.venv/bin/python bench/restore.py [--events 1000000,5000000] [--keys 10000] [--spacing-ms 1000]``
(minutes: the replays).
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
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from iqgraph.examples.shop import ITEMS, build_app  # noqa: E402
from iqgraph.stores import PartitionState, StateDirectory  # noqa: E402
from iqgraph.stores.changelog import RESTORES  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import JAVA_PARTITIONER  # noqa: E402
from iqgraph.streaming.changelog import CHANGELOG_CONFIG, changelog_topic  # noqa: E402
from iqgraph.streaming.runner import RunnerSettings, StreamRunner  # noqa: E402
from iqgraph.streaming.session import build_spark_session  # noqa: E402

PARTITIONS = 6


def produce_orders(bootstrap: str, topic: str, events: int, keys: int, spacing_ms: int) -> float:
    """Produce events orders over keys customers; return the seconds it took."""
    producer = Producer({**JAVA_PARTITIONER, "bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    rng = random.Random(events)
    started = time.monotonic()
    base = 1_767_225_600_000
    for n in range(events):
        quantity = rng.randint(1, 5)
        customer = f"customer-{rng.randrange(keys):05d}"
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((base + n * spacing_ms) / 1000)) + "Z"
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


def changelog_bytes(broker: KafkaBroker, changelog: str) -> int:
    """Return the bytes of changelog's partitions on the broker's disk (segments and indexes)."""
    dirs = [d for d in broker.log_dir.iterdir() if d.name.rsplit("-", 1)[0] == changelog]
    return sum(f.stat().st_size for d in dirs for f in d.iterdir() if f.suffix == ".log")


def create_changelog(broker: KafkaBroker, changelog: str) -> None:
    """Create changelog as the runner would, with delete.retention.ms 0 (see the module's docstring)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    config = {**CHANGELOG_CONFIG, "delete.retention.ms": "0"}
    for future in admin.create_topics([NewTopic(changelog, PARTITIONS, config=config)]).values():
        future.result(30)


def cleaned_after(broker: KafkaBroker, changelog: str, timeout: float) -> float:
    """Wait until the cleaner is done with changelog (its bytes unchanged for 10 s); return the seconds it took."""
    started, deadline = time.monotonic(), time.monotonic() + timeout
    last, since = changelog_bytes(broker, changelog), time.monotonic()
    while time.monotonic() - since < 10.0 and time.monotonic() < deadline:
        time.sleep(1.0)
        now = changelog_bytes(broker, changelog)
        if now != last:
            last, since = now, time.monotonic()
    return time.monotonic() - started - 10.0


def entries(runner: StreamRunner, topic: str) -> int:
    """Return the entries the runner's copies of topic hold, in every column family."""
    return sum(sum(1 for _ in stores.db.entries()) for stores in runner.partitions[topic].values())


def run(
    spark: Any, broker: KafkaBroker, root: Path, events: int, keys: int, spacing_ms: int, aged: bool, timeout: float
) -> dict[str, float]:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    broker.create_topics({topic: PARTITIONS})
    app = build_app(topic, PARTITIONS)
    changelog = changelog_topic(app.name, topic)
    if aged:
        create_changelog(broker, changelog)
    produced = produce_orders(broker.bootstrap_servers, topic, events, keys, spacing_ms)
    settings = RunnerSettings(broker.bootstrap_servers, max_records_per_batch=200_000)
    replaying = StreamRunner(app, spark, StateDirectory(root / f"replay-{events}", app.name), settings)
    try:
        replay = ready_after(replaying, topic, timeout)
        replayed_entries = entries(replaying, topic)
    finally:
        replaying.stop()
    written = changelog_bytes(broker, changelog)
    cleaning = cleaned_after(broker, changelog, timeout)
    cleaned = changelog_bytes(broker, changelog)
    RESTORES.clear()
    restoring = StreamRunner(app, spark, StateDirectory(root / f"restore-{events}", app.name), settings)
    try:
        restore = ready_after(restoring, topic, timeout)
        restored_entries = entries(restoring, topic)
    finally:
        restoring.stop()
    read = [p for (name, _), p in RESTORES.items() if name.startswith(f"{app.name}-{topic}")]
    return {
        "events": events,
        "produce_s": produced,
        "replay_s": replay,
        "changelog_written_mb": written / 1e6,
        "cleaning_s": cleaning,
        "changelog_cleaned_mb": cleaned / 1e6,
        "restore_s": restore,
        "replayed_entries": replayed_entries,
        "restored_entries": restored_entries,
        "changelog_records": sum(p.records for p in read),
        "changelog_mb": sum(p.bytes for p in read) / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", default="1000000,5000000")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--spacing-ms", type=int, default=1000, help="event time between two orders")
    parser.add_argument("--no-age", action="store_true", help="the changelog with its own delete.retention.ms")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    histories = [int(n) for n in args.events.split(",")]
    spark = build_spark_session("local[*]", shuffle_partitions=2)
    try:
        with tempfile.TemporaryDirectory(prefix="iqgraph-restore-") as tmp, KafkaBroker() as broker:
            runs = [
                run(spark, broker, Path(tmp), n, args.keys, args.spacing_ms, not args.no_age, args.timeout)
                for n in histories
            ]
    finally:
        spark.stop()
    for figures in runs:
        print(
            f"{figures['events']:>10,} events: replay {figures['replay_s']:7.1f} s; changelog "
            f"{figures['changelog_written_mb']:.1f} MB after the replay, "
            f"{figures['changelog_cleaned_mb']:.1f} MB after cleaning ({figures['cleaning_s']:.0f} s); "
            f"restore {figures['restore_s']:6.1f} s "
            f"({figures['changelog_records']:,} changelog records, {figures['changelog_mb']:.1f} MB read; "
            f"{figures['restored_entries']:,} entries restored, {figures['replayed_entries']:,} replayed)"
        )
    if len(runs) > 1:
        print(f"restore {histories[-1]:,} / {histories[0]:,}: {runs[-1]['restore_s'] / runs[0]['restore_s']:.2f}x")
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
