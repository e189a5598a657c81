"""Standby copies kept by following their changelogs instead of running the pipeline (``streaming.changelog``).

One consumer (read_committed) over every followed partition: a copy restores in bulk while RESTORING, then applies
each batch whole when its last record (the next source offset) arrives, with exact positions and lag.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from iqgraph.stores import PartitionState, PartitionStores
from iqgraph.stores.changelog import RESTORES, Record, RestoreProgress, apply_records, changelog_next, is_batch_end
from iqgraph.streaming.changelog import (
    Changelogs,
    TransientRetries,
    changelog_consumer,
    message_key,
    message_offset,
)
from iqgraph.streaming.kafka_offsets import KafkaSourceError

log = logging.getLogger(__name__)
log.addFilter(TransientRetries())

#: Seconds without a record after which the consumer is checked: when a changelog's stable end is past its position,
#: a new consumer reads on (`ChangelogFollower._renew`).
STUCK_S = 15.0


class ChangelogFollower:
    """Standby copies kept by applying their changelogs: one consumer thread over every followed partition.

    A copy restores in bulk while RESTORING (chunks, not served) up to the changelog's stable end seen when it was
    added, and turns RUNNING once it is there AND has applied the input topic up to its end as it was then (what a
    copy running the pipeline waits for too: a changelog still empty at a cluster's start is no state to serve); from
    then on it applies each batch whole, when the batch's last record arrives.
    """

    def __init__(self, changelogs: Changelogs) -> None:
        self.changelogs = changelogs
        self._lock = threading.Lock()
        self._followed: dict[tuple[str, int], tuple[str, PartitionStores]] = {}  # changelog tp -> (topic, stores)
        self._targets: dict[tuple[str, int], int] = {}
        self._source_targets: dict[tuple[str, int], int] = {}  # the input topic's end offset when followed
        self._pending: dict[tuple[str, int], list[Record]] = {}
        self._assigned: set[tuple[str, int]] = set()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, topic: str, stores: PartitionStores, source_end: int = 0) -> None:
        """Start following stores' changelog partition (a new copy is RESTORING until it caught up with the
        changelog and with source_end, the input partition's end offset now)."""
        tp = (self.changelogs.topic(topic), stores.db.partition)
        target = self.changelogs.end_offsets(topic, [stores.db.partition])[stores.db.partition]
        if stores.db.state is not PartitionState.RUNNING:  # a copy RUNNING already (an active demoted) stays so:
            stores.db.set_state(PartitionState.RESTORING)  # its data is whole batches; its lag says how stale
        with self._lock:
            self._followed[tp] = (topic, stores)
            self._targets[tp] = target
            self._source_targets[tp] = source_end
            self._pending[tp] = []
            self._caught_up(tp, stores, changelog_next(stores.db))
        RESTORES[tp] = RestoreProgress(topic, stores.db.partition, changelog_next(stores.db), target)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="changelog-follower", daemon=True)
            self._thread.start()

    def release(self, topic: str, partition: int) -> None:
        """Stop following topic's partition: nothing is applied to it after this returns."""
        with self._lock:
            tp = (self.changelogs.topic(topic), partition)
            self._followed.pop(tp, None)
            self._pending.pop(tp, None)

    def followed(self) -> list[tuple[str, int]]:
        """Return the (input topic, partition) pairs followed now."""
        with self._lock:
            return sorted((topic, tp[1]) for tp, (topic, _) in self._followed.items())

    def stop(self) -> None:
        """Stop the thread (the copies stay open)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        consumer = changelog_consumer(self.changelogs.config, self.changelogs.app)
        quiet_since = time.monotonic()  # when the last message came
        try:
            while not self._stopped.is_set():
                try:
                    self._reconcile(consumer)
                    if not self._assigned:
                        time.sleep(0.1)
                        continue
                    messages = consumer.consume(5_000, timeout=0.2)
                    for message in messages:
                        self._take(message)
                    self._flush_restoring()
                    if messages:
                        quiet_since = time.monotonic()
                    elif time.monotonic() - quiet_since > STUCK_S:
                        quiet_since = time.monotonic()
                        if behind := self._behind(consumer):
                            log.warning(
                                "changelog follower: nothing read for %.0f s while %s wait; reading them with a new "
                                "consumer",
                                STUCK_S,
                                ", ".join(f"{t}[{p}] from {pos} to {end}" for (t, p), (pos, end) in behind.items()),
                            )
                            consumer = self._renew(consumer)
                except KafkaException as exc:  # Kafka away, a partition moving: try again
                    log.warning("changelog follower: %s; retrying in 1 s", exc)
                    time.sleep(1.0)
        finally:
            consumer.close()

    def _behind(self, consumer: Consumer) -> dict[tuple[str, int], tuple[int, int]]:
        """Return the followed changelog partitions whose stable end is past the consumer's position: (position,
        end) by partition; none while Kafka does not answer (its outage is `KafkaWatch`'s to report)."""
        try:
            return self._behind_now(consumer)
        except (KafkaException, KafkaSourceError):
            return {}

    def _behind_now(self, consumer: Consumer) -> dict[tuple[str, int], tuple[int, int]]:
        """`_behind`, raising what Kafka's silence raises."""
        with self._lock:
            followed = {tp: (topic, stores) for tp, (topic, stores) in self._followed.items() if tp in self._assigned}
        positions = {
            (tp.topic, tp.partition): tp.offset for tp in consumer.position([TopicPartition(*tp) for tp in followed])
        }
        by_topic: dict[str, list[int]] = {}
        for (_, partition), (topic, _) in followed.items():
            by_topic.setdefault(topic, []).append(partition)
        behind = {}
        for topic, partitions in by_topic.items():
            for partition, end in self.changelogs.end_offsets(topic, partitions).items():
                tp = (self.changelogs.topic(topic), partition)
                position = positions.get(tp, -1)
                position = position if position >= 0 else changelog_next(followed[tp][1].db)
                if position < end:
                    behind[tp] = (position, end)
        return behind

    def _renew(self, consumer: Consumer) -> Consumer:
        """Close consumer and return a new one that reads every followed partition again from where its copy is:
        after a whole cluster's return, one librdkafka consumer read nothing more of two partitions for good while
        the other copies went on (its metadata kept their leader unknown: librdkafka#5430)."""
        with self._lock:
            self._flush_restoring_locked()
            for tp in self._pending:  # a running copy's part of a batch is read again, whole
                self._pending[tp] = []
        consumer.close()
        self._assigned = set()
        return changelog_consumer(self.changelogs.config, self.changelogs.app)

    def _reconcile(self, consumer: Consumer) -> None:
        """Assign the changelog partitions followed now, each from where its copy is."""
        with self._lock:
            wanted = {tp: stores for tp, (_, stores) in self._followed.items()}
        gone = self._assigned - set(wanted)
        if gone:
            consumer.incremental_unassign([TopicPartition(t, p) for t, p in gone])
            self._assigned -= gone
        new = [tp for tp in wanted if tp not in self._assigned]
        if new:
            consumer.incremental_assign([TopicPartition(t, p, changelog_next(wanted[(t, p)].db)) for t, p in new])
            self._assigned |= set(new)

    def _take(self, message: Message) -> None:
        error = message.error()
        tp = (message.topic() or "", message.partition() or 0)
        with self._lock:
            followed = self._followed.get(tp)
            if followed is None:
                return
            stores = followed[1]
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    progress = RESTORES.get(tp)
                    end = message_offset(message)
                    if progress is not None:  # the changelog's end as last seen: a standby's lag in its terms
                        progress.target = max(progress.target, end)
                        progress.position = max(progress.position, end)
                    self._caught_up(tp, stores, end)
                    return
                raise KafkaException(error)
            key, value, after = message_key(message), message.value(), message_offset(message) + 1
            pending = self._pending[tp]
            pending.append((key, value))
            progress = RESTORES.get(tp)
            if progress is not None:
                progress.records += 1
                progress.bytes += len(key) + len(value or b"")
                progress.position = after
            if is_batch_end(key):
                apply_records(stores.db, pending, after)
                self._pending[tp] = []
                self._caught_up(tp, stores, after)

    def _caught_up(self, tp: tuple[str, int], stores: PartitionStores, offset: int) -> None:
        """Turn a restoring copy RUNNING once it applied every whole batch up to its targets (the lock is held)."""
        if stores.db.state is not PartitionState.RESTORING or offset < self._targets.get(tp, 0):
            return
        pending = self._pending.get(tp)
        if pending:
            apply_records(stores.db, pending, offset)
            self._pending[tp] = []
        if stores.db.next_offset() >= self._source_targets.get(tp, 0):
            stores.db.set_state(PartitionState.RUNNING)
            log.info("%s-%s: standby caught up with its changelog at offset %d", tp[0], tp[1], offset)

    def _flush_restoring(self) -> None:
        """Write what restoring copies hold (not served yet: a chunk need not be a whole batch)."""
        with self._lock:
            self._flush_restoring_locked()

    def _flush_restoring_locked(self) -> None:
        """`_flush_restoring` with the lock held."""
        for tp, (_, stores) in self._followed.items():
            pending = self._pending.get(tp)
            if pending and stores.db.state is PartitionState.RESTORING:
                progress = RESTORES.get(tp)
                position = progress.position if progress is not None else changelog_next(stores.db)
                apply_records(stores.db, pending, position)
                self._pending[tp] = []
