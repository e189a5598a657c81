"""The bloom store view of one partition: has this key been seen?

A pybloom-live ScalableBloomFilter per partition, kept in memory for lookups and snapshotted into the
partition database in the same WriteBatch as the offsets it covers, so that a restart restores it
exactly and only records after the snapshot are replayed. Keys are hashed in their encoded form, so
the integer 5 and the string "5" are different keys.

The snapshot is stored in pages of PAGE_BYTES (``page<i>``, with its length under ``pages``), and a batch writes
only the pages its keys changed: the changelog (``stores.changelog``) then carries a batch's changed pages, not the
whole filter. A database written before pages holds the whole snapshot under ``snapshot``; it is read, and replaced
by pages at the next batch.
"""

from __future__ import annotations

import io
import struct
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from pybloom_live import ScalableBloomFilter

from iqgraph.stores.aggregations import Aggregation
from iqgraph.stores.codecs import Key, KeyCodec, decode_int64, encode_int64
from iqgraph.stores.distinct import BloomBits
from iqgraph.stores.exceptions import CorruptValueError
from iqgraph.stores.partition import PartitionDB, PartitionTransaction
from iqgraph.stores.scan import Page
from iqgraph.stores.scans import Scan, refused
from iqgraph.stores.spec import BloomSpec, StoreKind
from iqgraph.stores.types import Followed, Lookup
from iqgraph.stores.writes import ChangeRecorder, StorePartials

SNAPSHOT_KEY = b"snapshot"  # the whole snapshot, as databases written before pages hold it
PAGES_KEY = b"pages"  # the snapshot's length in bytes (int64): its pages are page<0>..page<n-1>
PAGE_BYTES = 256  # a batch of 10 keys changes ~48 of a 60 KB filter's 240 pages (docs/benchmarks.md)


def page_key(index: int) -> bytes:
    """Return the key of the snapshot's page index."""
    return b"page" + index.to_bytes(4, "big")


def pages_of(snapshot: bytes) -> list[bytes]:
    """Return snapshot cut into pages of PAGE_BYTES (the last one shorter)."""
    return [snapshot[i : i + PAGE_BYTES] for i in range(0, len(snapshot), PAGE_BYTES)]


class BloomStore:
    """Set membership with a bounded false-positive rate and no false negatives."""

    kind: ClassVar[StoreKind] = StoreKind.BLOOM
    windowed: ClassVar[bool] = False
    aggregated: ClassVar[bool] = False
    followable: ClassVar[bool] = True
    keys_only: ClassVar[bool] = True
    keeps_tables: ClassVar[bool] = False
    rankable: ClassVar[bool] = False

    def __init__(self, db: PartitionDB, name: str) -> None:
        self.db = db
        spec = db.spec(name)
        if spec.kind is not self.kind or spec.bloom is None:
            raise TypeError(f"store {name!r} is a {spec.kind.value} store, not bloom")
        self.bloom: BloomSpec = spec.bloom
        self.name = name
        self.codec = KeyCodec(spec.key_type)
        self._filter: ScalableBloomFilter | None = None
        self._pages: list[bytes] = []  # the snapshot's pages as stored, the filter's state at the last batch
        self._lock = threading.Lock()
        db.on_restored(self._forget)  # the changelog wrote new pages: read them at the next use

    @property
    def error_rate(self) -> float:
        """Return the configured false-positive rate."""
        return self.bloom.error_rate

    def _loaded(self) -> ScalableBloomFilter:
        with self._lock:
            if self._filter is None:
                self._filter = self._restore()
            return self._filter

    def _stored(self) -> bytes | None:
        """Return the stored snapshot (from its pages, or whole as older databases hold it), None if none."""
        family = self.db.family(self.name)
        length = family.get(PAGES_KEY)
        if length is None:
            whole: bytes | None = family.get(SNAPSHOT_KEY)
            self._pages = []  # the next batch writes every page (and deletes the whole snapshot)
            return whole
        count = -(-decode_int64(length) // PAGE_BYTES)
        pages: list[bytes | None] = family.get([page_key(i) for i in range(count)])  # type: ignore[assignment]
        if any(page is None for page in pages):
            raise CorruptValueError(f"bloom snapshot of store {self.name!r} misses pages")
        self._pages = [page for page in pages if page is not None]
        return b"".join(self._pages)

    def _restore(self) -> ScalableBloomFilter:
        raw = self._stored()
        if raw is None:
            return ScalableBloomFilter(initial_capacity=self.bloom.capacity, error_rate=self.bloom.error_rate)
        try:
            return ScalableBloomFilter.fromfile(io.BytesIO(raw))
        except (struct.error, ValueError, EOFError, IndexError, TypeError) as exc:
            raise CorruptValueError(f"bloom snapshot of store {self.name!r} cannot be read: {exc}") from exc

    def might_contain(self, key: Key) -> bool:
        """Return False if key was never added; True if it probably was."""
        encoded = self.codec.encode(key)
        self.db.check_queryable()
        return encoded in self._loaded()

    def might_contain_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return might_contain for each key, in key order."""
        encoded = [self.codec.encode(k) for k in keys]
        self.db.check_queryable()
        bloom = self._loaded()
        return [k in bloom for k in encoded]

    def approximate_count(self) -> int:
        """Return about how many distinct keys were added.

        There is no exact count, unlike the other stores: the filter keeps no keys, and telling a new key
        from a false positive would take the keys themselves.
        """
        self.db.check_queryable()
        return len(self._loaded())

    def bits(self) -> BloomBits:
        """Return a snapshot of the filter: what a union with other partitions' filters needs (``stores.distinct``)."""
        self.db.check_queryable()
        bloom = self._loaded()
        snapshot = io.BytesIO()
        bloom.tofile(snapshot)
        return BloomBits(snapshot.getvalue())

    # -- the read protocol (``stores.types.StoreReads``) --------------------------------------------

    @staticmethod
    def combiner(agg: Aggregation) -> Callable[[Any, Any], Any]:
        """Return how two partitions' answers for one key combine: added in either."""
        return lambda a, b: bool(a) or bool(b)

    @staticmethod
    def finalizer(agg: Aggregation) -> Callable[[Any], Any] | None:
        """Return None: an answer is its value."""
        return None

    def read_states(self, lookups: Sequence[Lookup]) -> list[Any]:
        """Return per lookup whether its key was probably added."""
        return self.might_contain_many([lookup[0] for lookup in lookups])

    def contains_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return per key whether it was probably added."""
        return self.might_contain_many(keys)

    def followed(self, keys: Sequence[Key], time_from: int | None = None) -> list[Followed]:
        """Return the keys the filter (probably) contains, state True and no position (a filter keeps none)."""
        return [
            (key, None, True, None) for key, found in zip(keys, self.might_contain_many(keys), strict=True) if found
        ]

    def page(self, scan: Scan, first: int, after: str | None) -> Page[Any]:
        """Refuse: a bloom filter keeps no keys to scan."""
        raise refused(scan, self.name, self.kind)

    def read_count(self, exact: bool, distinct: bool) -> int | BloomBits:
        """Return the filters' estimate of the keys added (never exact); distinct: the filter, to count a union."""
        return self.bits() if distinct else self.approximate_count()

    def apply(self, tx: PartitionTransaction, partials: StorePartials, changes: ChangeRecorder) -> Mapping[bytes, Any]:
        """Add the batch's keys (the write protocol: ``stores.writes``); a watched key's change is True."""
        self.add(tx, partials.keys)
        if changes.watches(self.name):
            keys = partials.keys
            changes.constant(self.name, keys, True, dict(zip(keys, partials.positions, strict=True)))
        return {}

    def add(self, tx: PartitionTransaction, keys: Iterable[Key]) -> None:
        """Add keys when tx commits, together with a snapshot of the filter."""
        encoded = [self.codec.encode(k) for k in keys]
        if not encoded:
            return

        def flush() -> None:
            bloom = self._loaded()
            for key in encoded:
                bloom.add(key)
            snapshot = io.BytesIO()
            bloom.tofile(snapshot)
            self._write_pages(tx, snapshot.getvalue())

        tx.before_commit(flush)
        tx.after_abort(self._forget)

    def _write_pages(self, tx: PartitionTransaction, snapshot: bytes) -> None:
        """Write the pages of snapshot that differ from the stored ones (and its length when it changed)."""
        old, new = self._pages, pages_of(snapshot)
        if not old:
            tx.delete(self.name, SNAPSHOT_KEY)
        if sum(map(len, old)) != len(snapshot) or not old:
            tx.put(self.name, PAGES_KEY, encode_int64(len(snapshot)))
        for index, page in enumerate(new):
            if index >= len(old) or old[index] != page:
                tx.put(self.name, page_key(index), page)
        tx.delete_many(self.name, (page_key(i) for i in range(len(new), len(old))))
        self._pages = new  # an abort forgets them with the filter

    def _forget(self) -> None:
        """Drop the in-memory filter; the next use restores it from the last committed snapshot."""
        with self._lock:
            self._filter = None
            self._pages = []
