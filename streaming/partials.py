"""The Spark side of a batch's partial aggregates: one wide row per record, then pyarrow in each task.

ONE projection carries every record once (``NARROW_SCHEMA`` with no store: its offset and, for a bad
record, its error and raw bytes) plus, for every store WITHOUT a transform, that store's key and value as
columns of the same row (``_k<i>``, ``_v<i>``; ``arrow_partials.wide_view`` reads them back per store). A
store WITH a transform or a join (``streaming.joins``) may filter, add or change rows, so its records are
projected on their own to
``NARROW_SCHEMA`` rows (``store`` set) and unioned by name with the wide rows. The union is coalesced into a
few tasks (no shuffle: each Kafka partition's records of a store stay whole and in order) and aggregated
by ``streaming.arrow_partials.partials_of`` through mapInArrow (``task_partials``: what the worker holds frozen
out of PySpark's collection after each task). The driver gets one small Arrow table.

One wide row instead of one narrow row per store moves a batch's records from the JVM to Python once, not
once per store (the shop example's 10 stores: 20k rows instead of 220k per 20k-record batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial, reduce
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType, NumericType

from iqgraph.stores import store_class
from iqgraph.streaming.arrow_partials import PARTIALS_SCHEMA, StorePlan, task_partials
from iqgraph.streaming.definitions import DefinitionError, StoreDefinition
from iqgraph.streaming.joins import Enrich
from iqgraph.streaming.static_types import check_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _narrow_columns(
    store: str | None,
    key: Column,
    error: Column,
    inum: Column | None = None,
    fnum: Column | None = None,
    payload: Column | None = None,
    wide: Sequence[Column] = (),
    bad_in_a_store: Column | None = None,
) -> list[Column]:
    inum, fnum, payload = (F.lit(None) if c is None else c for c in (inum, fnum, payload))
    # a record's raw bytes travel only when it is bad (for the dead-letter topic): bad for every store (error),
    # or bad for one of the stores in the wide row (its key is null)
    failed = error.isNotNull() if bad_in_a_store is None else error.isNotNull() | bad_in_a_store
    return [
        *wide,
        F.lit(store).cast("string").alias("store"),
        F.col("_partition").cast("int").alias("partition"),
        F.col("_offset").cast("long").alias("offset"),
        F.col("_event_ms").cast("long").alias("event_ms"),
        key.cast("string").alias("key"),
        inum.cast("long").alias("inum"),
        fnum.cast("double").alias("fnum"),
        payload.cast("string").alias("payload"),
        error.cast("string").alias("error"),
        F.when(failed, F.col("_raw_key")).alias("raw_key"),
        F.when(failed, F.col("_raw_value")).alias("raw_value"),
    ]


def store_frame(good: DataFrame, store: StoreDefinition, enrich: Enrich | None = None) -> DataFrame:
    """Return the good records of a batch after the store's join and transformation, its key as ``_skey``."""
    frame = enrich(good) if enrich is not None else good
    frame = store.transform(frame) if store.transform is not None else frame
    check_records(store, frame.columns)
    return frame.withColumn("_skey", F.col(store.key or "_key"))


#: The Spark type of each kind of value column a store aggregates (None: count and bloom need none).
_VALUE_TYPES = {"inum": "long", "fnum": "double", "payload": "string"}


def _store_value(frame: DataFrame, store: StoreDefinition) -> tuple[Column | None, str | None]:
    """Return the column a store aggregates and its kind ("inum", "fnum", "payload"; None: none needed)."""
    agg = store.aggregate
    if store_class(store.kind).keys_only or agg.kind == "count":
        return None, None
    if agg.user is not None:  # the task folds the rows: each a JSON object of the columns, nulls included
        columns = _payload_columns(frame, store)
        return F.to_json(F.struct(*columns), {"ignoreNullFields": "false"}), "payload"
    if agg.kind == "latest":
        columns = agg.columns or tuple(c for c in frame.columns if not c.startswith("_"))
        # a tombstone (no value: only on a table topic) has a null payload, which deletes the key
        return F.when(F.col("_raw_value").isNotNull(), F.to_json(F.struct(*columns))), "payload"
    column = str(agg.column)
    if column not in frame.columns:
        raise DefinitionError(f"store {store.name!r} aggregates column {column!r}, which its records lack")
    data_type = frame.schema[column].dataType
    if not isinstance(data_type, NumericType):
        raise DefinitionError(f"store {store.name!r}: {agg.kind} needs a numeric column; {column!r} is {data_type}")
    return F.col(column), "inum" if isinstance(data_type, IntegralType) else "fnum"


def _payload_columns(frame: DataFrame, store: StoreDefinition) -> tuple[str, ...]:
    """Return the columns a user aggregation's rows hold: those it names, else every record column."""
    columns = store.aggregate.columns or tuple(c for c in frame.columns if not c.startswith("_"))
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DefinitionError(f"store {store.name!r} aggregates columns {missing}, which its records lack")
    return columns


def _store_narrow(good: DataFrame, store: StoreDefinition, enrich: Enrich | None) -> tuple[DataFrame, str | None]:
    frame = store_frame(good, store, enrich)
    key = F.col("_skey")
    value, kind = _store_value(frame, store)
    inum, fnum, payload = (value if kind == name else None for name in ("inum", "fnum", "payload"))
    error = F.when(key.isNull(), F.lit("null key"))
    return frame.select(*_narrow_columns(store.name, key, error, inum, fnum, payload)), _number(kind)


def _store_wide(decoded: DataFrame, store: StoreDefinition, index: int) -> tuple[list[Column], str | None]:
    """Return a store's key and value as columns of the wide row (``_k<index>``, ``_v<index>``), and its kind."""
    frame = store_frame(decoded, store)  # checks the key column; a store without a transform adds only _skey
    value, kind = _store_value(frame, store)
    columns = [F.col(store.key or "_key").cast("string").alias(f"_k{index}")]
    if kind is not None and value is not None:
        columns.append(value.cast(_VALUE_TYPES[kind]).alias(f"_v{index}"))
    return columns, kind


def _number(kind: str | None) -> str | None:
    return kind if kind in ("inum", "fnum") else None


def _plan(
    store: StoreDefinition, number: str | None, stream_times: Mapping[int, int], wide: tuple[int, str | None] | None
) -> StorePlan:
    window = None
    if store.window is not None:
        window = (store.window.size_ms, store.window.advance, store.window.grace_ms)
    user = store.aggregate.user if not store_class(store.kind).keys_only else None
    return StorePlan(store.name, store.kind.value, store.aggregation, number, window, dict(stream_times), wide, user)


class PartialsPlan:
    """The partials of one topic's batches, with the wide rows' Spark expressions built once.

    The expressions of the wide rows only name columns that every batch's decoded frame has (the topic's
    schema fixes them), so they are built on the first batch and reused: building them again cost ~1,800
    Py4J round trips (~0.25 s) per micro-batch. A store with a transform is built per batch (its transform
    is the user's code, called on each batch's frame).
    """

    def __init__(self, stores: Sequence[StoreDefinition], tasks: int) -> None:
        self.stores = stores
        self.tasks = tasks
        self._rows: list[Column] | None = None
        self._kinds: dict[int, str | None] = {}  # store index -> value kind, for the stores in the wide rows

    def frame(
        self,
        decoded: DataFrame,
        stream_times: Mapping[str, Mapping[int, int]],
        joins: Mapping[str, Enrich] | None = None,
    ) -> DataFrame:
        """Return the batch's partial aggregates (PARTIALS_SCHEMA) for every store of the topic.

        joins: per store with a join, the join of its records with its table as of this batch.
        """
        if self._rows is None:
            wide: list[Column] = []
            null_keys: list[Column] = []
            for index, store in enumerate(self.stores):
                if not store.own_rows:
                    columns, self._kinds[index] = _store_wide(decoded, store, index)
                    wide += columns
                    null_keys.append(F.col(store.key or "_key").isNull())
            bad_in_a_store = reduce(lambda a, b: a | b, null_keys) if null_keys else None
            self._rows = _narrow_columns(None, F.lit(None), F.col("_error"), wide=wide, bad_in_a_store=bad_in_a_store)
        good = decoded.where(F.col("_error").isNull()) if len(self._kinds) < len(self.stores) else decoded
        narrow: list[DataFrame] = []
        plans = []
        for index, store in enumerate(self.stores):
            times = stream_times.get(store.name, {})
            if index in self._kinds:
                kind = self._kinds[index]
                plans.append(_plan(store, _number(kind), times, (index, kind)))
            else:
                frame, number = _store_narrow(good, store, (joins or {}).get(store.name))
                narrow.append(frame)
                plans.append(_plan(store, number, times, None))
        rows = decoded.select(*self._rows)
        union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), narrow, rows).coalesce(self.tasks)
        return union.mapInArrow(partial(task_partials, plans=plans), PARTIALS_SCHEMA)


def partials_frame(
    decoded: DataFrame,
    stores: Sequence[StoreDefinition],
    stream_times: Mapping[str, Mapping[int, int]],
    tasks: int,
    joins: Mapping[str, Enrich] | None = None,
) -> DataFrame:
    """Return one batch's partial aggregates (PARTIALS_SCHEMA) for every store of one topic."""
    return PartialsPlan(stores, tasks).frame(decoded, stream_times, joins)
