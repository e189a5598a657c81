"""A changelog batch while Kafka is away (issue 42 part 1): with a limit (``ChangelogWriter.outage_s``; a node's
default: ``OUTAGE_S``) the batch waits and is sent again through a new producer of the same transactional id,
committed once when Kafka is back — a pause of the pipeline, not a dead query — and ends in one ChangelogError past
the limit, written nowhere. Each test runs its own broker (killed and started again on the same data)."""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from iqgraph.stores import PartitionStores, StateDirectory
from iqgraph.stores.changelog import is_batch_end
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port
from iqgraph.streaming.changelog import (
    CHANGELOG_CONFIG,
    ChangelogError,
    Changelogs,
    changelog_consumer,
    changelog_topic,
)
from tests.stores.conftest import SPECS, TOPIC
from tests.support.changelog_batches import contents, write_batch

APP = "outage"
TIMEOUT_S = 4.0  # the writers' transaction timeout here (30 s in a node): a message waits this long, then is sent again


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(data_dir=tmp_path / "kafka", port=free_port("127.0.0.1"))
    broker.start()
    broker.create_topics({changelog_topic(APP, TOPIC): 1}, CHANGELOG_CONFIG)
    yield broker
    broker.stop()


@pytest.fixture
def copy(tmp_path: Path) -> Iterator[PartitionStores]:
    stores = StateDirectory(tmp_path / "state", APP).open(TOPIC, 0, SPECS)
    yield stores
    stores.close()


def live_producers() -> int:
    """Return how many confluent-kafka producers this process holds (each a librdkafka client with its threads)."""
    gc.collect()
    return sum(type(held) is Producer for held in gc.get_objects())


def committed_batches(config: dict[str, str]) -> int:
    """Return how many batches the changelog holds, as a read_committed reader sees it (aborted sends are not)."""
    from confluent_kafka import TopicPartition

    consumer = changelog_consumer(config, APP)
    consumer.assign([TopicPartition(changelog_topic(APP, TOPIC), 0, 0)])
    ends = 0
    try:
        while True:
            message = consumer.poll(10)
            assert message is not None, "the changelog did not answer"
            if message.error():
                assert message.error().code() == message.error()._PARTITION_EOF, message.error()
                return ends
            ends += is_batch_end(message.key())
    finally:
        consumer.close()


def test_a_batch_sent_while_kafka_is_away_waits_and_is_committed_once_when_it_is_back(
    kafka: KafkaBroker, copy: PartitionStores, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {"bootstrap.servers": kafka.bootstrap_servers}
    changelogs = Changelogs(config, APP, transaction_timeout_s=TIMEOUT_S)
    changelogs.writer(TOPIC).outage_s = 20 * TIMEOUT_S
    rng = random.Random(5)
    for _ in range(3):
        write_batch(copy, changelogs, rng)
    kafka.kill()  # the whole of Kafka is gone, mid-stream
    failed: list[BaseException] = []

    def batch() -> None:
        try:
            write_batch(copy, changelogs, rng)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failed.append(exc)

    with caplog.at_level(logging.WARNING, logger="iqgraph.streaming.changelog"):
        sending = threading.Thread(target=batch)
        sending.start()
        time.sleep(3 * TIMEOUT_S)  # its messages timed out at least twice
        assert sending.is_alive() and not failed, failed
        kafka.start()
        sending.join(120)
    assert not sending.is_alive() and not failed, failed
    lines = [r.getMessage() for r in caplog.records if r.name == "iqgraph.streaming.changelog"]
    assert sum("sending it again until it does" in line for line in lines) == 1, lines
    assert sum("batch sent after" in line for line in lines) == 1, lines
    write_batch(copy, changelogs, rng)  # and the next batch goes as usual
    assert committed_batches(config) == 5
    fresh = StateDirectory(tmp_path / "fresh", APP).open(TOPIC, 0, SPECS)
    try:
        Changelogs(config, APP).restore(TOPIC, fresh)
        assert contents(fresh) == contents(copy)
    finally:
        fresh.close()


def test_a_batch_kafka_never_takes_ends_in_one_error_and_is_not_written(
    kafka: KafkaBroker, copy: PartitionStores
) -> None:
    config = {"bootstrap.servers": kafka.bootstrap_servers}
    changelogs = Changelogs(config, APP, transaction_timeout_s=TIMEOUT_S)
    rng = random.Random(6)
    write_batch(copy, changelogs, rng)
    changelogs.writer(TOPIC).outage_s = 2 * TIMEOUT_S
    before, producers = contents(copy), live_producers()  # the writer's one among them
    kafka.kill()
    started = time.monotonic()
    with pytest.raises(ChangelogError, match=r"the batch was not sent: .*Message timed out") as raised:
        write_batch(copy, changelogs, rng)
    took = time.monotonic() - started
    assert 2 * TIMEOUT_S <= took < 8 * TIMEOUT_S, took
    assert "\n" not in str(raised.value)
    assert contents(copy) == before
    # every producer started during the outage is gone, the error kept or not: one whose start timed out, left
    # alive, goes on asking for the transactional id and, once Kafka is back, fences the next batch's producer
    assert live_producers() == producers - 1
    # Kafka back: the next batch goes, on a new producer (a failed batch's is never kept: one may be stuck)
    started = changelogs.writer(TOPIC).producers_started  # 1, and those tried during the outage
    kafka.start()
    write_batch(copy, changelogs, rng)
    assert changelogs.writer(TOPIC).producers_started == started + 1
    assert committed_batches(config) == 2
