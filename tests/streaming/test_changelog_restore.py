"""Copies built after the source's retention deleted records answer what the older copy answers (issue 41): a copy
on a wiped state dir, a new standby that follows the changelog, and that standby promoted to active; a copy that
stopped longer ago than the changelog keeps tombstones restores in full, a recent one its tail. The shop app
(key-value, windows, a ranking, a bloom filter keyed by a column) on the session's broker, one Spark session."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from iqgraph.examples.shop import build_app, generate_orders
from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.stores.changelog import CHANGELOG_NEXT_KEY, RESTORES
from iqgraph.stores.partition import META_CF, TOPIC_PARTITIONS_KEY
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.changelog import changelog_topic
from iqgraph.streaming.definitions import App
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from tests.support.pipeline import START_MS

PARTITIONS = 3
CAUGHT_UP_S = 180.0
Dump = dict[int, dict[str, dict[bytes, bytes]]]


def orders(seed: int, n: int) -> list[tuple[bytes, bytes, None]]:
    """Return n shop orders as (key, value, None) records."""
    import orjson

    return [(k.encode(), orjson.dumps(v), None) for k, v in itertools.islice(generate_orders(seed, START_MS), n)]


def delete_all_records(bootstrap: str, topic: str) -> None:
    """Delete every record the topic holds, as time retention does once they are old enough."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[1] for p in range(PARTITIONS)}
    consumer.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, p, end) for p, end in ends.items()]).values():
        future.result(timeout=30)


def runner_on(
    app: App, spark: Any, state: Path, bootstrap: str, role: Callable[[str, int], str] | None = None, **settings: Any
) -> StreamRunner:
    """Return a started runner over every partition of app's topic (role: which it follows as a standby)."""
    runner = StreamRunner(
        app,
        spark,
        StateDirectory(state, app.name),
        RunnerSettings(bootstrap, max_records_per_batch=2_000, **settings),
        role=role,
    )
    runner.start({app.topics[0].name: range(PARTITIONS)})
    return runner


def caught_up(runner: StreamRunner, topic: str) -> None:
    runner.wait_until_caught_up(timeout=CAUGHT_UP_S)
    assert all(s.db.state is PartitionState.RUNNING for s in runner.partitions[topic].values())


def dump(partitions: Mapping[int, PartitionStores]) -> Dump:
    """Return every column family's entries of each partition (meta without the copy's own bookkeeping)."""
    found: Dump = {}
    for p, stores in partitions.items():
        families: dict[str, dict[bytes, bytes]] = {}
        for family, key in stores.db.entries():
            families.setdefault(family, {})[key] = stores.db.family(family).get(key)
        for local in (CHANGELOG_NEXT_KEY, TOPIC_PARTITIONS_KEY, b"committed_at_ms"):
            families.get(META_CF, {}).pop(local, None)
        found[p] = families
    return found


def wait_equal(expected: Callable[[], Dump], actual: Callable[[], Dump], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while expected() != actual():
        assert time.monotonic() < deadline, "the copies differ"
        time.sleep(0.2)


def test_copies_built_after_retention_answer_what_the_older_copy_answers(
    broker: KafkaBroker, spark: Any, tmp_path: Path, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(PARTITIONS)
    app = build_app(topic, PARTITIONS)
    bootstrap = broker.bootstrap_servers
    produce(bootstrap, topic, orders(1, 3_000))
    older = runner_on(app, spark, tmp_path / "older", bootstrap)
    try:
        caught_up(older, topic)
        truth = dump(older.partitions[topic])
        counts = {
            k: v for s in older.partitions[topic].values() for k, v in s.kv("order_count").all(limit=10_000).items
        }
    finally:
        older.stop()
    assert sum(counts.values()) == 3_000
    delete_all_records(bootstrap, topic)  # retention: the topic holds none of the records the stores count

    # without changelogs a copy on a wiped disk replays what the topic still holds: nothing (the old failure)
    replayed = runner_on(app, spark, tmp_path / "replayed", bootstrap, changelog=False)
    try:
        caught_up(replayed, topic)
        assert dump(replayed.partitions[topic]) != truth
        assert not any(s.kv("order_count").all(limit=10).items for s in replayed.partitions[topic].values())
    finally:
        replayed.stop()

    # a node restarted on a wiped state dir restores the changelog, then reads on: exactly the older copy's state
    wiped = runner_on(app, spark, tmp_path / "wiped", bootstrap)
    standby: StreamRunner | None = None
    roles = {"role": "standby"}
    try:
        caught_up(wiped, topic)
        assert dump(wiped.partitions[topic]) == truth
        # a new standby (no pipeline: it follows the changelog) is equal too, and keeps following new batches
        standby = runner_on(
            app, spark, tmp_path / "standby", bootstrap, role=lambda t, p: roles["role"], follow_changelog=True
        )
        assert standby.hosted.follower is not None and len(standby.hosted.follower.followed()) == PARTITIONS
        wait_equal(lambda: truth, lambda: dump(standby.partitions[topic]) if standby else {})
        produce(bootstrap, topic, orders(2, 1_000))
        caught_up(wiped, topic)
        wait_equal(lambda: dump(wiped.partitions[topic]), lambda: dump(standby.partitions[topic]) if standby else {})
        after = {k: v for s in wiped.partitions[topic].values() for k, v in s.kv("order_count").all(limit=10_000).items}
        assert sum(after.values()) == 4_000
    finally:
        wiped.stop()
    # the active is gone; the standby is promoted: it takes the changelog over and runs the pipeline from its offsets
    roles["role"] = "active"
    assert standby is not None
    try:
        standby.reassign({topic: range(PARTITIONS)})
        produce(bootstrap, topic, orders(3, 500))
        caught_up(standby, topic)
        final = {
            k: v for s in standby.partitions[topic].values() for k, v in s.kv("order_count").all(limit=10_000).items
        }
        assert sum(final.values()) == 4_500
        assert standby.hosted.follower is not None and standby.hosted.follower.followed() == []
        promoted = dump(standby.partitions[topic])
    finally:
        standby.stop()
    # and a copy built from the changelog now equals the promoted one
    last = runner_on(app, spark, tmp_path / "last", bootstrap, role=lambda t, p: "standby", follow_changelog=True)
    try:
        wait_equal(lambda: promoted, lambda: dump(last.partitions[topic]))
    finally:
        last.stop()


def set_tombstone_retention(bootstrap: str, topic: str, ms: int) -> None:
    """Set topic's delete.retention.ms (how long the cleaner keeps tombstones)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry("delete.retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.incremental_alter_configs(
        [ConfigResource("topic", topic, incremental_configs=[entry])]
    ).values():
        future.result(timeout=30)


def restored_from(topic: str, app: App) -> dict[int, int]:
    """Return the changelog offset each partition's last restore started at."""
    changelog = changelog_topic(app.name, topic)
    return {p: RESTORES[(changelog, p)].start for p in range(PARTITIONS) if (changelog, p) in RESTORES}


def test_a_copy_older_than_the_changelogs_tombstones_restores_in_full_and_a_recent_one_its_tail(
    broker: KafkaBroker, spark: Any, tmp_path: Path, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(PARTITIONS)
    app = build_app(topic, PARTITIONS)
    bootstrap = broker.bootstrap_servers

    def run_once(state: str, seed: int) -> Dump:
        produce(bootstrap, topic, orders(seed, 600))
        runner = runner_on(app, spark, tmp_path / state, bootstrap)
        try:
            caught_up(runner, topic)
            return dump(runner.partitions[topic])
        finally:
            runner.stop()

    def reopened(state: str) -> tuple[Dump, dict[int, int]]:
        RESTORES.clear()
        runner = runner_on(app, spark, tmp_path / state, bootstrap)
        try:
            caught_up(runner, topic)
            return dump(runner.partitions[topic]), restored_from(topic, app)
        finally:
            runner.stop()

    run_once("a", 1)  # copy a writes the changelog, then stops
    newer = run_once("b", 2)  # copy b restores it and writes on: the changelog has batches past copy a
    # a recent copy reads only the tail past its own position
    state, starts = reopened("a")
    assert state == newer
    assert starts and all(start > 0 for start in starts.values()), starts
    newest = run_once("b", 3)
    # the changelog keeps tombstones 2 s: copy a, last written more than 1 s ago, could miss a purged delete
    set_tombstone_retention(bootstrap, changelog_topic(app.name, topic), 2_000)
    time.sleep(1.5)
    state, starts = reopened("a")
    assert state == newest
    assert starts and all(start == 0 for start in starts.values()), starts
