"""Kafka offsets: the iqkafka source's JSON form and read limits, and the long-lived offsets client every node uses.

Spark stores a source offset as JSON; ours maps each owned partition, as a string, to the next offset to read:
``{"0": 123, "3": 9}``. Inside Python an offset map is ``dict[int, int]``.

`KafkaOffsets` keeps ONE AdminClient for the life of the stream reader: Spark calls ``latestOffset`` every
trigger, and creating a client per call cost ~300 ms per micro-batch, against < 1 ms for a ListOffsets request
on a warm client. One ListOffsets request covers all partitions of a leader, so the cost barely grows with P.

While a partition's leadership moves (a broker killed, restarted or shut down), librdkafka's ListOffsets leaves
the work to its caller; measured on a 3-broker cluster whose leader of partition 0 was killed with SIGKILL and
started again 14 s later:
- for the dead leader's partition it answered offset -1001 (OFFSET_INVALID) without an error, on every request
  until the broker was back, although another broker led the partition ~4 s after the kill: the admin client
  refreshed its metadata only when asked for it;
- once the broker was back, it answered FENCED_LEADER_EPOCH (its leader epoch was stale) on every request;
- a request sent to the dead leader waited for its whole timeout.
Other answers mean the same "ask again with fresh metadata" (`RETRIABLE`): NOT_LEADER_OR_FOLLOWER,
LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION (a broker behind on the metadata), OFFSET_NOT_AVAILABLE (a new
leader unsure of its high watermark), and librdkafka's own _NOENT "No leaders found" (its cached metadata, kept
from a whole cluster's outage, names no leader: it answered so on every request for 170 s after the cluster's
return, until asked for fresh metadata). So each request here takes at most ATTEMPT_TIMEOUT_S, and the partitions
that failed so, or got no offset, are asked again after the topic's metadata is refreshed (`list_topics`: librdkafka
keeps the answer for the next request) and a short backoff, until the call's timeout; then, or at once for any
other error, `KafkaSourceError`. tests/e2e/test_kafka_broker_loss.py lists the offsets every 0.1 s through the
same drill: no error, no wrong offset, the longest call 4–9 s (while no broker led the partition).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import OFFSET_INVALID, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

__all__ = [
    "KafkaOffsets",
    "KafkaSourceError",
    "OffsetMap",
    "RETRIABLE",
    "cap_offsets",
    "decode_offsets",
    "encode_offsets",
    "fair_shares",
]

log = logging.getLogger(__name__)

#: Kafka partition -> offset.
OffsetMap = dict[int, int]

#: Error codes worth a retry, besides those librdkafka marks retriable (`KafkaError.retriable`, which a
#: partition's error in an admin result does not carry): leadership moving, metadata behind, a lost connection.
RETRIABLE: frozenset[int] = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,  # NOT_LEADER_OR_FOLLOWER
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        # "Failed to query partition leaders: No leaders found": librdkafka's cached metadata has no leader for the
        # partition (kept from a cluster's outage) and is refreshed only when asked (or every 5 minutes): seen on
        # one node of the Kafka drill for 170 s after the whole cluster was back, each restart dying on it
        KafkaError._NOENT,
    }
)
#: The first wait before a retry, doubled per attempt up to the most; never past the caller's timeout.
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
#: The most one request may take: one sent to a dead leader is given up for the leader of fresh metadata.
ATTEMPT_TIMEOUT_S = 2.0


class KafkaSourceError(RuntimeError):
    """The iqkafka source was misconfigured, or Kafka could not serve it."""


def encode_offsets(offsets: Mapping[int, int]) -> dict[str, int]:
    """Return offsets in Spark's JSON form, partitions as strings in ascending order."""
    return {str(p): int(offsets[p]) for p in sorted(offsets)}


def decode_offsets(offsets: Mapping[str, Any] | None) -> OffsetMap:
    """Return the offset map of a JSON offset ({"<partition>": offset})."""
    return {int(p): int(o) for p, o in (offsets or {}).items()}


def fair_shares(backlog: Mapping[int, int], budget: int) -> OffsetMap:
    """Split budget records across partitions evenly, none beyond its backlog; the rest go to others."""
    shares = dict.fromkeys(backlog, 0)
    pending = sorted((p for p in backlog if backlog[p] > 0), key=lambda p: (backlog[p], p))
    for i, p in enumerate(pending):
        shares[p] = min(backlog[p], budget // (len(pending) - i))
        budget -= shares[p]
    return shares


def cap_offsets(start: Mapping[int, int], latest: Mapping[int, int], max_records: int) -> OffsetMap:
    """Return end offsets that read at most max_records after start, shared fairly across partitions."""
    backlog = {p: max(latest[p] - start[p], 0) for p in latest}
    shares = fair_shares(backlog, max_records)
    return {p: start[p] + shares[p] for p in latest}


def _retriable(exc: KafkaException) -> bool:
    """Return whether a Kafka call that raised exc is worth making again (after fresh metadata)."""
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in RETRIABLE)


class KafkaOffsets:
    """Partitions and earliest / latest offsets of one topic, over one long-lived AdminClient.

    Every call ends within ``timeout`` seconds: retriable errors are retried until then (see the module).
    """

    def __init__(
        self,
        config: Mapping[str, str],
        topic: str,
        timeout: float = 30.0,
        *,
        admin: Callable[[dict[str, Any]], AdminClient] = lambda config: AdminClient(config, logger=log),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Args:
        admin: makes the AdminClient (tests give a fake); sleep: how a backoff waits.
        """
        self.topic = topic
        self.timeout = timeout
        self._admin = admin({**config})
        self._sleep = sleep

    def partitions(self) -> tuple[int, ...]:
        """Return the topic's partition ids in ascending order.

        A topic Kafka does not know (UNKNOWN_TOPIC_OR_PARTITION in the metadata) is an error at once: the
        metadata of any broker lists an existing topic, whoever leads its partitions.
        """
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while True:
            try:
                return self._partitions_once(deadline)
            except KafkaException as exc:
                self._retry_or_raise(f"no metadata for topic {self.topic!r}", exc, deadline, attempt)
            attempt += 1

    def _partitions_once(self, deadline: float) -> tuple[int, ...]:
        """Ask once for the topic's partitions; raise KafkaException for an error worth judging for a retry."""
        metadata = self._admin.list_topics(self.topic, timeout=_attempt(deadline)).topics[self.topic]
        error = metadata.error
        if error is None:
            return tuple(sorted(metadata.partitions))
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise KafkaSourceError(f"topic {self.topic!r}: {error}")
        raise KafkaException(error)

    def earliest(self, partitions: Iterable[int]) -> OffsetMap:
        """Return the first offset still held by each partition."""
        return self._list(partitions, OffsetSpec.earliest())

    def latest(self, partitions: Iterable[int]) -> OffsetMap:
        """Return the offset after the last committed record of each partition (its stable end)."""
        return self._list(partitions, OffsetSpec.latest())

    def _list(self, partitions: Iterable[int], spec: OffsetSpec) -> OffsetMap:
        """Return the offsets of partitions for spec, in one ListOffsets request per leader (and per retry)."""
        pending, found = set(partitions), OffsetMap()
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while pending:
            failed = self._list_once(pending, spec, deadline, found)
            if not failed:
                break
            partition, exc = _worst(failed)
            self._retry_or_raise(f"could not list offsets of {self.topic!r} [{partition}]", exc, deadline, attempt)
            self._refresh_metadata(deadline)
            pending, attempt = set(failed), attempt + 1
        return found

    def _list_once(
        self, partitions: set[int], spec: OffsetSpec, deadline: float, found: OffsetMap
    ) -> dict[int, KafkaException]:
        """Ask once for partitions' offsets: put the answers in found, return the partitions that failed and why."""
        request = {TopicPartition(self.topic, p): spec for p in sorted(partitions)}
        futures = self._admin.list_offsets(
            request,
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=_attempt(deadline),
        )
        failed: dict[int, KafkaException] = {}
        for tp, future in futures.items():
            try:
                offset = future.result().offset
            except KafkaException as exc:
                failed[tp.partition] = exc
                continue
            if offset < 0:  # OFFSET_INVALID without an error: the request went to a leader that is gone
                failed[tp.partition] = KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, _NO_OFFSET))
            else:
                found[tp.partition] = offset
        return failed

    def _retry_or_raise(self, what: str, exc: KafkaException, deadline: float, attempt: int) -> None:
        """Wait the attempt's backoff when exc is retriable and time is left; else raise KafkaSourceError."""
        wait = min(FIRST_BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
        if not _retriable(exc) or time.monotonic() + wait >= deadline:
            raise KafkaSourceError(f"{what}: {exc}") from exc
        log.info("%s: %s; retrying in %.2f s", what, exc, wait)
        self._sleep(wait)

    def _refresh_metadata(self, deadline: float) -> None:
        """Ask for the topic's metadata: librdkafka keeps the answer (its leaders and epochs) for the next request."""
        try:
            self._admin.list_topics(self.topic, timeout=_attempt(deadline))
        except KafkaException as exc:  # the retry will say what is wrong, if anything still is
            log.debug("refreshing the metadata of %s: %s", self.topic, exc)


_NO_OFFSET = f"no offset (librdkafka answered {OFFSET_INVALID}): its leader is gone or unknown"


def _worst(failed: Mapping[int, KafkaException]) -> tuple[int, KafkaException]:
    """Return the failure that decides about a retry: the first one not retriable, else the first."""
    ordered = sorted(failed.items())
    return next(((p, exc) for p, exc in ordered if not _retriable(exc)), ordered[0])


def _attempt(deadline: float) -> float:
    """Return the timeout of one request: what is left until deadline (at least 0.1 s), at most ATTEMPT_TIMEOUT_S."""
    return min(max(deadline - time.monotonic(), 0.1), ATTEMPT_TIMEOUT_S)
