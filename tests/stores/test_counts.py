"""Exact entry counts of key-value and window stores, kept in meta in the batch that changes the entries."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iqgraph.stores import (
    KeyValueStore,
    PartitionStores,
    PartitionTransaction,
    StoreKind,
    StoreNotReadyError,
    WindowStore,
)
from iqgraph.stores.codecs import decode_int64
from iqgraph.stores.partition import META_CF, counter_key, entries_counter
from tests.stores.conftest import SPECS, Apply
from tests.support.crash_writer import dump, run_writer

COUNTED = [s.name for s in SPECS if s.kind is not StoreKind.BLOOM]
_fresh_partition = itertools.count(1)


def stored(stores: PartitionStores, name: str) -> int:
    """Return how many keys the family of store name really holds."""
    return sum(1 for _ in stores.db.family(name).keys())


def counted_views(stores: PartitionStores) -> list[KeyValueStore | WindowStore]:
    """Return the view of every store that keeps an exact count."""
    return [stores.window(n) if stores.db.spec(n).kind is StoreKind.WINDOW else stores.kv(n) for n in COUNTED]


def assert_exact(stores: PartitionStores, view: KeyValueStore | WindowStore, expected: int) -> None:
    assert view.count() == stored(stores, view.name) == expected


# -- key-value stores ----------------------------------------------------------------------------------------


def test_a_new_store_counts_zero(partition: PartitionStores) -> None:
    assert [view.count() for view in counted_views(partition)] == [0] * len(COUNTED) == [0] * 10


def test_merges_count_new_keys(partition: PartitionStores, apply: Apply) -> None:
    counts = partition.kv("counts")
    apply(partition, lambda tx: counts.merge(tx, [(f"k{i}", 1) for i in range(150)]))
    assert_exact(partition, counts, 150)
    apply(partition, lambda tx: counts.merge(tx, [(f"k{i}", 1) for i in range(100, 200)]))
    assert_exact(partition, counts, 200)
    assert partition.kv("latest").count() == 0  # counts are per store


def test_updating_the_same_keys_many_times_does_not_grow_the_count(partition: PartitionStores, apply: Apply) -> None:
    counts = partition.kv("counts")
    for _ in range(40):
        apply(partition, lambda tx: counts.merge(tx, [(f"k{i}", 1) for i in range(150)]))
    partition.db.family("counts").flush()
    assert_exact(partition, counts, 150)
    assert counts.get("k7") == 40


def test_a_null_partial_for_a_new_key_stores_and_counts_nothing(partition: PartitionStores, apply: Apply) -> None:
    sums = partition.kv("sums")
    apply(partition, lambda tx: sums.merge(tx, [("a", None), ("b", 2)]))
    apply(partition, lambda tx: sums.merge(tx, [("b", None)]))
    assert_exact(partition, sums, 1)


def test_puts_and_deletes(partition: PartitionStores, apply: Apply) -> None:
    latest = partition.kv("latest")
    apply(partition, lambda tx: [latest.put(tx, k, k) for k in ("a", "b", "c")])
    assert_exact(partition, latest, 3)
    apply(partition, lambda tx: [latest.put(tx, k, None) for k in ("a", "b")])  # over existing keys
    assert_exact(partition, latest, 3)
    apply(partition, lambda tx: [latest.delete(tx, k) for k in ("a", "missing")])
    assert_exact(partition, latest, 2)
    apply(partition, lambda tx: latest.delete(tx, "a"))  # already gone
    assert_exact(partition, latest, 2)


def test_keys_created_and_deleted_in_one_transaction_net_out(partition: PartitionStores, apply: Apply) -> None:
    latest, counts = partition.kv("latest"), partition.kv("counts")
    apply(partition, lambda tx: latest.put(tx, "old", 1))

    def churn(tx: PartitionTransaction) -> None:
        latest.put(tx, "new", 1)
        latest.put(tx, "new", 2)
        latest.delete(tx, "new")
        latest.delete(tx, "new")
        latest.delete(tx, "old")
        latest.put(tx, "old", 3)
        latest.put(tx, "again", 1)
        latest.delete(tx, "again")
        latest.put(tx, "again", 2)
        counts.merge(tx, [("x", 1), ("y", 1)])
        counts.merge(tx, [("x", 1), ("z", 1)])
        counts.delete(tx, "y")

    apply(partition, churn)
    assert_exact(partition, latest, 2)
    assert_exact(partition, counts, 2)


def test_an_aborted_transaction_changes_no_count(partition: PartitionStores, apply: Apply) -> None:
    counts, window = partition.kv("counts"), partition.window("tumbling")
    apply(partition, lambda tx: counts.merge(tx, [("a", 1)]))
    apply(partition, lambda tx: window.aggregate(tx, [("a", 5, 1)]))

    def fail(tx: PartitionTransaction) -> None:
        counts.merge(tx, [("b", 1), ("c", 1)])
        counts.delete(tx, "a")
        window.aggregate(tx, [("b", 7, 1), ("a", 500, 1)])  # a new window, and the old one expires
        raise RuntimeError("batch failed")

    def disk_full() -> None:
        raise OSError("disk full")

    with pytest.raises(RuntimeError, match="batch failed"):
        apply(partition, fail)
    tx = partition.db.begin(2, 3)
    assert tx is not None
    counts.merge(tx, [("d", 1)])
    tx.before_commit(disk_full)
    with pytest.raises(OSError, match="disk full"):
        tx.commit()
    assert_exact(partition, counts, 1)
    assert_exact(partition, window, 1)


def test_count_needs_a_queryable_partition(open_partition: Callable[..., PartitionStores]) -> None:
    stores = open_partition(running=False)
    for view in counted_views(stores):
        with pytest.raises(StoreNotReadyError):
            view.count()


# -- window stores -------------------------------------------------------------------------------------------


def test_window_count_is_the_number_of_key_window_entries(partition: PartitionStores, apply: Apply) -> None:
    hopping = partition.window("hopping")  # each timestamp falls into two windows
    apply(partition, lambda tx: hopping.aggregate(tx, [("a", 7, 1), ("a", 9, 1), ("b", 7, 1)]))
    assert_exact(partition, hopping, 4)
    apply(partition, lambda tx: hopping.aggregate(tx, [("a", 8, 1), ("a", 12, 1)]))
    assert_exact(partition, hopping, 5)


def test_window_count_across_retention_drops(partition: PartitionStores, apply: Apply) -> None:
    window = partition.window("tumbling")  # retention 100
    records = [(k, t, 1) for t in range(0, 200, 10) for k in ("a", "b")]
    apply(partition, lambda tx: window.aggregate(tx, records))
    assert_exact(partition, window, 20)  # 40 applied, the 20 windows before 91 dropped
    assert stored(partition, "tumbling.by_time") == 20
    apply(partition, lambda tx: window.aggregate(tx, [("a", 255, 1)]))
    assert_exact(partition, window, 9)  # [160, 190] for a and b, and a's [250, 260)
    apply(partition, lambda tx: window.aggregate(tx, [("c", 10_000, 1)]))
    assert_exact(partition, window, 1)


def test_a_window_dropped_by_two_merges_in_one_batch_is_counted_once(partition: PartitionStores, apply: Apply) -> None:
    window = partition.window("tumbling")
    apply(partition, lambda tx: window.merge(tx, [("a", 0, 1), ("b", 50, 1)], stream_time=50))

    def two_merges(tx: PartitionTransaction) -> None:
        window.merge(tx, [("c", 150, 1)], stream_time=150)  # drops a's [0, 10)
        window.merge(tx, [("d", 190, 1)], stream_time=190)  # drops b's [50, 60); a's again in the index scan

    apply(partition, two_merges)
    assert_exact(partition, window, 2)


# -- lifetime -----------------------------------------------------------------------------------------------


def test_counts_survive_close_and_reopen(open_partition: Callable[..., PartitionStores], apply: Apply) -> None:
    stores = open_partition()
    apply(stores, lambda tx: stores.kv("counts").merge(tx, [(f"k{i}", 1) for i in range(30)]))
    apply(stores, lambda tx: stores.window("hopping").aggregate(tx, [("a", 7, 1)]))
    stores.close()
    again = open_partition()
    assert again.kv("counts").count() == 30
    assert again.window("hopping").count() == 2
    apply(again, lambda tx: again.kv("counts").merge(tx, [("k0", 1), ("new", 1)]))
    assert_exact(again, again.kv("counts"), 31)


def test_a_database_written_before_counting_gets_its_counts_on_open(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition()
    apply(stores, lambda tx: stores.kv("latest").merge(tx, [(f"k{i}", i) for i in range(25)]))
    apply(stores, lambda tx: stores.window("tumbling").aggregate(tx, [(k, 5, 1) for k in "abc"]))
    for name in COUNTED:  # as a database written before this version was
        del stores.db.family(META_CF)[counter_key(entries_counter(name))]
    assert stores.db.counter(entries_counter("latest")) == 0
    stores.close()
    old = open_partition()
    assert old.kv("latest").count() == 25
    assert old.window("tumbling").count() == 3
    assert old.kv("counts").count() == 0
    apply(old, lambda tx: old.kv("latest").merge(tx, [("k0", 1), ("k99", 1)]))
    assert_exact(old, old.kv("latest"), 26)


def test_counts_match_the_stores_after_a_crash_and_restart(tmp_path: Path) -> None:
    root = tmp_path / "state"
    run_writer(root, "kill-in-commit", 4)
    run_writer(root, "clean", 6)
    content = dump(root)
    for name in ("counts", "latest", "windows"):
        assert decode_int64(content[META_CF][counter_key(entries_counter(name))]) == len(content[name]) > 0
    assert counter_key(entries_counter("seen")) not in content[META_CF]  # a bloom filter cannot count


# -- against a model -----------------------------------------------------------------------------------------

#: Batches of (operation, key), each committed or aborted.
batches_of_operations = st.lists(
    st.tuples(
        st.lists(st.tuples(st.sampled_from(["put", "delete", "merge"]), st.sampled_from("abcdef")), max_size=8),
        st.booleans(),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches_of_operations)
def test_count_matches_a_model(
    open_partition: Callable[..., PartitionStores], batches: list[tuple[list[tuple[str, str]], bool]]
) -> None:
    stores = open_partition(partition=next(_fresh_partition))
    counts = stores.kv("counts")
    model: set[str] = set()
    for ops, aborted in batches:
        start = stores.db.next_offset()
        tx = stores.db.begin(start, start + 1)
        assert tx is not None
        pending = set(model)
        for op, key in ops:
            if op == "delete":
                counts.delete(tx, key)
                pending.discard(key)
            elif op == "put":
                counts.put(tx, key, start)
                pending.add(key)
            else:
                counts.merge(tx, [(key, 1)])
                pending.add(key)
        if aborted:
            tx.abort()
        else:
            tx.commit()
            model = pending
        assert_exact(stores, counts, len(model))
    stores.close()
