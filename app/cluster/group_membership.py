"""Kafka-group membership: the consumer-group protocol assigns partitions, a compacted topic tells every node.

As a Kafka Streams instance does, each node joins consumer group ``<app_name>`` subscribed to the input topics,
but only to take part in the assignment: assigned partitions are paused at once and nothing is committed (the
streaming runner reads the data). On every assignment, and every ``heartbeat_s`` after, the node publishes a
``MemberRecord`` (JSON, key = node id) to the compacted topic ``<app_name>.iq-metadata``; every node tails that
topic from the beginning and builds the ``ClusterMap`` from the latest record per key (``build_map``). A clean
stop publishes a tombstone; a crashed node's record ages out after ``liveness_s``.

Warm-up replicas, as Kafka Streams' high-availability assignor (KIP-441): a record also reports the state
and lag of every partition the node hosts (from the ``replicas`` callable), and a claim makes its claimant
active only once its copy is caught up; until then a caught-up copy elsewhere stays active and the claimant
warms up as a standby. A partition whose claimant's record expired goes at once to the best copy that runs
it. The record and the rules are in ``app.cluster.group_assignment``. A node re-publishes as soon as one of its
copies turns caught up (or stops being so), not only on the heartbeat.

The group's rebalance protocol is classic (the default) or KIP-848's consumer protocol (``group_protocol``):
``app.cluster.group_protocol`` has the settings each needs and why claims order the same way under both.

Static membership (``group.instance.id``) is not used: a restarted node is a new member, and its old one's
partitions move at once to a live copy (the warm-up rules above), not after the session timeout.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from iqgraph.app.cluster.group_assignment import (
    ACCEPTABLE_RECOVERY_LAG,
    MemberRecord,
    TopicPartitionKey,
    build_map,
    is_caught_up,
)
from iqgraph.app.cluster.group_protocol import (
    CONSUMER,
    GROUP_PROTOCOLS,
    GroupConfigError,
    configure_group,
    group_consumer_config,
    group_generation,
    is_incremental,
)
from iqgraph.app.cluster.membership import ClusterMap, with_global_topics
from iqgraph.app.cluster.replicas import ReplicaState

__all__ = [
    "ACCEPTABLE_RECOVERY_LAG",
    "GroupMembership",
    "GroupMembershipError",
    "MemberRecord",
    "Replicas",
    "build_map",
    "metadata_topic_for",
]

log = logging.getLogger(__name__)

_POLL_S = 0.05
_REPORT_S = 0.25  # how often the hosted copies are looked at: one turning caught up is published at once
_Config = dict[str, str | int | float | bool]
#: What a node's pipelines report: (topic, partition) -> (state, lag; None when the end offset is unknown).
Replicas = Callable[[], Mapping[TopicPartitionKey, tuple[str, int | None]]]


class GroupMembershipError(RuntimeError):
    """The node could not join the group, or the topics it needs are missing or mis-sized."""


#: The metadata topic, compacted for real: its active segment rolls every 10 minutes, so the log cleaner keeps
#: about the latest record per member (plus at most 10 minutes of heartbeats) and a starting node reads little.
METADATA_TOPIC_CONFIG: Mapping[str, str] = MappingProxyType(
    {"cleanup.policy": "compact", "segment.ms": str(10 * 60 * 1000), "min.compaction.lag.ms": "0"}
)


def metadata_topic_for(app_name: str) -> str:
    """Return the name of the compacted topic where app_name's nodes publish their assignments."""
    return f"{app_name}.iq-metadata"


class GroupMembership:
    """Membership by consumer group: the group assigns partitions, the metadata topic spreads the map."""

    def __init__(
        self,
        node_id: str,
        url: str,
        app_name: str,
        topics: Mapping[str, int],
        bootstrap_servers: str,
        kafka_config: Mapping[str, str] | None = None,
        standbys: int = 0,
        session_timeout_ms: int = 10_000,
        assignment_strategy: str = "range",
        heartbeat_s: float = 2.0,
        liveness_s: float = 6.0,
        start_timeout_s: float = 30.0,
        replicas: Replicas | None = None,
        acceptable_recovery_lag: int = ACCEPTABLE_RECOVERY_LAG,
        global_topics: Mapping[str, int] | None = None,
        group_protocol: str = "classic",
    ) -> None:
        """Configure the member; nothing connects before start().

        Args:
            kafka_config: librdkafka settings for every client (security, timeouts); the group's own win over it.
            session_timeout_ms: under the consumer protocol, set as the group's config on the broker at start().
            assignment_strategy: "range" (default) gives partition p of every input topic to the same node (under
                the consumer protocol it names the broker's assignor: "range" or "uniform").
            liveness_s: a member whose record is older (by its publisher's clock) leaves the map.
            replicas: the state and lag of every partition this node hosts, published with each record (called
                from the membership thread; may return nothing before the pipelines exist). Without it the node
                reports no copy: its claims are active at once and it never takes over a partition.
            acceptable_recovery_lag: a copy at most this many records behind (and RUNNING) is caught up.
            global_topics: topics every node consumes whole (global tables): not in the group's subscription,
                served by this node in its map (membership.with_global_topics).
            group_protocol: "classic" (default) or "consumer" (KIP-848; app.cluster.group_protocol).
        """
        if not topics or standbys < 0 or liveness_s <= heartbeat_s or acceptable_recovery_lag < 0:
            raise ValueError("need a topic, standbys >= 0, liveness_s > heartbeat_s and acceptable_recovery_lag >= 0")
        if group_protocol not in GROUP_PROTOCOLS:
            raise ValueError(f"group_protocol must be one of {GROUP_PROTOCOLS}, not {group_protocol!r}")
        self.node_id, self.url, self.app_name = node_id, url.rstrip("/"), app_name
        self.topics = dict(topics)
        self.global_topics = dict(global_topics or {})
        self.metadata_topic = metadata_topic_for(app_name)
        self._common: _Config = {**(kafka_config or {}), "bootstrap.servers": bootstrap_servers}
        self._standbys, self._session_ms, self._strategy = standbys, session_timeout_ms, assignment_strategy
        self._protocol, self._incremental = group_protocol, is_incremental(group_protocol, assignment_strategy)
        self._heartbeat_s, self._liveness_s, self._start_timeout_s = heartbeat_s, liveness_s, start_timeout_s
        self._replicas, self._recovery_lag = replicas, acceptable_recovery_lag
        self._hosted: dict[TopicPartitionKey, ReplicaState] = {}
        self._last_report = 0.0
        self._map = ClusterMap(0, {}, {})
        self._records: dict[str, MemberRecord] = {}
        self._active: set[tuple[str, int]] = set()
        self._published: MemberRecord | None = None
        self._first_published_at: float | None = None
        self._position = 0  # next offset of the metadata topic to read
        self._last_rebuild = 0.0
        self._last_error: KafkaError | None = None
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._callbacks: list[Callable[[ClusterMap], None]] = []
        self._maps: queue.SimpleQueue[ClusterMap | None] = queue.SimpleQueue()
        self._group: Consumer | None = None
        self._reader: Consumer | None = None
        self._producer: Producer | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Join the group; block until this node's first assignment is published and read back into the map."""
        admin = AdminClient(self._common, logger=log)
        self._check_topics(admin)
        try:
            if self._protocol == CONSUMER:  # its session timeout is the group's config, on the broker
                configure_group(admin, self.app_name, self._session_ms)
        except GroupConfigError as exc:
            raise GroupMembershipError(str(exc)) from exc
        self._open_clients()
        self._threads = [
            threading.Thread(target=self._run, name=f"membership-{self.node_id}", daemon=True),
            threading.Thread(target=self._notify, name=f"membership-notify-{self.node_id}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        if not self._ready.wait(self._start_timeout_s):
            self.stop()
            raise GroupMembershipError(
                f"node {self.node_id!r} got no assignment from consumer group {self.app_name!r} on "
                f"{self._common['bootstrap.servers']} within {self._start_timeout_s:g} s "
                f"(last client error: {self._last_error})"
            )

    def stop(self) -> None:
        """Leave the group cleanly, publish a tombstone for this node and stop the background threads."""
        self._stopping.set()
        if self._threads:
            self._threads[0].join()
        if self._group is not None:
            self._group.close()  # sends LeaveGroup: the others rebalance now rather than after a session timeout
        if self._producer is not None and self._published is not None:
            self._send(None)
        if self._reader is not None:
            self._reader.close()
        self._maps.put(None)
        for thread in self._threads[1:]:
            thread.join()
        self._group = self._reader = self._producer = None
        self._threads = []

    def current(self) -> ClusterMap:
        """Return the latest map."""
        return self._map

    def refresh(self, timeout: float = 5.0) -> ClusterMap:
        """Read the metadata topic up to its current end, then return the map (the current one on timeout)."""
        if self._reader is None:
            return self._map
        partition = TopicPartition(self.metadata_topic, 0)
        try:
            _low, end = self._reader.get_watermark_offsets(partition, timeout=timeout)
        except KafkaException as exc:
            log.warning("could not read the end of %s: %s", self.metadata_topic, exc)
            return self._map
        with self._lock:
            if not self._lock.wait_for(lambda: self._position >= end, timeout):
                log.warning("%s not read up to offset %d within %g s", self.metadata_topic, end, timeout)
            self._rebuild()
        return self._map

    def subscribe(self, callback: Callable[[ClusterMap], None]) -> None:
        """Call callback with every new map, from a notifier thread (a slow callback cannot stall the group)."""
        self._callbacks.append(callback)

    def _check_topics(self, admin: AdminClient) -> None:
        """Fail clearly if an input topic is missing or mis-sized; create the metadata topic if missing."""
        try:
            found = admin.list_topics(timeout=10).topics
        except KafkaException as exc:
            raise GroupMembershipError(f"cannot reach Kafka at {self._common['bootstrap.servers']}: {exc}") from exc
        for topic, count in self.topics.items():
            if topic not in found or found[topic].error is not None:
                raise GroupMembershipError(f"input topic {topic!r} does not exist; create it with {count} partitions")
            if len(found[topic].partitions) != count:
                actual = len(found[topic].partitions)
                raise GroupMembershipError(f"input topic {topic!r} has {actual} partitions, configured {count}")
        if self.metadata_topic in found:
            return
        new = NewTopic(self.metadata_topic, 1, replication_factor=-1, config=dict(METADATA_TOPIC_CONFIG))
        try:
            admin.create_topics([new])[self.metadata_topic].result(timeout=10)
        except KafkaException as exc:  # another node may have created it first: that is fine
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise GroupMembershipError(f"could not create {self.metadata_topic!r}: {exc}") from exc

    def _open_clients(self) -> None:
        """Create the group consumer, the metadata reader (from the beginning) and the publisher."""
        self._group = Consumer(self._group_config(), logger=log)
        self._group.subscribe(
            sorted(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        # group.id is mandatory in confluent-kafka; this reader only assigns, so it never joins that group.
        reader: _Config = {"group.id": f"{self.metadata_topic}-reader", "enable.auto.commit": False}
        self._reader = Consumer({**self._common, **reader, "enable.partition.eof": True}, logger=log)
        self._reader.assign([TopicPartition(self.metadata_topic, 0, OFFSET_BEGINNING)])
        producer = {"acks": "all", "enable.idempotence": True, "linger.ms": 5}  # in order, once each
        self._producer = Producer({**self._common, **producer}, logger=log)

    def _group_config(self) -> _Config:
        """Return the group consumer's configuration: it assigns and pauses, never consumes or commits."""
        return {
            **self._common,
            "group.id": self.app_name,
            "client.id": f"{self.app_name}-{self.node_id}",
            **group_consumer_config(self._protocol, self._strategy, self._session_ms),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "latest",
        }

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take the assignment paused, then publish this node's active partitions at the group's generation.

        Under the consumer protocol (as with a cooperative assignor) partitions come and go incrementally.
        """
        if self._incremental:
            consumer.incremental_assign(partitions)  # on_assign gets only the added partitions
            self._active |= {(tp.topic, tp.partition) for tp in partitions}
        else:
            consumer.assign(partitions)
            self._active = {(tp.topic, tp.partition) for tp in partitions}
        consumer.pause(partitions)
        generation = group_generation(consumer)
        if generation is None:  # not librdkafka's format: count locally (then only time orders nodes' claims)
            generation = self._published.generation + 1 if self._published else 0
        self._publish(self._record(generation))
        log.info("node %s assigned %s at generation %d", self.node_id, sorted(self._active), generation)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Forget revoked partitions; keep serving them until the new owner's higher generation claims them."""
        self._active -= {(tp.topic, tp.partition) for tp in partitions}

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Withdraw the claims on lost partitions at once: this node is out of the group's generation."""
        self._on_revoke(consumer, partitions)
        if self._published is not None:
            self._publish(self._record(self._published.generation))

    def _run(self) -> None:
        """Stay in the group, tail the metadata topic, heartbeat, expire silent members: until stop()."""
        assert self._group is not None  # noqa: S101 - set by start() before this thread runs
        while not self._stopping.is_set():
            message = self._group.poll(_POLL_S)
            if message is not None and message.error() is not None:
                self._last_error = message.error()
                log.warning("membership consumer: %s", message.error())
            self._read_metadata()
            self._heartbeat()
            if time.monotonic() - self._last_rebuild >= _POLL_S * 4:
                with self._lock:
                    self._rebuild()

    def _heartbeat(self) -> None:
        """Re-publish this node's record every heartbeat_s, and at once when a hosted copy turns caught up or not."""
        if self._published is None or time.monotonic() - self._last_report < _REPORT_S:
            return
        self._last_report = time.monotonic()
        self._hosted = self._report()
        changed = self._readiness(self._published.hosted) != self._readiness(self._hosted)
        if changed or time.time() - self._published.time >= self._heartbeat_s:
            self._publish(replace(self._published, time=time.time(), hosted=self._hosted))

    def _report(self) -> dict[TopicPartitionKey, ReplicaState]:
        """Return the state and lag of the copies this node hosts, as its replicas callable tells."""
        if self._replicas is None:
            return {}
        try:
            found = self._replicas()
        except Exception:  # the node's bug must not stop the heartbeat: keep the last report
            log.exception("replicas callable of %s failed", self.node_id)
            return self._hosted
        return {(str(t), int(p)): ReplicaState(state, lag) for (t, p), (state, lag) in sorted(found.items())}

    def _readiness(self, hosted: Mapping[TopicPartitionKey, ReplicaState]) -> dict[TopicPartitionKey, bool]:
        """Return, per hosted copy, whether it is caught up: what moves actives (other lag changes can wait)."""
        return {tp: is_caught_up(r, self._recovery_lag) for tp, r in hosted.items()}

    def _read_metadata(self) -> None:
        """Apply the metadata records that arrived (latest per key wins; a tombstone removes the key)."""
        assert self._reader is not None  # noqa: S101 - set by start() before this thread runs
        messages = self._reader.consume(500, _POLL_S)
        if not messages:
            return
        with self._lock:
            for message in messages:
                self._apply(message)
            self._rebuild()
            self._lock.notify_all()

    def _apply(self, message: Message) -> None:
        """Apply one metadata record (a tombstone removes its key), or the end-of-partition marker."""
        error, offset = message.error(), message.offset() or 0
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:  # the marker carries the end offset
                self._position = max(self._position, offset)
            else:
                log.warning("metadata reader: %s", error)
            return
        self._position = max(self._position, offset + 1)
        node, value = (message.key() or b"").decode(errors="replace"), message.value()
        try:
            if value is None:
                self._records.pop(node, None)
            else:
                self._records[node] = MemberRecord.decode(value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("skipping malformed record at %s offset %d: %s", self.metadata_topic, offset, exc)

    def _rebuild(self) -> None:
        """Rebuild the map from the records (caller holds the lock); queue it for subscribers if it changed."""
        self._last_rebuild, floor = time.monotonic(), self._map.generation
        built = build_map(
            self._records,
            now=time.time(),
            liveness_s=self._liveness_s,
            standbys=self._standbys,
            floor=floor,
            recovery_lag=self._recovery_lag,
        )
        new = with_global_topics(built, self.node_id, self.global_topics)
        if new != self._map:
            self._map = new
            self._maps.put(new)
        own, first = self._records.get(self.node_id), self._first_published_at
        if own is not None and first is not None and own.time >= first:
            self._ready.set()  # after the map is set: start() returns with this node's assignment in current()

    def _record(self, generation: int) -> MemberRecord:
        """Return this node's record: its claims at generation and its hosted copies, now."""
        active: dict[str, tuple[int, ...]] = {}
        for topic, partition in sorted(self._active):
            active[topic] = (*active.get(topic, ()), partition)
        self._hosted = self._report()
        return MemberRecord(self.node_id, self.url, active, generation, time.time(), self._hosted)

    def _publish(self, record: MemberRecord) -> None:
        """Publish record as this node's latest (the heartbeat re-sends it with a new time)."""
        self._published = record
        if self._first_published_at is None:
            self._first_published_at = record.time
        self._send(record.encode())

    def _send(self, value: bytes | None) -> None:
        """Produce value under this node's key and wait for it (a failure is logged; the heartbeat retries)."""
        assert self._producer is not None  # noqa: S101 - set by start()
        try:
            self._producer.produce(self.metadata_topic, key=self.node_id.encode(), value=value)
        except (KafkaException, BufferError) as exc:
            log.warning("could not publish membership of %s: %s", self.node_id, exc)
        self._producer.flush(5.0)

    def _notify(self) -> None:
        """Hand every new map to the subscribers, in order, until stop()."""
        while (new := self._maps.get()) is not None:
            for callback in list(self._callbacks):
                try:
                    callback(new)
                except Exception:  # a subscriber's bug must not silence the others or stop the notifier
                    log.exception("membership subscriber %r failed", callback)
