"""Changelog topics: each batch's state changes in a compacted Kafka topic, and restore from it.

One changelog topic per input topic of the app, ``<app>-<topic>-changelog``, partitioned like the input topic: its
partition p holds what the stores of input partition p changed (``stores.changelog``: every store of the partition
database, the meta family with the next source offset last). Kafka Streams keeps one changelog per store; here the
unit of exactly-once is the partition database (ONE WriteBatch across its stores with the next offset), so one topic
per partition database keeps a batch in one topic-partition, and its last record — the next source offset, one key,
compacted to the newest — always says where the source is read on from. ``cleanup.policy=compact``: time retention
never deletes a state.

- ``ChangelogWriter``: the active copy sends each batch's records in ONE Kafka transaction per partition (a
  transactional producer per partition, ``transactional.id`` = ``<changelog>-<p>``), committed before the local
  WriteBatch is written (``PartitionTransaction.publish``), so the changelog is never behind the local state for
  long: a crash between the two leaves the changelog one batch ahead, which the next start reads back. A new owner's
  ``init_transactions`` fences the previous one (a zombie's next send fails, its batch is not written locally) and
  aborts its open transaction.
- ``restore``: a copy reads its changelog partition from where it is (0 when it holds nothing) up to the last
  stable offset, in bulk WriteBatches (no Spark), before its pipeline starts at the restored next offset.
- ``streaming.changelog_follower.ChangelogFollower``: standbys apply the changelog instead of running the pipeline.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import NoReturn

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from iqgraph.stores import PartitionState, PartitionStores
from iqgraph.stores.changelog import (
    BATCH_END_KEY,
    CHANGELOG_NEXT_KEY,
    RESTORES,
    Record,
    RestoreProgress,
    apply_records,
    batch_records,
    changelog_next,
    is_batch_end,
    record_key,
    record_position,
)
from iqgraph.stores.codecs import encode_int64
from iqgraph.stores.partition import META_CF, NEXT_OFFSET_KEY, TOPIC_PARTITIONS_KEY, PartitionDB, PartitionTransaction
from iqgraph.streaming.definitions import App
from iqgraph.streaming.kafka_offsets import KafkaOffsets

log = logging.getLogger(__name__)


class TransientRetries(logging.Filter):
    """Drops librdkafka's "Failed to acquire … PID …: retrying" lines: a transaction coordinator still loading or
    just moved, which the producer retries by itself (a retry that never succeeds ends ``init_transactions`` with a
    one-line ChangelogError instead). Seen as WARNINGs on a fresh broker while its __transaction_state loads."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("Failed to acquire" in message and message.endswith(": retrying"))


log.addFilter(TransientRetries())

#: The changelog topics' configuration (Kafka Streams' changelogs: compacted; no time retention).
CHANGELOG_CONFIG = {
    "cleanup.policy": "compact",
    # A restore reads the cleaned segments (about one record per entry), the dirty ones and the active segment.
    # The cleaner compacts closed segments only: 1 MiB segments (not 1 GiB; ~70,000 lz4 records) or an hour bound
    # what a restore reads uncompacted at the tail, and cleaning once 20 % of the log is dirty (not 50 %) bounds the
    # rest to 1.25x the state. Both are topic settings an operator may change (kafka-configs --alter).
    "segment.bytes": str(1 << 20),
    "segment.ms": str(3_600_000),
    "min.cleanable.dirty.ratio": "0.2",
    # A tombstone (a deleted key, an expired window) is kept an hour after cleaning, not a day: a restore reads the
    # last hour's deletes, not the last day's. A copy that stopped longer ago than half of it restores in full
    # (streaming.runner: it could miss a purged delete); readers at the head (standbys) are seconds behind.
    "delete.retention.ms": str(3_600_000),
}
RESTORE_CHUNK = 20_000  # records per WriteBatch while restoring (not served: batches need not be whole)
TRANSACTION_TIMEOUT_S = 30.0
#: How long a batch keeps being sent while Kafka does not take it (a broker restarting, the transaction coordinator
#: moving, the whole cluster away) before its query dies: Kafka Streams' task.timeout.ms (5 minutes). Each send again
#: goes through a new producer of the partition's transactional id (`ChangelogWriter._renew`): the abort and send
#: again through the same producer that this first did left, 2 runs in 6, a read_committed reader stopped for good at
#: the aborted attempt (a hanging transaction: a write of it landing after its abort marker, KIP-890's problem), and
#: a standby's follower with it (the Kafka drill of 2026-11-29); so this was 0 (the first such error ended the batch
#: and the query, and the supervisor restarted it once Kafka answered) until the new producer came.
OUTAGE_S = 300.0
#: How long one new producer's init_transactions waits while Kafka is away before the next try, so that a stop is
#: seen within seconds.
RENEW_WAIT_S = 5.0
#: Errors that mean Kafka is away or moving, not that the batch is wrong: the batch is sent again, through a new
#: producer. A message times out when it waited transaction.timeout.ms (librdkafka caps message.timeout.ms to it); an
#: idempotent producer whose messages timed out reports OUT_OF_ORDER_SEQUENCE_NUMBER next, which a new producer epoch
#: clears; the messages of a transaction failed so are purged (_PURGE_QUEUE, _PURGE_INFLIGHT).
_AWAY = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
    }
)


def changelog_topic(app: str, topic: str) -> str:
    """Return the name of the changelog topic of input topic in app."""
    return f"{app}-{topic}-changelog"


def restore_group(app: str) -> str:
    """Return the group id app's changelog consumers give: librdkafka wants one, and looks its coordinator up (a
    right to DESCRIBE it), though they only assign partitions and commit nothing. Each app its own, as the
    rights are granted per app."""
    return f"{app}-changelog-restore"


class ChangelogError(RuntimeError):
    """A changelog could not be made or written (a batch not sent is not written locally either)."""


_REFUSED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)


def changelog_topics(app: App) -> list[NewTopic]:
    """Return the changelog topics of app (every input topic but global tables, which every node reads whole)."""
    return [
        NewTopic(changelog_topic(app.name, t.name), num_partitions=t.partitions, config=dict(CHANGELOG_CONFIG))
        for t in app.topics
        if not t.global_table
    ]


def ensure_changelog_topics(config: Mapping[str, str], app: App, timeout: float = 10.0) -> dict[str, int]:
    """Create app's changelog topics Kafka does not have; return them. Raise ChangelogError (one line) if refused."""
    admin = AdminClient(dict(config), logger=log)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise ChangelogError(f"cannot list topics: {exc}") from None
    wanted = [t for t in changelog_topics(app) if t.topic not in existing]
    if not wanted:
        return {}
    futures = admin.create_topics(wanted, operation_timeout=timeout, request_timeout=timeout)
    created = {}
    for new in wanted:
        try:
            futures[new.topic].result(timeout=timeout)
            created[new.topic] = new.num_partitions
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # another node made it first
                continue
            grant = (
                f"; grant CREATE on topic {new.topic!r} to this node's principal, or create it yourself "
                f"({new.num_partitions} partitions, cleanup.policy=compact)"
                if error.code() in _REFUSED
                else ""
            )
            raise ChangelogError(f"cannot create changelog topic {new.topic!r}: {error.str()}{grant}") from None
    return created


class ChangelogFencedError(ChangelogError):
    """Another copy took this partition's changelog over: this one must stop writing it."""


def message_offset(message: Message) -> int:
    """Return the offset of a consumed message or partition-end event (librdkafka gives every one an offset)."""
    offset = message.offset()
    if offset is None:
        raise KafkaException(KafkaError(KafkaError._BAD_MSG, "a changelog message without an offset"))
    return offset


def message_key(message: Message) -> bytes:
    """Return a changelog record's key (every record iqgraph writes has one)."""
    key = message.key()
    if key is None:
        raise KafkaException(KafkaError(KafkaError._BAD_MSG, "a changelog record without a key"))
    return key


def changelog_consumer(config: Mapping[str, str], app: str) -> Consumer:
    """Return a read_committed consumer of app's changelogs, which assigns partitions and commits nothing."""
    return Consumer(
        {
            **config,
            "group.id": restore_group(app),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
        },
        logger=log,
    )


class ChangelogWriter:
    """The active copy's side: each partition's batches sent to its changelog partition, one transaction each."""

    def __init__(
        self,
        config: Mapping[str, str],
        app: str,
        topic: str,
        transaction_timeout_s: float = TRANSACTION_TIMEOUT_S,
        outage_s: float = OUTAGE_S,
    ) -> None:
        self.config = dict(config)
        self.topic = changelog_topic(app, topic)
        self.transaction_timeout_s = transaction_timeout_s
        self.outage_s = outage_s
        self._producers: dict[int, Producer] = {}
        self.fenced: dict[int, float] = {}  # partition -> when (time.monotonic()) another copy fenced this writer
        self.producers_started = 0  # one per partition taken over, and one more after each batch that failed
        self.sent_bytes = 0
        self.sent_records = 0

    def fence(self, partition: int) -> None:
        """Take partition's changelog over: fence any earlier writer and abort its open transaction."""
        self.fenced.pop(partition, None)
        old = self._producers.pop(partition, None)
        if old is not None:
            old.flush(1.0)
        try:
            self._producers[partition] = self._start_producer(partition)
        except KafkaException as exc:
            raise ChangelogError(f"cannot write changelog {self.topic}[{partition}]: {exc.args[0].str()}") from None

    def _start_producer(self, partition: int, wait_s: float | None = None) -> Producer:
        """Return a new producer of partition's transactional id, initialised within wait_s (default: the
        transaction timeout): the coordinator bumps the id's epoch, fences every earlier producer of it and aborts
        the transaction one left open (KafkaException: it did not)."""
        producer = Producer(
            {
                **self.config,
                "transactional.id": f"{self.topic}-{partition}",
                "transaction.timeout.ms": int(self.transaction_timeout_s * 1000),
                "linger.ms": 5,
                "compression.type": "lz4",
            },
            logger=log,
        )
        self.producers_started += 1
        try:
            producer.init_transactions(self.transaction_timeout_s if wait_s is None else wait_s)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            # Destroyed here, not when the error is: a producer whose start timed out goes on asking for its id in
            # librdkafka's threads and, once Kafka is back, fences the producer started after it (held by exc's
            # traceback, which a caller may keep, it did: CI, test_a_batch_kafka_never_takes_ends_in_one_error_...)
            del producer
            raise KafkaException(error) from None
        return producer

    def take_over(self, partition: int) -> None:
        """Be partition's writer: fence the others (unless this writer holds it already)."""
        if partition not in self._producers:
            self.fence(partition)

    def release(self, partition: int) -> None:
        """Stop writing partition (another copy is its writer now)."""
        producer = self._producers.pop(partition, None)
        if producer is not None:
            producer.flush(1.0)

    def reset(self, db: PartitionDB, start: int) -> int:
        """Empty db's changelog partition (a tombstone for each of db's entries) and make start its next source
        offset, in one transaction; return the changelog offset after it."""
        self.take_over(db.partition)
        records: list[Record] = [
            (record_key(family, key), None)
            for family, key in db.entries()
            if not (family == META_CF and key in (CHANGELOG_NEXT_KEY, TOPIC_PARTITIONS_KEY, NEXT_OFFSET_KEY))
        ]
        records.append((BATCH_END_KEY, encode_int64(start)))
        log.warning(
            "%s[%d]: emptied for a rebuild from offset %d (%d entries)",
            self.topic,
            db.partition,
            start,
            len(records) - 1,
        )
        return self._send(db.partition, records) + 1

    def publish(self, partition: int, tx: PartitionTransaction, stop: Callable[[], bool] = lambda: False) -> None:
        """Send tx's records in one transaction, then record in tx where the changelog now ends. While Kafka does not
        take them, send them again for up to outage_s (stop: the query is stopping, give up now)."""
        if partition not in self._producers:
            self.fence(partition)
        last = self._send(partition, batch_records(tx), stop)
        record_position(tx, last + 1)

    def _send(self, partition: int, records: list[Record], stop: Callable[[], bool] = lambda: False) -> int:
        """Send records in one transaction through partition's producer; return the offset of the last one. When
        Kafka is away (`_AWAY`), drop that producer and send them again through a new one (`_renew`) until they are
        taken or outage_s have passed; then (or on any other error) raise ChangelogError, or ChangelogFencedError
        when another copy writes the partition now."""
        began = time.monotonic()
        waiting = False
        while True:
            producer = self._producers[partition]
            try:
                offsets = self._send_once(producer, partition, records)
                break
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not isinstance(error, KafkaError) or error.fatal() or error.code() not in _AWAY:
                    self._abandon(producer, partition, exc)
                if stop() or time.monotonic() - began > self.outage_s:
                    self._abandon(producer, partition, exc)
                if not waiting:
                    waiting = True
                    log.warning(
                        "changelog %s[%d]: Kafka did not take the batch (%s); sending it again until it does (for "
                        "%.0f s at most), reads go on from the stores",
                        self.topic,
                        partition,
                        error.str(),
                        self.outage_s,
                    )
                failed = KafkaException(error)  # not exc: its traceback holds the producer _renew destroys
            del producer
            self._renew(partition, failed, began, stop)
        if waiting:
            log.warning("changelog %s[%d]: batch sent after %.0f s", self.topic, partition, time.monotonic() - began)
        self.sent_records += len(records)
        self.sent_bytes += sum(len(k) + len(v or b"") for k, v in records)
        return max(offsets)

    def _send_once(self, producer: Producer, partition: int, records: list[Record]) -> list[int]:
        """Send records in one transaction; return their offsets (KafkaException: the transaction is open)."""
        offsets: list[int] = []
        errors: list[KafkaError] = []

        def delivered(error: KafkaError | None, message: Message) -> None:  # must not raise: librdkafka calls it
            offset = message.offset()  # within flush(), and a raise would turn the next call into a SystemError
            if error is not None or offset is None:
                errors.append(error or KafkaError(KafkaError._BAD_MSG, "delivered without an offset"))
            else:
                offsets.append(offset)

        producer.begin_transaction()
        for key, value in records:
            self._produce(producer, partition, key, value, delivered)
        producer.flush(self.transaction_timeout_s)
        if errors or len(offsets) != len(records):
            raise KafkaException(errors[0] if errors else KafkaError(KafkaError._TIMED_OUT))
        producer.commit_transaction(self.transaction_timeout_s)
        return offsets

    def _renew(self, partition: int, cause: KafkaException, began: float, stop: Callable[[], bool]) -> None:
        """Replace partition's producer, whose transaction Kafka did not take, by a new one of the same transactional
        id, again each second while Kafka is away; give up (`_abandon`'s errors) when fenced, stopping, past
        outage_s, or the start fails otherwise.

        The old one is purged and destroyed, not told to abort: an abort and a send again through the same producer
        (the same epoch) left, 2 runs in 6, a read_committed reader stopped for good at the aborted attempt — a
        write of the aborted attempt landing after its abort marker, a hanging transaction (KIP-890's problem). The
        new producer's init_transactions bumps the epoch and has the coordinator abort what the old one left open;
        a late write of the old epoch is fenced."""
        old = self._producers.pop(partition)
        with contextlib.suppress(KafkaException):
            old.purge()
        del old  # the last reference: librdkafka's handle is destroyed, its connections closed
        while True:
            if stop():  # the partition may be another copy's now: a new producer would fence that copy's
                self._abandon(None, partition, cause)
            try:
                self._producers[partition] = self._start_producer(
                    partition, min(RENEW_WAIT_S, self.transaction_timeout_s)
                )
                return
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                retriable = isinstance(error, KafkaError) and error.retriable() and not error.fatal()
                if not retriable or time.monotonic() - began > self.outage_s:
                    self._abandon(None, partition, exc if not retriable else cause)
                time.sleep(1.0)

    def _produce(
        self, producer: Producer, partition: int, key: bytes, value: bytes | None, delivered: Callable[..., None]
    ) -> None:
        while True:
            try:
                producer.produce(self.topic, value=value, key=key, partition=partition, on_delivery=delivered)
                return
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)

    def _abandon(self, producer: Producer | None, partition: int, exc: KafkaException) -> NoReturn:
        """Abort the producer's transaction and drop it (None: it is gone already; a fenced one is remembered as
        fenced), then raise what the batch's caller is told."""
        error = exc.args[0] if exc.args else None
        fatal = isinstance(error, KafkaError) and error.fatal()
        if fatal:
            self._producers.pop(partition, None)
            self.fenced[partition] = time.monotonic()
            raise ChangelogFencedError(
                f"changelog {self.topic}[{partition}]: another copy writes it now ({error.str()}); this batch is "  # type: ignore[union-attr]
                "not applied here"
            ) from None
        if producer is not None:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(self.transaction_timeout_s)
            # Never kept: the next batch starts over with a new producer (its fence aborts what is left open). A kept
            # one may be stuck: after a whole cluster's return (the Kafka drill in CI) one timed every batch of its
            # partition out, 30 s each, restart after restart, while a new client of the same node reached it at once.
            with contextlib.suppress(KafkaException):
                producer.purge()
        self._producers.pop(partition, None)
        raise ChangelogError(f"changelog {self.topic}[{partition}]: the batch was not sent: {exc}") from None

    def close(self) -> None:
        """Close every producer (nothing is pending between batches)."""
        for producer in self._producers.values():
            producer.flush(1.0)
        self._producers.clear()


class Changelogs:
    """The changelog topics of one app: end offsets, restores, the active's writers."""

    def __init__(
        self, config: Mapping[str, str], app: str, transaction_timeout_s: float = TRANSACTION_TIMEOUT_S
    ) -> None:
        self.config = dict(config)
        self.app = app
        self.transaction_timeout_s = transaction_timeout_s
        self._offsets: dict[str, KafkaOffsets] = {}
        self._writers: dict[str, ChangelogWriter] = {}

    def topic(self, topic: str) -> str:
        """Return the changelog topic of input topic."""
        return changelog_topic(self.app, topic)

    def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """Return the last stable offset of topic's changelog partitions."""
        name = self.topic(topic)
        if name not in self._offsets:
            self._offsets[name] = KafkaOffsets(self.config, name)
        return dict(self._offsets[name].latest(partitions))

    def writer(self, topic: str) -> ChangelogWriter:
        """Return the writer of topic's changelog."""
        if topic not in self._writers:
            self._writers[topic] = ChangelogWriter(self.config, self.app, topic, self.transaction_timeout_s)
        return self._writers[topic]

    def restore(
        self,
        topic: str,
        stores: PartitionStores,
        stop: Callable[[], bool] = lambda: False,
        target: int | None = None,
    ) -> RestoreProgress:
        """Apply stores' changelog partition from where the stores are up to its last stable offset (or target,
        read by the caller), in bulk."""
        db = stores.db
        start = changelog_next(db)
        if target is None:
            target = self.end_offsets(topic, [db.partition])[db.partition]
        progress = RestoreProgress(topic, db.partition, start, target, position=start)
        RESTORES[(self.topic(topic), db.partition)] = progress
        if start >= target:
            return progress
        log.info("%s-%s: restoring from changelog offsets %d..%d", topic, db.partition, start, target - 1)
        consumer = changelog_consumer(self.config, self.app)
        try:
            consumer.assign([TopicPartition(self.topic(topic), db.partition, start)])
            _read_to(consumer, stores, progress, stop)
        finally:
            consumer.close()
        log.info(
            "%s-%s: restored %d records (%.1f MB) from its changelog in %.1f s",
            topic,
            db.partition,
            progress.records,
            progress.bytes / 1e6,
            time.monotonic() - progress.started,
        )
        return progress

    def close(self) -> None:
        """Close the writers."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


def _read_to(consumer: Consumer, stores: PartitionStores, progress: RestoreProgress, stop: Callable[[], bool]) -> None:
    """Consume and apply until the consumer is at progress.target (or the end of what it may read)."""
    pending: list[Record] = []
    running = stores.db.state is PartitionState.RUNNING  # a promoted standby reading its tail keeps serving
    last_logged = time.monotonic()
    while progress.position < progress.target and not stop():
        messages = consumer.consume(10_000, timeout=0.5)
        at_end = False
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end = True
                    progress.position = max(progress.position, message_offset(message))
                    continue
                raise KafkaException(error)
            key, value = message_key(message), message.value()
            pending.append((key, value))
            progress.bytes += len(key) + len(value or b"")
            progress.position = message_offset(message) + 1
        whole = not running or (bool(pending) and is_batch_end(pending[-1][0]))  # a served copy sees whole batches
        if (len(pending) >= RESTORE_CHUNK and whole) or (pending and (at_end or progress.position >= progress.target)):
            progress.records += apply_records(stores.db, pending, progress.position)
            pending = []
        if at_end:
            break
        if time.monotonic() - last_logged > 2.0:
            log.info("%s", progress.line())
            last_logged = time.monotonic()
    if pending:
        progress.records += apply_records(stores.db, pending, progress.position)
