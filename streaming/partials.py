"""Per-batch partial aggregates, computed in Spark: one row per (store, partition, key[, window]).

Every store's partials, the late-record counts, stream times, offset ranges and bad records of a batch
are unioned into one DataFrame of ``PARTIALS_SCHEMA`` so that the driver gets them in a single Arrow
transfer. ``kind`` tells the rows apart:

- ``p``: a partial aggregate (``partial`` is a JSON array of one element; ``records`` it covers);
- ``late``: records that arrived after their window closed (``records``);
- ``st``: the largest event time of the batch in a partition (``window_start``);
- ``off``: the offsets seen in a partition (``window_start`` = first, ``records`` = last);
- ``bad``: one bad record (``partial`` is a JSON object with offset, error, base64 key and value).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyspark.sql import Column, Window
from pyspark.sql import functions as F

from stores import StoreKind
from streaming.decode import META_COLUMNS
from streaming.definitions import DefinitionError, StoreDefinition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PARTIALS_SCHEMA = (
    "kind string, store string, partition int, key string, window_start long, partial string, records long"
)
_LONG_MIN = -(1 << 63)


def _row(
    kind: str,
    store: str | None,
    key: Column | None = None,
    window_start: Column | None = None,
    partial: Column | None = None,
    records: Column | None = None,
) -> list[Column]:
    return [
        F.lit(kind).alias("kind"),
        F.lit(store).cast("string").alias("store"),
        F.col("_partition").cast("int").alias("partition"),
        (key if key is not None else F.lit(None)).cast("string").alias("key"),
        (window_start if window_start is not None else F.lit(None)).cast("long").alias("window_start"),
        (partial if partial is not None else F.lit(None)).cast("string").alias("partial"),
        (records if records is not None else F.lit(None)).cast("long").alias("records"),
    ]


def _bad_info(error: Column) -> Column:
    return F.to_json(
        F.struct(
            F.col("_offset").alias("offset"),
            error.alias("error"),
            F.base64("_raw_key").alias("key"),
            F.base64("_raw_value").alias("value"),
        )
    )


def batch_rows(decoded: DataFrame) -> list[DataFrame]:
    """Return the offset-range and bad-record rows of a decoded batch."""
    offsets = decoded.groupBy("_partition").agg(F.min("_offset").alias("lo"), F.max("_offset").alias("hi"))
    bad = decoded.where(F.col("_error").isNotNull())
    return [
        offsets.select(*_row("off", None, window_start=F.col("lo"), records=F.col("hi"))),
        bad.select(*_row("bad", None, partial=_bad_info(F.col("_error")))),
    ]


def _aggregate_expr(store: StoreDefinition, frame: DataFrame) -> Column:
    agg = store.aggregate
    if store.kind is StoreKind.BLOOM:
        return F.lit(None)
    if agg.kind == "count":
        return F.count(F.lit(1))
    if agg.kind == "latest":
        columns = agg.columns or tuple(c for c in frame.columns if not c.startswith("_"))
        return F.max_by(F.struct(*columns), F.col("_offset"))
    column = F.col(str(agg.column))
    if agg.kind == "avg":
        return F.array(F.sum(column).cast("double"), F.count(column).cast("double"))
    return {"sum": F.sum, "min": F.min, "max": F.max}[agg.kind](column)


def store_frame(good: DataFrame, store: StoreDefinition) -> DataFrame:
    """Return the good records of a batch after the store's transformation, with its key as ``_skey``."""
    frame = store.transform(good) if store.transform is not None else good
    missing = [c for c in ("_partition", "_offset", "_event_ms", "_raw_key", "_raw_value") if c not in frame.columns]
    if missing:
        raise DefinitionError(
            f"the transform of store {store.name!r} dropped {missing}; keep the columns {list(META_COLUMNS)}"
        )
    if store.key is not None and store.key not in frame.columns:
        raise DefinitionError(f"store {store.name!r} is keyed by column {store.key!r}, which its records lack")
    return frame.withColumn("_skey", F.col(store.key or "_key"))


def store_rows(good: DataFrame, store: StoreDefinition, stream_times: Mapping[int, int]) -> list[DataFrame]:
    """Return the partial-aggregate rows (and late, stream-time and bad rows) of one store."""
    frame = store_frame(good, store)
    bad = frame.where(F.col("_skey").isNull()).select(*_row("bad", store.name, partial=_bad_info(F.lit("null key"))))
    keyed = frame.where(F.col("_skey").isNotNull())
    value = F.to_json(F.array(_aggregate_expr(store, keyed))).alias("_p")
    if store.kind is not StoreKind.WINDOW:
        grouped = keyed.groupBy("_partition", "_skey").agg(value, F.count(F.lit(1)).alias("_n"))
        return [bad, grouped.select(*_row("p", store.name, F.col("_skey"), None, F.col("_p"), F.col("_n")))]
    return [bad, *_window_rows(keyed, store, stream_times, value)]


def _stored_time(stream_times: Mapping[int, int]) -> Column:
    if not stream_times:
        return F.lit(_LONG_MIN).cast("long")
    pairs = [F.lit(x) for item in stream_times.items() for x in item]
    return F.coalesce(F.create_map(*pairs)[F.col("_partition")], F.lit(_LONG_MIN)).cast("long")


def _window_rows(
    keyed: DataFrame, store: StoreDefinition, stream_times: Mapping[int, int], value: Column
) -> list[DataFrame]:
    assert store.window is not None  # noqa: S101 - a window store always has a window spec
    size, advance, grace = store.window.size_ms, store.window.advance, store.window.grace_ms
    so_far = Window.partitionBy("_partition").orderBy("_offset").rowsBetween(Window.unboundedPreceding, 0)
    ts = F.col("_event_ms")
    last = ts - F.pmod(ts, F.lit(advance))
    first = F.ceil((ts - F.lit(size - 1)) / F.lit(advance)).cast("long") * F.lit(advance)
    windows = (
        keyed.withColumn("_st", F.greatest(_stored_time(stream_times), F.max(ts).over(so_far)))
        .withColumn("_wstart", F.explode(F.sequence(first, last, F.lit(advance).cast("long"))))
        .withColumn("_late", F.col("_wstart") + F.lit(size + grace) <= F.col("_st"))
    )
    on_time = windows.where(~F.col("_late")).groupBy("_partition", "_skey", "_wstart")
    late = windows.where(F.col("_late")).groupBy("_partition").agg(F.count(F.lit(1)).alias("_n"))
    times = keyed.groupBy("_partition").agg(F.max(ts).alias("_max"))
    return [
        on_time.agg(value, F.count(F.lit(1)).alias("_n")).select(
            *_row("p", store.name, F.col("_skey"), F.col("_wstart"), F.col("_p"), F.col("_n"))
        ),
        late.select(*_row("late", store.name, records=F.col("_n"))),
        times.select(*_row("st", store.name, window_start=F.col("_max"))),
    ]
