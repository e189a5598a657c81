"""The key-value store: point, multi, range, prefix and paged reads; merges of every aggregation."""

from __future__ import annotations

import base64

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iqgraph.stores import (
    AVG,
    SUM,
    CorruptValueError,
    InvalidCursorError,
    InvalidKeyError,
    Key,
    KeyValueStore,
    PartitionStores,
    PartitionTransaction,
    UnknownFormatError,
)
from tests.stores.conftest import Apply

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
hypothesis_settings = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def fill(stores: PartitionStores, apply: Apply, name: str, items: dict[Key, object]) -> KeyValueStore:
    """Replace the content of store name with items, in one batch, and return its view."""
    kv = stores.kv(name)

    def write(tx: PartitionTransaction) -> None:
        for raw_key in list(stores.db.family(name).keys()):
            tx.delete(name, raw_key)
        for key, value in items.items():
            kv.put(tx, key, value)

    apply(stores, write)
    return kv


def page_through(read: object, limit: int, after: str | None = None) -> list[tuple[Key, object]]:
    """Return every item of a paged read (from cursor after), following cursors with pages of limit items."""
    items: list[tuple[Key, object]] = []
    for _ in range(10_000):
        page = read(limit=limit, after=after)  # type: ignore[operator]
        assert len(page.items) <= limit
        assert page.items or page.next_cursor is None
        items.extend(page.items)
        if page.next_cursor is None:
            return items
        assert len(page.items) == limit
        after = page.next_cursor
    raise AssertionError("pagination does not end")


# -- reads ------------------------------------------------------------------------------------------------


def test_get_and_multi_get(partition: PartitionStores, apply: Apply) -> None:
    kv = fill(partition, apply, "latest", {"a": 1, "b": {"x": [1, 2]}, "c": None, "é": 2.5})
    assert kv.get("a") == 1
    assert kv.get("b") == {"x": [1, 2]}
    assert kv.get("missing") is None
    assert kv.multi_get(["é", "missing", "a", "b", "a"]) == [2.5, None, 1, {"x": [1, 2]}, 1]
    assert kv.multi_get([]) == []


def test_int_keys_get(partition: PartitionStores, apply: Apply) -> None:
    kv = fill(partition, apply, "latest_int", {INT64_MIN: "min", -1: "neg", 0: "zero", INT64_MAX: "max"})
    assert kv.multi_get([0, -1, 1, INT64_MAX, INT64_MIN]) == ["zero", "neg", None, "max", "min"]


@pytest.mark.parametrize(
    ("name", "key"),
    [("latest", 1), ("latest", True), ("latest_int", "1"), ("latest_int", 1.0), ("latest_int", 1 << 64)],
)
def test_invalid_keys(partition: PartitionStores, name: str, key: object) -> None:
    kv = partition.kv(name)
    for read in (
        lambda: kv.get(key),  # type: ignore[arg-type]
        lambda: kv.multi_get(["a" if name == "latest" else 1, key]),  # type: ignore[list-item]
        lambda: kv.range(key, None),  # type: ignore[arg-type]
        lambda: kv.range(None, key),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidKeyError):
            read()
    tx = partition.db.begin(0, 1)
    assert tx is not None
    for write in (
        lambda: kv.merge(tx, [(key, 1)]),  # type: ignore[list-item]
        lambda: kv.put(tx, key, 1),  # type: ignore[arg-type]
        lambda: kv.delete(tx, key),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidKeyError):
            write()


def test_range_bounds_are_inclusive_and_optional(partition: PartitionStores, apply: Apply) -> None:
    keys = ["a", "b", "ba", "bb", "c", "d"]
    kv = fill(partition, apply, "latest", {k: k.upper() for k in keys})

    def keys_of(from_key: str | None, to_key: str | None) -> list[Key]:
        return [k for k, _ in kv.range(from_key, to_key).items]

    assert keys_of("b", "c") == ["b", "ba", "bb", "c"]
    assert keys_of("az", "bz") == ["b", "ba", "bb"]
    assert keys_of(None, "b") == ["a", "b"]
    assert keys_of("bb", None) == ["bb", "c", "d"]
    assert keys_of(None, None) == keys
    assert keys_of("c", "b") == []
    assert keys_of("c", "c") == ["c"]
    assert kv.range("b", "b").items == [("b", "B")]


def test_int_range_orders_negatives_first(partition: PartitionStores, apply: Apply) -> None:
    keys = [-(10**12), -300, -1, 0, 1, 255, 256, 10**12]
    kv = fill(partition, apply, "latest_int", {k: k for k in reversed(keys)})
    assert [k for k, _ in kv.range(None, None).items] == keys
    assert [k for k, _ in kv.range(-300, 1).items] == [-300, -1, 0, 1]
    assert [k for k, _ in kv.range(-2, None).items] == [-1, 0, 1, 255, 256, 10**12]


def test_limit_and_cursor_pages_have_no_gaps_or_duplicates(partition: PartitionStores, apply: Apply) -> None:
    keys = [f"k{i:03d}" for i in range(95)]
    kv = fill(partition, apply, "latest", {k: i for i, k in enumerate(keys)})
    first = kv.range("k010", "k050", limit=10)
    assert [k for k, _ in first.items] == keys[10:20]
    assert first.next_cursor is not None
    second = kv.range("k010", "k050", limit=10, after=first.next_cursor)
    assert [k for k, _ in second.items] == keys[20:30]
    for limit in (1, 7, 10, 41, 500):
        assert page_through(lambda **kw: kv.range("k010", "k050", **kw), limit) == [
            (k, int(k[1:])) for k in keys[10:51]
        ]
    exact = kv.range("k000", "k009", limit=10)
    assert len(exact.items) == 10 and exact.next_cursor is None  # no empty last page


def test_a_cursor_survives_writes_between_pages(partition: PartitionStores, apply: Apply) -> None:
    kv = fill(partition, apply, "latest", {k: 0 for k in "abcdef"})
    page = kv.all(limit=2)
    assert [k for k, _ in page.items] == ["a", "b"]
    apply(partition, lambda tx: (kv.delete(tx, "b"), kv.delete(tx, "c"), kv.put(tx, "bb", 1)))
    rest = page_through(kv.all, 2, after=page.next_cursor)
    assert [k for k, _ in rest] == ["bb", "d", "e", "f"]


def test_prefix_scan(partition: PartitionStores, apply: Apply) -> None:
    keys = ["a", "ab", "abc", "abd", "ac", "b", "é", "éa", "ab\x00", "ab\uffff"]
    kv = fill(partition, apply, "latest", {k: len(k) for k in keys})
    assert [k for k, _ in kv.prefix("ab").items] == ["ab", "ab\x00", "abc", "abd", "ab\uffff"]
    assert [k for k, _ in kv.prefix("é").items] == ["é", "éa"]
    assert kv.prefix("z").items == []
    assert [k for k, _ in kv.prefix("").items] == sorted(keys)
    assert [k for k, _ in page_through(lambda **kw: kv.prefix("a", **kw), 2)] == sorted(k for k in keys if k[0] == "a")


def test_prefix_scan_needs_string_keys(partition: PartitionStores) -> None:
    with pytest.raises(InvalidKeyError):
        partition.kv("latest_int").prefix(1)  # type: ignore[arg-type]


def test_all_is_paginated(partition: PartitionStores, apply: Apply) -> None:
    items = {f"user-{i}": {"n": i} for i in range(250)}
    kv = fill(partition, apply, "latest", items)
    first = kv.all()
    assert len(first.items) == 100 and first.next_cursor is not None
    assert page_through(kv.all, 33) == sorted(items.items())


def test_approximate_num_entries_after_a_flush(partition: PartitionStores, apply: Apply) -> None:
    kv = fill(partition, apply, "latest", {f"k{i}": i for i in range(5_000)})
    partition.db.family("latest").flush()
    assert 4_000 <= kv.approximate_num_entries() <= 6_000
    assert partition.kv("latest_int").approximate_num_entries() < 100  # estimates are per store


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "!!!",
        "é",
        "",
        base64.urlsafe_b64encode(b"c2:k001").decode(),
        base64.urlsafe_b64encode(b"k001").decode(),
    ],
)
def test_invalid_cursor(partition: PartitionStores, apply: Apply, cursor: str) -> None:
    kv = fill(partition, apply, "latest", {"k001": 1, "k002": 2})
    with pytest.raises(InvalidCursorError):
        kv.all(limit=1, after=cursor)


def test_a_cursor_before_the_range_start_is_invalid(partition: PartitionStores, apply: Apply) -> None:
    kv = fill(partition, apply, "latest", {"a": 1, "b": 2, "m": 3, "n": 4})
    cursor = kv.all(limit=1).next_cursor
    assert cursor is not None
    with pytest.raises(InvalidCursorError):
        kv.range("m", "z", after=cursor)


def test_page_size_must_be_positive(partition: PartitionStores) -> None:
    with pytest.raises(ValueError, match="page size"):
        partition.kv("latest").all(limit=0)


def test_a_corrupt_stored_value_raises(partition: PartitionStores, apply: Apply) -> None:
    apply(partition, lambda tx: (tx.put("latest", b"bad", b"\x01{"), tx.put("latest", b"new", b"\x09{}")))
    kv = partition.kv("latest")
    with pytest.raises(CorruptValueError):
        kv.get("bad")
    with pytest.raises(UnknownFormatError):
        kv.multi_get(["new"])


# -- merges ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "batches", "expected"),
    [
        ("counts", [{"a": 1, "b": 2}, {"a": 3}, {"b": 1, "c": 5}], {"a": 4, "b": 3, "c": 5}),
        ("sums", [{"a": 1.5, "b": -2}, {"a": 2.5}, {"b": -1, "c": 0}], {"a": 4.0, "b": -3, "c": 0}),
        ("mins", [{"a": 5, "b": -2}, {"a": 3}, {"a": 4, "b": -1}], {"a": 3, "b": -2, "c": None}),
        ("maxes", [{"a": 5, "b": -2}, {"a": 3}, {"a": 7, "b": -1}], {"a": 7, "b": -1, "c": None}),
        ("maxes", [{"a": "b"}, {"a": "a"}, {"a": "c"}], {"a": "c"}),
        ("latest", [{"a": {"v": 1}, "b": 1}, {"a": {"v": 2}}, {"b": None}], {"a": {"v": 2}, "b": 1}),
        ("avgs", [{"a": [10, 2]}, {"a": [2, 2], "b": [3, 1]}, {"b": [0, 0]}], {"a": 3.0, "b": 3.0}),
    ],
)
def test_merges_across_batches(
    partition: PartitionStores, apply: Apply, name: str, batches: list[dict[str, object]], expected: dict[str, object]
) -> None:
    kv = partition.kv(name)
    for batch in batches:
        apply(partition, lambda tx, batch=batch: kv.merge(tx, batch.items()))
    assert kv.multi_get(list(expected)) == list(expected.values())
    assert dict(kv.all().items) == {k: v for k, v in expected.items() if v is not None}


def test_avg_is_stored_as_sum_and_count(partition: PartitionStores, apply: Apply) -> None:
    kv = partition.kv("avgs")
    apply(partition, lambda tx: kv.merge(tx, [("a", [9, 2]), ("zero", [0, 0])]))
    apply(partition, lambda tx: kv.merge(tx, [("a", [3, 1])]))
    assert partition.db.family("avgs").get(b"a") == b"\x01[12,3]"
    assert kv.get("a") == 4.0
    assert kv.get("zero") is None  # no samples: no average
    assert kv.range("a", "a").items == [("a", 4.0)]


def test_merge_with_another_aggregation(partition: PartitionStores, apply: Apply) -> None:
    kv = partition.kv("latest")
    apply(partition, lambda tx: kv.merge(tx, [("a", 2)], aggregation=SUM))
    apply(partition, lambda tx: kv.merge(tx, [("a", 3)], aggregation=SUM))
    assert kv.get("a") == 5
    apply(partition, lambda tx: kv.merge(tx, [("b", [1, 1])], aggregation=AVG))
    apply(partition, lambda tx: kv.merge(tx, [("b", [3, 1])], aggregation=AVG))
    assert kv.get("b") == [4, 2]  # the view finalizes with the store's own aggregation (latest)


def test_put_and_delete(partition: PartitionStores, apply: Apply) -> None:
    kv = partition.kv("counts")
    apply(partition, lambda tx: kv.merge(tx, [("a", 1), ("b", 1)]))
    apply(partition, lambda tx: (kv.put(tx, "a", 10), kv.delete(tx, "b"), kv.delete(tx, "never")))
    assert kv.multi_get(["a", "b"]) == [10, None]
    apply(partition, lambda tx: kv.merge(tx, [("a", 1), ("b", 1)]))
    assert kv.multi_get(["a", "b"]) == [11, 1]
    apply(partition, lambda tx: kv.merge(tx, []))
    assert kv.multi_get(["a", "b"]) == [11, 1]


def test_a_key_given_twice_in_one_merge_folds_both_partials(partition: PartitionStores, apply: Apply) -> None:
    kv = partition.kv("counts")
    apply(partition, lambda tx: kv.merge(tx, [("a", 1), ("b", 1), ("a", 2)]))
    assert kv.multi_get(["a", "b"]) == [3, 1]


# -- against a model (hypothesis) ------------------------------------------------------------------------

int_keys = st.integers(INT64_MIN, INT64_MAX) | st.integers(-1000, 1000)
str_keys = st.text(max_size=8) | st.text(alphabet="ab\x00é", max_size=4)


@hypothesis_settings
@given(
    st.dictionaries(int_keys, st.integers(-1000, 1000), max_size=60),
    st.none() | int_keys,
    st.none() | int_keys,
    st.integers(1, 7),
)
def test_int_range_matches_a_sorted_model(
    partition: PartitionStores, apply: Apply, items: dict[int, int], lo: int | None, hi: int | None, limit: int
) -> None:
    kv = fill(partition, apply, "latest_int", items)  # type: ignore[arg-type]
    expected = [(k, items[k]) for k in sorted(items) if (lo is None or lo <= k) and (hi is None or k <= hi)]
    assert kv.range(lo, hi, limit=1000).items == expected
    assert page_through(lambda **kw: kv.range(lo, hi, **kw), limit) == expected


@hypothesis_settings
@given(
    st.dictionaries(str_keys, st.integers(-1000, 1000), max_size=60),
    st.none() | str_keys,
    st.none() | str_keys,
    st.integers(1, 7),
)
def test_string_range_matches_a_sorted_model(
    partition: PartitionStores, apply: Apply, items: dict[str, int], lo: str | None, hi: str | None, limit: int
) -> None:
    kv = fill(partition, apply, "latest", items)  # type: ignore[arg-type]
    expected = [(k, items[k]) for k in sorted(items) if (lo is None or lo <= k) and (hi is None or k <= hi)]
    assert kv.range(lo, hi, limit=1000).items == expected
    assert page_through(lambda **kw: kv.range(lo, hi, **kw), limit) == expected
    assert page_through(kv.all, limit) == sorted(items.items())


@hypothesis_settings
@given(st.dictionaries(str_keys, st.integers(-1000, 1000), max_size=40), str_keys, st.integers(1, 5))
def test_prefix_matches_a_model(
    partition: PartitionStores, apply: Apply, items: dict[str, int], prefix: str, limit: int
) -> None:
    kv = fill(partition, apply, "latest", items)  # type: ignore[arg-type]
    expected = [(k, items[k]) for k in sorted(items) if k.startswith(prefix)]
    assert page_through(lambda **kw: kv.prefix(prefix, **kw), limit) == expected
