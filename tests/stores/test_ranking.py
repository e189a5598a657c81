"""The ranking store: an ordered index (group, value from the greatest down, member) kept in the batch's transaction."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iqgraph.stores import KEEP_GROUP, LATEST, PartitionStores, StoreKind, StoreSpec
from iqgraph.stores.ranking import rank_bytes
from iqgraph.stores.scan import decode_cursor
from tests.stores.conftest import Apply

RANKING = (
    StoreSpec("top", StoreKind.RANKING, "string", LATEST),
    StoreSpec("top_int", StoreKind.RANKING, "int", LATEST),
)
_fresh = itertools.count(100)


def _top(stores: PartitionStores, group: str | None, limit: int = 1000, name: str = "top") -> list[tuple[Any, Any]]:
    return [(member, value) for member, value, _ in stores.ranking(name).top(group, limit).items]


def _expected(entries: dict[Any, tuple[str | None, Any]], group: str | None) -> list[tuple[Any, Any]]:
    kept = [(m, v) for m, (g, v) in entries.items() if v is not None and (group is None or g == group)]
    return sorted(kept, key=lambda mv: (-mv[1], mv[0]))


def test_rank_bytes_order_values_from_the_greatest_down() -> None:
    values = [float("inf"), 1e300, 10.5, 10, 3, 0.5, 0.0, -0.5, -3, -1e300, float("-inf")]
    assert sorted(values, key=rank_bytes) == values


def test_values_that_rise_and_fall_move_in_the_index_and_ties_order_by_member(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=RANKING)
    view = stores.ranking("top")
    apply(stores, lambda tx: view.update(tx, ["a", "b", "c", "d"], ["jazz", "jazz", "rock", "jazz"], [5, 9, 7, 5]))
    assert _top(stores, "jazz") == [("b", 9), ("a", 5), ("d", 5)]
    assert _top(stores, None) == [("b", 9), ("c", 7), ("a", 5), ("d", 5)]
    # b falls below a; c changes group (KEEP_GROUP keeps the others' groups); d's value rises
    apply(stores, lambda tx: view.update(tx, ["b", "c", "d"], [KEEP_GROUP, "jazz", KEEP_GROUP], [1, 7, 6]))
    assert _top(stores, "jazz") == [("c", 7), ("d", 6), ("a", 5), ("b", 1)]
    assert _top(stores, "rock") == []
    assert view.entry("c") == ("jazz", 7)
    assert view.count() == 4
    assert sum(1 for _ in stores.db.family("top.index").keys()) == 8  # one key per member per index, none stale


def test_a_member_without_a_number_or_group_is_kept_out_of_that_index(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=RANKING)
    view = stores.ranking("top")
    apply(stores, lambda tx: view.update(tx, ["a", "b", "c"], [None, "x", "x"], [3, None, float("nan")]))
    assert _top(stores, None) == [("a", 3)]
    assert _top(stores, "x") == []
    apply(stores, lambda tx: view.update(tx, ["b"], [KEEP_GROUP], [4]))
    assert _top(stores, "x") == [("b", 4)]
    assert view.count() == 3


def test_pages_resume_after_their_cursor(open_partition: Callable[..., PartitionStores], apply: Apply) -> None:
    stores = open_partition(specs=RANKING)
    view = stores.ranking("top_int")
    members = list(range(25))
    apply(stores, lambda tx: view.update(tx, members, ["g"] * 25, [m % 7 for m in members]))
    seen, after = [], None
    while True:
        page = view.top("g", 4, after)
        seen += [(m, v) for m, v, _ in page.items]
        if page.next_cursor is None:
            break
        assert decode_cursor(page.next_cursor) == page.items[-1][2]
        after = page.next_cursor
    assert seen == sorted(((m, m % 7) for m in members), key=lambda mv: (-mv[1], mv[0]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from("abcdefgh"),
                st.sampled_from(["x", "y", None, KEEP_GROUP]),
                st.one_of(st.none(), st.integers(-50, 50), st.floats(-50, 50, allow_nan=False)),
            ),
            min_size=1,
            max_size=6,
            unique_by=lambda t: t[0],
        ),
        min_size=1,
        max_size=8,
    )
)
def test_the_index_equals_a_sort_of_the_last_entries(
    open_partition: Callable[..., PartitionStores], apply: Apply, batches: list[list[tuple[str, Any, Any]]]
) -> None:
    stores = open_partition(partition=next(_fresh), specs=RANKING)
    view = stores.ranking("top")
    model: dict[str, tuple[str | None, Any]] = {}
    for batch in batches:
        members, groups, values = zip(*batch, strict=True)
        apply(stores, lambda tx, m=members, g=groups, v=values: view.update(tx, list(m), list(g), list(v)))
        for member, group, value in batch:
            old_group = model[member][0] if member in model else None
            model[member] = (old_group if group is KEEP_GROUP else group, value)
    for group in ("x", "y", None):
        assert _top(stores, group) == _expected(model, group)
    assert view.count() == len(model)


def test_a_group_longer_than_its_length_prefix_is_refused(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=RANKING)
    with pytest.raises(ValueError, match="65,535 bytes"):
        stores.ranking("top").top("x" * 70_000, 5)


def test_an_infinite_value_is_kept_out_and_leaves_nothing_stale(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=RANKING)
    view = stores.ranking("top")
    apply(stores, lambda tx: view.update(tx, ["a", "b"], ["g", "g"], [float("inf"), float("-inf")]))
    assert _top(stores, "g") == []
    apply(stores, lambda tx: view.update(tx, ["a", "b"], [KEEP_GROUP, KEEP_GROUP], [5, 2]))
    assert _top(stores, "g") == [("a", 5), ("b", 2)]
    assert _top(stores, None) == [("a", 5), ("b", 2)]
