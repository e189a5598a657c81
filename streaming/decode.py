"""Decode raw Kafka records into typed columns, marking the bad ones instead of failing on them.

Output columns: ``_topic``, ``_partition``, ``_offset``, ``_timestamp``, ``_key`` (string or long),
``_event_ms`` (event time in epoch milliseconds), the value's columns (JSON) or ``value`` (string, bytes),
``_raw_key`` and ``_raw_value`` (for the dead-letter topic) and ``_error`` (null for a good record, else
why it is bad: null key, value too large, undecodable value, a date or timestamp outside the years 1 to 9999,
missing event time).

Avro values (``value_format="avro"``) are turned into JSON text by ``streaming.avro`` and then parsed
like JSON values, with the Spark type derived from the Avro schema; bad Avro is an undecodable value.

On a table topic a null value is a tombstone, not a bad record: its value columns are null, ``_raw_value``
is null (how the stores tell a tombstone), and its event time is the record's Kafka timestamp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DateType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iqgraph.streaming.avro import avro_json_column, avro_struct_type, encode_avro, load_avro_schema
from iqgraph.streaming.definitions import DefinitionError, Topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CORRUPT = "_corrupt"
#: The instants a store can answer (Python's datetime, GraphQL's DateTime): years 1 to 9999, in epoch milliseconds.
#: A time outside them (epoch milliseconds in a TIMESTAMP column, which Spark reads as seconds: year 58884) is a
#: bad record, not a stored value that every later read of its store fails on.
MIN_MS, MAX_MS = -62_135_596_800_000, 253_402_300_799_999
META_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp", "_key", "_event_ms", "_raw_key", "_raw_value")


def value_schema(topic: Topic, parse: Callable[[str], DataType] = DataType.fromDDL) -> StructType | None:
    """Return the StructType of topic's JSON or Avro values (None for string or bytes values).

    parse: reads a DDL schema (Spark's parser, which needs a session; streaming.static_types passes its own).
    """
    if topic.value_format == "avro":
        return avro_struct_type(_avro_schema(topic))
    if topic.value_format != "json":
        return None
    if isinstance(topic.schema, StructType):
        return topic.schema
    parsed = parse(str(topic.schema))
    if not isinstance(parsed, StructType):
        raise DefinitionError(f"topic {topic.name!r}: schema must be a struct, got {parsed.simpleString()}")
    return parsed


_PARSED: dict[int, tuple[Topic, dict[str, Any]]] = {}  # id(topic) -> its parsed Avro schema (topics live long)


def _avro_schema(topic: Topic) -> dict[str, Any]:
    found = _PARSED.get(id(topic))
    if found is None or found[0] is not topic:
        assert isinstance(topic.schema, str | Mapping)  # noqa: S101 - Topic checks an Avro topic's schema
        found = _PARSED[id(topic)] = (topic, load_avro_schema(topic.schema, topic=topic.name))
    return found[1]


def serialize_value(topic: Topic, value: Any) -> bytes:
    """Return the bytes a producer sends for value on topic (the decoder's inverse): JSON, Avro, text or bytes.

    Raise ValueError when an Avro value does not fit the topic's schema.
    """
    if topic.value_format == "avro":
        return encode_avro(value, _avro_schema(topic))
    if topic.value_format == "json":
        return orjson.dumps(value)
    return value if isinstance(value, bytes) else str(value).encode()


def _key_column(topic: Topic) -> Column:
    if topic.key_format == "string":
        return F.col("key").cast("string")
    unsigned = F.conv(F.hex(F.col("key")), 16, 10).cast("decimal(20,0)")
    # the bounds as decimal literals: a Python int past 2**63 - 1 does not cross Py4J (a Java long)
    two_63, two_64 = (F.lit(str(n)).cast("decimal(20,0)") for n in (2**63, 2**64))
    signed = F.when(unsigned >= two_63, unsigned - two_64).otherwise(unsigned)
    return F.when(F.length("key") == 8, signed.cast("long"))


def _event_ms(topic: Topic, schema: StructType | None) -> Column:
    if topic.event_time is None:
        return F.unix_millis(F.col("timestamp"))
    if schema is None or topic.event_time not in schema.fieldNames():
        raise DefinitionError(f"topic {topic.name!r}: event_time column {topic.event_time!r} is not in its schema")
    field_type = schema[topic.event_time].dataType
    column = F.col(f"_value.{topic.event_time}")
    if isinstance(field_type, TimestampType):
        return F.unix_millis(column)
    if isinstance(field_type, NumericType):
        return column.cast("long")
    raise DefinitionError(f"topic {topic.name!r}: event_time column must be a timestamp or epoch milliseconds")


def _time_columns(schema: StructType | None) -> list[str]:
    """Return the names of the value's date and timestamp columns."""
    times = (DateType, TimestampType, TimestampNTZType)
    return [] if schema is None else [f.name for f in schema.fields if isinstance(f.dataType, times)]


def _value_columns(topic: Topic, schema: StructType | None) -> list[Column]:
    if schema is not None:
        return [F.col(f"_value.{name}").alias(name) for name in schema.fieldNames()]
    if topic.value_format == "string":
        return [F.col("value").cast("string").alias("value")]
    return [F.col("value").alias("value")]


def decode(raw: DataFrame, topic: Topic, schema: StructType | None) -> DataFrame:
    """Return raw Kafka rows of topic decoded, with ``_error`` set on the bad ones.

    streaming.static_types.decoded_schema says the same columns' types in Python: change both together.
    """
    return Decoder(topic, schema)(raw)


class Decoder:
    """Decode raw Kafka rows of one topic; the Spark expressions are built once and applied to every batch.

    Building them costs hundreds of Py4J round trips; they only name the source's columns, the same in every
    micro-batch.
    """

    def __init__(self, topic: Topic, schema: StructType | None) -> None:
        self.parsed: Column | None = None
        undecodable = F.lit(False)
        if schema is not None:
            with_corrupt = StructType([*schema.fields, StructField(CORRUPT, StringType())])
            options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
            # Avro: the bytes become JSON text first (streaming.avro), then parse as JSON values do
            text = (
                avro_json_column(F.col("value"), _avro_schema(topic))
                if topic.value_format == "avro"
                else F.col("value").cast("string")
            )
            self.parsed = F.from_json(text, with_corrupt, options)
            undecodable = F.col("_value").isNull() | F.col(f"_value.{CORRUPT}").isNotNull()
        key = _key_column(topic)
        event_ms = _event_ms(topic, schema)
        tombstone = F.col("value").isNull()
        if topic.table:  # a tombstone: no value to decode, its time is the record's
            undecodable = ~tombstone & undecodable
            event_ms = F.when(tombstone, F.unix_millis(F.col("timestamp"))).otherwise(event_ms)
        error = (
            F.when(tombstone & F.lit(not topic.table), F.lit("null value"))
            .when(F.length("value") > topic.max_value_bytes, F.lit("value too large"))
            .when(undecodable, F.lit("undecodable value"))
            .when(key.isNull(), F.lit("null key" if topic.key_format == "string" else "null or non-8-byte long key"))
        )
        for name in _time_columns(schema):
            year = F.year(F.col(f"_value.{name}"))
            error = error.when((year < 1) | (year > 9999), F.lit(f"{name}: a time outside the years 1 to 9999"))
        error = error.when(event_ms.isNull(), F.lit("missing event time")).when(
            (event_ms < MIN_MS) | (event_ms > MAX_MS), F.lit("event time outside the years 1 to 9999")
        )
        self.columns = [
            F.col("topic").alias("_topic"),
            F.col("partition").alias("_partition"),
            F.col("offset").alias("_offset"),
            F.col("timestamp").alias("_timestamp"),
            key.alias("_key"),
            event_ms.alias("_event_ms"),
            F.col("key").alias("_raw_key"),
            F.col("value").alias("_raw_value"),
            error.alias("_error"),
            *_value_columns(topic, schema),
        ]

    def __call__(self, raw: DataFrame) -> DataFrame:
        """Return raw decoded, with ``_error`` set on the bad rows."""
        parsed = raw if self.parsed is None else raw.withColumn("_value", self.parsed)
        return parsed.select(*self.columns)
