"""The Spark side of a batch's partial aggregates: narrow per-store rows, then pyarrow in each task.

For each store, its records (after its transformation) are projected to ``NARROW_SCHEMA``; all stores'
projections and one row per record for offsets and bad records are unioned, coalesced into a few tasks
(no shuffle: each Kafka partition's records of a store stay whole and in order) and aggregated by
``streaming.arrow_partials.partials_of`` through mapInArrow. The driver gets one small Arrow table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial, reduce
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType, NumericType

from iqgraph.stores import StoreKind
from iqgraph.streaming.arrow_partials import PARTIALS_SCHEMA, StorePlan, partials_of
from iqgraph.streaming.decode import META_COLUMNS
from iqgraph.streaming.definitions import DefinitionError, StoreDefinition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _narrow(
    frame: DataFrame,
    store: str | None,
    key: Column,
    error: Column,
    inum: Column | None = None,
    fnum: Column | None = None,
    payload: Column | None = None,
) -> DataFrame:
    inum, fnum, payload = (F.lit(None) if c is None else c for c in (inum, fnum, payload))
    failed = error.isNotNull()
    return frame.select(
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
    )


def store_frame(good: DataFrame, store: StoreDefinition) -> DataFrame:
    """Return the good records of a batch after the store's transformation, its key as ``_skey``."""
    frame = store.transform(good) if store.transform is not None else good
    missing = [c for c in ("_partition", "_offset", "_event_ms", "_raw_key", "_raw_value") if c not in frame.columns]
    if missing:
        raise DefinitionError(
            f"the transform of store {store.name!r} dropped {missing}; keep the columns {list(META_COLUMNS)}"
        )
    if store.key is not None and store.key not in frame.columns:
        raise DefinitionError(f"store {store.name!r} is keyed by column {store.key!r}, which its records lack")
    return frame.withColumn("_skey", F.col(store.key or "_key"))


def _store_narrow(good: DataFrame, store: StoreDefinition) -> tuple[DataFrame, str | None]:
    frame = store_frame(good, store)
    key, agg = F.col("_skey"), store.aggregate
    error = F.when(key.isNull(), F.lit("null key"))
    if store.kind is StoreKind.BLOOM or agg.kind == "count":
        return _narrow(frame, store.name, key, error), None
    if agg.kind == "latest":
        columns = agg.columns or tuple(c for c in frame.columns if not c.startswith("_"))
        return _narrow(frame, store.name, key, error, payload=F.to_json(F.struct(*columns))), None
    column = str(agg.column)
    if column not in frame.columns:
        raise DefinitionError(f"store {store.name!r} aggregates column {column!r}, which its records lack")
    data_type = frame.schema[column].dataType
    if not isinstance(data_type, NumericType):
        raise DefinitionError(f"store {store.name!r}: {agg.kind} needs a numeric column; {column!r} is {data_type}")
    if isinstance(data_type, IntegralType):
        return _narrow(frame, store.name, key, error, inum=F.col(column)), "inum"
    return _narrow(frame, store.name, key, error, fnum=F.col(column)), "fnum"


def _plan(store: StoreDefinition, number: str | None, stream_times: Mapping[int, int]) -> StorePlan:
    window = None
    if store.window is not None:
        window = (store.window.size_ms, store.window.advance, store.window.grace_ms)
    aggregation = "latest" if store.kind is StoreKind.BLOOM else store.aggregate.kind
    return StorePlan(store.name, store.kind.value, aggregation, number, window, dict(stream_times))


def partials_frame(
    decoded: DataFrame,
    stores: Sequence[StoreDefinition],
    stream_times: Mapping[str, Mapping[int, int]],
    tasks: int,
) -> DataFrame:
    """Return the batch's partial aggregates (PARTIALS_SCHEMA) for every store of one topic."""
    good = decoded.where(F.col("_error").isNull())
    frames = [_narrow(decoded, None, F.lit(None), F.col("_error"))]
    plans = []
    for store in stores:
        frame, number = _store_narrow(good, store)
        frames.append(frame)
        plans.append(_plan(store, number, stream_times.get(store.name, {})))
    union = reduce(lambda a, b: a.unionByName(b), frames).coalesce(tasks)
    return union.mapInArrow(partial(partials_of, plans=plans), PARTIALS_SCHEMA)
