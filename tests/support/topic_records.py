"""What a Kafka topic holds, read back with a plain consumer: the ground truth a test compares stores with."""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition


def records_of(bootstrap: str, topic: str, partition: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """Return (offset, key, value) of every record a read_committed consumer reads of a partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "sem",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])  # retention may have moved it
        records: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, f"{topic}[{partition}] not read to its end in 30 s"
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return records
            assert error is None, error
            offset = message.offset()
            assert offset is not None
            records.append((offset, message.key(), message.value()))
    finally:
        consumer.close()
