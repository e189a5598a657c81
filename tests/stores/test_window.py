"""The window store: window assignment, fetches, grace and late records, retention, stream time."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iqgraph.stores import (
    InvalidKeyError,
    Key,
    Page,
    PartitionStores,
    WindowedValue,
    WindowSpec,
    WindowStore,
)
from iqgraph.stores.codecs import decode_int64
from tests.stores.conftest import Apply

INT64_MAX = (1 << 63) - 1


def windows(found: list[WindowedValue] | Page[WindowedValue]) -> list[tuple[Key, int, int, object]]:
    items = found.items if isinstance(found, Page) else found
    return [(w.key, w.start, w.end, w.value) for w in items]


def page_through(read: Callable[..., Page[WindowedValue]], limit: int) -> list[WindowedValue]:
    """Return every window of a paged read, following cursors."""
    items: list[WindowedValue] = []
    after: str | None = None
    for _ in range(10_000):
        page = read(limit=limit, after=after)
        assert len(page.items) <= limit
        items.extend(page.items)
        if page.next_cursor is None:
            return items
        after = page.next_cursor
    raise AssertionError("pagination does not end")


def aggregate(stores: PartitionStores, apply: Apply, name: str, records: list[tuple[Key, int, object]]) -> WindowStore:
    """Apply records (key, event time, partial) to window store name in one batch; return the view."""
    window = stores.window(name)
    apply(stores, lambda tx: window.aggregate(tx, records))
    return window


# -- window assignment ----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 60).flatmap(lambda size: st.tuples(st.just(size), st.integers(1, size))),
    st.integers(-(10**6), 10**6) | st.integers(-(10**15), 10**15),
)
def test_window_starts_are_exactly_the_windows_that_contain_the_timestamp(
    size_advance: tuple[int, int], ts: int
) -> None:
    size, advance = size_advance
    spec = WindowSpec(size_ms=size, advance_ms=advance)
    brute_force = [s for s in range(ts - size + 1, ts + 1) if s % advance == 0]
    starts = spec.window_starts(ts)
    assert starts == brute_force
    assert all(start <= ts < start + size for start in starts)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10**6), st.integers(-(10**12), 10**12))
def test_a_tumbling_window_is_the_one_that_contains_the_timestamp(size: int, ts: int) -> None:
    assert WindowSpec(size_ms=size).window_starts(ts) == [ts // size * size]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size_ms": 0}, "size"),
        ({"size_ms": 10, "advance_ms": 11}, "advance"),
        ({"size_ms": 10, "advance_ms": -1}, "advance"),
        ({"size_ms": 10, "grace_ms": -1}, "grace"),
        ({"size_ms": 10, "grace_ms": 5, "retention_ms": 14}, "retention"),
    ],
)
def test_invalid_window_specs(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WindowSpec(**kwargs)


# -- reads ----------------------------------------------------------------------------------------------


def test_fetch_returns_a_keys_windows_in_time_order(partition: PartitionStores, apply: Apply) -> None:
    window = aggregate(
        partition, apply, "tumbling", [("a", 3, 1), ("a", 7, 1), ("b", 5, 1), ("a", 12, 1), ("ab", 4, 1), ("a", 25, 1)]
    )
    assert windows(window.fetch("a", 0, 100)) == [("a", 0, 10, 2), ("a", 10, 20, 1), ("a", 20, 30, 1)]
    assert windows(window.fetch("a", 10, 20)) == [("a", 10, 20, 1), ("a", 20, 30, 1)]  # starts in [from, to]
    assert windows(window.fetch("a", 1, 19)) == [("a", 10, 20, 1)]
    assert windows(window.fetch("b", 0, 100)) == [("b", 0, 10, 1)]
    assert window.fetch("a", 30, 100) == []
    assert window.fetch("missing", 0, 100) == []
    assert window.fetch("a", 20, 10) == []


def test_hopping_windows(partition: PartitionStores, apply: Apply) -> None:
    window = aggregate(partition, apply, "hopping", [("a", 7, 1), ("a", 9, 1), ("a", 12, 1)])
    assert windows(window.fetch("a", -100, 100)) == [("a", 0, 10, 2), ("a", 5, 15, 3), ("a", 10, 20, 1)]


def test_int_keys(partition: PartitionStores, apply: Apply) -> None:
    records: list[tuple[Key, int, object]] = [(-5, 1, 2.5), (-5, 2, 1), (3, 1, 4), (0, 11, 1), (-(1 << 62), 3, 1)]
    window = aggregate(partition, apply, "tumbling_int", records)
    assert windows(window.fetch(-5, 0, 50)) == [(-5, 0, 10, 3.5)]
    assert [w.key for w in window.fetch_range(None, None, 0, 50).items] == [-(1 << 62), -5, 0, 3]
    assert [w.key for w in window.fetch_range(-5, 0, 0, 50).items] == [-5, 0]
    with pytest.raises(InvalidKeyError):
        window.fetch("a", 0, 10)


def test_fetch_all_is_ordered_by_start_then_key_and_paginated(partition: PartitionStores, apply: Apply) -> None:
    records: list[tuple[Key, int, object]] = [(k, t, 1) for t in (1, 12, 23, 34) for k in ("c", "a", "b", "a\x00")]
    window = aggregate(partition, apply, "tumbling", records)
    everything = [(w.start, w.key) for w in window.fetch_all(0, 100).items]
    assert everything == [(s, k) for s in (0, 10, 20, 30) for k in ("a", "a\x00", "b", "c")]
    assert [(w.start, w.key) for w in window.fetch_all(10, 20).items] == everything[4:12]
    assert [(w.start, w.key) for w in window.fetch_all(11, 20).items] == everything[8:12]
    for limit in (1, 3, 4, 100):
        assert page_through(lambda **kw: window.fetch_all(5, 30, **kw), limit) == window.fetch_all(5, 30).items
    assert window.fetch_all(40, 100).items == []
    assert window.fetch_all(20, 10).items == []


def test_fetch_range_is_a_key_range_within_a_time_range(partition: PartitionStores, apply: Apply) -> None:
    keys = ["a", "a\x00", "ab", "b", "c"]
    window = aggregate(partition, apply, "tumbling", [(k, t, 1) for t in (1, 12, 23) for k in keys])
    found = window.fetch_range("a", "ab", 10, 20)
    assert [(w.key, w.start) for w in found.items] == [(k, s) for k in ("a", "a\x00", "ab") for s in (10, 20)]
    assert [(w.key, w.start) for w in window.fetch_range("a\x00", "b", 0, 0).items] == [
        ("a\x00", 0),
        ("ab", 0),
        ("b", 0),
    ]
    assert [w.key for w in window.fetch_range(None, "a", 0, 100).items] == ["a"] * 3
    assert [w.key for w in window.fetch_range("b", None, 0, 100).items] == ["b"] * 3 + ["c"] * 3
    paged = page_through(lambda **kw: window.fetch_range("a", "b", 10, 20, **kw), 2)
    assert paged == window.fetch_range("a", "b", 10, 20).items
    assert [(w.key, w.start) for w in paged] == [(k, s) for k in ("a", "a\x00", "ab", "b") for s in (10, 20)]


# -- grace, late records, retention, stream time ----------------------------------------------------------


def test_grace_applies_records_until_window_end_plus_grace(partition: PartitionStores, apply: Apply) -> None:
    window = aggregate(partition, apply, "tumbling", [("a", 100, 1)])
    assert window.stream_time() == 100
    # [90, 100) closes at 100 + 5 (grace): still open. [80, 90) closed at 95: late.
    aggregate(partition, apply, "tumbling", [("a", 99, 1), ("a", 89, 1), ("b", 85, 1)])
    assert windows(window.fetch("a", 0, 200)) == [("a", 90, 100, 1), ("a", 100, 110, 1)]
    assert window.fetch("b", 0, 200) == []
    assert window.late_records() == 2
    # stream time moves record by record within a batch: 115 closes [100, 110) for the record after it
    aggregate(partition, apply, "tumbling", [("a", 104, 1), ("a", 115, 1), ("a", 105, 1), ("a", 109, 1)])
    assert windows(window.fetch("a", 100, 200)) == [("a", 100, 110, 2), ("a", 110, 120, 1)]
    assert window.late_records() == 4
    assert window.stream_time() == 115


def test_merge_counts_closed_windows_as_late(partition: PartitionStores, apply: Apply) -> None:
    window = partition.window("tumbling")
    apply(partition, lambda tx: window.merge(tx, [("a", 100, 1)], stream_time=100))
    apply(partition, lambda tx: window.merge(tx, [("a", 90, 1), ("a", 80, 7), ("a", 100, 2)], stream_time=90, late=3))
    assert windows(window.fetch("a", 0, 200)) == [("a", 90, 100, 1), ("a", 100, 110, 3)]
    assert window.late_records() == 4
    assert window.stream_time() == 100  # stream time never goes back


def test_retention_drops_old_windows_from_both_families(partition: PartitionStores, apply: Apply) -> None:
    window = aggregate(partition, apply, "tumbling", [(k, t, 1) for t in range(0, 200, 10) for k in ("a", "b")])
    assert window.stream_time() == 190
    # retention 100: windows that start at or before 190 - 100 are gone
    kept = list(range(100, 200, 10))
    assert [w.start for w in window.fetch("a", -1000, 1000)] == kept
    assert [w.start for w in window.fetch_all(-1000, 1000).items] == [s for s in kept for _ in "ab"]
    assert [w.start for w in window.fetch_range(None, None, -1000, 1000).items] == kept * 2
    by_key = [decode_int64(k[-8:]) for k in partition.db.family("tumbling").keys()]
    by_time = [decode_int64(k[:8]) for k in partition.db.family("tumbling.by_time").keys()]
    assert sorted(by_key) == sorted(by_time) == sorted(kept * 2)
    aggregate(partition, apply, "tumbling", [("a", 255, 1)])
    assert [w.start for w in window.fetch("a", -1000, 1000)] == [160, 170, 180, 190, 250]
    assert len(list(partition.db.family("tumbling.by_time").keys())) == 4 + 4 + 1


def test_reads_hide_expired_windows_that_are_not_yet_dropped(partition: PartitionStores, apply: Apply) -> None:
    window = partition.window("hopping")  # retention 1000
    apply(partition, lambda tx: window.merge(tx, [("a", 0, 1), ("a", 500, 1)], stream_time=500))
    apply(partition, lambda tx: window.merge(tx, [], stream_time=1_200))
    assert [w.start for w in window.fetch("a", 0, 2_000)] == [500]
    assert [w.start for w in window.fetch_all(0, 2_000).items] == [500]


def test_stream_time_and_late_count_survive_reopen(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition()
    assert stores.window("tumbling").stream_time() is None
    aggregate(stores, apply, "tumbling", [("a", 50, 1), ("a", 30, 1)])
    stores.close()
    again = open_partition()
    window = again.window("tumbling")
    assert window.stream_time() == 50
    assert window.late_records() == 1
    aggregate(again, apply, "tumbling", [("a", 39, 1), ("a", 41, 1)])  # [30, 40) is still closed
    assert windows(window.fetch("a", 0, 100)) == [("a", 40, 50, 1), ("a", 50, 60, 1)]
    assert window.late_records() == 2
    assert again.window("hopping").stream_time() is None  # stream time is per store


def test_two_aggregates_in_one_batch_compose(partition: PartitionStores, apply: Apply) -> None:
    window = partition.window("tumbling")

    def two_chunks(tx: object) -> None:
        window.aggregate(tx, [("a", 1_000, 1), ("a", 10, 1)])  # type: ignore[arg-type]
        window.aggregate(tx, [("a", 500, 1)])  # type: ignore[arg-type]

    apply(partition, two_chunks)
    assert window.stream_time() == 1_000
    assert window.late_records() == 2
    assert windows(window.fetch("a", 0, 2_000)) == [("a", 1_000, 1_010, 1)]


def test_fetch_to_the_end_of_time_returns_only_the_key(partition: PartitionStores, apply: Apply) -> None:
    window = aggregate(partition, apply, "tumbling", [("a", 5, 1), ("a\x00", 5, 1)])
    assert [w.key for w in window.fetch("a", 0, INT64_MAX)] == ["a"]


def test_fetch_all_to_the_end_of_time(partition: PartitionStores, apply: Apply) -> None:
    window = aggregate(partition, apply, "tumbling", [("a", 5, 1)])
    assert [w.key for w in window.fetch_all(0, INT64_MAX).items] == ["a"]


def test_a_window_given_twice_in_one_merge_folds_both_partials(partition: PartitionStores, apply: Apply) -> None:
    window = partition.window("tumbling")
    apply(partition, lambda tx: window.merge(tx, [("a", 10, 1), ("b", 10, 1), ("a", 10, 2)], stream_time=15))
    assert windows(window.fetch_all(0, 100)) == [("a", 10, 20, 3), ("b", 10, 20, 1)]
