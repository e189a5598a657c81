"""The ``iqkafka`` Spark source: a Python Data Source over confluent-kafka that yields Arrow record batches.

The runner's default source is Spark's own JVM connector (``format("kafka")``, ``streaming.runner``); this one,
selected with ``RunnerSettings(source="iqkafka")``, reads Kafka with librdkafka in Spark's Python workers and is
kept for the A/B measurement against it (``bench/ingest.py --source kafka,iqkafka``). Register it once per session
and read a topic as a stream::

    spark.dataSource.register(KafkaDataSource)
    spark.readStream.format("iqkafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("topic", "events")
        .option("partitions", "0,2")                      # the partitions this node owns
        .option("startingOffsets", '{"0": 1200, "2": 7}')  # next offsets to apply, read from our stores
        .option("maxRecordsPerBatch", "10000")
        .load()

Options (all strings):
  ``kafka.bootstrap.servers`` (required), and any other ``kafka.<librdkafka property>`` (SASL, SSL, ...),
  passed to every client without the prefix.
  ``topic`` (required).
  ``partitions``: comma-separated partition ids this query reads; default all partitions of the topic.
  ``startingOffsets``: JSON ``{"<partition>": offset}``. These come from our stores, which are the source of
  truth for "applied up to offset X", not from Spark's checkpoint; a partition missing from the map starts at
  its earliest offset. Spark uses them only for a query without a checkpoint; a restarted query continues
  from its checkpoint and the sink skips slices the stores have already applied.
  ``maxRecordsPerBatch``: at most this many records per micro-batch, shared fairly across partitions with
  backlog (Spark's admission control: ``getDefaultReadLimit`` / ``latestOffset(start, limit)``).
  ``pollTimeoutMs``: how long a read task may wait for records it knows exist before failing (default 60 s).

Schema: key binary, value binary, topic string, partition int, offset long, timestamp timestamp.

On the driver Spark keeps one stream reader per query alive across micro-batches; it asks for offsets over
one long-lived AdminClient (see `streaming.kafka_offsets`). Each read task reads exactly the offsets
[start, end) of one Kafka partition with an assigned consumer (no group membership, no commits) and yields
one RecordBatch per ``consume()`` call. Offsets are Spark's JSON ``{"<partition>": next offset}``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from iqgraph.streaming.kafka_offsets import (
    KafkaOffsets,
    KafkaSourceError,
    OffsetMap,
    cap_offsets,
    decode_offsets,
    encode_offsets,
)
from iqgraph.streaming.kafka_read import ARROW_SCHEMA, KafkaInputPartition, read_partition

__all__ = [
    "ARROW_SCHEMA",
    "SCHEMA",
    "KafkaDataSource",
    "KafkaInputPartition",
    "KafkaSourceError",
    "KafkaSourceOptions",
    "KafkaStreamReader",
    "read_partition",
]

log = logging.getLogger(__name__)

SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


@dataclass(frozen=True)
class KafkaSourceOptions:
    """The parsed options of an iqkafka stream (see the module docstring)."""

    topic: str
    client_config: Mapping[str, str]
    partitions: tuple[int, ...] | None = None
    starting_offsets: OffsetMap = field(default_factory=dict)
    max_records_per_batch: int | None = None
    poll_timeout: float = 60.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
        """Return the options of a DataSource's option map; raise KafkaSourceError if invalid."""
        client = {k[len("kafka.") :]: str(v) for k, v in options.items() if k.lower().startswith("kafka.")}
        if not client.get("bootstrap.servers") or not options.get("topic"):
            raise KafkaSourceError("iqkafka needs the options kafka.bootstrap.servers and topic")
        try:
            return cls(
                topic=options["topic"],
                client_config=client,
                partitions=_parse_partitions(options),
                starting_offsets=decode_offsets(json.loads(options.get("startingOffsets") or "{}")),
                max_records_per_batch=_positive(options.get("maxRecordsPerBatch")),
                poll_timeout=int(options.get("pollTimeoutMs") or 60_000) / 1000,
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise KafkaSourceError(f"invalid iqkafka option: {exc}") from exc


def _parse_partitions(options: Mapping[str, str]) -> tuple[int, ...] | None:
    """Return the partitions listed in the partitions option, or None when it is absent."""
    if "partitions" not in options:
        return None
    return tuple(sorted({int(p) for p in options["partitions"].split(",") if p.strip()}))


def _positive(value: str | None) -> int | None:
    """Return value as a positive int, None when unset."""
    if value is None or value == "":
        return None
    if int(value) <= 0:
        raise ValueError(f"maxRecordsPerBatch must be positive, got {value}")
    return int(value)


class KafkaDataSource(DataSource):
    """Spark Python Data Source ``iqkafka``: a Kafka topic as a stream of Arrow record batches."""

    @classmethod
    def name(cls) -> str:
        """Return the format name used with spark.readStream.format()."""
        return "iqkafka"

    def schema(self) -> str:
        """Return the schema of the records this source emits."""
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """Return a stream reader for these options."""
        return KafkaStreamReader(KafkaSourceOptions.parse(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plan micro-batches over the owned partitions of a topic and read them."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._offsets: KafkaOffsets | None = None
        self._owned: tuple[int, ...] | None = options.partitions
        self._initial: OffsetMap | None = None
        self._target: OffsetMap | None = None
        self._latest: OffsetMap | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader into its read tasks; a Kafka client cannot travel.
        return {**self.__dict__, "_offsets": None}

    def initialOffset(self) -> dict[str, int]:
        """Return the starting offsets of a query without a checkpoint."""
        return encode_offsets(self._initial_offsets())

    def getDefaultReadLimit(self) -> ReadLimit:
        """Return ReadMaxRows(maxRecordsPerBatch) when that option is set, else ReadAllAvailable."""
        limit = self.options.max_records_per_batch
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """Return the end offsets of the next micro-batch from start, within limit."""
        begin = self._resolve(decode_offsets(start))
        latest = self._latest = self._client().latest(begin)
        upper = latest if self._target is None else {p: min(latest[p], self._target[p]) for p in latest}
        end = {p: max(upper[p], begin[p]) for p in begin}
        if isinstance(limit, ReadMaxRows):
            end = cap_offsets(begin, end, limit.max_rows)
        return encode_offsets(end)

    def reportLatestOffset(self) -> dict[str, int] | None:
        """Return the latest offsets seen by the last latestOffset call, for progress reports."""
        return None if self._latest is None else encode_offsets(self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end offsets of an availableNow run at what the topic holds now."""
        self._target = self._client().latest(self._owned_partitions())

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        """Return one read task per partition with records in [start, end)."""
        begin, stop = decode_offsets(start), decode_offsets(end)
        begin = self._resolve(begin, stop)
        topic = self.options.topic
        return [KafkaInputPartition(topic, p, begin[p], stop[p]) for p in sorted(stop) if stop[p] > begin[p]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the records of one read task as Arrow record batches."""
        if not isinstance(partition, KafkaInputPartition):
            raise KafkaSourceError(f"not an iqkafka partition: {partition!r}")
        return read_partition(self.options.client_config, partition, self.options.poll_timeout)

    def commit(self, end: dict[str, int]) -> None:
        """Accept Spark's commit; the stores, not Kafka, record what has been applied."""
        log.debug("spark committed %s up to %s", self.options.topic, end)

    def stop(self) -> None:
        """Drop the offsets client."""
        self._offsets = None

    def _client(self) -> KafkaOffsets:
        """Return the long-lived offsets client, created on first use."""
        if self._offsets is None:
            self._offsets = KafkaOffsets(self.options.client_config, self.options.topic)
        return self._offsets

    def _owned_partitions(self) -> tuple[int, ...]:
        """Return the partitions this query reads, asking Kafka for all of them when not configured."""
        if self._owned is None:
            self._owned = self._client().partitions()
        return self._owned

    def _initial_offsets(self) -> OffsetMap:
        """Return the starting offsets of the owned partitions."""
        if self._initial is None:
            self._initial = self._starting(self._owned_partitions())
        return self._initial

    def _starting(self, partitions: Sequence[int]) -> OffsetMap:
        """Return startingOffsets for partitions, the earliest offset Kafka holds where not given."""
        given = self.options.starting_offsets
        earliest = self._client().earliest([p for p in partitions if p not in given])
        return {p: given[p] if p in given else earliest[p] for p in partitions}

    def _resolve(self, offsets: OffsetMap, keys: Mapping[int, int] | None = None) -> OffsetMap:
        """Return offsets for the owned partitions (or keys), the starting offset where missing."""
        wanted = self._owned_partitions() if keys is None else tuple(keys)
        missing = [p for p in wanted if p not in offsets]
        if not missing:
            return {p: offsets[p] for p in wanted}
        initial = self._initial_offsets()
        if unknown := [p for p in missing if p not in initial]:  # a batch planned under other ownership
            initial = {**initial, **self._starting(unknown)}
        return {p: offsets[p] if p in offsets else initial[p] for p in wanted}
