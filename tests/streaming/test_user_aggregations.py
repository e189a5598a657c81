"""User aggregations and collect(...) without Spark: the task's fold (pyarrow), the sink's merge (RocksDB),
the cross-partition combine of the query path, the sketches' accuracy, and definitions refused at load.

Ground truth is plain Python over the same records.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from iqgraph import App, Topic, UserAggregation, aggregate, collect, key_value_store, tumbling, window_store
from iqgraph.app.query.merging import combiner, finalize
from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.streaming.arrow_partials import StorePlan, partials_of
from iqgraph.streaming.definitions import DefinitionError
from iqgraph.streaming.sketches import histogram, hyperloglog

Record = tuple[int, int, str, dict[str, Any]]  # partition, offset, key, columns


def _table(store: str, records: Sequence[Record]) -> pa.Table:
    """Return a store's rows as the task gets them (NARROW_SCHEMA; event time = offset, no bad records)."""
    partitions, offsets, keys, values = zip(*records, strict=True)
    n, text = len(records), pa.string()
    return pa.table(
        {
            "store": pa.array([store] * n, text),
            "partition": pa.array(partitions, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "event_ms": pa.array(offsets, pa.int64()),
            "key": pa.array(keys, text),
            "payload": pa.array([orjson.dumps(v).decode() for v in values], text),
            "error": pa.nulls(n, text),
            "raw_key": pa.nulls(n, pa.binary()),
            "raw_value": pa.nulls(n, pa.binary()),
        }
    )


def _partials(plan: StorePlan, table: pa.Table) -> list[dict[str, Any]]:
    return [r for batch in partials_of(iter(table.to_batches()), [plan]) for r in batch.to_pylist()]


def _plan(agg: Any, name: str = "s", window: tuple[int, int, int] | None = None) -> StorePlan:
    kind = "window" if window else "key_value"
    return StorePlan(name, kind, agg.kind, window=window, user=agg.user)


def _sequence() -> UserAggregation:
    """A non-commutative fold (the order it sees rows in), merged by concatenation sorted by offset."""
    return UserAggregation(
        "sequence",
        init=list,
        add=lambda s, row: [*s, [row["_offset"], row["n"]]],
        merge=lambda a, b: sorted(a + b),
        finalize=lambda s: [n for _, n in s],
        value_type="array<long>",
        columns=("n",),
        with_position=True,
    )


def test_the_task_folds_each_group_in_offset_order_from_init() -> None:
    agg = aggregate(_sequence())
    records = [(0, o, "k" if o % 3 else "j", {"n": o * 10}) for o in range(12)]
    shuffled = random.Random(1).sample(records, len(records))  # a join may reorder a store's rows
    partials = _partials(_plan(agg), _table("s", shuffled))
    got = {(r["key"], r["partition"]): orjson.loads(r["partial"])[0] for r in partials if r["kind"] == "p"}
    assert got[("k", 0)] == [[o, o * 10] for o in range(12) if o % 3]
    assert got[("j", 0)] == [[o, o * 10] for o in range(12) if not o % 3]
    assert {r["records"] for r in partials if r["kind"] == "p"} == {4, 8}
    # each partial's position: the offset of its group's last record (what a live watch's resume compares)
    assert {r["key"]: r["position"] for r in partials if r["kind"] == "p"} == {"k": 11, "j": 9}
    # the same for a built-in aggregation (pyarrow's group_by), whatever order the rows come in
    counted = _partials(StorePlan("s", "key_value", "count"), _table("s", shuffled))
    assert {r["key"]: (r["partial"], r["position"]) for r in counted if r["kind"] == "p"} == {
        "k": ("[8]", 11),
        "j": ("[4]", 9),
    }


def test_a_window_store_folds_per_window_and_a_failing_add_is_a_bad_record() -> None:
    histo = UserAggregation(
        "strict_sum",
        init=lambda: 0,
        add=lambda s, row: s + int(row["x"]),  # int(None) raises: that record is bad, the others count
        merge=lambda a, b: a + b,
        finalize=lambda s: s,
        value_type="long",
    )
    agg = aggregate(histo, "x")
    records = [(1, o, "k", {"x": None if o == 3 else o}) for o in range(8)]
    partials = _partials(_plan(agg, window=(4, 4, 100)), _table("s", records))
    sums = {r["window_start"]: orjson.loads(r["partial"])[0] for r in partials if r["kind"] == "p"}
    assert sums == {0: 0 + 1 + 2, 4: 4 + 5 + 6 + 7}
    (bad,) = [orjson.loads(r["partial"]) for r in partials if r["kind"] == "bad"]
    assert bad["offset"] == 3 and "strict_sum" in bad["error"] and "TypeError" in bad["error"]


def _collect_app(keep: str = "last", k: int = 5) -> App:
    return App(
        name="c",
        topics=[Topic("t", schema="user STRING, item STRING, ts LONG", partitions=3)],
        stores=[
            key_value_store("by_item", "t", collect("user", "ts", max_items=k, order_by="ts", keep=keep), key="item")
        ],
    )


def _open(tmp_path: Path, app: App) -> list[PartitionStores]:
    directory = StateDirectory(tmp_path / "state", app.name)
    opened = [directory.open("t", p, app.specs("t")) for p in range(3)]
    for stores in opened:
        stores.db.set_state(PartitionState.RUNNING)
    return opened


def _apply(app: App, partitions: list[PartitionStores], records: Sequence[Record], batch: int) -> None:
    """Run records through the task's fold and the sink's merge, a batch of each partition at a time."""
    store = app.stores[0]
    plan = _plan(store.aggregate, store.name)
    by_partition: dict[int, list[Record]] = {}
    for record in records:
        by_partition.setdefault(record[0], []).append(record)
    for p, mine in by_partition.items():
        for start in range(0, len(mine), batch):
            chunk = mine[start : start + batch]
            items = [(r["key"], orjson.loads(r["partial"])[0]) for r in _partials(plan, _table(store.name, chunk))]
            db = partitions[p].db
            with db.begin(chunk[0][1], chunk[-1][1] + 1) as tx:
                partitions[p].kv(store.name).merge(tx, items)


def _records(seed: int, n: int) -> list[Record]:
    rng = random.Random(seed)
    offsets = [0, 0, 0]
    out = []
    for i in range(n):
        p = rng.randrange(3)
        ts = rng.randrange(40)  # coarse: ties in the order column within and across partitions
        out.append((p, offsets[p], rng.choice("abc"), {"user": f"u{i}", "item": None, "ts": ts}))
        offsets[p] += 1
    return out


@pytest.mark.parametrize("keep", ["last", "first"])
def test_collect_of_a_column_keyed_store_merges_across_partitions_to_one_sort(tmp_path: Path, keep: str) -> None:
    app = _collect_app(keep, k=5)
    records = _records(7, 300)
    partitions = _open(tmp_path, app)
    try:
        _apply(app, partitions, records, batch=17)
        definition = app.stores[0]
        combine = combiner(definition)
        for key in "abc":
            states = [stores.kv("by_item").multi_get([key], states=True)[0] for stores in partitions]
            random.Random(key).shuffle(states)  # partitions (and nodes) answer in any order
            merged = None
            for state in states:
                merged = combine(merged, state)
            ranked = sorted((v["ts"], p, o, v) for p, o, k, v in records if k == key)
            kept = ranked[-5:] if keep == "last" else ranked[:5]
            assert finalize(definition, merged) == [{"user": v["user"], "ts": v["ts"]} for *_, v in kept]
    finally:
        for stores in partitions:
            stores.close()


def test_collect_keeps_exactly_k_in_order_whatever_the_batches(tmp_path: Path) -> None:
    app = _collect_app("last", k=3)
    records = [(0, o, "a", {"user": f"u{o}", "item": None, "ts": 100 - o % 7}) for o in range(50)]
    results = []
    for batch in (1, 4, 50):
        partitions = _open(tmp_path / str(batch), app)
        try:
            _apply(app, partitions, records, batch)
            results.append(partitions[0].kv("by_item").get("a"))
        finally:
            for stores in partitions:
                stores.close()
    # ts 100 occurs at offsets 0, 7, …, 49: the last three by (ts, partition, offset) are 35, 42, 49
    assert results == [[{"user": f"u{o}", "ts": 100} for o in (35, 42, 49)]] * 3


def test_hyperloglog_counts_20k_distinct_values_within_its_error_bound() -> None:
    sketch = hyperloglog("user")
    values = [f"user-{i}" for i in range(20_000)]
    rng = random.Random(3)
    rows = [{"user": rng.choice(values)} for _ in range(10_000)] + [{"user": v} for v in values]
    rng.shuffle(rows)
    # three partitions' partials, merged in the sink's stored (base64) form
    parts = [sketch.fold(rows[i::3]) for i in range(3)]
    agg = sketch.aggregation()
    merged = agg.merge(agg.merge(parts[0], parts[1]), parts[2])
    estimate = agg.finalize(merged)
    exact = len({r["user"] for r in rows})
    assert abs(estimate - exact) / exact < 3 * 1.04 / 64  # three standard errors at 4,096 registers
    assert agg.merge(merged, merged) == merged  # idempotent: the register-wise max
    assert isinstance(merged, str) and len(merged) < 6_000


def test_histogram_counts_exactly() -> None:
    sketch = histogram("ms", [10, 50, 100])
    rng = random.Random(5)
    values = [rng.choice([None, rng.uniform(-5, 200), 10, 50, 100]) for _ in range(5_000)]
    agg = sketch.aggregation()
    state = agg.merge(
        sketch.fold([{"ms": v} for v in values[:2_000]]), sketch.fold([{"ms": v} for v in values[2_000:]])
    )
    got = agg.finalize(state)
    present = [v for v in values if v is not None]
    assert [b["count"] for b in got] == [
        sum(v < 10 for v in present),
        sum(10 <= v < 50 for v in present),
        sum(50 <= v < 100 for v in present),
        sum(v >= 100 for v in present),
    ]
    assert [(b["low"], b["high"]) for b in got] == [(None, 10), (10, 50), (50, 100), (100, None)]


def _user(**changes: Any) -> UserAggregation:
    parts: dict[str, Any] = {
        "name": "mine",
        "init": list,
        "add": lambda s, r: s,
        "merge": lambda a, b: a + b,
        "finalize": len,
        "value_type": "long",
    }
    return UserAggregation(**{**parts, **changes})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"merge": None}, "user aggregation 'mine': merge must be callable, got None"),
        ({"finalize": "len"}, "user aggregation 'mine': finalize must be callable, got 'len'"),
        ({"value_type": None}, "user aggregation 'mine': value_type must be a Spark DDL string or a DataType"),
        ({"value_type": "lnog"}, "user aggregation 'mine': bad value_type: type 'lnog': expected a type"),
        ({"init": set}, "user aggregation 'mine': the state of init() is not JSON-serialisable"),
        ({"init": lambda: (0, 0)}, "does not survive a JSON round trip ((0, 0) came back as [0, 0])"),
        ({"init": lambda: {1: 0}}, "the state of init() is not JSON-serialisable"),
        ({"init": lambda: None}, "init() is None; a state must not be None"),
        ({"merge": lambda a, b: 1 / 0}, "merge(init(), init()) raised ZeroDivisionError: division by zero"),
        ({"merge": lambda a, b: {0}}, "the state of merge(init(), init()) is not JSON-serialisable"),
        ({"encode": str}, "give both encode and decode (callables) or neither"),
        ({"name": "count"}, "'count' is a built-in aggregation; choose another name"),
    ],
)
def test_a_user_aggregation_that_cannot_merge_as_json_is_refused_in_one_line(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(DefinitionError) as refused:
        _user(**changes)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_codec_makes_a_state_storable() -> None:
    as_set = _user(init=set, merge=lambda a, b: a | b, encode=sorted, decode=set)
    agg = as_set.aggregation()
    assert agg.merge(["a", "b"], ["b", "c"]) == ["a", "b", "c"] and agg.finalize(["a", "b"]) == 2


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: collect(max_items=3, order_by="ts"), "collect needs the columns to keep"),
        (lambda: collect("a", max_items=0, order_by="ts"), "collect(max_items=0): keep at least 1 record per key"),
        (lambda: collect("a", max_items=3, order_by="ts", keep="middle"), "keep 'last' or 'first'"),
        (lambda: collect("a", max_items=3, order_by=""), "collect needs order_by"),
        (lambda: aggregate(len), "aggregate(...) takes a UserAggregation"),  # type: ignore[arg-type]
        (lambda: histogram("x", [3, 1]), "bounds must increase strictly"),
        (lambda: hyperloglog("x", precision=30), "use a precision from 4 to 16"),
    ],
)
def test_bad_collections_and_sketches_are_refused_in_one_line(build: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=None) as refused:
        build()
    assert message in str(refused.value)


def test_user_aggregations_go_where_count_goes() -> None:
    app = App(
        name="u",
        topics=[Topic("t", schema="user STRING, ms DOUBLE")],
        stores=[
            key_value_store("listeners", "t", aggregate(hyperloglog("user"))),
            window_store("latency", "t", aggregate(histogram("ms", [1.0])), tumbling(minutes=1)),
        ],
    )
    listeners, latency = app.stores
    assert listeners.aggregation == "hyperloglog" and latency.aggregation == "histogram"
    assert app.specs("t")[0].aggregation == listeners.state_aggregation
