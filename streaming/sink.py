"""The foreachBatch sink: partial aggregates from Spark merged into the partition databases.

For each micro-batch of one topic: drop records the stores have applied already (offset below the
partition's next offset), decode, compute every store's partials in Spark, bring them to the driver in
one Arrow transfer, and merge each partition's share into its database in ONE WriteBatch together with
its new next offset (invariant 1): each store's view applies its share as its kind does (the write protocol,
``stores.writes``; a ranking after the store it ranks). Bad records are counted per store, logged with
topic/partition/offset and sent to the dead-letter topic when one is configured (before the commit: at least once
there).
For the co-partitioned stores, each partition's distinct keys of the batch are sorted by which
partitioner explains their arrival partition (murmur2 only, CRC32 only, both, neither) and counted in
the same transaction (``partitioner.EVIDENCE_COUNTERS``): that is how routing detects the producers'
partitioner per topic. Records whose key the configured partitioner would send to another partition
(under "auto": neither would) are counted (``misrouted:<store>``) and warned about: routing could not
find them (invariant 4). Both hashes of a key are computed once and cached. A table topic's stores
take each key's last change of the batch: a value replaces the stored one, a tombstone deletes the key
(and its count) in the same WriteBatch. An optional observer hears
what each applied batch did (BatchReport: duration, records, bad records per store), e.g. the node's
metrics. With a change feed (``streaming.change_feed``), each partition's batch publishes, once committed,
the new states of the keys someone watches: key-value states as the merge returns them; windows and ranking
entries read from the transaction's own writes before and after their merge (their views do not return them),
so only the watched keys are read, and only while someone watches.

Each partition's stored next offset moves to where the source READ UP TO in the batch (its end offset), not only
past the batch's last record: a log that ends in offsets holding no record — a transaction's control marker, an
aborted transaction's records, a tombstone the log cleaner purged — would otherwise never reach its end offset
(and its partition would stay RESTORING). The end offsets are Spark's own, from the query's offset log
(`OffsetLog`: ``<checkpoint>/offsets/<batchId>``, written before the batch runs); a partition the source read
but that brought no record gets a WriteBatch with only its new offset. Exactly once stays: records below the
stored offset are dropped, and a slice commits only when it begins at the stored offset (``PartitionDB.begin``).
"""

from __future__ import annotations

import base64
import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
from pyspark.sql import functions as F

from iqgraph.stores import OffsetGapError, PartitionStores, PartitionTransaction, store_class
from iqgraph.stores.writes import StorePartials
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.change_set import ChangeSet, Interest, rank_entry
from iqgraph.streaming.changelog import ChangelogWriter
from iqgraph.streaming.dead_letter import DeadLetterQueue
from iqgraph.streaming.decode import Decoder, value_schema
from iqgraph.streaming.definitions import App, StoreDefinition, Topic
from iqgraph.streaming.joins import HostedTables, TableSnapshots
from iqgraph.streaming.offset_log import BatchOffsets, OffsetLog
from iqgraph.streaming.partials import PartialsPlan
from iqgraph.streaming.partitioner import (
    EVIDENCE_COUNTERS,
    Placement,
    evidence_of,
    explained,
    placement,
    serialize_key,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class BatchFailureEcho(logging.Filter):
    """Drop Py4J's "exception while executing the Python Proxy" record (a traceback) of an exception a sink's batch
    raised: Spark fails the query with it, and the supervisor says so in one line (`app.supervisor`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        tb = record.exc_info[2] if record.exc_info else None
        while tb is not None:
            if tb.tb_frame.f_code is StoreSink.__call__.__code__:
                return False
            tb = tb.tb_next
        return True


_UNWATCHED: AbstractContextManager[Interest] = nullcontext({})
_NO_CHANGES = ChangeSet({})  # watches no store: nothing is ever recorded into it
_NONE: Mapping[bytes, Any] = {}  # a store no batch changed yet (never written to)


@dataclass
class PartitionBatch:
    """What one batch brings to one partition, parsed from the partials table."""

    first_offset: int = -1
    last_offset: int = -1
    #: per store: (key, window start, partial state, records, position: the offset of its last record)
    partials: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    late: dict[str, int] = field(default_factory=dict)
    stream_time: dict[str, int] = field(default_factory=dict)
    bad: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch of a topic did, as the sink's observer hears it."""

    topic: str
    duration_s: float  # Spark job and merge
    records: int  # offsets applied, over every partition (= records, unless compaction left gaps)
    bad: Mapping[str, int]  # bad records counted, per store


BatchObserver = Callable[[BatchReport], None]


@dataclass
class Applied:
    """What apply() merged: records (offsets) and bad records per store, of slices not applied before."""

    records: int = 0
    bad: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _parse(table: pa.Table) -> dict[int, PartitionBatch]:
    columns = [table.column(name).to_pylist() for name in table.schema.names]
    batches: dict[int, PartitionBatch] = defaultdict(PartitionBatch)
    for kind, store, partition, key, window_start, partial, records, position in zip(*columns, strict=True):
        batch = batches[partition]
        if kind == "p":
            batch.partials[store].append((key, window_start, orjson.loads(partial)[0], records, position))
        elif kind == "off":
            first = window_start if batch.first_offset < 0 else min(batch.first_offset, window_start)
            batch.first_offset, batch.last_offset = first, max(batch.last_offset, records)
        elif kind == "late":
            batch.late[store] = batch.late.get(store, 0) + records
        elif kind == "st":
            batch.stream_time[store] = max(batch.stream_time.get(store, window_start), window_start)
        else:
            batch.bad.append((store, orjson.loads(partial)))
    return batches


class StoreSink:
    """foreachBatch target of one topic's streaming query on one node."""

    def __init__(
        self,
        app: App,
        topic: Topic,
        partitions: Mapping[int, PartitionStores],
        dead_letters: DeadLetterQueue | None = None,
        on_commit: Callable[[int, int], None] | None = None,
        tasks: int = 2,
        observer: BatchObserver | None = None,
        tables: HostedTables | None = None,
        change_feed: ChangeFeed | None = None,
        offset_log: OffsetLog | None = None,
        changelog: ChangelogWriter | None = None,
        logged: Iterable[int] | None = None,
    ) -> None:
        """Args:
        tables: the partitions this node hosts of a topic, now: where joined tables are read (streaming.joins).
        change_feed: where each partition's committed changes are published, for the stores someone watches.
        offset_log: the query's offset log, where each batch's end offsets are read (None: offsets move past the
            last record of each partition's slice only).
        changelog: where each partition's batch is sent, in one transaction, before it is written locally.
        logged: the partitions whose batches go to changelog (this node's active copies; None: every partition).
        """
        self.app = app
        self.topic = topic
        self.partitions = partitions
        self.stores = app.stores_of(topic.name)
        self.dead_letters = dead_letters
        self.on_commit = on_commit
        self.tasks = tasks
        self.observer = observer
        self.change_feed = change_feed
        self.offset_log = offset_log
        self.changelog = changelog
        self.logged = None if logged is None else frozenset(logged)
        self._decoder: Decoder | None = None  # built on the first batch, as the partials plan
        self._plan = PartialsPlan(self.stores, self.tasks)
        self._placements: dict[Any, Placement] = {}  # key -> where each partitioner puts it
        self._lock = threading.Lock()
        self.stopping = False
        self._tables = TableSnapshots(app, tables or (lambda topic: {}), lambda: self.stopping)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Apply one micro-batch (Spark's foreachBatch calls this on the driver)."""
        with self._lock:
            started = time.perf_counter()
            try:
                table = self.partials(batch)
            except Exception:
                if not self.stopping:
                    raise
                # The query is being stopped and Spark cancelled this batch's job: nothing was written,
                # the stores' offsets still say where to resume.
                log.info("batch %d of %s abandoned: the query is stopping", batch_id, self.topic.name)
                return
            computed = time.perf_counter()
            read = self.offset_log.batch(batch_id) if self.offset_log is not None else None
            batches = _parse(table) if table.num_rows else {}
            applied = self.apply(batches, read) if batches or read is not None else Applied()
            if self.observer is not None:
                duration = time.perf_counter() - started
                self.observer(BatchReport(self.topic.name, duration, applied.records, dict(applied.bad)))
            log.info(
                "batch %d of %s: %d partial rows, spark %.0f ms, merge %.0f ms",
                batch_id,
                self.topic.name,
                table.num_rows,
                (computed - started) * 1000,
                (time.perf_counter() - computed) * 1000,
            )

    def partials(self, batch: DataFrame) -> pa.Table:
        """Return the batch's partial aggregates as one Arrow table (see streaming.partials)."""
        if self._decoder is None:
            self._decoder = Decoder(self.topic, value_schema(self.topic))
        next_offsets = {p: s.db.next_offset() for p, s in self.partitions.items()}
        fresh = (
            batch.where(
                F.col("offset")
                >= F.create_map(*[F.lit(x) for kv in next_offsets.items() for x in kv])[F.col("partition")]
            )
            if next_offsets
            else batch.limit(0)
        )
        decoded = self._decoder(fresh)
        # The wide projection reads the batch once; a store with a transform or join reads it once more (its own
        # rows): then the decoded batch is cached, not read from Kafka and decoded twice.
        cached = any(store.own_rows for store in self.stores)
        if cached:
            decoded = decoded.persist()
        try:
            stream_times = {store.name: self._stream_times(store) for store in self.stores}
            joins = self._tables.joins(batch.sparkSession, self.stores, self.partitions)  # the tables, as of now
            return self._plan.frame(decoded, stream_times, joins).toArrow()
        finally:
            if cached:
                decoded.unpersist()

    def _stream_times(self, store: StoreDefinition) -> dict[int, int]:
        if not store_class(store.kind).windowed:
            return {}
        times = {p: s.window(store.name).stream_time() for p, s in self.partitions.items()}
        return {p: t for p, t in times.items() if t is not None}

    def apply(self, batches: Mapping[int, PartitionBatch], read: BatchOffsets | None = None) -> Applied:
        """Merge each partition's share of a batch into its database, with its offsets, atomically.

        read: where the batch's source read each partition (the offset log): a partition's next offset moves to its
        end offset there, past offsets that hold no record, even in a partition that brought no record.
        """
        applied = Applied()
        ends = read.ends if read is not None else {}
        for partition in sorted(set(batches) | set(ends)):
            batch = batches.get(partition) or PartitionBatch()
            stores = self.partitions.get(partition)
            if stores is None or (batch.last_offset < 0 and partition in batches):
                log.warning("%s-%s: batch for a partition this node does not own", self.topic.name, partition)
                continue
            start = stores.db.next_offset()
            end = self._end(partition, start, batch, read)
            if end <= start:
                continue  # applied already (a replay), or nothing read
            tx = stores.db.begin(start, end)
            if tx is None:
                continue
            if self.changelog is not None and (self.logged is None or partition in self.logged):
                tx.publish = functools.partial(self.changelog.publish, partition, stop=lambda: self.stopping)
            if batch.last_offset < 0:  # offsets without a record (markers, aborted or compacted away): the offset
                tx.commit()  # alone, in its own WriteBatch
                self._committed(partition, end, None)
                continue
            if batch.first_offset > start:
                log.info(
                    "%s-%s: offsets %s..%s absent (compaction or control records)",
                    self.topic.name,
                    partition,
                    start,
                    batch.first_offset - 1,
                )
            with self._watching() as interest:  # a subscription's snapshot waits for this batch (settle)
                changes = ChangeSet(interest) if interest else _NO_CHANGES
                with tx:
                    bad = self._merge(tx, stores, partition, batch, changes)
                self._committed(partition, end, changes)
            applied.records += batch.last_offset + 1 - max(start, batch.first_offset)
            for store, count in bad.items():
                applied.bad[store] += count
        return applied

    def _end(self, partition: int, start: int, batch: PartitionBatch, read: BatchOffsets | None) -> int:
        """Return the next offset of partition after this batch: where its source read up to, when that is known."""
        after_records = batch.last_offset + 1
        end = read.ends.get(partition) if read is not None else None
        if read is None or end is None:
            return after_records
        if end < after_records:
            log.warning(
                "%s-%s: the offset log ends the batch at %s but it has records up to %s: the log is ignored",
                self.topic.name,
                partition,
                end,
                batch.last_offset,
            )
            return after_records
        began = read.starts.get(partition) if read.starts is not None else None
        if began is not None and began > start and end > start:
            raise OffsetGapError(
                f"{self.topic.name}-{partition}: the batch read from offset {began} but the next offset to apply is "
                f"{start}: offsets {start}..{began - 1} were never read"
            )
        return end

    def _committed(self, partition: int, end: int, changes: ChangeSet | None) -> None:
        """Tell the change feed (its watched changes) and on_commit that partition is applied up to end."""
        if changes is not None and changes is not _NO_CHANGES and self.change_feed is not None:
            self.change_feed.publish(self.topic.name, partition, end, changes.ordered())
        if self.on_commit is not None:
            self.on_commit(partition, end)

    def _watching(self) -> AbstractContextManager[Interest]:
        return _UNWATCHED if self.change_feed is None else self.change_feed.writing(self.topic.name)

    def _merge(
        self,
        tx: PartitionTransaction,
        stores: PartitionStores,
        partition: int,
        batch: PartitionBatch,
        changes: ChangeSet = _NO_CHANGES,
    ) -> dict[str, int]:
        bad = self._record_bad(tx, partition, batch.bad)
        keyed = [(store, self._keys(store, batch.partials.get(store.name, []))) for store in self.stores]
        self._check_partitions(tx, partition, batch, [(s, keys) for s, keys in keyed if s.co_partitioned])
        merged: dict[str, Mapping[bytes, Any]] = {}  # each store's new states, for the rankings of it
        for store, keys in sorted(keyed, key=_ranked_last):  # a ranking after the store it ranks
            items = batch.partials.get(store.name, [])
            partials = StorePartials(
                keys,
                items,
                _positions(batch, items),
                table=self.topic.table,
                stream_time=batch.stream_time.get(store.name),
                late=batch.late.get(store.name, 0),
                ranks=store.ranks,
                group=store.group,
                ranked=merged.get(store.ranks, _NONE) if store.ranks is not None else _NONE,
                rank_change=rank_entry,
            )
            merged[store.name] = stores.store(store.name).apply(tx, partials, changes)
        return bad

    def _keys(self, store: StoreDefinition, items: list[tuple[Any, int | None, Any, int]]) -> list[Any]:
        if store.resolved_key_type(self.topic) == "int":
            return [int(it[0]) for it in items]
        return [it[0] for it in items]

    def _check_partitions(
        self,
        tx: PartitionTransaction,
        partition: int,
        batch: PartitionBatch,
        keyed: list[tuple[StoreDefinition, list[Any]]],
    ) -> None:
        placements = {key: self._placement(key) for _, keys in keyed for key in keys}
        evidence = evidence_of(placements.values(), partition)
        for field_name, counter in EVIDENCE_COUNTERS.items():
            if amount := getattr(evidence, field_name):
                tx.increment(counter, amount)
        partitioner = self.app.kafka.partitioner
        for store, keys in keyed:
            items = batch.partials.get(store.name, [])
            misrouted = sum(
                item[3]
                for key, item in zip(keys, items, strict=True)
                if not explained(placements[key], partition, partitioner)
            )
            if misrouted:
                tx.increment(f"misrouted:{store.name}", misrouted)
                log.warning(
                    "store %s: %d records on %s-%d have keys %s there; queries cannot find them",
                    store.name,
                    misrouted,
                    self.topic.name,
                    partition,
                    "neither murmur2 nor CRC32 puts"
                    if partitioner == "auto"
                    else f"the {partitioner} partitioner does not put",
                )

    def _placement(self, key: Any) -> Placement:
        where = self._placements.get(key)
        if where is None:
            if len(self._placements) > 1_000_000:
                self._placements.clear()
            where = self._placements[key] = placement(serialize_key(key, self.topic.key_format), self.topic.partitions)
        return where

    def _record_bad(
        self, tx: PartitionTransaction, partition: int, bad: list[tuple[str | None, dict[str, Any]]]
    ) -> dict[str, int]:
        counted: dict[str, int] = defaultdict(int)
        lettered: set[Any] = set()  # a record bad for several stores is dead-lettered once
        for store_name, info in bad:
            targets = [store_name] if store_name else [s.name for s in self.stores]
            for name in targets:
                tx.increment(f"bad:{name}", 1)
                counted[name] += 1
            log.warning(
                "bad record %s-%s@%s: %s (stores: %s)",
                self.topic.name,
                partition,
                info["offset"],
                info["error"],
                ", ".join(targets),
            )
            if self.dead_letters is not None and info["offset"] not in lettered:
                lettered.add(info["offset"])
                key = base64.b64decode(info["key"]) if info.get("key") else None
                value = base64.b64decode(info["value"]) if info.get("value") else None
                self.dead_letters.send(key, value, info["error"], (self.topic.name, partition, info["offset"]))
        if bad and self.dead_letters is not None:
            self.dead_letters.flush()
        return counted


def _positions(batch: PartitionBatch, items: list[tuple[Any, ...]]) -> list[int]:
    """Return each partial's position: the offset of its last record (a partial built without one — by hand, in a
    test — stands at the batch's last offset)."""
    return [it[4] if len(it) > 4 and it[4] is not None else batch.last_offset for it in items]


def _ranked_last(keyed: tuple[StoreDefinition, list[Any]]) -> bool:
    return keyed[0].ranks is not None


logging.getLogger("py4j.clientserver").addFilter(BatchFailureEcho())
