"""The iqkafka Python Data Source, over a real broker and a real Spark session."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.kafka_offsets import cap_offsets, fair_shares
from iqgraph.streaming.kafka_source import ARROW_SCHEMA, KafkaDataSource, KafkaSourceError, KafkaSourceOptions
from tests.conftest import MakeTopic

PARTITIONS, RECORDS = 4, 2000
Row = tuple[int, int, bytes, bytes]  # partition, offset, key, value


def record(i: int) -> Row:
    """Return record i as produced: round-robin over the partitions, so its offset is i // PARTITIONS."""
    return (i % PARTITIONS, i // PARTITIONS, f"k{i}".encode(), f"v{i}".encode())


@pytest.fixture(scope="module")
def loaded(broker: KafkaBroker, make_topic: MakeTopic) -> str:
    """Return a topic holding RECORDS keyed records over PARTITIONS partitions."""
    topic = make_topic(PARTITIONS)
    produce(broker.bootstrap_servers, topic, ((k, v, p) for p, _, k, v in map(record, range(RECORDS))))
    return topic


@pytest.fixture(scope="module")
def stream(spark: SparkSession, broker: KafkaBroker) -> Callable[..., DataFrame]:
    """Return a factory of iqkafka streaming DataFrames over the session's broker."""
    spark.dataSource.register(KafkaDataSource)

    def make(topic: str, **options: str) -> DataFrame:
        reader = spark.readStream.format("iqkafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
        return reader.option("topic", topic).options(**options).load()

    return make


def run_available_now(df: DataFrame, checkpoint: Path) -> list[list[Row]]:
    """Run df to the end of what is available now and return the rows of each micro-batch."""
    batches: list[list[Row]] = []

    def sink(batch: DataFrame, _batch_id: int) -> None:
        batches.append([(r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in batch.collect()])

    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    running = query.trigger(availableNow=True).start()
    assert running.awaitTermination(60), "query did not finish"
    return batches


def flat(batches: list[list[Row]]) -> list[Row]:
    """Return all rows of all batches, sorted."""
    return sorted(row for batch in batches for row in batch)


def test_reads_every_record_exactly_once(stream: Callable[..., DataFrame], loaded: str, tmp_path: Path) -> None:
    rows = flat(run_available_now(stream(loaded), tmp_path))

    assert rows == sorted(map(record, range(RECORDS)))


def test_reads_owned_partitions_from_starting_offsets(
    stream: Callable[..., DataFrame], loaded: str, tmp_path: Path
) -> None:
    df = stream(loaded, partitions="1,3", startingOffsets=json.dumps({"1": 300}))

    rows = flat(run_available_now(df, tmp_path))

    expected = [r for r in map(record, range(RECORDS)) if r[0] == 3 or (r[0] == 1 and r[1] >= 300)]
    assert rows == sorted(expected)


def test_max_records_per_batch_is_honoured(stream: Callable[..., DataFrame], loaded: str, tmp_path: Path) -> None:
    batches = run_available_now(stream(loaded, maxRecordsPerBatch="900"), tmp_path)

    assert [len(b) for b in batches] == [900, 900, 200]
    assert len(batches) == math.ceil(RECORDS / 900)
    assert flat(batches) == sorted(map(record, range(RECORDS)))


def test_restart_continues_from_the_checkpoint(
    stream: Callable[..., DataFrame], broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(2)
    produce(broker.bootstrap_servers, topic, [(b"a", b"1", 0), (b"b", b"2", 1)])
    first = flat(run_available_now(stream(topic), tmp_path))
    produce(broker.bootstrap_servers, topic, [(b"c", b"3", 1)])  # partition 0 gets nothing new

    second = flat(run_available_now(stream(topic), tmp_path))

    assert first == [(0, 0, b"a", b"1"), (1, 0, b"b", b"2")]
    assert second == [(1, 1, b"c", b"3")]


def test_picks_up_new_records_while_running(
    stream: Callable[..., DataFrame], broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(3)
    seen: list[Row] = []

    def sink(batch: DataFrame, _batch_id: int) -> None:
        seen.extend((r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in batch.collect())

    query = stream(topic).writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path))
    running = query.trigger(processingTime="0 seconds").start()
    try:
        running.processAllAvailable()
        produce(broker.bootstrap_servers, topic, [(b"x", b"1", 2), (b"y", b"2", 2)])
        running.processAllAvailable()
    finally:
        running.stop()

    assert sorted(seen) == [(2, 0, b"x", b"1"), (2, 1, b"y", b"2")]


def test_empty_partition_set_reads_nothing(stream: Callable[..., DataFrame], loaded: str, tmp_path: Path) -> None:
    batches = run_available_now(stream(loaded, partitions=""), tmp_path)

    assert len(batches) <= 1  # Spark runs the very first batch even when its offsets are empty
    assert flat(batches) == []


def test_schema_and_types(stream: Callable[..., DataFrame], loaded: str, tmp_path: Path) -> None:
    df = stream(loaded, partitions="2", startingOffsets='{"2": 499}')
    captured: list[Any] = []
    query = df.writeStream.foreachBatch(lambda batch, _: captured.extend(batch.collect()))
    assert query.option("checkpointLocation", str(tmp_path)).trigger(availableNow=True).start().awaitTermination(60)

    assert df.schema == StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
        ]
    )
    assert ARROW_SCHEMA.equals(to_arrow_schema(df.schema, timezone="UTC"))
    [row] = captured
    assert (row.key, row.value, row.topic, row.partition, row.offset) == (b"k1998", b"v1998", loaded, 2, 499)
    assert isinstance(row.timestamp, dt.datetime)


def test_fair_shares_split_the_budget_evenly_within_backlog() -> None:
    assert fair_shares({0: 100, 1: 100, 2: 100}, 10) == {0: 3, 1: 3, 2: 4}
    assert fair_shares({0: 1, 1: 100, 2: 0}, 10) == {0: 1, 1: 9, 2: 0}
    assert fair_shares({0: 5, 1: 5}, 100) == {0: 5, 1: 5}
    assert cap_offsets({0: 10, 1: 50}, {0: 20, 1: 40}, 4) == {0: 14, 1: 50}


def test_invalid_options_are_rejected() -> None:
    with pytest.raises(KafkaSourceError, match="kafka.bootstrap.servers"):
        KafkaSourceOptions.parse({"topic": "t"})
    with pytest.raises(KafkaSourceError, match="maxRecordsPerBatch"):
        KafkaSourceOptions.parse({"kafka.bootstrap.servers": "x", "topic": "t", "maxRecordsPerBatch": "0"})
    with pytest.raises(KafkaSourceError):
        KafkaSourceOptions.parse({"kafka.bootstrap.servers": "x", "topic": "t", "startingOffsets": "[1]"})
