"""Read tasks of the iqkafka Spark source: one Kafka partition's offsets [start, end) as Arrow record batches.

A read task runs in a Spark Python worker. It assigns a fresh consumer to its partition at the start offset
(no group membership, no commits), consumes in bulk, and yields one RecordBatch per ``consume()`` call, with
exactly the schema Spark expects so that Spark takes the Arrow fast path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, Message, TopicPartition
from pyspark.sql.datasource import InputPartition

from iqgraph.streaming.kafka_offsets import KafkaSourceError

__all__ = ["ARROW_SCHEMA", "KafkaInputPartition", "read_partition"]

log = logging.getLogger(__name__)

#: The Arrow form of the source's Spark schema, as Spark checks it: nullable fields, microseconds, UTC.
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
ROWS_PER_CONSUME = 10_000
DEFAULT_GROUP_ID = "iqgraph-iqkafka"  # librdkafka wants one; the consumer never joins the group


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """One read task: the offsets [start, end) of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int


def read_partition(
    client_config: Mapping[str, str], part: KafkaInputPartition, timeout: float = 60.0
) -> Iterator[pa.RecordBatch]:
    """Yield exactly the records [part.start, part.end) of one partition as Arrow record batches."""
    consumer = Consumer(consumer_config(client_config), logger=log)
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        yield from _consume_range(consumer, part, timeout)
    finally:
        consumer.close()


def consumer_config(client_config: Mapping[str, str]) -> dict[str, Any]:
    """Return the librdkafka config of a read task's consumer: assigned, never committing."""
    return {
        "group.id": DEFAULT_GROUP_ID,
        **client_config,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # a start offset Kafka no longer holds must fail, not skip
        "enable.partition.eof": False,
    }


def _consume_range(consumer: Consumer, part: KafkaInputPartition, timeout: float) -> Iterator[pa.RecordBatch]:
    """Consume from part.start until part.end in bulk; fail after timeout seconds without progress."""
    position, deadline = part.start, time.monotonic() + timeout
    while position < part.end:
        messages = _in_range(consumer.consume(min(part.end - position, ROWS_PER_CONSUME), 1.0), part)
        if messages:
            batch = _to_arrow(part, messages)
            yield batch
            position, deadline = batch["offset"][-1].as_py() + 1, time.monotonic() + timeout
            continue
        # Offsets may have gaps (compaction, transaction markers): trust the fetch position too.
        fetched = consumer.position([TopicPartition(part.topic, part.partition)])[0].offset
        position = max(position, fetched or 0)
        if time.monotonic() > deadline and position < part.end:
            raise KafkaSourceError(
                f"{part.topic}[{part.partition}]: no records at {position} "
                f"for {timeout:.0f} s, expected up to {part.end}"
            )


def _in_range(messages: list[Message], part: KafkaInputPartition) -> list[Message]:
    """Return the messages before part.end; raise on a consumer error."""
    for message in messages:
        if message.error() is not None:
            raise KafkaSourceError(f"{part.topic}[{part.partition}]: {message.error()}")
    return [m for m in messages if (m.offset() or 0) < part.end]


def _to_arrow(part: KafkaInputPartition, messages: list[Message]) -> pa.RecordBatch:
    """Return messages as one record batch of ARROW_SCHEMA."""
    n = len(messages)
    timestamps = [
        (ts * 1000 if kind != TIMESTAMP_NOT_AVAILABLE else None) for kind, ts in (m.timestamp() for m in messages)
    ]
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([part.topic] * n, pa.string()),
        pa.array([part.partition] * n, pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array(timestamps, pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
