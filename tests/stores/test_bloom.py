"""The bloom store: no false negatives, the configured false-positive rate, snapshots, aborts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from iqgraph.stores import CorruptValueError, InvalidKeyError, PartitionStores, PartitionTransaction
from iqgraph.stores.bloom import PAGE_BYTES, PAGES_KEY, SNAPSHOT_KEY, page_key, pages_of
from iqgraph.stores.codecs import decode_int64, encode_int64
from tests.stores.conftest import Apply

# "seen": string keys, capacity 50,000, error rate 1%; "seen_int": integer keys, capacity 1,000, 1%.


def add_in_batches(stores: PartitionStores, apply: Apply, name: str, keys: list[object], batches: int) -> None:
    bloom = stores.bloom(name)
    size = -(-len(keys) // batches)
    for i in range(0, len(keys), size):
        apply(stores, lambda tx, chunk=keys[i : i + size]: bloom.add(tx, chunk))  # type: ignore[misc]


def test_no_false_negatives(partition: PartitionStores, apply: Apply) -> None:
    keys = [f"user-{i}" for i in range(20_000)]
    add_in_batches(partition, apply, "seen", keys, 4)  # type: ignore[arg-type]
    bloom = partition.bloom("seen")
    assert all(bloom.might_contain_many(keys))
    assert bloom.might_contain("user-0") and bloom.might_contain("user-19999")
    assert 19_900 <= bloom.approximate_count() <= 20_000


def test_false_positive_rate_is_near_the_configured_one(partition: PartitionStores, apply: Apply) -> None:
    bloom = partition.bloom("seen_int")
    add_in_batches(partition, apply, "seen_int", list(range(0, 2_000, 2)), 2)  # a full first filter
    unseen = [k for k in range(-10_000, 20_000) if k < 0 or k >= 2_000 or k % 2]
    rate = sum(bloom.might_contain_many(unseen)) / len(unseen)
    assert 0.25 * bloom.error_rate <= rate <= 1.5 * bloom.error_rate
    # past its initial capacity the filter grows and the rate stays bounded
    add_in_batches(partition, apply, "seen_int", list(range(100_000, 103_000)), 1)
    rate = sum(bloom.might_contain_many(unseen)) / len(unseen)
    assert rate <= 1.5 * bloom.error_rate
    assert all(bloom.might_contain_many(list(range(0, 2_000, 2)) + list(range(100_000, 103_000))))


def test_a_rarely_filled_filter_has_few_false_positives(partition: PartitionStores, apply: Apply) -> None:
    add_in_batches(partition, apply, "seen", [f"k{i}" for i in range(1_000)], 1)
    bloom = partition.bloom("seen")
    assert sum(bloom.might_contain_many([f"u{i}" for i in range(20_000)])) <= 20_000 * bloom.error_rate


def test_the_snapshot_is_restored_after_reopen(open_partition: Callable[..., PartitionStores], apply: Apply) -> None:
    stores = open_partition()
    keys = [f"user-{i}" for i in range(5_000)]
    add_in_batches(stores, apply, "seen", keys, 5)  # type: ignore[arg-type]
    count = stores.bloom("seen").approximate_count()
    stores.close()
    again = open_partition()
    bloom = again.bloom("seen")
    assert all(bloom.might_contain_many(keys))
    assert bloom.approximate_count() == count
    assert sum(bloom.might_contain_many([f"other-{i}" for i in range(5_000)])) <= 5_000 * bloom.error_rate
    add_in_batches(again, apply, "seen", ["late-key"], 1)  # and it keeps growing from the snapshot
    assert all(bloom.might_contain_many([*keys, "late-key"]))


def test_keys_of_a_transaction_aborted_by_an_exception_are_not_visible(
    partition: PartitionStores, apply: Apply
) -> None:
    bloom = partition.bloom("seen")
    add_in_batches(partition, apply, "seen", ["kept"], 1)
    tx = partition.db.begin(1, 2)
    assert tx is not None
    with pytest.raises(RuntimeError), tx:
        bloom.add(tx, [f"aborted-{i}" for i in range(50)])
        raise RuntimeError("the batch failed")
    assert bloom.might_contain_many([f"aborted-{i}" for i in range(50)]) == [False] * 50
    assert bloom.might_contain("kept")


def test_keys_of_a_commit_that_fails_after_the_filter_flushed_are_not_visible(
    partition: PartitionStores, apply: Apply
) -> None:
    bloom = partition.bloom("seen")
    add_in_batches(partition, apply, "seen", ["kept"], 1)
    tx = partition.db.begin(1, 2)
    assert tx is not None
    bloom.add(tx, [f"aborted-{i}" for i in range(50)])

    def fail_after_flush(tx: PartitionTransaction = tx) -> None:
        assert bloom.might_contain("aborted-0")  # the in-memory filter took the keys
        raise OSError("write failed")

    tx.before_commit(fail_after_flush)
    with pytest.raises(OSError, match="write failed"):
        tx.commit()
    # the filter is reloaded from the last committed snapshot
    assert bloom.might_contain_many([f"aborted-{i}" for i in range(50)]) == [False] * 50
    assert bloom.might_contain("kept")
    assert bloom.approximate_count() == 1
    assert partition.db.next_offset() == 1


def test_int_and_string_keys_are_distinct(partition: PartitionStores, apply: Apply) -> None:
    add_in_batches(partition, apply, "seen_int", [5, -5, 1 << 40], 1)
    add_in_batches(partition, apply, "seen", ["5"], 1)
    ints, strings = partition.bloom("seen_int"), partition.bloom("seen")
    assert ints.might_contain_many([5, -5, 1 << 40, 6, -6, 0]) == [True, True, True, False, False, False]
    assert strings.might_contain_many(["5", "-5", "6"]) == [True, False, False]
    for store, key in ((ints, "5"), (ints, True), (ints, 5.0), (strings, 5), (strings, b"5")):
        with pytest.raises(InvalidKeyError):
            store.might_contain(key)  # type: ignore[arg-type]
        with pytest.raises(InvalidKeyError):
            store.might_contain_many([key])  # type: ignore[list-item]
    tx = partition.db.begin(partition.db.next_offset(), partition.db.next_offset() + 1)
    assert tx is not None
    with pytest.raises(InvalidKeyError):
        strings.add(tx, ["ok", 5])


def test_adding_no_keys_writes_nothing(partition: PartitionStores, apply: Apply) -> None:
    apply(partition, lambda tx: partition.bloom("seen").add(tx, []))
    assert partition.db.family("seen").get(SNAPSHOT_KEY) is None
    assert partition.db.family("seen").get(PAGES_KEY) is None


def stored_snapshot(stores: PartitionStores, name: str) -> bytes:
    """Return the bloom snapshot of store name as its pages hold it."""
    family = stores.db.family(name)
    length = decode_int64(family.get(PAGES_KEY))
    pages = [family.get(page_key(i)) for i in range(-(-length // PAGE_BYTES))]
    return b"".join(pages)


def write_snapshot(tx: PartitionTransaction, name: str, snapshot: bytes) -> None:
    """Store snapshot as store name's pages (with its length)."""
    tx.put(name, PAGES_KEY, encode_int64(len(snapshot)))
    for index, page in enumerate(pages_of(snapshot)):
        tx.put(name, page_key(index), page)


def reopen_with_snapshot(
    open_partition: Callable[..., PartitionStores], apply: Apply, corrupt: Callable[[bytes], bytes]
) -> PartitionStores:
    """Store a snapshot of seen_int changed by corrupt, then reopen the partition (as after a restart)."""
    stores = open_partition()
    add_in_batches(stores, apply, "seen_int", [1, 2, 3], 1)
    snapshot = stored_snapshot(stores, "seen_int")
    apply(stores, lambda tx: write_snapshot(tx, "seen_int", corrupt(snapshot)))
    stores.close()
    return open_partition()


@pytest.mark.parametrize("cut", [1, 100, 1_000])
def test_a_truncated_snapshot_is_corrupt(
    open_partition: Callable[..., PartitionStores], apply: Apply, cut: int
) -> None:
    stores = reopen_with_snapshot(open_partition, apply, lambda snapshot: snapshot[:-cut])
    with pytest.raises(CorruptValueError):
        stores.bloom("seen_int").might_contain(1)


@pytest.mark.parametrize(
    "corrupt",
    [lambda _: b"garbage", lambda _: b"", lambda snapshot: snapshot[:30]],
    ids=["garbage", "empty", "truncated-header"],
)
def test_a_garbage_snapshot_is_corrupt(
    open_partition: Callable[..., PartitionStores], apply: Apply, corrupt: Callable[[bytes], bytes]
) -> None:
    stores = reopen_with_snapshot(open_partition, apply, corrupt)
    with pytest.raises(CorruptValueError):
        stores.bloom("seen_int").might_contain(1)
