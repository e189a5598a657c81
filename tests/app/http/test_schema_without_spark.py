"""`iqgraph schema` without a JVM: the value types found in Python from the topics' declared schemas
(streaming.static_types) are those Spark's analysis finds (streaming.value_types), so the SDL is the same byte
for byte, for every example app, every app of tests/support and an app using every typing rule (transforms
that only filter included); the command starts no JVM and answers within 3 s; an app with a transform that
does more falls back to Spark after one line on stderr."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iqgraph.app.http.sdl import sdl
from iqgraph.examples import bookings, customers, music, shop, weblog
from iqgraph.streaming.collect import collect
from iqgraph.streaming.definitions import (
    App,
    Join,
    Topic,
    avg,
    bloom_store,
    count,
    key_value_store,
    latest,
    max_,
    min_,
    ranking_store,
    sum_,
    table_store,
    tumbling,
    window_store,
)
from iqgraph.streaming.sketches import histogram, hyperloglog
from iqgraph.streaming.static_types import NeedsSparkError, static_value_types
from iqgraph.streaming.user_aggregations import aggregate
from tests.support import apps as support_apps
from tests.support import feed_shop, plays, tables
from tests.support.cli import iqgraph

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Every value type decode can give: comments, NOT NULL at every level (from_json makes it nullable), nesting.
EVERY_TYPE = StructType(
    [
        StructField("id", StringType(), False, {"comment": "the id"}),
        StructField("n", IntegerType()),
        StructField("s", ShortType()),
        StructField("b", ByteType()),
        StructField("f", FloatType()),
        StructField("d", DecimalType(12, 3)),
        StructField("flag", BooleanType(), False),
        StructField("day", DateType()),
        StructField("raw", BinaryType()),
        StructField("local", TimestampNTZType()),
        StructField("at", TimestampType()),
        StructField("ts", LongType()),
        StructField("samples", ArrayType(LongType(), containsNull=False), False),
        StructField("tags", MapType(StringType(), IntegerType(), valueContainsNull=False)),
        StructField(
            "place",
            StructType(
                [
                    StructField("lat", DoubleType(), False, {"comment": "degrees"}),
                    StructField("names", ArrayType(StringType(), containsNull=False)),
                ]
            ),
            False,
        ),
    ]
)
AVRO_ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "item", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    ],
}


def _only_some(frame: Any) -> Any:
    """A transform that only filters: its records keep their types."""
    kept = frame.where(frame["id"].isNotNull() & ((frame.n.between(1, 9) | ~frame.flag) | frame.id.isin("a", "b")))
    return kept.filter(frame.at >= dt.datetime(2026, 1, 1)).where(frame.id.startswith("c") | (frame.d != frame.n))


def every_rule_app() -> App:
    """Return an app with every way a store's records get their type: JSON (StructType and DDL), Avro, string
    and bytes values, long keys, Kafka columns kept, joins (inner, left with a prefix), every aggregation."""
    ddl = (
        "id STRING NOT NULL COMMENT 'the id', n INT, at TIMESTAMP, xs ARRAY<INT>, m MAP<STRING, DOUBLE>, "
        "st STRUCT<a: INT NOT NULL, b: STRING COMMENT 'bee'>"
    )
    kafka_columns = ("_key", "_partition", "_offset", "_timestamp", "_topic", "_event_ms", "_raw_key", "_raw_value")
    counted = key_value_store("ddl_count", "ddl", count(), join=Join("places"))
    return App(
        "every_rule",
        [
            Topic("rich", schema=EVERY_TYPE, event_time="ts", partitions=2),
            Topic("ddl", schema=ddl, event_time="at", key_format="long", partitions=2),
            Topic("avro", schema=AVRO_ORDER, value_format="avro", event_time="ts"),
            Topic("text", value_format="string"),
            Topic("bytes", value_format="bytes", key_format="long"),
            Topic("people", schema="name STRING NOT NULL COMMENT 'who', city STRING", table=True, global_table=True),
            Topic("places", schema="name STRING, size INT NOT NULL", table=True, partitions=2, key_format="long"),
        ],
        [
            key_value_store("rich_latest", "rich", latest()),
            key_value_store("rich_kafka", "rich", latest("place", "id", *kafka_columns, "_error")),
            key_value_store("rich_sum", "rich", sum_("n")),
            key_value_store("rich_avg", "rich", avg("n")),
            key_value_store("rich_min", "rich", min_("d")),
            key_value_store("rich_max", "rich", max_("f"), key="id"),
            key_value_store("rich_last", "rich", collect("id", "d", "place", max_items=3, order_by="ts")),
            key_value_store("rich_distinct", "rich", hyperloglog("id")),
            window_store("rich_histogram", "rich", aggregate(histogram("f", [1, 2])), tumbling(minutes=1)),
            bloom_store("rich_seen", "rich", key="id"),
            key_value_store("rich_filtered", "rich", latest(), transform=_only_some),
            window_store("rich_same", "rich", sum_("n"), tumbling(minutes=1), transform=lambda frame: frame),
            key_value_store("ddl_latest", "ddl", latest()),
            key_value_store("ddl_left", "ddl", latest(), join=Join("people", on="id", how="left", prefix="p_")),
            key_value_store("ddl_inner", "ddl", latest("n", "size"), join=Join("places")),
            counted,
            ranking_store("ddl_top", counted, group="size"),
            key_value_store("avro_latest", "avro", latest()),
            key_value_store("avro_sum", "avro", sum_("amount")),
            key_value_store("text_latest", "text", latest()),
            key_value_store("bytes_last", "bytes", collect("value", max_items=2, order_by="_offset")),
            table_store("people", "people"),
            table_store("places", "places", "size"),
        ],
    )


#: Every app that defines stores: the examples (follow_key.py is a client, not an app), tests/support's, and ours.
APPS: dict[str, Callable[[], App]] = {
    "examples.shop": lambda: shop.app,
    "examples.bookings": lambda: bookings.app,
    "examples.customers": lambda: customers.app,
    "examples.music": lambda: music.app,
    "examples.weblog": lambda: weblog.app,
    "support.shop": support_apps.shop_app,
    "support.weblog": support_apps.weblog_app,
    "support.lab": support_apps.lab_app,
    "support.market": support_apps.market_app,
    "support.tables": lambda: tables.table_app("crm"),
    "support.feed_shop": feed_shop.shop_app,
    "support.feed_shop_table": lambda: feed_shop.shop_app(table=True),
    "support.plays": lambda: plays.plays_app("plays", 2),  # a transform that filters
    "every_rule": every_rule_app,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(APPS))
def test_the_types_found_without_spark_are_those_spark_finds(name: str, spark: SparkSession) -> None:
    from iqgraph.streaming.value_types import value_types

    app = APPS[name]()
    found, analysed = static_value_types(app), value_types(app, spark)
    assert found == analysed
    assert {k: t.jsonValue() for k, t in found.items()} == {k: t.jsonValue() for k, t in analysed.items()}
    assert sdl(app, found) == sdl(app, analysed)


@pytest.mark.parametrize(
    ("transform", "why"),
    [
        (lambda frame: frame.withColumn("n2", frame.n * 2), r"DataFrame.withColumn"),
        # pyspark.sql.functions need a SparkContext; with one (another test's), a real Column is no stand-in's
        (lambda frame: frame.where(F.col("n") > 1), r"(AssertionError\)|a filter by Column<)"),
        (lambda frame: frame.where("n > 1"), r"a filter by 'n > 1'"),
        (lambda frame: frame.where(frame.n), r"a filter by <.*FilterColumn"),
        (lambda frame: frame.where(frame.place > 1), r"a comparison of a struct<.*> column with 1"),
        (lambda frame: frame.where(frame.id > 1), r"a comparison of a string column with 1"),
        (lambda frame: frame.where(frame.n > 1 and frame.id == "a"), r"a column used as a Python bool"),
        (lambda frame: frame.count, r"DataFrame.count"),
        (lambda frame: None, r"it returns NoneType"),
    ],
)
def test_a_transform_that_does_more_than_filter_needs_spark_naming_the_store(transform: Any, why: str) -> None:
    app = App(
        "a",
        [Topic("rich", schema=EVERY_TYPE)],
        [
            key_value_store("filtered", "rich", latest(), transform=lambda frame: frame.where(frame.n > 1)),
            key_value_store("more", "rich", latest(), transform=transform),
        ],
    )
    with pytest.raises(NeedsSparkError, match=r"store 'more' has a transform that does more than filter \(" + why):
        static_value_types(app)


def test_what_decode_leaves_to_spark_needs_spark_naming_the_topic_or_column() -> None:
    def app(topic: Topic) -> App:
        return App("a", [topic], [key_value_store("latest", topic.name, latest())])

    with pytest.raises(NeedsSparkError, match=r"topic 'intervals': its schema is one for Spark's DDL parser"):
        static_value_types(app(Topic("intervals", schema="span INTERVAL DAY")))
    with pytest.raises(NeedsSparkError, match=r"topic 'codes' column 'code' is char\(3\)"):
        static_value_types(app(Topic("codes", schema="code CHAR(3)")))
    with pytest.raises(NeedsSparkError, match=r"column 'note' has a comment with escapes"):
        static_value_types(app(Topic("notes", schema=r"note STRING COMMENT 'it\'s'")))


def _timed_schema(app: str, java_home: Path) -> tuple[float, str, str, int]:
    """Run `iqgraph schema --app app` where no Java can start; return its wall time, stdout, stderr, exit code."""
    start = time.monotonic()
    # JAVA_HOME without bin/java: Spark's launcher finds no JVM to start (cwd: where the test's own app is)
    result = iqgraph("schema", "--app", app, cwd=java_home, env={"JAVA_HOME": str(java_home)})
    return time.monotonic() - start, result.stdout, result.stderr, result.returncode


def test_iqgraph_schema_starts_no_jvm(tmp_path: Path) -> None:
    # how long it takes is bench/startup.py's (docs/benchmarks.md, "Start-up"): tests check behaviour
    wall, stdout, stderr, code = _timed_schema("iqgraph.examples.shop:app", tmp_path)
    assert code == 0, stderr
    assert stdout == sdl(shop.app, static_value_types(shop.app))  # Spark's SDL: see the comparison above
    assert "iqgraph schema:" not in stderr
    print(f"iqgraph schema without a JVM: {wall:.2f} s")
    # where Java cannot start, a command that does need Spark fails: the check above would catch a JVM
    (tmp_path / "with_transform.py").write_text(_APP_WITH_TRANSFORM)
    _, _, stderr, code = _timed_schema("with_transform:app", tmp_path)
    assert code != 0 and "iqgraph schema: store 'orders_per_band' has a transform" in stderr


_APP_WITH_TRANSFORM = """
from pyspark.sql import functions as F

from iqgraph.examples.shop import build_app
from iqgraph.streaming.definitions import App, count, key_value_store


def band(amount):
    return "large" if amount >= 50 else "small"


def with_band(frame):
    return frame.withColumn("band", F.udf(band, "string")(F.col("amount")))


shop = build_app("orders", 3)
app = App(
    "banded",
    shop.topics,
    [*shop.stores, key_value_store("orders_per_band", "orders", count(), key="band", transform=with_band)],
)
"""


@pytest.mark.slow
def test_an_app_with_a_transform_is_typed_by_spark_after_one_line_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "with_transform.py").write_text(_APP_WITH_TRANSFORM)
    result = iqgraph("schema", "--app", "with_transform:app", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith("iqgraph schema:")]
    assert ours == [
        "iqgraph schema: store 'orders_per_band' has a transform that does more than filter "
        "(DataFrame.withColumn): starting a local Spark session to type the stores"
    ]
    assert "ordersPerBand" in result.stdout and "type LatestOrder " in result.stdout
