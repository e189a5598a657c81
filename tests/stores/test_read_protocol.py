"""Store kinds as objects, scans as types: every store view answers one read protocol (``stores.types.StoreReads``),
each typed scan is answered by its kind's view only, locates its items where the store's cursor resumes, and
survives its wire form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from iqgraph.stores import (
    COUNT,
    LATEST,
    SUM,
    BloomStore,
    KeyCodec,
    KeyValueStore,
    PartitionStores,
    PrefixScan,
    RangeScan,
    RankingStore,
    Scan,
    StoreKind,
    StoreSpec,
    TopScan,
    WindowedValue,
    WindowRangeScan,
    WindowScan,
    WindowSpec,
    WindowStore,
    scan_from_wire,
    store_class,
)
from iqgraph.stores.aggregations import AVG
from iqgraph.stores.distinct import BloomBits, KeyDigests, distinct_count
from iqgraph.stores.kinds import STORE_CLASSES
from iqgraph.stores.scan import decode_cursor
from iqgraph.stores.scans import SCANS
from tests.stores.conftest import Apply

MINUTES = WindowSpec(size_ms=10, grace_ms=100, retention_ms=1_000)
SPECS = (
    StoreSpec("totals", StoreKind.KEY_VALUE, "string", SUM),
    StoreSpec(
        "minutes", StoreKind.WINDOW, "string", COUNT, window=WindowSpec(size_ms=10, grace_ms=100, retention_ms=1_000)
    ),
    StoreSpec("seen", StoreKind.BLOOM, "string"),
    StoreSpec("top", StoreKind.RANKING, "string", LATEST),
)
EVERY_SCAN: tuple[Scan, ...] = (
    RangeScan("b", "d"),
    PrefixScan("c"),
    WindowScan(0, 100),
    WindowRangeScan("a", "c", 10, 20),
    TopScan(None),
)


@pytest.fixture
def stores(open_partition: Callable[..., PartitionStores], apply: Apply) -> PartitionStores:
    """Return a partition with every kind of store filled: 7 keys, two windows each, all seen, all ranked."""
    stores = open_partition(specs=SPECS)
    keys = ["a", "b", "c", "ca", "cb", "d", "e"]

    def write(tx: Any) -> None:
        stores.kv("totals").merge(tx, [(k, i) for i, k in enumerate(keys, start=1)])
        stores.window("minutes").aggregate(tx, [(k, ts, 1) for k in keys for ts in (5, 15)])
        stores.bloom("seen").add(tx, keys)
        stores.ranking("top").update(tx, keys, [None] * len(keys), list(range(len(keys))))

    apply(stores, write)
    return stores


def test_every_kind_of_store_is_a_class_that_answers_the_read_protocol() -> None:
    assert set(STORE_CLASSES) == set(StoreKind)
    for kind in StoreKind:
        cls = store_class(kind)
        assert cls.kind is kind
        for name in ("read_states", "contains_many", "followed", "page", "read_count", "combiner", "finalizer"):
            assert callable(getattr(cls, name)), (cls, name)
    assert [store_class(k).windowed for k in StoreKind] == [k is StoreKind.WINDOW for k in StoreKind]
    assert {k for k in StoreKind if store_class(k).aggregated} == {StoreKind.KEY_VALUE, StoreKind.WINDOW}
    assert {cls.store_kind for cls in SCANS.values()} == set(StoreKind) - {StoreKind.BLOOM}  # a filter has no keys


def test_a_scan_is_answered_by_its_kinds_view_as_the_named_read_and_refused_by_the_others(
    stores: PartitionStores,
) -> None:
    kv, window, ranking = stores.kv("totals"), stores.window("minutes"), stores.ranking("top")
    named = {
        RangeScan("b", "d"): kv.range("b", "d", 3, states=True),
        PrefixScan("c"): kv.prefix("c", 3, states=True),
        WindowScan(0, 100): window.fetch_all(0, 100, 3, states=True),
        WindowRangeScan("a", "c", 10, 20): window.fetch_range("a", "c", 10, 20, 3, states=True),
        TopScan(None): ranking.top(None, 3),
    }
    assert set(named) == set(EVERY_SCAN)
    for scan, expected in named.items():
        view = stores.store({StoreKind.KEY_VALUE: "totals", StoreKind.WINDOW: "minutes"}.get(scan.store_kind, "top"))
        assert view.page(scan, 3, None) == expected, scan
        if expected.next_cursor is not None:
            resumed = view.page(scan, 3, expected.next_cursor)
            assert resumed.items and resumed.items[0] not in expected.items, scan
        for other in ("totals", "minutes", "seen", "top"):
            if stores.store(other).kind is not scan.store_kind:
                with pytest.raises(TypeError, match=f"a {scan.kind} scan reads a {scan.store_kind.value} store"):
                    stores.store(other).page(scan, 3, None)


def test_a_scans_order_is_the_stores_key_its_cursor_resumes_after(stores: PartitionStores) -> None:
    """What the merge of partitions' pages records per partition must be where that partition's store resumes."""
    codec = KeyCodec("string")
    for scan in EVERY_SCAN:
        view = stores.store({StoreKind.KEY_VALUE: "totals", StoreKind.WINDOW: "minutes"}.get(scan.store_kind, "top"))
        page = view.page(scan, 2, None)
        assert page.next_cursor is not None, scan
        assert scan.order(codec)(page.items[-1]) == decode_cursor(page.next_cursor), scan
        assert sorted(page.items, key=scan.order(codec)) == page.items, scan


def test_scans_combine_and_finalize_their_items_by_the_aggregation() -> None:
    kv, windows = RangeScan(), WindowScan()
    combine = kv.combiner(AVG)
    assert combine is not None and AVG.finalize(combine(("k", [3.0, 1]), ("k", [5.0, 1]))[1]) == 4.0
    assert kv.finalized(AVG, [("k", [9.0, 3])]) == [("k", 3.0)]
    merge = windows.combiner(SUM)
    assert merge is not None
    assert merge(WindowedValue("k", 0, 10, 2), WindowedValue("k", 0, 10, 3)) == WindowedValue("k", 0, 10, 5)
    assert WindowRangeScan().finalized(AVG, [WindowedValue("k", 0, 10, [6.0, 2])]) == [WindowedValue("k", 0, 10, 3.0)]
    assert TopScan().combiner(SUM) is None and TopScan().finalized(SUM, [("m", 1, b"x")]) == [("m", 1, b"x")]


def test_point_reads_counts_and_membership_through_the_protocol(stores: PartitionStores) -> None:
    kv, window, bloom, ranking = (stores.store(n) for n in ("totals", "minutes", "seen", "top"))
    assert isinstance(kv, KeyValueStore) and isinstance(window, WindowStore)
    assert isinstance(bloom, BloomStore) and isinstance(ranking, RankingStore)
    assert kv.read_states([("b", None, None), ("zz", None, None)]) == [2, None]
    [all_windows, late] = window.read_states([("a", None, None), ("a", 10, None)])
    assert [(w.start, w.value) for w in all_windows] == [(0, 1), (10, 1)] and [w.start for w in late] == [10]
    assert bloom.read_states([("a", None, None), ("zz", None, None)]) == [True, False]
    with pytest.raises(TypeError, match="ranking"):
        ranking.read_states([("a", None, None)])
    for view in (kv, window, bloom, ranking):
        assert view.contains_many(["a", "zz"]) == [True, False], view
    assert (kv.read_count(True, False), window.read_count(True, False), ranking.read_count(True, True)) == (7, 14, 7)
    assert isinstance(kv.read_count(False, False), int) and isinstance(bloom.read_count(True, False), int)
    digests, bits = kv.read_count(True, True), bloom.read_count(False, True)
    assert isinstance(digests, KeyDigests) and isinstance(bits, BloomBits)
    assert distinct_count([digests, digests]) == 7  # a key in several partitions counts once
    assert distinct_count([window.read_count(True, True)]) == 14  # a window store's entries: (key, window) pairs


def test_combiners_and_finalizers_of_the_kinds() -> None:
    assert store_class(StoreKind.BLOOM).combiner(SUM)(False, True) is True
    assert store_class(StoreKind.BLOOM).finalizer(SUM) is None
    assert store_class(StoreKind.KEY_VALUE).combiner(SUM)(2, 3) == 5
    windows = store_class(StoreKind.WINDOW).combiner(SUM)([WindowedValue("k", 0, 10, 1)], None)
    assert windows == [WindowedValue("k", 0, 10, 1)]
    finalize = store_class(StoreKind.WINDOW).finalizer(AVG)
    assert finalize is not None and finalize([WindowedValue("k", 0, 10, [4.0, 2])]) == [WindowedValue("k", 0, 10, 2.0)]


@pytest.mark.parametrize("scan", EVERY_SCAN + (RangeScan(), WindowScan(), TopScan("jazz"), RangeScan(1, 2)))
def test_a_scan_survives_its_wire_form(scan: Scan) -> None:
    assert scan_from_wire(scan.to_wire(), scan.store_kind.value) == scan
    assert scan.to_wire() == {"kind": scan.kind, "args": scan.args}


@pytest.mark.parametrize(
    ("wire", "store_kind", "message"),
    [
        (
            {"kind": "nope"},
            None,
            "not a scan this API sends; kinds: ['fetch_all', 'fetch_range', 'prefix', 'range', 'top']",
        ),
        ("range", None, "not a scan this API sends"),
        ({"kind": "prefix", "args": {}}, None, "a prefix scan takes ['prefix']"),
        ({"kind": "top", "args": {"group": None, "x": 1}}, None, "a top scan takes ['group']"),
        ({"kind": "range", "args": ["a"]}, None, "a range scan takes ['from_key', 'to_key']"),
        ({"kind": "range", "args": {}}, "window", "a range scan reads a key_value store, not a window"),
        ({"kind": "fetch_all", "args": {"time_from": "a"}}, None, "time_from and time_to are integers"),
        ({"kind": "fetch_all", "args": {"time_to": True}}, None, "time_from and time_to are integers"),
        (
            {"kind": "range", "args": {"from_key": ["a"]}},
            None,
            "keys, prefixes and groups are strings, integers or null",
        ),
    ],
)
def test_a_wire_form_no_peer_sends_is_one_line(wire: Any, store_kind: str | None, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("]", r"\]")) as caught:
        scan_from_wire(wire, store_kind)
    assert "\n" not in str(caught.value)


def test_scans_are_frozen_values() -> None:
    scan = RangeScan("a", "b")
    with pytest.raises(AttributeError):
        scan.from_key = "c"  # type: ignore[misc]
    assert scan == RangeScan("a", "b") and hash(scan) == hash(RangeScan("a", "b"))
    assert WindowScan().args == {"time_from": -(1 << 62), "time_to": 1 << 62}  # no bounds: every window


def test_followed_keys_carry_their_positions_and_a_ranking_is_not_followed_by_key(
    open_partition: Callable[..., PartitionStores], apply: Apply
) -> None:
    stores = open_partition(specs=SPECS)
    kv, window, bloom = stores.kv("totals"), stores.window("minutes"), stores.bloom("seen")

    def write(tx: Any) -> None:
        kv.merge(tx, [("a", 1), ("b", 2)], positions=[10, 11])
        window.merge(tx, [("a", 0, 1), ("a", 10, 1)], stream_time=15, positions=[12, 13])
        bloom.add(tx, ["a"])

    apply(stores, write)
    apply(stores, lambda tx: kv.delete(tx, "b", position=14))
    assert kv.followed(["a", "b", "never"], None) == [
        ("a", None, 1, 10),
        ("b", None, None, 14),
        ("never", None, None, -1),
    ]
    assert window.followed(["a", "never"], None) == [("a", 0, 1, 12), ("a", 10, 1, 13)]
    assert window.followed(["a"], 10) == [("a", 10, 1, 13)]
    assert bloom.followed(["a", "never"], None) == [("a", None, True, None)]
    assert [k for k in StoreKind if store_class(k).followable] == [
        StoreKind.KEY_VALUE,
        StoreKind.WINDOW,
        StoreKind.BLOOM,
    ]
    with pytest.raises(TypeError, match="follow its top"):
        stores.ranking("top").followed(["a"], None)
