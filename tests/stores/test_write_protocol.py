"""The write protocol (``stores.writes.StoreWrites.apply``): every kind of store view applies a batch's partials as
its kind does and records the watched keys' changes — what the sink asks each store, never switching on the kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iqgraph.stores import (
    COUNT,
    LATEST,
    SUM,
    KeyValueStore,
    PartitionStores,
    RankingStore,
    StoreKind,
    StoreSpec,
    WindowSpec,
    store_class,
)
from iqgraph.stores.kinds import STORE_CLASSES
from iqgraph.stores.writes import StorePartials
from iqgraph.streaming.change_set import ChangeSet, RankEntry, rank_entry
from tests.stores.conftest import Apply

SPECS = (
    StoreSpec("totals", StoreKind.KEY_VALUE, "string", SUM),
    StoreSpec("table", StoreKind.KEY_VALUE, "string", LATEST),
    StoreSpec(
        "minutes", StoreKind.WINDOW, "string", COUNT, window=WindowSpec(size_ms=10, grace_ms=0, retention_ms=100)
    ),
    StoreSpec("seen", StoreKind.BLOOM, "string"),
    StoreSpec("top", StoreKind.RANKING, "string", COUNT),
)


def _apply(stores: PartitionStores, apply: Apply, name: str, partials: StorePartials, changes: ChangeSet) -> Any:
    answers: list[Any] = []
    apply(stores, lambda tx: answers.append(stores.store(name).apply(tx, partials, changes)))
    return answers[0]


def test_every_kind_of_store_answers_the_write_protocol() -> None:
    for kind in StoreKind:
        assert callable(store_class(kind).apply), kind
    assert {cls.kind for cls in STORE_CLASSES.values() if cls.keeps_tables} == {StoreKind.KEY_VALUE}
    assert {cls.kind for cls in STORE_CLASSES.values() if cls.rankable} == {StoreKind.KEY_VALUE}
    assert {cls.kind for cls in STORE_CLASSES.values() if cls.keys_only} == {StoreKind.BLOOM}


def test_a_key_value_store_merges_partials_and_records_the_watched_keys(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=SPECS)
    changes = ChangeSet({"totals": {"a"}})
    first = StorePartials(["a", "b"], [("a", None, 2, 1, 10), ("b", None, 5, 1, 11)], [10, 11])
    states = _apply(stores, apply, "totals", first, changes)
    again = _apply(stores, apply, "totals", StorePartials(["a"], [("a", None, 3, 1, 12)], [12]), changes)
    view = stores.kv("totals")
    assert view.multi_get(["a", "b"]) == [5, 5]
    assert states == {view.codec.encode("a"): 2, view.codec.encode("b"): 5}
    assert again == {view.codec.encode("a"): 5}
    assert changes.ordered() == {"totals": [("a", None, 2, 10), ("a", None, 5, 12)]}  # b is not watched


def test_a_table_store_replaces_and_a_tombstone_deletes(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=SPECS)
    _apply(
        stores,
        apply,
        "table",
        StorePartials(["k", "j"], [("k", None, {"v": 1}, 1), ("j", None, 2, 1)], [3, 4]),
        ChangeSet({}),
    )
    changes = ChangeSet({"table": None})
    tombstone = StorePartials(["k", "gone"], [("k", None, None, 1), ("gone", None, None, 1)], [7, 8], table=True)
    _apply(stores, apply, "table", tombstone, changes)
    assert stores.kv("table").multi_get(["k", "j"]) == [None, 2]
    assert stores.kv("table").count() == 1
    assert changes.ordered() == {"table": [("k", None, None, 7)]}  # a key never stored: no change


def test_a_window_store_merges_windows_moves_stream_time_and_records_changed_windows(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=SPECS)
    changes = ChangeSet({"minutes": {"a"}})
    partials = StorePartials(
        ["a", "a", "b"], [("a", 0, 2, 2), ("a", 10, 1, 1), ("b", 10, 4, 4)], [1, 2, 3], stream_time=15, late=1
    )
    assert _apply(stores, apply, "minutes", partials, changes) == {}
    window = stores.window("minutes")
    assert [(w.start, w.value) for w in window.fetch("a", 0, 100)] == [(0, 2), (10, 1)]
    assert window.stream_time() == 15
    assert window.late_records() == 1
    assert changes.ordered() == {"minutes": [("a", 0, 2, 1), ("a", 10, 1, 2)]}


def test_a_bloom_filter_adds_the_keys_and_records_each_watched_one_as_true(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=SPECS)
    changes = ChangeSet({"seen": {"x"}})
    assert (
        _apply(
            stores,
            apply,
            "seen",
            StorePartials(["x", "y"], [("x", None, None, 1), ("y", None, None, 1)], [4, 5]),
            changes,
        )
        == {}
    )
    assert stores.bloom("seen").might_contain_many(["x", "y", "z"]) == [True, True, False]
    assert changes.ordered() == {"seen": [("x", None, True, 4)]}


def test_a_ranking_indexes_the_new_states_of_the_store_it_ranks_applied_before_it(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=SPECS)
    changes = ChangeSet({"top": {"b"}})
    captured: list[Any] = []

    def batch(tx: Any) -> None:
        totals: KeyValueStore = stores.kv("totals")
        ranking: RankingStore = stores.ranking("top")
        merged = totals.apply(tx, StorePartials(["a", "b"], [("a", None, 3, 1), ("b", None, 7, 1)], [1, 2]), changes)
        members = StorePartials(
            ["a", "b"],
            [("a", None, None, 1), ("b", None, None, 1)],
            [1, 2],
            ranks="totals",
            ranked=merged,
            rank_change=rank_entry,
        )
        captured.append(ranking.apply(tx, members, changes))

    apply(stores, batch)
    assert captured == [{}]
    assert [(e.member, e.value) for e in stores.ranking("top").top(None, 10).items] == [("b", 7), ("a", 3)]
    assert changes.ordered() == {"top": [("b", None, RankEntry(None, 7, None), None)]}
    # a member whose group came without a new value keeps its stored state, read from the store it ranks
    grouped = StorePartials(["a"], [("a", None, {"g": "x"}, 1)], [3], ranks="totals", group="g", rank_change=rank_entry)
    _apply(stores, apply, "top", grouped, ChangeSet({}))
    assert [(e.member, e.value) for e in stores.ranking("top").top("x", 10).items] == [("a", 3)]
