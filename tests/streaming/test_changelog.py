"""The changelog (streaming.changelog, stores.changelog) on the session's Apache Kafka broker: batches sent in one
transaction each, a copy restored from it equal to the writer's stores, a standby that follows it, a zombie fenced."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from iqgraph.app.metrics import changelog_metrics
from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.stores.changelog import changelog_next
from iqgraph.streaming import changelog_follower
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.changelog import (
    CHANGELOG_CONFIG,
    ChangelogFencedError,
    Changelogs,
    changelog_consumer,
    changelog_topic,
)
from iqgraph.streaming.changelog_follower import ChangelogFollower
from iqgraph.streaming.kafka_offsets import KafkaSourceError
from tests.stores.conftest import SPECS, TOPIC
from tests.support.changelog_batches import contents, write_batch

Open = Callable[[str, int], PartitionStores]


@pytest.fixture
def app_name(broker: KafkaBroker) -> str:
    """Return a new app name whose changelog topic (2 partitions, compacted) exists."""
    name = f"cl{random.randrange(1 << 30):x}"
    broker.create_topics({changelog_topic(name, TOPIC): 2}, CHANGELOG_CONFIG)
    return name


@pytest.fixture
def open_copy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Open]:
    """Return a function that opens partition p of TOPIC in a state directory of its own (a copy on a node)."""
    opened: list[PartitionStores] = []

    def open_(node: str, partition: int = 0) -> PartitionStores:
        root = tmp_path_factory.getbasetemp() / f"{node}-{random.randrange(1 << 30):x}"
        stores = StateDirectory(root, "test-app").open(TOPIC, partition, SPECS)
        opened.append(stores)
        return stores

    yield open_
    for stores in opened:
        stores.close()


def test_a_copy_restored_from_the_changelog_equals_the_writer(
    broker: KafkaBroker, app_name: str, open_copy: Open
) -> None:
    config = {"bootstrap.servers": broker.bootstrap_servers}
    changelogs = Changelogs(config, app_name)
    active = open_copy("a")
    rng = random.Random(1)
    for _ in range(30):
        write_batch(active, changelogs, rng)
    assert changelog_next(active.db) > 0
    fresh = open_copy("b")
    progress = Changelogs(config, app_name).restore(TOPIC, fresh)
    assert progress.records > 0
    assert contents(fresh) == contents(active)
    # operators see it: where the copy is, the end it restored to, records, bytes
    gauges = {m.name: m.samples for m in changelog_metrics({(changelog_topic(app_name, TOPIC), 0): progress})}
    assert gauges["iqgraph_changelog_position"][0].value == changelog_next(fresh.db) == progress.target
    assert gauges["iqgraph_changelog_restored_records"][0].value == progress.records
    assert gauges["iqgraph_changelog_restored_bytes"][0].value == progress.bytes > 0
    assert gauges["iqgraph_changelog_restore_remaining_offsets"][0].value == 0
    fresh.db.set_state(PartitionState.RUNNING)
    active.db.set_state(PartitionState.RUNNING)
    assert fresh.bloom("seen").might_contain_many([f"k{i}" for i in range(60)]) == active.bloom(
        "seen"
    ).might_contain_many([f"k{i}" for i in range(60)])
    # a copy with state reads only the tail
    for _ in range(5):
        write_batch(active, changelogs, rng)
    tail = Changelogs(config, app_name).restore(TOPIC, fresh)
    assert 0 < tail.records < progress.records
    assert contents(fresh) == contents(active)


def active_copy(
    config: dict[str, str], app_name: str, active: PartitionStores, seed: int, batches: int
) -> tuple[Changelogs, PartitionStores, random.Random]:
    """Write batches random batches to active and its changelog; return the changelogs, active and the batches'
    random generator (for more)."""
    changelogs = Changelogs(config, app_name)
    rng = random.Random(seed)
    for _ in range(batches):
        write_batch(active, changelogs, rng)
    return changelogs, active, rng


def test_a_standby_follows_the_changelog_batch_by_batch(broker: KafkaBroker, app_name: str, open_copy: Open) -> None:
    config = {"bootstrap.servers": broker.bootstrap_servers}
    changelogs, active, rng = active_copy(config, app_name, open_copy("a", 1), seed=2, batches=10)
    standby = open_copy("s", 1)
    follower = ChangelogFollower(Changelogs(config, app_name))
    follower.follow(TOPIC, standby)
    try:
        seen_offsets: set[int] = set()
        stop = threading.Event()

        def watch() -> None:  # every next offset a reader sees is a batch end of the writer's
            while not stop.is_set():
                if standby.db.state is PartitionState.RUNNING:
                    seen_offsets.add(standby.db.next_offset())
                time.sleep(0.001)

        watcher = threading.Thread(target=watch)
        watcher.start()
        for _ in range(20):
            write_batch(active, changelogs, rng)
        deadline = time.monotonic() + 20
        while standby.db.next_offset() != active.db.next_offset() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        watcher.join()
        assert standby.db.state is PartitionState.RUNNING
        assert contents(standby) == contents(active)
        assert seen_offsets <= {40 * i for i in range(31)}
    finally:
        follower.stop()


def test_a_zombie_writer_is_fenced_and_writes_nothing_locally(
    broker: KafkaBroker, app_name: str, open_copy: Open
) -> None:
    config = {"bootstrap.servers": broker.bootstrap_servers}
    zombie_log, new_log = Changelogs(config, app_name), Changelogs(config, app_name)
    zombie = open_copy("z")
    rng = random.Random(3)
    write_batch(zombie, zombie_log, rng)
    new_owner = open_copy("n")
    new_log.writer(TOPIC).fence(0)
    new_log.restore(TOPIC, new_owner)
    before = contents(zombie)
    with pytest.raises(ChangelogFencedError):
        write_batch(zombie, zombie_log, rng)
    assert contents(zombie) == before
    write_batch(new_owner, new_log, rng)
    check = open_copy("c")
    Changelogs(config, app_name).restore(TOPIC, check)
    assert contents(check) == contents(new_owner)


class DeafConsumer:
    """A real changelog consumer that reads nothing, as the one librdkafka#5430 left without a leader for good."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def consume(self, *_: Any, **__: Any) -> list[Any]:
        time.sleep(0.2)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def test_a_standby_whose_consumer_reads_nothing_while_the_changelog_grows_reads_on_with_a_new_one(
    broker: KafkaBroker,
    app_name: str,
    open_copy: Open,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = {"bootstrap.servers": broker.bootstrap_servers}
    changelogs, active, rng = active_copy(config, app_name, open_copy("a", 0), seed=3, batches=3)
    made: list[Any] = []

    def first_deaf(*args: Any) -> Any:
        consumer = changelog_consumer(*args)
        made.append(consumer)
        return DeafConsumer(consumer) if len(made) == 1 else consumer

    monkeypatch.setattr(changelog_follower, "changelog_consumer", first_deaf)
    monkeypatch.setattr(changelog_follower, "STUCK_S", 2.0)
    standby = open_copy("s", 0)
    follower = ChangelogFollower(Changelogs(config, app_name))
    silent = [KafkaSourceError("could not list offsets: Kafka away")]  # the first look: Kafka does not answer
    end_offsets = follower.changelogs.end_offsets

    def after_silence(*args: Any) -> Any:
        if silent and threading.current_thread().name == "changelog-follower":
            raise silent.pop()
        return end_offsets(*args)

    monkeypatch.setattr(follower.changelogs, "end_offsets", after_silence)
    with caplog.at_level(logging.WARNING, logger="iqgraph.streaming.changelog_follower"):
        follower.follow(TOPIC, standby)
        try:
            for _ in range(5):
                write_batch(active, changelogs, rng)
            deadline = time.monotonic() + 30
            while standby.db.next_offset() != active.db.next_offset() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            follower.stop()
    assert not silent and len(made) == 2 and standby.db.state is PartitionState.RUNNING  # the thread outlived it
    assert contents(standby) == contents(active)
    lines = [r.getMessage() for r in caplog.records if "a new consumer" in r.getMessage()]
    assert len(lines) == 1 and f"{changelog_topic(app_name, TOPIC)}[0] from " in lines[0], lines
