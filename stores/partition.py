"""The partition database: one RocksDB per (topic, partition), a column family per store plus meta.

It holds the next offset to apply for its topic-partition in the meta family, written in the same
WriteBatch as the data that batch covers (invariant 1): a batch is applied whole with its offsets, or
not at all. Handing a partition over is opening, closing or deleting one directory (invariant 2).

Meta also holds counters (``counter:<name>``), among them the exact number of entries of each
key-value and window store (``counter:count:<store>``), kept by the store views in the batch that
changes the entries. A database written before entries were counted gets its counts on open, by one
pass over each such store's family, before any batch can be applied.
"""

from __future__ import annotations

import enum
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import cast

from rocksdict import ColumnFamily, Options, Rdict, WriteBatch

from iqgraph.stores.codecs import decode_int64, encode_int64
from iqgraph.stores.distinct import KeyDigests, key_digests
from iqgraph.stores.exceptions import (
    DataLostError,
    OffsetError,
    OffsetGapError,
    RepartitionedError,
    StateDirError,
    StateDirLockedError,
    StoreNotReadyError,
    UnknownStoreError,
)
from iqgraph.stores.spec import StoreKind, StoreSpec

log = logging.getLogger(__name__)

META_CF = "__meta"
NEXT_OFFSET_KEY = b"next_offset"
COMMITTED_AT_KEY = b"committed_at_ms"  # wall-clock time of the last batch committed, in ms since the epoch
TOPIC_PARTITIONS_KEY = b"topic_partitions"  # the topic's partition count when the database was created
COUNTED_KINDS = frozenset({StoreKind.KEY_VALUE, StoreKind.WINDOW, StoreKind.RANKING})


def repartitioned_message(topic: str, built_for: int, found: int) -> str:
    """Return what a reader of a repartitioned topic's stores is told: what happened and what to do."""
    return (
        f"topic {topic!r} has {found} partitions, but the stores were built for {built_for}: a key's records are now "
        "split between two partitions and no per-key answer can be right. Kafka cannot re-split a topic: produce "
        f"the records into a new topic created with the partition count you want, point Topic(...) at it with "
        "its partitions=, and start the nodes on new state directories"
    )


def counter_key(name: str) -> bytes:
    """Return the meta key of counter name."""
    return b"counter:" + name.encode()


def entries_counter(store: str) -> str:
    """Return the name of the counter of store's entries (keys, or (key, window) pairs)."""
    return f"count:{store}"


class PartitionState(enum.Enum):
    """Lifecycle of a partition database, as readers see it."""

    CREATED = "CREATED"
    RESTORING = "RESTORING"
    RUNNING = "RUNNING"
    DATA_LOST = "DATA_LOST"  # records it never applied were deleted from the topic: see PartitionDB.lost
    REPARTITIONED = "REPARTITIONED"  # the topic's partition count changed: see PartitionDB.repartitioned
    CLOSED = "CLOSED"


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return options


def _open_rdict(path: Path, families: Iterable[str]) -> Rdict:
    wanted = set(families) | {META_CF}
    if (path / "CURRENT").exists():
        wanted |= set(Rdict.list_cf(str(path), Options(raw_mode=True))) - {"default"}
    try:
        return Rdict(str(path), _options(), column_families={cf: Options(raw_mode=True) for cf in wanted})
    except Exception as exc:  # rocksdict raises bare Exception for every RocksDB status
        if "lock" in str(exc).lower():
            raise StateDirLockedError(f"partition database {path} is open in another process or handle") from exc
        raise StateDirError(f"cannot open partition database {path}: {exc}") from exc


class PartitionDB:
    """One RocksDB holding every store's data for one topic-partition, and the offsets applied."""

    def __init__(self, path: Path, topic: str, partition: int, specs: Sequence[StoreSpec]) -> None:
        self.path = path
        self.topic = topic
        self.partition = partition
        self.specs = {spec.name: spec for spec in specs}
        path.mkdir(parents=True, exist_ok=True)
        self._db: Rdict | None = _open_rdict(path, (cf for s in specs for cf in s.column_families))
        self._families: dict[str, Rdict] = {}
        self._handles: dict[str, ColumnFamily] = {}
        self._write_lock = threading.Lock()
        self.state = PartitionState.CREATED
        #: The offsets [first, end) Kafka deleted before this database applied them (state DATA_LOST), else None.
        self.lost: tuple[int, int] | None = None
        #: (partitions the stores were built for, partitions the topic has now) once they differ (REPARTITIONED).
        self.repartitioned: tuple[int, int] | None = None
        #: Wall-clock time (time.time()) of the last batch written, or of the opening: how fresh the data is.
        self.applied_at = time.time()
        #: Bumped after every write of the next offset; next_offset() remembers (version, offset) of one version.
        self._version = 0
        self._next: tuple[int, int] | None = None
        self._restored_listeners: list[Callable[[], None]] = []
        try:
            self._count_uncounted_stores()
        except BaseException:
            self.close()  # release the LOCK: the caller gets no handle to close
            raise

    def __repr__(self) -> str:
        return f"PartitionDB({self.topic}-{self.partition}, {self.state.value})"

    @property
    def rdict(self) -> Rdict:
        """Return the open RocksDB; raise StoreNotReadyError once closed."""
        if self._db is None:
            raise StoreNotReadyError(f"partition {self.topic}-{self.partition} is closed", state="CLOSED")
        return self._db

    def spec(self, name: str) -> StoreSpec:
        """Return the spec of store name; raise UnknownStoreError if this database has none."""
        try:
            return self.specs[name]
        except KeyError:
            known = ", ".join(sorted(self.specs)) or "none"
            raise UnknownStoreError(f"no store named {name!r} (stores: {known})") from None

    def family(self, name: str) -> Rdict:
        """Return the column family name (a store's, or meta)."""
        family = self._families.get(name)
        if family is None:
            self._check_family(name)
            family = self._families[name] = self.rdict.get_column_family(name)
        return family

    def key_digests(self, name: str) -> KeyDigests:
        """Return the digests of every key of store name's own column family (``stores.distinct``)."""
        self.check_queryable()
        return key_digests(self.family(name).keys())  # type: ignore[arg-type] # rocksdict yields bytes keys

    def handle(self, name: str) -> ColumnFamily:
        """Return the write handle of column family name."""
        handle = self._handles.get(name)
        if handle is None:
            self._check_family(name)
            handle = self._handles[name] = self.rdict.get_column_family_handle(name)
        return handle

    def _check_family(self, name: str) -> None:
        if name != META_CF and not any(name in s.column_families for s in self.specs.values()):
            self.spec(name)

    def has_family(self, name: str) -> bool:
        """Return whether name is meta or a column family of one of this database's stores."""
        return name == META_CF or any(name in s.column_families for s in self.specs.values())

    def set_state(self, state: PartitionState) -> None:
        """Move the partition to state (the runner does this as it restores and serves)."""
        log.debug("partition %s-%s: %s -> %s", self.topic, self.partition, self.state.value, state.value)
        self.state = state

    def mark_lost(self, first_offset: int, end_offset: int) -> None:
        """Record that Kafka deleted records [first_offset, end_offset) this database never applied (DATA_LOST)."""
        self.lost = (first_offset, end_offset)
        self.set_state(PartitionState.DATA_LOST)

    def not_queryable(self, where: str = "") -> StoreNotReadyError:
        """Return the error a read of this partition gets while it is not RUNNING (where: ' on <node>')."""
        name = f"{self.topic}-{self.partition}"
        if self.state is PartitionState.DATA_LOST and self.lost is not None:
            first, end = self.lost
            return DataLostError(
                f"partition {name}{where}: records {first}..{end - 1} were deleted from Kafka before they were "
                "applied (retention); restart the node with --rebuild-lost-partitions to rebuild it from the "
                "earliest offset",
                topic=self.topic,
                partition=self.partition,
                first_offset=first,
                end_offset=end,
            )
        if self.state is PartitionState.REPARTITIONED and self.repartitioned is not None:
            return RepartitionedError(
                repartitioned_message(self.topic, *self.repartitioned),
                topic=self.topic,
                built_for=self.repartitioned[0],
                found=self.repartitioned[1],
            )
        return StoreNotReadyError(f"partition {name} is {self.state.value}{where}", state=self.state.value)

    def mark_repartitioned(self, found: int) -> None:
        """Record that the topic now has found partitions, not the count the stores were built for."""
        self.repartitioned = (self.topic_partitions(), found)
        self.set_state(PartitionState.REPARTITIONED)

    def topic_partitions(self, declared: int | None = None) -> int:
        """Return the topic's partition count the stores are built for; the first call with declared records it.

        Raises RepartitionedError if declared differs from the recorded count (the app's topic was changed).
        """
        raw = self.meta(TOPIC_PARTITIONS_KEY)
        if raw is None:
            if declared is None:
                raise StateDirError(f"{self.topic}-{self.partition}: no partition count recorded yet")
            self.family(META_CF)[TOPIC_PARTITIONS_KEY] = encode_int64(declared)
            return declared
        built_for = decode_int64(raw)
        if declared is not None and declared != built_for:
            raise RepartitionedError(
                repartitioned_message(self.topic, built_for, declared),
                topic=self.topic,
                built_for=built_for,
                found=declared,
            )
        return built_for

    def committed_at(self) -> float | None:
        """Return the wall-clock time (time.time()) the last batch was committed, kept across restarts (None: never,
        or before this was kept)."""
        raw = self.meta(COMMITTED_AT_KEY)
        return None if raw is None else decode_int64(raw) / 1000

    def start_at(self, offset: int) -> None:
        """Make a database that applied nothing start at offset (the first one Kafka still holds)."""
        with self._write_lock:
            if self.next_offset() != 0:
                raise OffsetError(f"{self.topic}-{self.partition} has applied records; it cannot move its start")
            self.family(META_CF)[NEXT_OFFSET_KEY] = encode_int64(offset)
            self._version += 1

    def check_queryable(self) -> None:
        """Raise StoreNotReadyError unless the partition answers queries."""
        if self.state is not PartitionState.RUNNING:
            raise self.not_queryable()

    def meta(self, key: bytes) -> bytes | None:
        """Return the meta value stored under key."""
        value: bytes | None = self.family(META_CF).get(key)
        return value

    def multi_get(self, family: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """Return the values of keys in family, in key order, in one RocksDB multi-get."""
        if not keys:
            return []
        values: list[bytes | None] = self.family(family).get(list(keys))  # type: ignore[assignment]
        return values

    def counter(self, name: str) -> int:
        """Return the counter name kept in meta (late records, bad records, entries, …); 0 if never counted."""
        raw = self.meta(counter_key(name))
        return 0 if raw is None else decode_int64(raw)

    def _count_uncounted_stores(self) -> None:
        """Count the entries of every counted store that has no entry counter yet, and store the counts.

        Runs while the database is being opened, so no batch can write between the pass and the write.
        """
        batch = WriteBatch(raw_mode=True)
        for spec in self.specs.values():
            key = counter_key(entries_counter(spec.name))
            if spec.kind not in COUNTED_KINDS or self.meta(key) is not None:
                continue
            count = sum(1 for _ in self.family(spec.name).keys())
            if count:
                log.info("%s: counted %d entries in store %s", self, count, spec.name)
            batch.put(key, encode_int64(count), self.handle(META_CF))
        if not batch.is_empty():
            self.rdict.write(batch)

    def next_offset(self) -> int:
        """Return the offset of the first record not yet applied (0 for a new partition).

        Read from RocksDB once per write of it (every read of a query asks): kept with the version it was read at,
        and kept only if no write bumped the version while it was read.
        """
        version, known = self._version, self._next
        if known is not None and known[0] == version:
            return known[1]
        raw = self.meta(NEXT_OFFSET_KEY)
        found = 0 if raw is None else decode_int64(raw)
        if self._version == version:
            self._next = (version, found)
        return found

    def begin(self, start_offset: int, end_offset: int) -> PartitionTransaction | None:
        """Start applying records [start_offset, end_offset); None if they are applied already.

        Raises OffsetGapError if start_offset is past the next offset (records would be lost) and
        OffsetError if the range straddles it (the caller must drop the records already applied).
        """
        expected = self.next_offset()
        if end_offset <= expected:
            return None
        if start_offset > expected:
            raise OffsetGapError(
                f"{self.topic}-{self.partition}: batch starts at {start_offset}, next offset is {expected}"
            )
        if start_offset < expected:
            raise OffsetError(
                f"{self.topic}-{self.partition}: batch [{start_offset}, {end_offset}) overlaps applied "
                f"records; start it at {expected}"
            )
        return PartitionTransaction(self, start_offset, end_offset)

    def write(self, batch: WriteBatch, start_offset: int) -> None:
        """Write batch atomically if no other batch was applied since it began at start_offset."""
        with self._write_lock:
            if self.next_offset() != start_offset:
                raise OffsetError(f"{self.topic}-{self.partition}: another batch was applied since this one began")
            self.rdict.write(batch)
            self._version += 1
            self.applied_at = time.time()

    def entries(self) -> Iterator[tuple[str, bytes]]:
        """Yield (column family, key) of every entry, meta included."""
        families = {META_CF} | {cf for spec in self.specs.values() for cf in spec.column_families}
        for family in sorted(families):
            for key in self.family(family).keys():
                yield family, cast(bytes, key)  # raw mode: every key is bytes

    def write_restored(self, batch: WriteBatch) -> None:
        """Write batch atomically as it came from the changelog (``stores.changelog``): whole batches of another
        writer's, whatever the next offset is now; then tell the views holding state in memory to drop it."""
        with self._write_lock:
            self.rdict.write(batch)
            self._version += 1
            self.applied_at = time.time()
        for listener in list(self._restored_listeners):
            listener()

    def on_restored(self, listener: Callable[[], None]) -> None:
        """Call listener after every write_restored (a view that keeps state in memory reloads it)."""
        self._restored_listeners.append(listener)

    def close(self) -> None:
        """Close the database, dropping every handle so that the directory can be reopened."""
        if self._db is None:
            return
        self._families.clear()
        self._handles.clear()
        db, self._db = self._db, None
        self._version += 1  # a closed database's next offset is not known: next_offset() raises as any read does
        db.close()
        self.state = PartitionState.CLOSED

    def delete(self) -> None:
        """Close the database and remove its directory."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


Hook = Callable[[], None]


class PartitionTransaction:
    """The writes of one batch into one partition database, committed with the new offset at once.

    Reads through the transaction see its own pending writes, so merges within a batch compose.
    """

    def __init__(self, db: PartitionDB, start_offset: int, end_offset: int) -> None:
        self.db = db
        self.start_offset = start_offset
        self.end_offset = end_offset
        self._batch = WriteBatch(raw_mode=True)
        self._pending: dict[str, dict[bytes, bytes | None]] = {}
        self._before_commit: list[Hook] = []
        self._after_abort: list[Hook] = []
        self._done = False
        #: Called with the transaction once its every write is in, before the local write (the changelog's send:
        #: ``streaming.changelog``); what it raises aborts the transaction.
        self.publish: Callable[[PartitionTransaction], None] | None = None

    def __enter__(self) -> PartitionTransaction:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def multi_get(self, family: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """Return the values of keys in family, pending writes first."""
        pending = self._pending.get(family)
        if not pending:
            return self.db.multi_get(family, keys)
        missing = [k for k in keys if k not in pending]
        stored = dict(zip(missing, self.db.multi_get(family, missing), strict=True))
        return [pending[k] if k in pending else stored[k] for k in keys]

    def put(self, family: str, key: bytes, value: bytes) -> None:
        """Write value under key in family when the transaction commits."""
        self._batch.put(key, value, self.db.handle(family))
        self._pending.setdefault(family, {})[key] = value

    def put_many(self, family: str, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Write every (key, value) of items in family when the transaction commits."""
        handle = self.db.handle(family)
        pending = self._pending.setdefault(family, {})
        put = self._batch.put
        for key, value in items:
            put(key, value, handle)
            pending[key] = value

    def changes(self) -> dict[str, dict[bytes, bytes | None]]:
        """Return the writes so far, per column family: key -> new value (None: deleted)."""
        return self._pending

    def delete(self, family: str, key: bytes) -> None:
        """Delete key from family when the transaction commits."""
        self._batch.delete(key, self.db.handle(family))
        self._pending.setdefault(family, {})[key] = None

    def delete_many(self, family: str, keys: Iterable[bytes]) -> None:
        """Delete every key of keys from family when the transaction commits."""
        handle = self.db.handle(family)
        pending = self._pending.setdefault(family, {})
        delete = self._batch.delete
        for key in keys:
            delete(key, handle)
            pending[key] = None

    def increment(self, counter: str, amount: int) -> None:
        """Add amount to counter (see PartitionDB.counter) when the transaction commits."""
        key = counter_key(counter)
        raw = self.multi_get(META_CF, [key])[0]
        self.put(META_CF, key, encode_int64((0 if raw is None else decode_int64(raw)) + amount))

    def before_commit(self, hook: Hook) -> None:
        """Run hook just before the batch is written (a view flushing what it buffered)."""
        self._before_commit.append(hook)

    def after_abort(self, hook: Hook) -> None:
        """Run hook if the transaction is abandoned or its write fails (a view dropping its changes)."""
        self._after_abort.append(hook)

    def commit(self) -> None:
        """Write every change and the new next offset in one atomic batch."""
        if self._done:
            raise OffsetError("transaction already finished")
        try:
            for hook in self._before_commit:
                hook()
            self.put(META_CF, NEXT_OFFSET_KEY, encode_int64(self.end_offset))
            self.put(META_CF, COMMITTED_AT_KEY, encode_int64(int(time.time() * 1000)))
            if self.publish is not None:
                self.publish(self)
            self.db.write(self._batch, self.start_offset)
        except BaseException:
            self.abort()
            raise
        self._done = True

    def abort(self) -> None:
        """Drop every change; the database keeps the state of the last committed batch."""
        self._done = True
        for hook in self._after_abort:
            hook()
