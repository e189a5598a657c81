"""The bloom store view of one partition: has this key been seen?

A pybloom-live ScalableBloomFilter per partition, kept in memory for lookups and snapshotted into the
partition database in the same WriteBatch as the offsets it covers, so that a restart restores it
exactly and only records after the snapshot are replayed. Keys are hashed in their encoded form, so
the integer 5 and the string "5" are different keys.
"""

from __future__ import annotations

import io
import struct
import threading
from collections.abc import Iterable, Sequence

from pybloom_live import ScalableBloomFilter

from iqgraph.stores.codecs import Key, KeyCodec
from iqgraph.stores.distinct import BloomBits
from iqgraph.stores.exceptions import CorruptValueError
from iqgraph.stores.partition import PartitionDB, PartitionTransaction
from iqgraph.stores.spec import BloomSpec, StoreKind

SNAPSHOT_KEY = b"snapshot"


class BloomStore:
    """Set membership with a bounded false-positive rate and no false negatives."""

    def __init__(self, db: PartitionDB, name: str) -> None:
        self.db = db
        spec = db.spec(name)
        if spec.kind is not StoreKind.BLOOM or spec.bloom is None:
            raise TypeError(f"store {name!r} is a {spec.kind.value} store, not bloom")
        self.bloom: BloomSpec = spec.bloom
        self.name = name
        self.codec = KeyCodec(spec.key_type)
        self._filter: ScalableBloomFilter | None = None
        self._lock = threading.Lock()

    @property
    def error_rate(self) -> float:
        """Return the configured false-positive rate."""
        return self.bloom.error_rate

    def _loaded(self) -> ScalableBloomFilter:
        with self._lock:
            if self._filter is None:
                self._filter = self._restore()
            return self._filter

    def _restore(self) -> ScalableBloomFilter:
        raw = self.db.family(self.name).get(SNAPSHOT_KEY)
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
            tx.put(self.name, SNAPSHOT_KEY, snapshot.getvalue())

        tx.before_commit(flush)
        tx.after_abort(self._forget)

    def _forget(self) -> None:
        """Drop the in-memory filter; the next use restores it from the last committed snapshot."""
        with self._lock:
            self._filter = None
