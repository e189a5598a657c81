"""Routing uses the producers' partitioner: checked against librdkafka producing into the real broker."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from iqgraph.streaming.broker import ONE_RECORD_PER_REQUEST, EmbeddedBroker
from iqgraph.streaming.partitioner import murmur2, partition_for
from tests.conftest import MakeTopic

PARTITIONS = 7


def test_murmur2_matches_kafkas_java_test_vectors() -> None:
    def signed(value: int) -> int:
        return value - (1 << 32) if value >= 1 << 31 else value

    assert signed(murmur2(b"21")) == -973932308
    assert signed(murmur2(b"foobar")) == -790332482
    assert signed(murmur2(b"a-little-bit-long-string")) == -985981536
    assert signed(murmur2(b"")) == 275646681


@pytest.mark.parametrize(
    ("librdkafka", "ours"), [("murmur2_random", "murmur2"), ("consistent_random", "consistent_random")]
)
def test_partition_for_agrees_with_librdkafka(
    broker: EmbeddedBroker, make_topic: MakeTopic, librdkafka: str, ours: str
) -> None:
    topic = make_topic(PARTITIONS, prefix="route")
    producer = Producer(
        {**ONE_RECORD_PER_REQUEST, "bootstrap.servers": broker.bootstrap_servers, "partitioner": librdkafka}
    )
    landed: dict[str, int] = {}

    def delivered(error: object, message: object) -> None:
        assert error is None
        landed[message.key().decode()] = message.partition()  # type: ignore[attr-defined]

    keys = [f"customer-{i:04d}" for i in range(300)] + ["ü-ñ-漢字", "a" * 100]
    if librdkafka == "murmur2_random":
        keys.append("")  # consistent_random partitions empty keys at random, like null ones
    for key in keys:
        producer.produce(topic, key=key.encode(), value=b"{}", on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert set(landed) == set(keys)
    for key, partition in landed.items():
        assert partition_for(key, PARTITIONS, "string", ours) == partition, key  # type: ignore[arg-type]
