"""The dead-letter topic: bad records, with why and where they came from in their headers."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaException, Producer

log = logging.getLogger(__name__)


class DeadLetterQueue:
    """Send bad records to a topic, each with headers naming its error, topic, partition and offset."""

    def __init__(self, bootstrap_servers: str, topic: str, config: Mapping[str, str] | None = None) -> None:
        self.topic = topic
        self._producer = Producer({**(config or {}), "bootstrap.servers": bootstrap_servers, "acks": "all"})
        self._failed: list[str] = []

    def send(self, key: bytes | None, value: bytes | None, error: str, source: tuple[str, int, int]) -> None:
        """Queue one bad record read at source (topic, partition, offset)."""
        topic, partition, offset = source
        headers: dict[str, str | bytes | None] = {
            "iq.error": error,
            "iq.topic": topic,
            "iq.partition": str(partition),
            "iq.offset": str(offset),
        }
        self._producer.produce(self.topic, value=value, key=key, headers=headers, on_delivery=self._delivered)
        self._producer.poll(0)

    def _delivered(self, err: object, _msg: object) -> None:
        if err is not None:
            self._failed.append(str(err))

    def close(self) -> None:
        """Flush what is queued and release the producer."""
        self._producer.flush(5.0)
        self._producer.close()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued record is acknowledged; raise KafkaException if one was not."""
        remaining = self._producer.flush(timeout)
        failed, self._failed = self._failed, []
        if remaining or failed:
            raise KafkaException(f"dead-letter topic {self.topic}: {remaining} unsent, errors: {failed[:3]}")
