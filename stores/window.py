"""The window store view of one partition: values per key per time window, with grace and retention.

Three column families: ``<store>`` keyed by window key (key, then window start: ordered by key, then
time) and ``<store>.by_time`` keyed by window start then key (ordered by time), which serves fetch_all
and lets retention drop the oldest windows without scanning every key, and ``<store>.positions``, each
window's position (``stores.positions``). Stream time (the largest event
time applied), the count of late records and the exact number of (key, window) entries (counter
``count:<store>``) live in the meta family, written with each batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from iqgraph.stores.aggregations import Aggregation, merge_state
from iqgraph.stores.codecs import Key, KeyCodec, decode_int64, decode_value, encode_int64, encode_value
from iqgraph.stores.distinct import KeyDigests
from iqgraph.stores.partition import META_CF, PartitionDB, PartitionTransaction, entries_counter
from iqgraph.stores.positions import KeyPositions
from iqgraph.stores.scan import Page, inclusive_stop, paginate, scan
from iqgraph.stores.scans import FAR_FUTURE, FAR_PAST, Scan, WindowRangeScan, WindowScan, refused
from iqgraph.stores.spec import StoreKind, WindowSpec
from iqgraph.stores.types import Followed, Lookup
from iqgraph.stores.writes import ChangeRecorder, StorePartials

DEFAULT_PAGE = 100
NO_TIME = -(1 << 63)


@dataclass(frozen=True)
class WindowedValue:
    """The value of one key in one window [start, end)."""

    key: Key
    start: int
    end: int
    value: Any


def merge_windows(agg: Aggregation, a: Sequence[WindowedValue], b: Sequence[WindowedValue]) -> list[WindowedValue]:
    """Return the windows of a and b, those with the same start combined, in time order."""
    by_start = {w.start: w for w in a}
    for w in b:
        old = by_start.get(w.start)
        by_start[w.start] = (
            w if old is None else WindowedValue(w.key, w.start, w.end, merge_state(agg, old.value, w.value))
        )
    return [by_start[s] for s in sorted(by_start)]


def final_window(agg: Aggregation, window: WindowedValue) -> WindowedValue:
    """Return window with its state finalized into a value."""
    return WindowedValue(window.key, window.start, window.end, agg.finalize(window.value))


class WindowStore:
    """Tumbling or hopping window aggregates per key, in one partition database."""

    kind: ClassVar[StoreKind] = StoreKind.WINDOW
    windowed: ClassVar[bool] = True
    aggregated: ClassVar[bool] = True
    followable: ClassVar[bool] = True
    keys_only: ClassVar[bool] = False
    keeps_tables: ClassVar[bool] = False
    rankable: ClassVar[bool] = False

    def __init__(self, db: PartitionDB, name: str) -> None:
        self.db = db
        self.spec = db.spec(name)
        if self.spec.kind is not self.kind or self.spec.window is None:
            raise TypeError(f"store {name!r} is a {self.spec.kind.value} store, not window")
        self.window: WindowSpec = self.spec.window
        self.name = name
        self.index = f"{name}.by_time"
        self.codec = KeyCodec(self.spec.key_type)
        self._stream_time_key = b"stream_time:" + name.encode()
        self._late_counter = f"late:{name}"
        self._entries_counter = entries_counter(name)
        self.positions = KeyPositions(db, name)

    def stream_time(self) -> int | None:
        """Return the largest event time applied so far (None before the first record)."""
        raw = self.db.meta(self._stream_time_key)
        return None if raw is None else decode_int64(raw)

    def _stream_time_in(self, tx: PartitionTransaction) -> int | None:
        raw = tx.multi_get(META_CF, [self._stream_time_key])[0]
        return None if raw is None else decode_int64(raw)

    def late_records(self) -> int:
        """Return how many records arrived after their window closed and were not applied."""
        return self.db.counter(self._late_counter)

    def count(self) -> int:
        """Return the exact number of (key, window) entries stored, as of the last committed batch.

        A window past retention counts until retention drops it (reads hide it already), which the
        batch that moves stream time past it does.
        """
        self.db.check_queryable()
        return self.db.counter(self._entries_counter)

    def _count_entries(self, tx: PartitionTransaction, added: int) -> None:
        if added:
            tx.increment(self._entries_counter, added)

    def _expired_before(self, stream_time: int | None) -> int:
        """Return the first window start still retained at stream_time."""
        return NO_TIME if stream_time is None else stream_time - self.window.retention + 1

    def _closed(self, start: int, stream_time: int | None) -> bool:
        return stream_time is not None and start + self.window.size_ms + self.window.grace_ms <= stream_time

    def _entry(self, key: bytes, raw: bytes) -> WindowedValue:
        k, start = self.codec.decode_window_key(key)
        value = self.spec.aggregation.finalize(decode_value(raw))
        return WindowedValue(k, start, start + self.window.size_ms, value)

    def _state_entry(self, key: bytes, raw: bytes) -> WindowedValue:
        k, start = self.codec.decode_window_key(key)
        return WindowedValue(k, start, start + self.window.size_ms, decode_value(raw))

    # -- reads --------------------------------------------------------------------------------

    def fetch(self, key: Key, time_from: int, time_to: int, *, states: bool = False) -> list[WindowedValue]:
        """Return key's windows whose start is in [time_from, time_to], oldest first.

        With states=True the values are the stored aggregation states (mergeable across partitions).
        """
        prefix = self.codec.encode_window_prefix(key)
        self.db.check_queryable()
        time_from = max(time_from, self._expired_before(self.stream_time()))
        upper = prefix + encode_int64(time_to)
        found = scan(self.db.family(self.name), prefix + encode_int64(time_from), inclusive_stop(upper))
        entry = self._state_entry if states else self._entry
        return [entry(k, v) for k, v in found]

    def fetch_all(
        self,
        time_from: int,
        time_to: int,
        limit: int = DEFAULT_PAGE,
        after: str | None = None,
        *,
        states: bool = False,
    ) -> Page[WindowedValue]:
        """Return every key's windows whose start is in [time_from, time_to], by start then key."""
        self.db.check_queryable()
        time_from = max(time_from, self._expired_before(self.stream_time()))
        if time_from > time_to:
            return Page()
        family = self.db.family(self.name)
        stop_at = encode_int64(time_to)
        convert = self._state_entry if states else self._entry

        def entry(index_key: bytes, _: bytes) -> WindowedValue:
            window_key = index_key[8:]
            raw: bytes = family[window_key]  # type: ignore[assignment]
            return convert(window_key, raw)

        lower = encode_int64(time_from)
        return paginate(self.db.family(self.index), lower, lambda k: k[:8] > stop_at, limit, after, entry)

    def fetch_range(
        self,
        from_key: Key | None,
        to_key: Key | None,
        time_from: int,
        time_to: int,
        limit: int = DEFAULT_PAGE,
        after: str | None = None,
        *,
        states: bool = False,
    ) -> Page[WindowedValue]:
        """Return windows of keys in [from_key, to_key] with start in [time_from, time_to], by key then time."""
        lower = None if from_key is None else self.codec.encode_window_prefix(from_key)
        upper = None if to_key is None else self.codec.encode_window_prefix(to_key)
        self.db.check_queryable()
        time_from = max(time_from, self._expired_before(self.stream_time()))
        low, high = encode_int64(time_from), encode_int64(time_to)
        return paginate(
            self.db.family(self.name),
            lower,
            None if upper is None else (lambda k: k[:-8] > upper),
            limit,
            after,
            self._state_entry if states else self._entry,
            keep=lambda k: low <= k[-8:] <= high,
        )

    # -- the read protocol (``stores.types.StoreReads``) --------------------------------------------

    @staticmethod
    def combiner(agg: Aggregation) -> Callable[[Any, Any], Any]:
        """Return how two partitions' windows of one key combine (windows with the same start merged)."""
        return lambda a, b: merge_windows(agg, a or [], b or [])

    @staticmethod
    def finalizer(agg: Aggregation) -> Callable[[Any], Any] | None:
        """Return how a read's windows' states become values."""
        return lambda windows: [final_window(agg, w) for w in windows]

    def read_states(self, lookups: Sequence[Lookup]) -> list[Any]:
        """Return each lookup's windows with start in its range (None: open), states, oldest first."""
        return [
            self.fetch(k, FAR_PAST if lo is None else lo, FAR_FUTURE if hi is None else hi, states=True)
            for k, lo, hi in lookups
        ]

    def contains_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return per key whether the store holds a window of it."""
        return [bool(self.fetch_range(k, k, FAR_PAST, FAR_FUTURE, 1, states=True).items) for k in keys]

    def followed(self, keys: Sequence[Key], time_from: int | None = None) -> list[Followed]:
        """Return the keys' windows from time_from (None: all), states, each with its position."""
        start = FAR_PAST if time_from is None else time_from
        found = [w for key in keys for w in self.fetch(key, start, FAR_FUTURE, states=True)]
        positions = self.positions.read([self.codec.encode_window_key(w.key, w.start) for w in found])
        return [(w.key, w.start, w.value, at) for w, at in zip(found, positions, strict=True)]

    def page(self, scan: Scan, first: int, after: str | None) -> Page[Any]:
        """Return a page of a window scan's windows (states), resumed after the cursor."""
        if isinstance(scan, WindowScan):
            return self.fetch_all(scan.time_from, scan.time_to, first, after, states=True)
        if isinstance(scan, WindowRangeScan):
            return self.fetch_range(scan.from_key, scan.to_key, scan.time_from, scan.time_to, first, after, states=True)
        raise refused(scan, self.name, self.kind)

    def read_count(self, exact: bool, distinct: bool) -> int | KeyDigests:
        """Return the (key, window) entries: exact or RocksDB's estimate; distinct (exact): the keys' digests."""
        if distinct and exact:
            return self.db.key_digests(self.name)
        if exact:
            return self.count()
        return self.db.family(self.name).property_int_value("rocksdb.estimate-num-keys") or 0

    # -- writes -------------------------------------------------------------------------------

    def apply(self, tx: PartitionTransaction, partials: StorePartials, changes: ChangeRecorder) -> Mapping[bytes, Any]:
        """Merge each window's partial and move stream time (the write protocol: ``stores.writes``), recording the
        watched windows the merge changed (read from the transaction before and after: merge returns no states)."""
        items = [(k, int(it[1] or 0), it[2]) for k, it in zip(partials.keys, partials.items, strict=True)]
        recorded = None
        if changes.watches(self.name):
            watched = set(changes.selected(self.name, (key for key, _, _ in items)))
            rows = {(k, start): self.codec.encode_window_key(k, start) for k, start, _ in items if k in watched}
            recorded = changes.rows(self.name, tx, self.name, [(k, start, raw) for (k, start), raw in rows.items()])
        changed = self.merge(tx, items, partials.stream_time, partials.late, positions=partials.positions)
        if recorded is not None:
            recorded(changed)
        return {}

    def merge(
        self,
        tx: PartitionTransaction,
        items: Iterable[tuple[Key, int, Any]],
        stream_time: int | None,
        late: int = 0,
        aggregation: Aggregation | None = None,
        positions: Sequence[int] | None = None,
    ) -> dict[bytes, int]:
        """Fold partial states per (key, window start) and advance stream time.

        Windows already closed (end + grace <= stream time before this batch) are not applied and
        count as late, as do the late records the caller found; windows past retention are dropped.
        positions: per item, the offset of the last record its partial covers; a window whose state changes
        gets the largest of its items' (``stores.positions``). Return those windows' positions, by window key.
        """
        agg = aggregation or self.spec.aggregation
        before = self._stream_time_in(tx)
        after = before if stream_time is None else stream_time if before is None else max(before, stream_time)
        retained_from = self._expired_before(after)
        partials: dict[bytes, tuple[int, Any]] = {}
        latest: dict[bytes, int] = {}
        for i, (key, start, partial) in enumerate(items):
            if self._closed(start, before):
                late += 1
                continue
            if start < retained_from:  # already past retention: it would be dropped at once
                continue
            window_key = self.codec.encode_window_key(key, start)
            previous = partials.get(window_key)
            partials[window_key] = (start, merge_state(agg, previous and previous[1], partial))
            if positions is not None:
                latest[window_key] = max(positions[i], latest.get(window_key, -1))
        changed = self._apply(tx, [(k, start, p) for k, (start, p) in partials.items()], agg, latest)
        if after is not None and after != before:
            tx.put(META_CF, self._stream_time_key, encode_int64(after))
            self._drop_expired(tx, retained_from)
        if late:
            tx.increment(self._late_counter, late)
        return changed

    def _apply(
        self,
        tx: PartitionTransaction,
        pairs: Sequence[tuple[bytes, int, Any]],
        agg: Aggregation,
        positions: Mapping[bytes, int],
    ) -> dict[bytes, int]:
        stored = tx.multi_get(self.name, [k for k, _, _ in pairs]) if pairs else []
        self._count_entries(tx, sum(raw is None for raw in stored))
        changed: dict[bytes, int] = {}
        for (key, start, partial), raw in zip(pairs, stored, strict=True):
            if raw is None:
                tx.put(self.index, encode_int64(start) + key, b"")
            old = None if raw is None else decode_value(raw)
            new = merge_state(agg, old, partial)
            tx.put(self.name, key, encode_value(new))
            if key in positions and new != old:
                changed[key] = positions[key]
        self.positions.record(tx, changed)
        return changed

    def _drop_expired(self, tx: PartitionTransaction, retained_from: int) -> None:
        stop = encode_int64(retained_from)
        index_keys = [k for k, _ in scan(self.db.family(self.index), None, lambda k: k >= stop)]
        if not index_keys:
            return
        window_keys = [k[8:] for k in index_keys]
        # Count only windows still stored: an earlier merge in this batch may have dropped some already.
        self._count_entries(tx, -sum(raw is not None for raw in tx.multi_get(self.name, window_keys)))
        for index_key, window_key in zip(index_keys, window_keys, strict=True):
            tx.delete(self.index, index_key)
            tx.delete(self.name, window_key)
        self.positions.forget(tx, window_keys)

    def aggregate(
        self, tx: PartitionTransaction, records: Iterable[tuple[Key, int, Any]], aggregation: Aggregation | None = None
    ) -> None:
        """Apply records (key, event time, partial) in offset order, record by record.

        Each record advances stream time first; a record whose window is closed by then is late.
        """
        agg = aggregation or self.spec.aggregation
        stream_time = self._stream_time_in(tx)
        partials: dict[tuple[Key, int], Any] = {}
        late = 0
        for key, timestamp, partial in records:
            self.codec.check(key)
            stream_time = timestamp if stream_time is None else max(stream_time, timestamp)
            for start in self.window.window_starts(timestamp):
                if self._closed(start, stream_time):
                    late += 1
                    continue
                partials[(key, start)] = merge_state(agg, partials.get((key, start)), partial)
        items = [(k, start, p) for (k, start), p in partials.items()]
        self.merge(tx, items, stream_time, late, agg)
