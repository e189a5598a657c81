"""The query runner: one streaming query per input topic over the partitions this node owns.

Start offsets come from the stores (each partition database's next offset), not from a Spark
checkpoint: every start uses a fresh checkpoint, so a partition newly owned by this node starts where
its store ends (0 if it never had it). A partition is RESTORING until it has applied everything that
was in the topic when it was opened (its last stable offset), then RUNNING (queryable).

The source is Spark's own Kafka connector by default (``RunnerSettings(source="kafka")``: its jars come
with the session, ``streaming.session``), reading exactly the owned partitions (``assign``) from the
stores' offsets, committed records only (``read_committed``); ``source="iqkafka"`` selects the Python Data
Source over confluent-kafka (``streaming.kafka_source``) instead. The query's checkpoint holds Spark's
offset log, where the sink reads how far each batch read every partition (``streaming.sink.OffsetLog``).

With changelogs (``RunnerSettings(changelog=True)``, the default; ``streaming.changelog``), a partition this node
is the active copy of takes its changelog partition over (fencing the previous writer), restores what it lacks from
it (all of it on an empty state dir), and only then reads the input topic, from the offset the changelog's last
batch recorded; each of its batches goes to the changelog in one transaction before the local write. A partition
this node hosts as a standby (``role``) runs no pipeline: the ``ChangelogFollower`` applies its changelog. A
standby promoted to active keeps serving while it takes over. Global tables keep no changelog: every node reads
them whole from their own (compacted) topic.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from py4j.protocol import Py4JError
from pyspark.errors import StreamingQueryException

from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.stores.changelog import BATCH_END_KEY, apply_records, changelog_next
from iqgraph.stores.codecs import encode_int64
from iqgraph.streaming.apache_kafka import FETCH_COMMAND, SPARK_KAFKA_VERSION, JarsError
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.changelog import ChangelogFollower, Changelogs, ensure_changelog_topics
from iqgraph.streaming.dead_letter import DeadLetterQueue
from iqgraph.streaming.definitions import App
from iqgraph.streaming.kafka_client_config import java_consumer_options
from iqgraph.streaming.kafka_offsets import KafkaOffsets
from iqgraph.streaming.kafka_source import KafkaDataSource
from iqgraph.streaming.sink import BatchObserver, OffsetLog, StoreSink, mark_running_when_caught_up
from iqgraph.streaming.topic_config import tombstone_retention_s

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader, StreamingQuery

log = logging.getLogger(__name__)

STOP_AFTER_BATCH_S = 20.0  # how long a stop waits for the batches in flight before it interrupts them
_TERMINATED = "org.apache.spark.sql.execution.streaming.runtime.TERMINATED$"  # the state Spark's loop ends on

Assignment = Mapping[str, Iterable[int]]


class QueryStoppedError(RuntimeError):
    """A streaming query is no longer active though nobody stopped it."""


@dataclass(frozen=True)
class RunnerSettings:
    """How the streaming queries run."""

    bootstrap_servers: str
    kafka_config: Mapping[str, str] | None = None
    producer_config: Mapping[str, str] | None = None
    max_records_per_batch: int = 200_000
    trigger_interval: str = "0 seconds"
    source: str = "kafka"  # Spark's JVM connector (its jars in the session), or "iqkafka": the Python Data Source
    rebuild_lost: bool = False  # rebuild a partition whose unapplied records Kafka deleted (else: DATA_LOST)
    changelog: bool = True  # batches go to the changelog topics; copies restore from them
    # standbys apply the changelog instead of running the pipeline (False: they run it, writing nothing to it)
    follow_changelog: bool = False

    def __post_init__(self) -> None:
        if self.source not in ("iqkafka", "kafka"):
            raise ValueError(f"source must be 'iqkafka' (ours) or 'kafka' (Spark's JVM connector), not {self.source!r}")
        if self.source == "kafka":  # a setting the JVM client cannot take fails now, in one line, not at a query
            java_consumer_options({**(self.kafka_config or {}), "bootstrap.servers": self.bootstrap_servers})


#: How long the broker may hold a fetch of the JVM source's consumers while it waits for more records (the Java
#: client's default is 500 ms). Each read task leaves its consumer's next fetch waiting at the log end, and the
#: next batch's read of that partition waited for it: at light load (20 records/s) a batch's Spark work took
#: 0.7-0.8 s, 0.19-0.26 s with 10 ms (bench/ingest.py A/B, docs/benchmarks.md). The user's own setting wins.
FETCH_MAX_WAIT_MS = 10


def source_options(
    settings: RunnerSettings, topic: str, owned: list[int], starting: Mapping[int, int]
) -> dict[str, str]:
    """Return the reader options for the configured Kafka source over the owned partitions of topic."""
    client = {**(settings.kafka_config or {}), "bootstrap.servers": settings.bootstrap_servers}
    if settings.source == "kafka":  # the JVM client's names for librdkafka's (SASL, SSL, …)
        options = {"kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS)}
        options |= {f"kafka.{k}": str(v) for k, v in java_consumer_options(client).items()}
        return options | {
            # committed records only, and batch ends at the last stable offset (Spark lists offsets with this
            # isolation level too): an open transaction's records are never read, an aborted one's never applied
            "kafka.isolation.level": "read_committed",
            "assign": json.dumps({topic: owned}),
            "startingOffsets": json.dumps({topic: {str(p): starting[p] for p in owned}}),
            # a cap on the OFFSETS of a batch over all owned partitions (Spark splits it by each one's backlog)
            "maxOffsetsPerTrigger": str(settings.max_records_per_batch),
            # fail when offsets to read are gone (below the log start: retention, a deleted topic); offsets
            # that hold no record (control markers, aborted records, compacted away) are skipped, not loss
            "failOnDataLoss": "true",
        }
    options = {f"kafka.{k}": str(v) for k, v in client.items()}
    return options | {
        "topic": topic,
        "partitions": ",".join(map(str, owned)),
        "startingOffsets": json.dumps({str(p): starting[p] for p in owned}),
        "maxRecordsPerBatch": str(settings.max_records_per_batch),
    }


def _end_after_batch(spark: SparkSession, query: StreamingQuery) -> bool:
    """Ask an active query's thread to end once its micro-batch in flight is done; return whether it was asked.

    StreamingQuery.stop() interrupts the thread wherever it is: in a checkpoint write (Hadoop forks chmod and
    logs the interrupted join with a Java stack trace), in a Spark job (its tasks logged as lost), in a call
    to the Python source's worker. Spark has no public call to stop between batches, but its batch loop ends
    by itself once the query's state says TERMINATED, which stop() sets before it interrupts: set only that.
    """
    try:
        state = query._jsq.streamingQuery().state()
        if state.get().toString() != "ACTIVE":
            return False
        terminated = spark._jvm.java.lang.Class.forName(_TERMINATED).getField("MODULE$").get(None)  # type: ignore[union-attr]
        return bool(state.compareAndSet(state.get(), terminated))
    except Py4JError:  # another Spark's internals: stop() alone, as before
        log.info("query %s: cannot end it between batches; stopping it at once", query.name, exc_info=True)
        return False


def _await_end(query: StreamingQuery, deadline: float) -> None:
    """Wait until query's thread has finished its batch in flight and ended, at most until deadline."""
    try:
        query.awaitTermination(max(deadline - time.monotonic(), 0.1))  # type: ignore[arg-type] # seconds, a float
    except StreamingQueryException as exc:  # it died in its last batch: a stop hides nothing from anyone now
        log.info("query %s ended with: %s", query.name, exc)


def _connector_missing(error: BaseException) -> bool:
    """Return whether error is Spark's "data source kafka not found" (no connector jar on the classpath)."""
    text = str(error)  # Spark 4: [_LEGACY_ERROR_TEMP_1140] Failed to find data source: kafka. Please deploy ...
    return "kafka" in text.lower() and ("_LEGACY_ERROR_TEMP_1140" in text or "Failed to find data source" in text)


@dataclass(frozen=True)
class PartitionStatus:
    """One owned partition: its state, the offset applied up to, the topic's end, and the lag."""

    topic: str
    partition: int
    state: str
    applied_offset: int
    end_offset: int

    @property
    def lag(self) -> int:
        """Return how many records the store is behind the topic."""
        return max(self.end_offset - self.applied_offset, 0)


class StreamRunner:
    """Run, restart and report the streaming queries that keep one node's stores."""

    def __init__(
        self,
        app: App,
        spark: SparkSession,
        state_dir: StateDirectory,
        settings: RunnerSettings,
        observer: BatchObserver | None = None,
        change_feed: ChangeFeed | None = None,
        role: Callable[[str, int], str] | None = None,
    ) -> None:
        """Args:
        change_feed: where every sink publishes its committed changes (the node's, kept across restarts).
        role: "active" or "standby" of a hosted partition (None: this node is the active copy of all it hosts).
        """
        self.app = app
        self.observer = observer  # hears every applied micro-batch (e.g. the node's metrics)
        self.change_feed = change_feed
        self.spark = spark
        self.state_dir = state_dir
        self.settings = settings
        self.partitions: dict[str, dict[int, PartitionStores]] = {}
        self._targets: dict[tuple[str, int], int] = {}
        self._queries: list[StreamingQuery] = []
        self._sinks: list[StoreSink] = []
        self._checkpoints: list[Path] = []
        self._offsets: dict[str, KafkaOffsets] = {}
        self._dead_letter_queue: DeadLetterQueue | None = None
        self._lock = threading.RLock()
        self.role = role or (lambda topic, partition: "active")
        producing = {**self._client_config(), **(settings.producer_config or {})}
        self.changelogs = Changelogs(producing, app.name) if settings.changelog else None
        self.follower = ChangelogFollower(self.changelogs) if self.changelogs is not None else None
        self._changelogs_made = False
        spark.dataSource.register(KafkaDataSource)

    def _client_config(self) -> dict[str, str]:
        return {**(self.settings.kafka_config or {}), "bootstrap.servers": self.settings.bootstrap_servers}

    def offsets(self, topic: str) -> KafkaOffsets:
        """Return the long-lived offsets client of topic."""
        if topic not in self._offsets:
            self._offsets[topic] = KafkaOffsets(self._client_config(), topic)
        return self._offsets[topic]

    def logged(self, topic: str) -> bool:
        """Return whether topic's stores keep a changelog (on, and not a global table)."""
        return self.changelogs is not None and not self.app.topic(topic).global_table

    def followed(self, topic: str, partition: int) -> bool:
        """Return whether this node keeps partition by following its changelog (a standby's copy)."""
        return self.settings.follow_changelog and self.writes_changelog(topic, partition) is False

    def writes_changelog(self, topic: str, partition: int) -> bool | None:
        """Return whether this node writes partition's changelog (its active copy); None: topic keeps none."""
        if not self.logged(topic):
            return None
        return self.role(topic, partition) == "active"

    def start(self, assignment: Assignment) -> None:
        """Open the assigned partitions' databases and start one query per topic over the ones it is active for."""
        with self._lock:
            if self.changelogs is not None and not self._changelogs_made:
                ensure_changelog_topics(self.changelogs.config, self.app)
                self._changelogs_made = True
            owned = {t.name: sorted(set(assignment.get(t.name, ()))) for t in self.app.topics}
            owned = {topic: partitions for topic, partitions in owned.items() if partitions}
            active = {topic: [p for p in ps if not self.followed(topic, p)] for topic, ps in owned.items()}
            for topic, partitions in owned.items():  # every topic's partitions open before any query runs: a
                self._follow(topic, [p for p in partitions if p not in active[topic]])  # join's first batch finds
                self._open(topic, active[topic])  # its table's partitions (streaming.joins)
            for topic, partitions in active.items():
                readable = [p for p in partitions if self.partitions[topic][p].db.state is not PartitionState.DATA_LOST]
                if readable:
                    self._queries.append(self._start_query(topic, readable))

    def _follow(self, topic: str, followed: list[int]) -> None:
        """Open the standby copies of topic's partitions followed, each kept by the changelog follower."""
        if not followed:
            return
        assert self.follower is not None and self.changelogs is not None  # noqa: S101 - followed() says so
        open_now = self.partitions.setdefault(topic, {})
        already = set(self.follower.followed())
        writer = self.changelogs.writer(topic)
        ends = self.offsets(topic).latest(followed)
        tail_ok = self._tail_readable(topic, [p for p in followed if p not in open_now and (topic, p) not in already])
        for partition in followed:
            writer.release(partition)  # an active copy demoted: it writes the changelog no more
            if (topic, partition) in already:
                continue
            stores = open_now.get(partition) or tail_ok(self.state_dir.open(topic, partition, self.app.specs(topic)))
            open_now[partition] = stores
            stores.db.topic_partitions(self.app.topic(topic).partitions)
            self.follower.follow(topic, stores, ends[partition])

    def _open(self, topic: str, owned: list[int]) -> None:
        open_now = self.partitions.setdefault(topic, {})
        ends = self.offsets(topic).latest(owned)
        earliest = self.offsets(topic).earliest(owned)
        horizon = tombstone_retention_s(self._client_config(), topic) if self.app.topic(topic).table else None
        kept_before = {partition: open_now.get(partition) for partition in owned}
        tail_ok = self._tail_readable(topic, [p for p in owned if kept_before[p] is None])
        for partition in owned:
            if self.follower is not None:
                self.follower.release(topic, partition)  # a standby promoted: the pipeline keeps it from now on
            stores = open_now.get(partition) or tail_ok(self.state_dir.open(topic, partition, self.app.specs(topic)))
            open_now[partition] = stores
            stores.db.topic_partitions(self.app.topic(topic).partitions)  # refuses stores built for another count
        self._restore(topic, {partition: open_now[partition] for partition in owned})
        for partition in owned:
            kept, stores = kept_before[partition], open_now[partition]
            if kept is None and horizon is not None:  # after the restore: a changelog last written before the
                stores = self._tombstones_kept(stores, horizon)  # horizon may miss purged deletes as a disk may
            open_now[partition] = stores = self._from_log_start(stores, earliest[partition])
            stores.db.topic_partitions(self.app.topic(topic).partitions)  # recorded anew in rebuilt stores
            self._targets[(topic, partition)] = ends[partition]
            if stores.db.state is PartitionState.DATA_LOST:
                continue  # not read: what it holds can never be complete again
            if kept is stores and stores.db.state is PartitionState.RUNNING:
                continue  # kept through a reassignment: its data stays valid, it only pauses while the query restarts
            stores.db.set_state(PartitionState.RESTORING)
            mark_running_when_caught_up(stores, ends[partition])

    def _tail_readable(self, topic: str, partitions: list[int]) -> Callable[[PartitionStores], PartitionStores]:
        """Return a check for copies of topic's partitions opened from disk: one that last applied a changelog batch
        longer ago than half the time the changelog keeps tombstones (delete.retention.ms) while the changelog has
        batches past it is emptied, and restores the whole changelog: reading only the tail, it could miss deletes
        the cleaner purged since (a key deleted would stay, wrongly). A copy with nothing to read keeps its state."""
        if self.changelogs is None or not self.logged(topic) or not partitions:
            return lambda stores: stores
        changelogs = self.changelogs
        horizon = tombstone_retention_s(changelogs.config, changelogs.topic(topic))
        ends = changelogs.end_offsets(topic, partitions)

        def check(stores: PartitionStores) -> PartitionStores:
            db = stores.db
            position, committed = changelog_next(db), db.committed_at()
            if horizon is None or position == 0 or ends.get(db.partition, 0) <= position:
                return stores
            if committed is not None and time.time() - committed < horizon / 2:
                return stores
            log.warning(
                "%s-%s: its copy last applied a changelog batch %s ago, longer than half the time %s keeps "
                "tombstones (%.0f s): restoring the whole changelog so that no purged delete is missed",
                db.topic,
                db.partition,
                "an unknown time" if committed is None else f"{time.time() - committed:.0f} s",
                changelogs.topic(topic),
                horizon,
            )
            db.delete()
            return self.state_dir.open(db.topic, db.partition, self.app.specs(db.topic))

        return check

    def _restore(self, topic: str, opened: Mapping[int, PartitionStores]) -> None:
        """Take over (or let go of) each partition's changelog and restore the stores from it, the partitions at
        once: one's fetch, fence and RocksDB writes overlap another's (they were 6 restores end to end)."""
        if self.changelogs is None or not opened:
            return
        changelogs = self.changelogs

        def fence(partition: int) -> None:
            if self.writes_changelog(topic, partition):  # fence the last writer first (its open transaction is
                changelogs.writer(topic).take_over(partition)  # aborted, so the restore's end is its last batch)
            elif self.logged(topic):
                changelogs.writer(topic).release(partition)  # a standby running the pipeline writes none

        with ThreadPoolExecutor(max_workers=len(opened), thread_name_prefix=f"restore-{topic}") as pool:
            for fenced in [pool.submit(fence, partition) for partition in opened]:
                fenced.result()  # the first failure is raised, after every one ended
            if not self.logged(topic):
                return
            targets = changelogs.end_offsets(topic, sorted(opened))
            restores = [pool.submit(changelogs.restore, topic, opened[p], target=targets[p]) for p in opened]
            for done in restores:
                done.result()

    def _tombstones_kept(self, stores: PartitionStores, horizon_s: float) -> PartitionStores:
        """Return a table partition's stores, rebuilt from scratch if they stopped applying longer ago than the
        topic keeps tombstones (horizon_s): deletes purged since would be missed for good (streaming.topic_config).
        """
        committed = stores.db.committed_at()
        if stores.db.next_offset() == 0 or (committed is not None and time.time() - committed < horizon_s):
            return stores
        idle = "an unknown time" if committed is None else f"{time.time() - committed:.0f} s"
        log.warning(
            "%s-%s: table stores last applied %s ago, longer than the topic keeps tombstones (delete.retention.ms "
            "%.0f s): rebuilding from the earliest offset so that no purged delete is missed",
            stores.db.topic,
            stores.db.partition,
            idle,
            horizon_s,
        )
        return self._recreate(stores)

    def _recreate(self, stores: PartitionStores, start: int = 0) -> PartitionStores:
        """Delete a partition's stores and return new, empty ones in their place, reading the topic from start.

        With a changelog, the changelog is emptied too (a tombstone for every entry, in one transaction): a copy
        restored from it later must not find what the rebuild dropped.
        """
        db = stores.db
        reset = None
        if self.writes_changelog(db.topic, db.partition):
            assert self.changelogs is not None  # noqa: S101 - logged() says so
            reset = self.changelogs.writer(db.topic).reset(db, start)
        db.delete()
        rebuilt = self.state_dir.open(db.topic, db.partition, self.app.specs(db.topic))
        if reset is not None:
            apply_records(rebuilt.db, [(BATCH_END_KEY, encode_int64(start))], reset)
        elif start:
            rebuilt.db.start_at(start)
        return rebuilt

    def _from_log_start(self, stores: PartitionStores, first: int) -> PartitionStores:
        """Return the stores to read a partition into, given the first offset Kafka still holds (retention).

        A database that applied nothing starts there. One whose next offset Kafka deleted lost records
        [next, first): it is DATA_LOST (its reads fail with the range and what to do), or, with rebuild_lost,
        deleted and rebuilt from first (the lost range stays on it, for the metrics).
        """
        db = stores.db
        applied = db.next_offset()
        if applied >= first:
            return stores
        if db.lost is None and applied == 0:
            db.start_at(first)  # a new copy reads what the topic holds, as a consumer from the earliest offset
            return stores
        lost = db.lost or (applied, first)
        log.error(
            "%s-%s: Kafka deleted records %d..%d before this node applied them (retention)%s",
            db.topic,
            db.partition,
            lost[0],
            lost[1] - 1,
            ": rebuilding from the earliest offset"
            if self.settings.rebuild_lost
            else ": the partition answers DATA_LOST; restart with --rebuild-lost-partitions to rebuild it",
        )
        if not self.settings.rebuild_lost:
            db.mark_lost(*lost)
            return stores
        rebuilt = self._recreate(stores, first)
        rebuilt.db.lost = lost
        return rebuilt

    def _start_query(self, topic: str, owned: list[int]) -> StreamingQuery:
        stores = self.partitions[topic]
        starting = {p: stores[p].db.next_offset() for p in owned}
        checkpoint = Path(tempfile.mkdtemp(prefix=f"iqgraph-{self.app.name}-{topic}-"))
        self._checkpoints.append(checkpoint)
        sink = StoreSink(
            self.app,
            self.app.topic(topic),
            {p: stores[p] for p in owned},
            self._dead_letters(),
            self._committed(topic),
            observer=self.observer,
            tables=lambda table_topic: self.partitions.get(table_topic, {}),
            change_feed=self.change_feed,
            offset_log=OffsetLog(checkpoint / "offsets", topic, starting),
            changelog=self.changelogs.writer(topic) if self.changelogs is not None and self.logged(topic) else None,
            logged=[p for p in owned if self.writes_changelog(topic, p)],
        )
        self._sinks.append(sink)
        options = source_options(self.settings, topic, owned, starting)
        reader = self.spark.readStream.format(self.settings.source).options(**options)
        log.info("starting query on %s partitions %s from offsets %s", topic, owned, starting)
        return (
            self._load(reader)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=self.settings.trigger_interval)
            .queryName(f"iqgraph-{self.app.name}-{topic}")
            .start()
        )

    def _load(self, reader: DataStreamReader) -> DataFrame:
        """Return reader's stream; raise `JarsError` (one line) when Spark has no Kafka connector."""
        try:
            return reader.load()
        except Exception as exc:
            if self.settings.source == "kafka" and _connector_missing(exc):
                raise JarsError(
                    f"Spark's Kafka source is not in this Spark session: build it with "
                    f"iqgraph.streaming.session.build_spark_session (spark-sql-kafka-0-10 {SPARK_KAFKA_VERSION} "
                    f"jars, installed by `{FETCH_COMMAND}`) or add the connector to spark.jars"
                ) from exc
            raise

    def _dead_letters(self) -> DeadLetterQueue | None:
        topic = self.app.kafka.dead_letter_topic
        if topic is None:
            return None
        if self._dead_letter_queue is None:
            config = {**(self.settings.kafka_config or {}), **(self.settings.producer_config or {})}
            self._dead_letter_queue = DeadLetterQueue(self.settings.bootstrap_servers, topic, config)
        return self._dead_letter_queue

    def _committed(self, topic: str) -> Callable[[int, int], None]:
        def on_commit(partition: int, next_offset: int) -> None:
            stores = self.partitions.get(topic, {}).get(partition)
            if stores is not None:
                mark_running_when_caught_up(stores, self._targets.get((topic, partition), 0))

        return on_commit

    def stop_queries(self) -> None:
        """Stop every streaming query (stores stay open), each between two micro-batches when it can."""
        with self._lock:
            for sink in self._sinks:
                sink.stopping = True
            ending = [query for query in self._queries if _end_after_batch(self.spark, query)]
            deadline = time.monotonic() + STOP_AFTER_BATCH_S
            for query in self._queries:
                if query in ending:
                    _await_end(query, deadline)
                query.stop()  # interrupts a query still in a batch; else only Spark's clean-up
            self._queries.clear()
            self._sinks.clear()
            for checkpoint in self._checkpoints:
                shutil.rmtree(checkpoint, ignore_errors=True)
            self._checkpoints.clear()

    def reassign(self, assignment: Assignment) -> None:
        """Restart for a new assignment: close partitions no longer owned (their data stays on disk)."""
        with self._lock:
            self.stop_queries()
            for topic, open_now in self.partitions.items():
                keep = set(assignment.get(topic, ()))
                for partition in [p for p in open_now if p not in keep]:
                    if self.follower is not None:
                        self.follower.release(topic, partition)
                    if self.changelogs is not None and self.logged(topic):
                        self.changelogs.writer(topic).release(partition)
                    open_now.pop(partition).close()
            self.start(assignment)

    def stop(self) -> None:
        """Stop the queries and close every partition database."""
        with self._lock:
            self.stop_queries()
            if self.follower is not None:
                self.follower.stop()
            if self.changelogs is not None:
                self.changelogs.close()
            for open_now in self.partitions.values():
                for stores in open_now.values():
                    stores.close()
            self.partitions.clear()
            self._offsets.clear()
            if self._dead_letter_queue is not None:
                self._dead_letter_queue.close()
                self._dead_letter_queue = None

    def raise_if_failed(self) -> None:
        """Raise the exception of a query that died."""
        for query in self._queries:
            error = query.exception()
            if error is not None:
                raise error

    def failure(self) -> BaseException | None:
        """Return why a query died, if one did: its exception, or QueryStoppedError if it stopped unasked."""
        with self._lock:  # not while a reassignment stops and starts the queries on purpose
            for query in self._queries:
                error = query.exception()
                if error is not None:
                    return error
                if not query.isActive:
                    return QueryStoppedError(f"streaming query {query.name} stopped without being asked to")
        return None

    def last_applied(self) -> float:
        """Return the wall-clock time of the last batch applied to any open partition (0 if none is open)."""
        return max((s.db.applied_at for ps in list(self.partitions.values()) for s in list(ps.values())), default=0.0)

    def restart(self) -> None:
        """Restart every query over the partitions open now (after a query died)."""
        with self._lock:
            self.reassign({topic: sorted(open_now) for topic, open_now in self.partitions.items()})

    def status(self) -> list[PartitionStatus]:
        """Return the state and lag of every owned partition."""
        result = []
        for topic, open_now in sorted(self.partitions.items()):
            ends = self.offsets(topic).latest(open_now)
            for partition, stores in sorted(open_now.items()):
                db = stores.db
                result.append(
                    PartitionStatus(topic, partition, db.state.value, db.next_offset(), ends.get(partition, 0))
                )
        return result

    def wait_until_caught_up(self, timeout: float = 120.0, poll: float = 0.2) -> list[PartitionStatus]:
        """Block until every owned partition is RUNNING with no lag; raise TimeoutError past timeout."""
        deadline = time.monotonic() + timeout
        while True:
            self.raise_if_failed()
            status = self.status()
            if all(s.state == PartitionState.RUNNING.value and s.lag == 0 for s in status):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"stores not caught up after {timeout:.0f} s: {status}")
            time.sleep(poll)
