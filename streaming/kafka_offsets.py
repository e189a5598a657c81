"""Kafka offsets for the iqkafka Spark source: the JSON form, read limits, and a long-lived offsets client.

Spark stores a source offset as JSON; ours maps each owned partition, as a string, to the next offset to read:
``{"0": 123, "3": 9}``. Inside Python an offset map is ``dict[int, int]``.

`KafkaOffsets` keeps ONE AdminClient for the life of the stream reader: Spark calls ``latestOffset`` every
trigger, and creating a client per call cost ~300 ms per micro-batch, against < 1 ms for a ListOffsets request
on a warm client. One ListOffsets request covers all partitions of a leader, so the cost barely grows with P.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

__all__ = [
    "KafkaOffsets",
    "KafkaSourceError",
    "OffsetMap",
    "cap_offsets",
    "decode_offsets",
    "encode_offsets",
    "fair_shares",
]

log = logging.getLogger(__name__)

#: Kafka partition -> offset.
OffsetMap = dict[int, int]


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


class KafkaOffsets:
    """Partitions and earliest / latest offsets of one topic, over one long-lived AdminClient."""

    def __init__(self, config: Mapping[str, str], topic: str, timeout: float = 30.0) -> None:
        self.topic = topic
        self.timeout = timeout
        self._admin = AdminClient(dict(config), logger=log)

    def partitions(self) -> tuple[int, ...]:
        """Return the topic's partition ids in ascending order."""
        try:
            metadata = self._admin.list_topics(self.topic, timeout=self.timeout).topics[self.topic]
        except KafkaException as exc:
            raise KafkaSourceError(f"no metadata for topic {self.topic!r}: {exc}") from exc
        if metadata.error is not None:
            raise KafkaSourceError(f"topic {self.topic!r}: {metadata.error}")
        return tuple(sorted(metadata.partitions))

    def earliest(self, partitions: Iterable[int]) -> OffsetMap:
        """Return the first offset still held by each partition."""
        return self._list(partitions, OffsetSpec.earliest())

    def latest(self, partitions: Iterable[int]) -> OffsetMap:
        """Return the offset after the last committed record of each partition (its stable end)."""
        return self._list(partitions, OffsetSpec.latest())

    def _list(self, partitions: Iterable[int], spec: OffsetSpec) -> OffsetMap:
        """Return the offsets of partitions for spec, in one ListOffsets request per leader."""
        request = {TopicPartition(self.topic, p): spec for p in partitions}
        if not request:
            return {}
        futures = self._admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=self.timeout
        )
        try:
            return {tp.partition: future.result().offset for tp, future in futures.items()}
        except KafkaException as exc:
            raise KafkaSourceError(f"could not list offsets of {self.topic!r}: {exc}") from exc
