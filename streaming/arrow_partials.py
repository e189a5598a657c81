"""Partial aggregates of one Spark task's records, with pyarrow: the function Spark's mapInArrow runs.

Input rows (``NARROW_SCHEMA``): one per record with no store, carrying the record's offset and, for a bad
record, its error and raw bytes — and, in extra columns of the same row, the key and value of every store
without a transform (``StorePlan.wide``, read back by ``wide_view``); plus one row per record per store
with a transform (``store`` set). Output rows
(``PARTIALS_SCHEMA``), told apart by ``kind``:

- ``p``: a partial aggregate per (store, partition, key[, window start]); ``partial`` is a JSON array
  holding the partial state, ``records`` how many records it covers, ``position`` the offset of the last;
- ``late``: records that came after their window closed (``records``) per (store, partition);
- ``st``: the largest event time per (store, partition) (``window_start``);
- ``off``: the first (``window_start``) and last (``records``) offset seen per partition;
- ``bad``: one bad record; ``partial`` is a JSON object with offset, error, base64 key and value.

Each (store, Kafka partition) arrives whole and in offset order in one task, so stream time per record
(for lateness) is exact: the stored stream time, then the running maximum of event times.
"""

from __future__ import annotations

import base64
import gc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from iqgraph.streaming.user_aggregations import UserAggregation

NARROW_SCHEMA = (
    "store string, partition int, offset long, event_ms long, key string, inum long, fnum double, "
    "payload string, error string, raw_key binary, raw_value binary"
)
PARTIALS_SCHEMA = (
    "kind string, store string, partition int, key string, window_start long, partial string, records long, "
    "position long"
)
PARTIALS_ARROW = pa.schema(
    [
        ("kind", pa.string()),
        ("store", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.string()),
        ("window_start", pa.int64()),
        ("partial", pa.string()),
        ("records", pa.int64()),
        ("position", pa.int64()),
    ]
)
_LONG_MIN = -(1 << 63)


@dataclass(frozen=True)
class StorePlan:
    """What a task needs to know of one store to compute its partials (small and picklable)."""

    name: str
    kind: str  # "key_value" | "window" | "bloom"
    aggregation: str  # count | sum | min | max | avg | latest | latest_by_time
    number: str | None = None  # "inum" or "fnum": the column holding the aggregated number
    window: tuple[int, int, int] | None = None  # size, advance, grace (ms)
    stream_times: Mapping[int, int] = field(default_factory=dict)
    #: Where the wide rows hold this store's key and value: (i, kind) for columns _k<i> and _v<i> (kind: the
    #: NARROW_SCHEMA column the value stands for — inum, fnum or payload; None: no value). None: narrow rows.
    wide: tuple[int, str | None] | None = None
    #: A user aggregation (or collect): the task folds each group's JSON rows with it, in offset order.
    user: UserAggregation | None = None


@dataclass
class _Rows:
    columns: dict[str, list[Any]] = field(default_factory=lambda: {n: [] for n in PARTIALS_ARROW.names})

    def add(self, kind: str, store: str | None, partition: int, **values: Any) -> None:
        for name, column in self.columns.items():
            column.append(
                kind
                if name == "kind"
                else store
                if name == "store"
                else partition
                if name == "partition"
                else values.get(name)
            )

    def extend(
        self,
        kind: str,
        store: str,
        partitions: list[int],
        keys: list[Any],
        starts: list[Any] | None,
        partials: list[str],
        records: list[int],
        positions: list[int],
    ) -> None:
        n = len(partitions)
        c = self.columns
        c["kind"].extend([kind] * n)
        c["store"].extend([store] * n)
        c["partition"].extend(partitions)
        c["key"].extend(keys)
        c["window_start"].extend(starts if starts is not None else [None] * n)
        c["partial"].extend(partials)
        c["records"].extend(records)
        c["position"].extend(positions)

    def batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(self.columns, schema=PARTIALS_ARROW)


def task_partials(batches: Iterator[pa.RecordBatch], plans: Sequence[StorePlan]) -> Iterator[pa.RecordBatch]:
    """``partials_of`` as the function mapInArrow runs in a Python worker; after a worker's first task, what it
    holds is frozen out of the garbage collector's reach.

    PySpark's daemon runs a full ``gc.collect()`` in a reused worker after every task (pyspark/daemon.py), which
    walked every object the worker held: pyspark, pyarrow, numpy, iqgraph, and what the first task imported lazily
    (pyarrow.acero) — ~80,000 objects, ~30 ms of CPU per task. ``gc.freeze()`` after the first task moves them into
    the permanent generation, which collections skip (then ~0.05 ms); each task's own garbage is still collected.
    Frozen after the task, not before: the first task's lazy imports would otherwise stay in every collection
    (~10 ms each). A flag says whether it is done: ``gc.get_freeze_count()`` walks the whole frozen list.
    """
    global _frozen  # once per worker process (spark.python.worker.reuse keeps it for the next task)
    yield from partials_of(batches, plans)
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()


_frozen = False  # whether this process froze its objects (task_partials)


def partials_of(batches: Iterator[pa.RecordBatch], plans: Sequence[StorePlan]) -> Iterator[pa.RecordBatch]:
    """Yield the partials (PARTIALS_ARROW) of one task's records (NARROW_SCHEMA)."""
    collected = list(batches)
    if not collected:
        return
    table = pa.Table.from_batches(collected)
    rows = _Rows()
    store = table["store"]
    records = table.filter(pc.is_null(store))
    _batch_rows(records, rows)
    good = records.filter(pc.is_null(records["error"]))
    for plan in plans:
        part = wide_view(good, plan) if plan.wide is not None else table.filter(pc.equal(store, plan.name))
        if part.num_rows:
            _store_rows(part, plan, rows)
    yield rows.batch()


def wide_view(good: pa.Table, plan: StorePlan) -> pa.Table:
    """Return one store's rows as NARROW_SCHEMA reads them, from the wide rows of the good records."""
    assert plan.wide is not None  # noqa: S101 - called for wide plans only
    index, kind = plan.wide
    key = good[f"_k{index}"]
    columns = {name: good[name] for name in ("partition", "offset", "event_ms")}
    columns["key"] = key
    if kind is not None:
        columns[kind] = good[f"_v{index}"]
    columns["error"] = pc.if_else(pc.is_null(key), pa.scalar("null key"), pa.scalar(None, pa.string()))
    columns["raw_key"], columns["raw_value"] = good["raw_key"], good["raw_value"]
    return pa.table(columns)


def _batch_rows(table: pa.Table, rows: _Rows) -> None:
    grouped = table.group_by("partition", use_threads=False).aggregate([("offset", "min"), ("offset", "max")])
    for p, lo, hi in zip(*(grouped[c].to_pylist() for c in ("partition", "offset_min", "offset_max")), strict=True):
        rows.add("off", None, p, window_start=lo, records=hi)
    _bad_rows(table.filter(pc.is_valid(table["error"])), None, rows)


def _bad_rows(bad: pa.Table, store: str | None, rows: _Rows) -> None:
    for record in bad.select(["partition", "offset", "error", "raw_key", "raw_value"]).to_pylist():
        info = {
            "offset": record["offset"],
            "error": record["error"],
            "key": base64.b64encode(record["raw_key"]).decode() if record["raw_key"] is not None else None,
            "value": base64.b64encode(record["raw_value"]).decode() if record["raw_value"] is not None else None,
        }
        rows.add("bad", store, record["partition"], partial=orjson.dumps(info).decode())


def _store_rows(table: pa.Table, plan: StorePlan, rows: _Rows) -> None:
    bad = pc.is_valid(table["error"])
    if pc.any(bad).as_py():
        _bad_rows(table.filter(bad), plan.name, rows)
        table = table.filter(pc.invert(bad))
    if plan.kind == "window":
        table = _windowed(table, plan, rows)
        group_keys = ["partition", "key", "window_start"]
    else:
        group_keys = ["partition", "key"]
    if table.num_rows == 0:
        return
    if plan.user is not None:
        _user_rows(table, plan, plan.user, group_keys, rows)
        return
    if plan.aggregation == "latest_by_time":  # the last row of a group is then its latest by event time
        table = table.sort_by([("event_ms", "ascending"), ("offset", "ascending")])
    elif plan.aggregation == "latest" and plan.kind != "bloom":  # the last row is its latest (joins may reorder)
        table = table.sort_by("offset")
    grouped = table.group_by(group_keys, use_threads=False).aggregate(_aggregations(plan))
    partials = _partial_json(grouped, plan)
    starts = grouped["window_start"].to_pylist() if plan.kind == "window" else None
    rows.extend(
        "p",
        plan.name,
        grouped["partition"].to_pylist(),
        grouped["key"].to_pylist(),
        starts,
        partials,
        grouped["offset_count"].to_pylist(),
        grouped["offset_max"].to_pylist(),
    )


def _user_rows(table: pa.Table, plan: StorePlan, user: UserAggregation, group_keys: list[str], rows: _Rows) -> None:
    """Add the partial of each group: its rows (JSON payloads) folded in offset order by the user aggregation.

    A record on which the user's ``add`` raises is a bad record of the store (skipped, counted, dead-lettered).
    """
    table = table.sort_by([("partition", "ascending"), ("offset", "ascending")])
    columns = {name: table[name].to_pylist() for name in {*group_keys, "partition", "offset", "payload"}}
    partitions, offsets, payloads = columns["partition"], columns["offset"], columns["payload"]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, group in enumerate(zip(*(columns[k] for k in group_keys), strict=True)):
        groups.setdefault(group, []).append(index)
    partials = []
    for members in groups.values():
        found = [orjson.loads(payloads[i] or "{}") for i in members]
        if user.with_position:
            for i, row in zip(members, found, strict=True):
                row["_partition"], row["_offset"] = partitions[i], offsets[i]

        def failed(at: int, exc: Exception, members: list[int] = members) -> None:
            i = members[at]
            error = f"user aggregation {user.name!r}: add raised {type(exc).__name__}: {exc}"
            info = {"offset": offsets[i], "error": error, "key": None, "value": None}
            rows.add("bad", plan.name, partitions[i], partial=orjson.dumps(info).decode())

        partials.append(orjson.dumps([user.fold(found, failed)]).decode())
    keys = list(zip(*groups, strict=True))
    starts = list(keys[2]) if plan.kind == "window" else None
    counts = [len(members) for members in groups.values()]
    positions = [max(offsets[i] for i in members) for members in groups.values()]
    rows.extend("p", plan.name, list(keys[0]), list(keys[1]), starts, partials, counts, positions)


def _aggregations(plan: StorePlan) -> list[Any]:
    aggs = [("offset", "count"), ("offset", "max")]
    if plan.kind == "bloom" or plan.aggregation == "count":
        return aggs
    last = pc.ScalarAggregateOptions(skip_nulls=False)
    if plan.aggregation == "latest":  # the last record wins, a tombstone's null payload too
        return [*aggs, ("payload", "last", last)]
    if plan.aggregation == "latest_by_time":
        return [*aggs, ("event_ms", "last", last), ("offset", "last", last), ("payload", "last", last)]
    number = str(plan.number)
    if plan.aggregation == "avg":
        return [*aggs, (number, "sum"), (number, "count")]
    return [*aggs, (number, plan.aggregation)]


def _partial_json(grouped: pa.Table, plan: StorePlan) -> list[str]:
    if plan.kind == "bloom":
        return ["[null]"] * grouped.num_rows
    if plan.aggregation == "count":
        return [f"[{n}]" for n in grouped["offset_count"].to_pylist()]
    if plan.aggregation == "latest":
        return [f"[{p}]" if p is not None else "[null]" for p in grouped["payload_last"].to_pylist()]
    if plan.aggregation == "latest_by_time":  # [[event_ms, partition, offset, value]]
        columns = (grouped[c].to_pylist() for c in ("event_ms_last", "partition", "offset_last", "payload_last"))
        return [f"[[{t},{p},{o},{v or 'null'}]]" for t, p, o, v in zip(*columns, strict=True)]
    number = str(plan.number)
    if plan.aggregation == "avg":
        sums, counts = grouped[f"{number}_sum"].to_pylist(), grouped[f"{number}_count"].to_pylist()
        return [orjson.dumps([[s, c]] if c else [None]).decode() for s, c in zip(sums, counts, strict=True)]
    values = grouped[f"{number}_{plan.aggregation}"].to_pylist()
    return [orjson.dumps([v]).decode() for v in values]


def _windowed(table: pa.Table, plan: StorePlan, rows: _Rows) -> pa.Table:
    """Return one row per (record, window it is on time for); add late and stream-time rows."""
    assert plan.window is not None  # noqa: S101 - a window plan always has a window
    size, advance, grace = plan.window
    table = table.sort_by([("partition", "ascending"), ("offset", "ascending")])
    partitions = table["partition"].to_numpy()
    ts = table["event_ms"].to_numpy().astype(np.int64)
    stream_time = np.empty_like(ts)
    for p in np.unique(partitions):
        seg = np.flatnonzero(partitions == p)
        stored = plan.stream_times.get(int(p), _LONG_MIN)
        stream_time[seg] = np.maximum.accumulate(np.maximum(ts[seg], stored))
        rows.add("st", plan.name, int(p), window_start=int(ts[seg].max()))
    per_record = -(-size // advance)
    first = -((-(ts - size + 1)) // advance) * advance
    starts = first[:, None] + advance * np.arange(per_record, dtype=np.int64)[None, :]
    valid = starts <= ts[:, None]
    late = valid & (starts + size + grace <= stream_time[:, None])
    for p in np.unique(partitions):
        count = int(late[partitions == p].sum())
        if count:
            rows.add("late", plan.name, int(p), records=count)
    on_time = valid & ~late
    record_index, window_index = np.nonzero(on_time)
    exploded = table.take(pa.array(record_index))
    return exploded.append_column("window_start", pa.array(starts[record_index, window_index], pa.int64()))
