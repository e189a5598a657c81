"""The query runner: one streaming query per input topic over the partitions this node runs the pipeline of.

The partitions themselves (opened, restored from their changelogs, RESTORING until they caught up, then RUNNING,
closed) are ``streaming.hosted_partitions``'s: the runner asks it to open an assignment, then runs a query over the
active copies it hands back. Start offsets come from the stores (each partition database's next offset), not from a
Spark checkpoint: every start uses a fresh checkpoint, so a partition newly owned by this node starts where its
store ends. A runner made without a Spark session opens and restores its partitions at once and starts their
queries once it has one (`StreamRunner.use_spark`): the node serves meanwhile.

The source is Spark's own Kafka connector by default (``RunnerSettings(source="kafka")``: its jars come
with the session, ``streaming.session``), reading exactly the owned partitions (``assign``) from the
stores' offsets, committed records only (``read_committed``); ``source="iqkafka"`` selects the Python Data
Source over confluent-kafka (``streaming.kafka_source``) instead. The query's checkpoint holds Spark's
offset log, where the sink reads how far each batch read every partition (``streaming.offset_log.OffsetLog``).

With changelogs (``RunnerSettings(changelog=True)``, the default; ``streaming.changelog``), each batch of an active
copy goes to its changelog in one transaction before the local write; a standby copy runs no pipeline (the
``ChangelogFollower`` applies its changelog). Global tables keep no changelog: every node reads them whole from
their own (compacted) topic.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from py4j.protocol import Py4JError
from pyspark.errors import StreamingQueryException

from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.dead_letter import DeadLetterQueue
from iqgraph.streaming.definitions import App
from iqgraph.streaming.hosted_partitions import Assignment, HostedPartitions, PartitionStatus
from iqgraph.streaming.kafka_client_config import java_consumer_options
from iqgraph.streaming.kafka_jars import FETCH_COMMAND, SPARK_KAFKA_VERSION, JarsError
from iqgraph.streaming.kafka_offsets import KafkaOffsets
from iqgraph.streaming.kafka_source import KafkaDataSource
from iqgraph.streaming.offset_log import OffsetLog
from iqgraph.streaming.runner_settings import RunnerSettings
from iqgraph.streaming.sink import BatchObserver, StoreSink

__all__ = ["PartitionStatus", "QueryStoppedError", "RunnerSettings", "StreamRunner", "source_options"]

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader, StreamingQuery

log = logging.getLogger(__name__)

STOP_AFTER_BATCH_S = 20.0  # how long a stop waits for the batches in flight before it interrupts them
_TERMINATED = "org.apache.spark.sql.execution.streaming.runtime.TERMINATED$"  # the state Spark's loop ends on


class QueryStoppedError(RuntimeError):
    """A streaming query is no longer active though nobody stopped it."""


#: How long the broker may hold a fetch of the JVM source's consumers while it waits for more records (the Java
#: client's default is 500 ms). Each read task leaves its consumer's next fetch waiting at the log end, and the
#: next batch's read of that partition waited for it: at light load (20 records/s) a batch's Spark work took
#: 0.7-0.8 s, 0.19-0.26 s with 10 ms (bench/ingest.py A/B, docs/benchmarks.md). The user's own setting wins.
FETCH_MAX_WAIT_MS = 10


def source_options(
    settings: RunnerSettings, topic: str, owned: list[int], starting: Mapping[int, int]
) -> dict[str, str]:
    """Return the reader options for the configured Kafka source over the owned partitions of topic."""
    client = settings.client_config
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


class StreamRunner:
    """Run, restart and report the streaming queries that keep one node's hosted partitions (`HostedPartitions`).

    Given no Spark session, it opens and restores the partitions it is assigned, and starts their queries once it is
    given one (`use_spark`): a node serves its restored stores while its Spark session starts.
    """

    def __init__(
        self,
        app: App,
        spark: SparkSession | None,
        state_dir: StateDirectory,
        settings: RunnerSettings,
        observer: BatchObserver | None = None,
        change_feed: ChangeFeed | None = None,
        role: Callable[[str, int], str] | None = None,
    ) -> None:
        """Args:
        spark: the session the queries run in (None: not yet; see `use_spark`).
        change_feed: where every sink publishes its committed changes (the node's, kept across restarts).
        role: "active" or "standby" of a hosted partition (None: this node is the active copy of all it hosts).
        """
        self.app = app
        self.observer = observer  # hears every applied micro-batch (e.g. the node's metrics)
        self.change_feed = change_feed
        self.settings = settings
        self.hosted = HostedPartitions(app, state_dir, settings, role)
        self.spark: SparkSession | None = None
        self._pipelines: dict[str, list[int]] = {}  # per topic, the hosted partitions whose pipeline runs here
        self._queries: list[StreamingQuery] = []
        self._sinks: list[StoreSink] = []
        self._checkpoints: list[Path] = []
        self._dead_letter_queue: DeadLetterQueue | None = None
        self._lock = threading.RLock()
        if spark is not None:
            self.use_spark(spark)

    @property
    def partitions(self) -> dict[str, dict[int, PartitionStores]]:
        """Return the open partitions' stores, per topic and partition."""
        return self.hosted.partitions

    def offsets(self, topic: str) -> KafkaOffsets:
        """Return the long-lived offsets client of topic."""
        return self.hosted.offsets(topic)

    @property
    def started(self) -> bool:
        """Return whether the queries run (or ran): False until the runner has a Spark session."""
        return self.spark is not None

    def use_spark(self, spark: SparkSession) -> None:
        """Run the queries in spark from now on, starting those of the partitions assigned so far."""
        with self._lock:
            spark.dataSource.register(KafkaDataSource)
            self.spark = spark
            self._start_queries()

    def start(self, assignment: Assignment) -> None:
        """Open the assigned partitions' databases and start one query per topic over the ones it is active for
        (once the runner has a Spark session)."""
        with self._lock:
            self._pipelines = self.hosted.assign(assignment)
            self._start_queries()

    def _start_queries(self) -> None:
        if self.spark is None:
            return  # the queries start with Spark (use_spark)
        for topic, partitions in self._pipelines.items():
            readable = self.hosted.readable(topic, partitions)
            if readable:
                self._queries.append(self._start_query(self.spark, topic, readable))

    def _start_query(self, spark: SparkSession, topic: str, owned: list[int]) -> StreamingQuery:
        stores, hosted = self.partitions[topic], self.hosted
        starting = {p: stores[p].db.next_offset() for p in owned}
        checkpoint = Path(tempfile.mkdtemp(prefix=f"iqgraph-{self.app.name}-{topic}-"))
        self._checkpoints.append(checkpoint)
        sink = StoreSink(
            self.app,
            self.app.topic(topic),
            {p: stores[p] for p in owned},
            self._dead_letters(),
            hosted.on_commit(topic),
            observer=self.observer,
            tables=lambda table_topic: self.partitions.get(table_topic, {}),
            change_feed=self.change_feed,
            offset_log=OffsetLog(checkpoint / "offsets", topic, starting),
            changelog=hosted.changelogs.writer(topic) if hosted.changelogs and hosted.logged(topic) else None,
            logged=[p for p in owned if hosted.writes_changelog(topic, p)],
        )
        self._sinks.append(sink)
        options = source_options(self.settings, topic, owned, starting)
        reader = spark.readStream.format(self.settings.source).options(**options)
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

    def stop_queries(self) -> None:
        """Stop every streaming query (stores stay open), each between two micro-batches when it can."""
        with self._lock:
            for sink in self._sinks:
                sink.stopping = True
            spark = self.spark
            ending = [query for query in self._queries if spark is not None and _end_after_batch(spark, query)]
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
            self.hosted.revoke(assignment)
            self.start(assignment)

    def stop(self) -> None:
        """Stop the queries and close every partition database."""
        with self._lock:
            self.stop_queries()
            self.hosted.close()
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
        return self.hosted.last_applied()

    def restart(self) -> None:
        """Restart every query over the partitions open now (after a query died)."""
        with self._lock:
            self.reassign(self.hosted.hosted())

    def status(self) -> list[PartitionStatus]:
        """Return the state and lag of every owned partition."""
        return self.hosted.status()

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
