"""Enrichment joins at ingest: each stream record joined with a table's value, as of when its batch runs.

A store declared with ``join=Join("songs", on="song_id")`` aggregates the stream's records joined with the
table store ``songs`` (inner: records without a match are dropped; left: they keep null table columns). The
table is one of the app's table stores, kept by its own streaming query on this node:

- a **global** table (every node holds every partition) joins on any column, or on the record key;
- a co-partitioned table (same partition count, not global) joins on the record key, **within the
  partition**: stream partition p sees table partition p (Kafka Streams' stream–table join).

Semantics (Kafka Streams' stream–table join at micro-batch granularity): a stream micro-batch sees the table
as this node has applied it when the batch starts — table updates applied before are seen, later ones are
not; the table's changes never re-aggregate stream records already applied. Before a batch is joined, the
table's partitions it needs (all of a global table; the batch's own partitions of a co-partitioned one) must
be hosted here and caught up (RUNNING): a stream never joins a half-restored or missing table; meanwhile the
stream's batch waits (logged every 30 s; the node's stall rule then reports it). On a replay after a
crash, a batch is joined with the table as it is then (as in Kafka Streams, a stream–table join depends on
processing order).

The table's contents travel to Spark as a small DataFrame (key, partition, the table's columns parsed from
the stored JSON with the table's own schema), rebuilt only when the table's applied offsets move, and
broadcast into the join.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import orjson
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegralType, StringType, StructField, StructType

from iqgraph.stores import PartitionState, PartitionStores, StoreNotReadyError
from iqgraph.streaming.decode import value_schema
from iqgraph.streaming.definitions import App, DefinitionError, Join, StoreDefinition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: topic -> the partition stores this node hosts for it, now (the runner's live view).
HostedTables = Callable[[str], Mapping[int, PartitionStores]]
_KEY, _PARTITION = "_jkey", "_jpartition"
_PAGE = 10_000


def table_schema(app: App, join: Join, parse: Callable[[str], DataType] = DataType.fromDDL) -> StructType:
    """Return the columns a join adds: the table store's kept columns, with the topic's types.

    parse: reads a DDL schema (see streaming.decode.value_schema).
    """
    table = app.store(join.table)
    schema = value_schema(app.topic(table.topic), parse)
    if schema is None:
        raise DefinitionError(f"table {join.table!r} has no JSON schema to join with")
    names = table.aggregate.columns or tuple(schema.fieldNames())
    return StructType([schema[name] for name in names])


#: Joins a store's records with its table: what store_frame applies before the store's transform.
Enrich = Callable[["DataFrame"], "DataFrame"]


def empty_joins(spark: SparkSession, app: App, stores: list[StoreDefinition]) -> dict[str, Enrich]:
    """Return the joins of stores against empty tables (to analyse their value types without data)."""
    return {
        s.name: _enrich(app, s, spark.createDataFrame([], _snapshot_schema(app, s.join)))
        for s in stores
        if s.join is not None
    }


def _snapshot_schema(app: App, join: Join) -> StructType:
    columns = table_schema(app, join)
    return StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": _KEY, "type": "string", "nullable": False, "metadata": {}},
                {"name": _PARTITION, "type": "integer", "nullable": False, "metadata": {}},
                *[f.jsonValue() for f in columns.fields],
            ],
        }
    )


def _enrich(app: App, store: StoreDefinition, table: DataFrame) -> Enrich:
    return lambda frame: joined(app, frame, store, table)


def joined(app: App, frame: DataFrame, store: StoreDefinition, table: DataFrame) -> DataFrame:
    """Return a store's records joined with a table frame (key, partition, columns)."""
    join = store.join
    assert join is not None  # noqa: S101 - called for stores with a join
    on = join.on or "_key"
    renamed = table.select(
        _KEY, _PARTITION, *[F.col(c).alias(join.prefix + c) for c in table.columns if c not in (_KEY, _PARTITION)]
    )
    _check_join(store, frame.schema, [c for c in renamed.columns if c not in (_KEY, _PARTITION)])
    condition = frame[on].cast("string") == renamed[_KEY]
    if not app.topic(app.store(join.table).topic).global_table:  # co-partitioned: within the partition
        condition = condition & (frame["_partition"] == renamed[_PARTITION])
    return frame.join(F.broadcast(renamed), condition, join.how).drop(_KEY, _PARTITION)


def joined_schema(
    app: App, store: StoreDefinition, records: StructType, parse: Callable[[str], DataType] = DataType.fromDDL
) -> StructType:
    """Return the schema of a store's records joined with its table: what Spark's analysis of ``joined`` finds.

    The table's columns follow the records' as the table's topic declares them (renamed by the join's prefix);
    a left join makes them nullable.
    """
    join = store.join
    assert join is not None  # noqa: S101 - called for stores with a join
    added = [
        StructField(join.prefix + f.name, f.dataType, f.nullable or join.how == "left", f.metadata)
        for f in table_schema(app, join, parse).fields
    ]
    _check_join(store, records, [f.name for f in added])
    return StructType([*records.fields, *added])


def _check_join(store: StoreDefinition, records: StructType, added: list[str]) -> None:
    """Refuse a join of a store's records (their schema) that adds the columns added."""
    join = store.join
    assert join is not None  # noqa: S101 - called for stores with a join
    on = join.on or "_key"
    if on not in records.fieldNames():
        raise DefinitionError(f"store {store.name!r} joins {join.table!r} on column {on!r}, which its records lack")
    if not isinstance(records[on].dataType, StringType | IntegralType):
        raise DefinitionError(
            f"store {store.name!r} joins {join.table!r} on column {on!r} of type "
            f"{records[on].dataType.simpleString()}: a table's keys are strings or integers"
        )
    if join.how == "left" and store.key in added:
        raise DefinitionError(
            f"store {store.name!r} is keyed by {store.key!r}, a column of table {join.table!r}, with a left join: a "
            "record without a match would have a null key (a bad record); use how='inner'"
        )
    clash = [c for c in added if c in records.fieldNames()]
    if clash:
        raise DefinitionError(
            f"store {store.name!r}: table {join.table!r} adds columns {clash} its records already have; "
            f"give the join a prefix (Join(..., prefix='{join.table}_'))"
        )


class JoinAbandonedError(RuntimeError):
    """The query stopped while a batch waited for its joined table: the batch applies nothing."""


class TableSnapshots:
    """The joined tables of one topic's stores, as DataFrames rebuilt when a table's applied offsets move."""

    def __init__(self, app: App, hosted: HostedTables, stopping: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        self.hosted = hosted
        self.stopping = stopping
        self._cache: dict[str, tuple[tuple[tuple[int, int], ...], DataFrame]] = {}
        self._lock = threading.Lock()

    def joins(self, spark: SparkSession, stores: list[StoreDefinition], own: Iterable[int]) -> dict[str, Enrich]:
        """Return the join of each store with a join, by store name (waits for its table to catch up).

        own: the stream partitions the batch holds; a co-partitioned table's same partitions are needed.
        """
        found = {}
        for store in stores:
            if store.join is not None:
                topic = self.app.topic(self.app.store(store.join.table).topic)
                needed = set(range(topic.partitions)) if topic.global_table else set(own)
                found[store.name] = _enrich(self.app, store, self.frame(spark, store.join, needed))
        return found

    def frame(self, spark: SparkSession, join: Join, needed: set[int]) -> DataFrame:
        """Return the table of join as a DataFrame (key, partition, columns) over the partitions needed."""
        topic = self.app.store(join.table).topic
        with self._lock:
            while True:
                partitions = self._wait_running(topic, needed)
                version = tuple(sorted((p, s.db.next_offset()) for p, s in partitions.items()))
                cached = self._cache.get(join.table)
                if cached is not None and cached[0] == version:
                    return cached[1]
                try:
                    rows = _rows(join.table, partitions, self.app.topic(topic).global_table)
                except StoreNotReadyError as exc:  # a partition moved or closed meanwhile: look again
                    log.info("table %s changed while read (%s); reading it again", join.table, exc)
                    time.sleep(0.1)
                    continue
                parsed = F.from_json("_json", table_schema(self.app, join))
                frame = spark.createDataFrame(rows, f"{_KEY} string, {_PARTITION} int, _json string")
                frame = frame.select(_KEY, _PARTITION, parsed.alias("_t")).select(_KEY, _PARTITION, "_t.*")
                self._cache[join.table] = (version, frame)
                return frame

    def _wait_running(self, topic: str, needed: set[int]) -> dict[int, PartitionStores]:
        """Return the needed partitions of the table topic once this node hosts them all, caught up."""
        logged = time.monotonic() - 25  # the first word after 5 s, then every 30 s
        while True:
            hosted = dict(self.hosted(topic))
            partitions = {p: hosted[p] for p in needed if p in hosted}
            if len(partitions) == len(needed) and all(
                s.db.state is PartitionState.RUNNING for s in partitions.values()
            ):
                return partitions
            if self.stopping():
                raise JoinAbandonedError(f"the query stops while a join waits for table topic {topic}")
            if time.monotonic() - logged > 30:
                missing = sorted(needed - set(hosted))
                log.warning(
                    "a join waits for table topic %s: %s",
                    topic,
                    f"partitions {missing} are not hosted here" if missing else "its partitions catch up",
                )
                logged = time.monotonic()
            time.sleep(0.1)


def _rows(table: str, partitions: Mapping[int, PartitionStores], whole: bool) -> list[tuple[str, int, str]]:
    """Return the table's (key, partition, JSON value) rows; whole (a global table): one row per key."""
    rows: dict[tuple[str, int], tuple[str, int, str]] = {}
    for partition, stores in sorted(partitions.items()):
        kv, after = stores.kv(table), None
        while True:
            page = kv.all(limit=_PAGE, after=after)
            for key, value in page.items:
                row = (str(key), partition, orjson.dumps(value).decode())
                where = (row[0], -1 if whole else partition)
                if where in rows:  # producers put one key on two partitions: the greater partition's value wins
                    log.warning(
                        "global table %s holds key %r in partitions %s and %s", table, key, rows[where][1], partition
                    )
                rows[where] = row
            if page.next_cursor is None:
                break
            after = page.next_cursor
    return list(rows.values())
