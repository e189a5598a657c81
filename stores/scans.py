"""Scans as types: frozen requests for one page of a store, each answered by one kind of store.

Kafka Streams IQv2's typed queries (``RangeQuery``, ``WindowRangeQuery``) are the model: a scan names what
it asks, the store view of its kind answers it (``page(scan, first, after)``) or refuses it. A scan also
knows its wire form (``{"kind": …, "args": {…}}``, what a peer's ``_scan`` carries and ``scan_from_wire``
checks), how the items of several partitions' pages order and combine, and how its states become values.

==================  ==========  =====================================================  =========================
scan                store       items                                                  order of the merged page
==================  ==========  =====================================================  =========================
``RangeScan``       key_value   (key, state), from_key <= key <= to_key                key
``PrefixScan``      key_value   (key, state), a string key starting with prefix        key
``WindowScan``      window      every key's windows with start in [time_from, time_to]  window start, then key
``WindowRangeScan`` window      windows of keys in [from_key, to_key], start in range  key, then window start
``TopScan``         ranking     (member, value, index key) of group (None: all)        value, greatest first
==================  ==========  =====================================================  =========================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

from iqgraph.stores.aggregations import Aggregation, merge_state
from iqgraph.stores.codecs import Key, KeyCodec, encode_int64
from iqgraph.stores.spec import StoreKind

#: The widest window time range: a window read without bounds.
FAR_PAST, FAR_FUTURE = -(1 << 62), 1 << 62
_TIMES = frozenset({"time_from", "time_to"})

Combine = Callable[[Any, Any], Any]


class _Entries:
    """A key-value store's scan: items (key, state), ordered by the key's bytes, combined by the aggregation."""

    __slots__ = ()
    store_kind: ClassVar[StoreKind] = StoreKind.KEY_VALUE

    def order(self, codec: KeyCodec) -> Callable[[Any], bytes]:
        """Return an item's place in the merged page: the stores key a partition resumes after."""
        return lambda item: codec.encode(item[0])

    def combiner(self, agg: Aggregation) -> Combine | None:
        """Return how two partitions' items with the same place combine (None: they never share one)."""
        return lambda a, b: (a[0], merge_state(agg, a[1], b[1]))

    def finalized(self, agg: Aggregation, items: list[Any]) -> list[Any]:
        """Return the merged items with their states finalized into values."""
        done = agg.finalize
        return [(key, done(state)) for key, state in items]


class _Windows:
    """A window store's scan: items ``WindowedValue`` (made as ``type(w)(…)``: stores.window imports this module)."""

    __slots__ = ()
    store_kind: ClassVar[StoreKind] = StoreKind.WINDOW

    def combiner(self, agg: Aggregation) -> Combine | None:
        """Return how two partitions' windows of one key and start combine."""
        return lambda a, b: type(a)(a.key, a.start, a.end, merge_state(agg, a.value, b.value))

    def finalized(self, agg: Aggregation, items: list[Any]) -> list[Any]:
        """Return the merged windows with their states finalized into values."""
        done = agg.finalize
        return [type(w)(w.key, w.start, w.end, done(w.value)) for w in items]


class _Wire:
    """The wire form of a scan: its kind's name and its fields."""

    __slots__ = ()
    kind: ClassVar[str]

    @property
    def args(self) -> dict[str, Any]:
        """Return the scan's arguments as a peer's ``_scan`` carries them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def to_wire(self) -> dict[str, Any]:
        """Return the scan as JSON: ``{"kind": …, "args": {…}}``."""
        return {"kind": self.kind, "args": self.args}


@dataclass(frozen=True, slots=True)
class RangeScan(_Wire, _Entries):
    """The entries of a key-value store with from_key <= key <= to_key (None: open), in key order."""

    kind: ClassVar[str] = "range"
    from_key: Key | None = None
    to_key: Key | None = None


@dataclass(frozen=True, slots=True)
class PrefixScan(_Wire, _Entries):
    """The entries of a key-value store whose string key starts with prefix, in key order."""

    kind: ClassVar[str] = "prefix"
    prefix: str


@dataclass(frozen=True, slots=True)
class WindowScan(_Wire, _Windows):
    """Every key's windows with start in [time_from, time_to], by start then key (Kafka Streams' fetchAll)."""

    kind: ClassVar[str] = "fetch_all"
    time_from: int = FAR_PAST
    time_to: int = FAR_FUTURE

    def order(self, codec: KeyCodec) -> Callable[[Any], bytes]:
        """Return a window's place in the merged page: its start, then its window key (the time index's key)."""
        return lambda w: encode_int64(w.start) + codec.encode_window_key(w.key, w.start)


@dataclass(frozen=True, slots=True)
class WindowRangeScan(_Wire, _Windows):
    """The windows of keys in [from_key, to_key] (None: open) with start in [time_from, time_to], by key then time."""

    kind: ClassVar[str] = "fetch_range"
    from_key: Key | None = None
    to_key: Key | None = None
    time_from: int = FAR_PAST
    time_to: int = FAR_FUTURE

    def order(self, codec: KeyCodec) -> Callable[[Any], bytes]:
        """Return a window's place in the merged page: its window key (key, then start)."""
        return lambda w: codec.encode_window_key(w.key, w.start)


@dataclass(frozen=True, slots=True)
class TopScan(_Wire):
    """A ranking's members of group (None: all), greatest value first: items (member, value, index key)."""

    kind: ClassVar[str] = "top"
    store_kind: ClassVar[StoreKind] = StoreKind.RANKING
    group: str | None = None

    def order(self, codec: KeyCodec) -> Callable[[Any], bytes]:
        """Return a member's place in the merged page: its index key."""
        return lambda item: item[2]

    def combiner(self, agg: Aggregation) -> Combine | None:
        """Return None: a member lives in one partition, nothing to combine."""
        return None

    def finalized(self, agg: Aggregation, items: list[Any]) -> list[Any]:
        """Return the items as they are: a ranking's index holds values already."""
        return items


Scan = RangeScan | PrefixScan | WindowScan | WindowRangeScan | TopScan
#: Every scan type, by its wire name.
SCANS: dict[str, type[Scan]] = {cls.kind: cls for cls in (RangeScan, PrefixScan, WindowScan, WindowRangeScan, TopScan)}


def scan_from_wire(data: Any, store_kind: str | None = None) -> Scan:
    """Return the scan a peer's ``_scan`` carries; raise ValueError (one line) if it is not one this API sends.

    store_kind: the kind of the store scanned (its value, e.g. "window"), checked against the scan's.
    """
    name = data.get("kind") if isinstance(data, dict) else None
    cls = SCANS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"not a scan this API sends; kinds: {sorted(SCANS)}")
    args = data.get("args") or {}
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING}
    if not isinstance(args, dict) or not required <= set(args) <= names:
        raise ValueError(f"a {cls.kind} scan takes {sorted(names)}")
    if store_kind is not None and store_kind != cls.store_kind.value:
        raise ValueError(f"a {cls.kind} scan reads a {cls.store_kind.value} store, not a {store_kind}")
    if any(type(args[a]) is not int for a in _TIMES & set(args)):
        raise ValueError("time_from and time_to are integers")
    if any(not (v is None or type(v) in (str, int)) for a, v in args.items() if a not in _TIMES):
        raise ValueError("keys, prefixes and groups are strings, integers or null")
    return cls(**args)


def refused(scan: Scan, store: str, kind: StoreKind) -> TypeError:
    """Return the error of a store asked a scan of another kind of store (routing checks it before: a bug)."""
    return TypeError(
        f"store {store!r} is a {kind.value} store: a {scan.kind} scan reads a {scan.store_kind.value} store"
    )
