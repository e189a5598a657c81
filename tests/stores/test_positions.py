"""Each key's (each window's) position: the offset of the record that last changed its state (``stores.positions``),
written in the batch that changes the state, only when it changes, and dropped with a window."""

from __future__ import annotations

from iqgraph.stores import PartitionStores
from tests.stores.conftest import Apply


def positions(stores: PartitionStores, store: str, keys: list[str]) -> list[int | None]:
    view = stores.kv(store)
    return view.positions.read(view.codec.encode_many(keys))


def test_a_key_takes_the_position_of_the_last_record_that_changed_its_state(
    partition: PartitionStores, apply: Apply
) -> None:
    maxes = partition.kv("maxes")
    apply(partition, lambda tx: maxes.merge(tx, [("a", 5), ("b", 1)], positions=[10, 11]))
    assert positions(partition, "maxes", ["a", "b", "c"]) == [10, 11, None]  # c: never written
    # a's 3 does not beat its 5 (no change: its position stays); b's two partials of one batch: the later one's
    apply(partition, lambda tx: maxes.merge(tx, [("a", 3), ("b", 7), ("b", 2)], positions=[20, 21, 22]))
    assert positions(partition, "maxes", ["a", "b"]) == [10, 22]
    assert maxes.multi_get(["a", "b"]) == [5, 7]
    # without positions (a caller that keeps none), nothing moves
    apply(partition, lambda tx: maxes.merge(tx, [("a", 9)]))
    assert positions(partition, "maxes", ["a"]) == [10]


def test_a_window_takes_its_records_position_and_loses_it_with_the_window(
    partition: PartitionStores, apply: Apply
) -> None:
    window = partition.window("tumbling")
    size = window.window.size_ms
    apply(partition, lambda tx: window.merge(tx, [("a", 0, 1), ("a", size, 1)], stream_time=size, positions=[3, 4]))
    found = window.positions.read([window.codec.encode_window_key("a", s) for s in (0, size)])
    assert found == [3, 4]
    far = size * 10_000  # past the retention of both windows: dropped, their positions too
    apply(partition, lambda tx: window.merge(tx, [("b", far, 1)], stream_time=far, positions=[9]))
    keys = [window.codec.encode_window_key(k, s) for k, s in (("a", 0), ("a", size), ("b", far))]
    assert window.positions.read(keys) == [None, None, 9]
