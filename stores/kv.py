"""The key-value store view of one partition: point and range reads, and the merges a batch applies.

Every write through the view keeps the exact number of keys (meta counter ``count:<store>``) in the
same batch, so count() is exact where approximate_num_entries() is RocksDB's estimate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from iqgraph.stores.aggregations import AggregatedStates, Aggregation, merge_state
from iqgraph.stores.codecs import Key, KeyCodec, decode_value, decode_values, encode_value, encode_values
from iqgraph.stores.distinct import KeyDigests
from iqgraph.stores.partition import PartitionDB, PartitionTransaction, entries_counter
from iqgraph.stores.positions import KeyPositions, latest_positions
from iqgraph.stores.scan import Page, inclusive_stop, paginate, prefix_stop
from iqgraph.stores.scans import PrefixScan, RangeScan, Scan, refused
from iqgraph.stores.spec import StoreKind
from iqgraph.stores.types import Followed, Lookup
from iqgraph.stores.writes import ChangeRecorder, StorePartials

DEFAULT_PAGE = 100


@dataclass(frozen=True)
class Merged:
    """What a merge did: the new state of every key it touched, and the keys whose state changed, with the
    position (record offset) that changed each — only when the merge was given positions."""

    states: dict[bytes, Any] = field(default_factory=dict)
    changed: dict[bytes, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TableChanges(Merged):
    """What a table's batch did: Merged for the keys given a value, and the keys its tombstones deleted (by key:
    the tombstone's position)."""

    deleted: dict[Any, int] = field(default_factory=dict)


class KeyValueStore(AggregatedStates):
    """Latest value, count, sum, min, max or avg per key, in one partition database."""

    kind: ClassVar[StoreKind] = StoreKind.KEY_VALUE
    #: whether a read's states are windows (their wire form: ``schema.wire``), and whether they are aggregated
    windowed: ClassVar[bool] = False
    aggregated: ClassVar[bool] = True
    followable: ClassVar[bool] = True
    keys_only: ClassVar[bool] = False
    keeps_tables: ClassVar[bool] = True
    rankable: ClassVar[bool] = True

    def __init__(self, db: PartitionDB, name: str) -> None:
        self.db = db
        self.spec = db.spec(name)
        if self.spec.kind is not self.kind:
            raise TypeError(f"store {name!r} is a {self.spec.kind.value} store, not key_value")
        self.name = name
        self.codec = KeyCodec(self.spec.key_type)
        self._finalize = self.spec.aggregation.finalize
        self._entries_counter = entries_counter(name)
        self.positions = KeyPositions(db, name)

    def _value(self, raw: bytes | None) -> Any:
        return None if raw is None else self._finalize(decode_value(raw))

    def _entry(self, key: bytes, raw: bytes) -> tuple[Key, Any]:
        return self.codec.decode(key), self._finalize(decode_value(raw))

    def _state_entry(self, key: bytes, raw: bytes) -> tuple[Key, Any]:
        return self.codec.decode(key), decode_value(raw)

    def get(self, key: Key) -> Any:
        """Return the value of key, or None if it has none."""
        encoded = self.codec.encode(key)
        self.db.check_queryable()
        return self._value(self.db.family(self.name).get(encoded))

    def multi_get(self, keys: Sequence[Key], *, states: bool = False) -> list[Any]:
        """Return the values of keys in key order (None where missing), in one RocksDB multi-get.

        With states=True, return the stored aggregation states (mergeable across partitions) instead.
        """
        encoded = self.codec.encode_many(keys)
        self.db.check_queryable()
        found = decode_values(self.db.multi_get(self.name, encoded))
        if states:
            return found
        done = self._finalize
        return [None if state is None else done(state) for state in found]

    def range(
        self,
        from_key: Key | None,
        to_key: Key | None,
        limit: int = DEFAULT_PAGE,
        after: str | None = None,
        *,
        states: bool = False,
    ) -> Page[tuple[Key, Any]]:
        """Return entries with from_key <= key <= to_key (None: unbounded) in natural key order."""
        lower = None if from_key is None else self.codec.encode(from_key)
        upper = None if to_key is None else self.codec.encode(to_key)
        self.db.check_queryable()
        entry = self._state_entry if states else self._entry
        return paginate(self.db.family(self.name), lower, inclusive_stop(upper), limit, after, entry)

    def prefix(
        self, prefix: str, limit: int = DEFAULT_PAGE, after: str | None = None, *, states: bool = False
    ) -> Page[tuple[Key, Any]]:
        """Return entries whose (string) key starts with prefix, in key order."""
        encoded = self.codec.encode_prefix(prefix)
        self.db.check_queryable()
        entry = self._state_entry if states else self._entry
        return paginate(self.db.family(self.name), encoded, prefix_stop(encoded), limit, after, entry)

    def all(
        self, limit: int = DEFAULT_PAGE, after: str | None = None, *, states: bool = False
    ) -> Page[tuple[Key, Any]]:
        """Return every entry, a page at a time, in key order."""
        return self.range(None, None, limit, after, states=states)

    def approximate_num_entries(self) -> int:
        """Return RocksDB's estimate of the number of keys (may be far off after updates and deletes)."""
        self.db.check_queryable()
        return self.db.family(self.name).property_int_value("rocksdb.estimate-num-keys") or 0

    def count(self) -> int:
        """Return the exact number of keys in this partition's store, as of the last committed batch."""
        self.db.check_queryable()
        return self.db.counter(self._entries_counter)

    # -- the read protocol (``stores.types.StoreReads``) --------------------------------------------

    def read_states(self, lookups: Sequence[Lookup]) -> list[Any]:
        """Return each lookup's state (None where missing), in one RocksDB multi-get."""
        return self.multi_get([lookup[0] for lookup in lookups], states=True)

    def contains_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return per key whether the store holds it."""
        return [state is not None for state in self.multi_get(keys, states=True)]

    def followed(self, keys: Sequence[Key], time_from: int | None = None) -> list[Followed]:
        """Return each key's state and position (a key not held: state None, position -1 if never written, else
        the tombstone's that deleted it)."""
        states = self.multi_get(keys, states=True)
        positions = self.positions.read(self.codec.encode_many(keys))
        return [
            (key, None, state, -1 if state is None and at is None else at)
            for key, state, at in zip(keys, states, positions, strict=True)
        ]

    def page(self, scan: Scan, first: int, after: str | None) -> Page[Any]:
        """Return a page of a range or prefix scan's (key, state) entries, resumed after the cursor."""
        if isinstance(scan, RangeScan):
            return self.range(scan.from_key, scan.to_key, first, after, states=True)
        if isinstance(scan, PrefixScan):
            return self.prefix(scan.prefix, first, after, states=True)
        raise refused(scan, self.name, self.kind)

    def read_count(self, exact: bool, distinct: bool) -> int | KeyDigests:
        """Return the keys stored: exact or RocksDB's estimate; distinct (exact): their digests, to count a union."""
        if distinct and exact:
            return self.db.key_digests(self.name)
        return self.count() if exact else self.approximate_num_entries()

    # -- the write protocol (``stores.writes.StoreWrites``) -----------------------------------------

    def apply(self, tx: PartitionTransaction, partials: StorePartials, changes: ChangeRecorder) -> Mapping[bytes, Any]:
        """Merge each key's partial (a table's: its last change), recording the watched keys' new states."""
        keys, items = partials.keys, partials.items
        if partials.table:
            done = self.apply_changes(
                tx, [(k, it[2], at) for k, it, at in zip(keys, items, partials.positions, strict=True)]
            )
            if changes.watches(self.name):
                changes.states(self.name, self.codec, keys, done)
                changes.constant(self.name, done.deleted, None, done.deleted)
            return done.states
        found = self.merge(tx, [(k, it[2]) for k, it in zip(keys, items, strict=True)], positions=partials.positions)
        if changes.watches(self.name):
            changes.states(self.name, self.codec, keys, found)
        return found.states

    def apply_changes(self, tx: PartitionTransaction, items: Sequence[tuple[Key, Any, int]]) -> TableChanges:
        """Apply a table's last change per key of a batch (key, value, position): a value replaces the key's, a
        tombstone (None) deletes it."""
        valued = [(key, value, at) for key, value, at in items if value is not None]
        merged = self.merge(tx, [(key, value) for key, value, _ in valued], positions=[at for _, _, at in valued])
        deleted: dict[Any, int] = {}
        for key, value, at in items:
            if value is None and self.delete(tx, key, at):  # a key that was stored: its deletion is a change
                deleted[key] = at
        return TableChanges(merged.states, merged.changed, deleted)

    def _count_entries(self, tx: PartitionTransaction, added: int) -> None:
        if added:
            tx.increment(self._entries_counter, added)

    def _exists(self, tx: PartitionTransaction, encoded: bytes) -> bool:
        return tx.multi_get(self.name, [encoded])[0] is not None

    def merge(
        self,
        tx: PartitionTransaction,
        items: Iterable[tuple[Key, Any]],
        aggregation: Aggregation | None = None,
        positions: Sequence[int] | None = None,
    ) -> Merged:
        """Fold each (key, partial state) into the stored state with the store's aggregation.

        positions: per item, the offset of the last record its partial covers: a key whose state changes gets the
        largest of its items' (``stores.positions``). Return the new state of every key the items touched, by
        encoded key (what a ranking of the store indexes), and those that changed.
        """
        agg = aggregation or self.spec.aggregation
        pairs = items if isinstance(items, list) else list(items)
        encoded = self.codec.encode_many([key for key, _ in pairs])
        partials: dict[bytes, Any] = {}
        for key, (_, partial) in zip(encoded, pairs, strict=True):
            partials[key] = merge_state(agg, partials[key], partial) if key in partials else partial
        if not partials:
            return Merged()
        keys = list(partials)
        olds = decode_values(tx.multi_get(self.name, keys))
        # A new key's state is its partial, so it is stored (and counted) unless that is null.
        pending = list(partials.values())
        self._count_entries(tx, sum(old is None and p is not None for old, p in zip(olds, pending, strict=True)))
        states = [merge_state(agg, old, p) for old, p in zip(olds, pending, strict=True)]
        # A key whose partials were all null (e.g. a sum over null values) gets no state.
        kept = [(key, state) for key, state in zip(keys, states, strict=True) if state is not None]
        tx.put_many(self.name, zip([key for key, _ in kept], encode_values([state for _, state in kept]), strict=True))
        changed: dict[bytes, int] = {}
        if positions is not None:  # the sink's partials have one item per key: no duplicate to resolve
            unique = len(partials) == len(encoded)
            latest = dict(zip(encoded, positions, strict=True)) if unique else latest_positions(encoded, positions)
            changed = {k: latest[k] for k, old, new in zip(keys, olds, states, strict=True) if new != old}
            self.positions.record(tx, changed)
        return Merged(dict(zip(keys, states, strict=True)), changed)

    def put(self, tx: PartitionTransaction, key: Key, value: Any) -> None:
        """Store value under key, replacing any state."""
        encoded = self.codec.encode(key)
        self._count_entries(tx, 0 if self._exists(tx, encoded) else 1)
        tx.put(self.name, encoded, encode_value(value))

    def delete(self, tx: PartitionTransaction, key: Key, position: int | None = None) -> bool:
        """Remove key (if it is stored); return whether it was. position: the tombstone's offset, kept as the
        key's position when the key was stored (a resume then learns it was deleted)."""
        encoded = self.codec.encode(key)
        existed = self._exists(tx, encoded)
        self._count_entries(tx, -1 if existed else 0)
        tx.delete(self.name, encoded)
        if existed and position is not None:
            self.positions.record(tx, {encoded: position})
        return existed
