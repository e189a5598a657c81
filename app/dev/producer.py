"""Produce into an app's topics (``iqgraph produce``, ``iqgraph dev``): generated events, or a user's records.

Keys are partitioned the way the app routes them (``producer_config``: murmur2 as Kafka's Java client), so
every record lands in the partition a lookup will ask.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from iqgraph.app.dev.data_file import BadLine, FileRecord
from iqgraph.streaming.broker import BATCHING
from iqgraph.streaming.decode import serialize_value
from iqgraph.streaming.definitions import App, DefinitionError
from iqgraph.streaming.partitioner import serialize_key

log = logging.getLogger(__name__)

__all__ = ["produce_events", "produce_records", "producer_config"]


class _RetriedByLibrdkafka(logging.Filter):
    """Drop librdkafka's warning that a just-started broker is still loading its coordinator: it retries by itself,
    and a record it cannot deliver in the end fails the produce (``_flush`` raises), so the line only alarms."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Coordinator load in progress: retrying" not in record.getMessage()


log.addFilter(_RetriedByLibrdkafka())  # the producers' librdkafka logger (Producer(logger=log))


def producer_config(app: App, bootstrap_servers: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return the librdkafka producer settings for app, partitioning like the Java client (murmur2)."""
    partitioner = "consistent_random" if app.kafka.partitioner == "consistent_random" else "murmur2_random"
    config = {**BATCHING, **app.kafka.config, **(extra or {})}
    return {**config, "bootstrap.servers": bootstrap_servers, "partitioner": partitioner}


def produce_events(
    app: App,
    config: Mapping[str, Any],
    *,
    count: int | None,
    rate: float | None,
    seed: int = 1,
    start_ms: int | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Produce count events (None: until stop is set) at about rate per second (None: as fast as possible)."""
    if app.generator is None:
        raise DefinitionError(f"app {app.name!r} has no event generator to produce from")
    producer = Producer(dict(config), logger=log)
    failures: list[KafkaError] = []
    delivered = _on_delivery(failures)
    events = app.generator(seed, start_ms if start_ms is not None else int(time.time() * 1000))
    started = time.monotonic()
    sent = 0
    try:
        for event in itertools.islice(events, count):
            if stop is not None and stop.is_set():
                break
            topic, key, value = app.addressed(event)
            raw_key = None if key is None else serialize_key(key, topic.key_format)
            _send(producer, topic.name, raw_key, None if value is None else serialize_value(topic, value), delivered)
            sent += 1
            if rate:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            if on_progress is not None and sent % 1000 == 0:
                on_progress(sent)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends an endless run: deliver what was sent, then say how many
    _flush(producer, failures)
    return sent


def produce_records(
    config: Mapping[str, Any], records: Iterable[FileRecord | BadLine], on_bad: Callable[[BadLine], None]
) -> tuple[int, int]:
    """Produce a file's records in order; hand each bad line to on_bad; return (records sent, bad lines)."""
    producer = Producer(dict(config), logger=log)
    failures: list[KafkaError] = []
    delivered = _on_delivery(failures)
    sent = bad = 0
    for record in records:
        if isinstance(record, BadLine):
            bad += 1
            on_bad(record)
            continue
        _send(producer, record.topic, record.key, record.value, delivered, record.timestamp_ms or 0)
        sent += 1
    _flush(producer, failures)
    return sent, bad


def _on_delivery(failures: list[KafkaError]) -> Callable[[KafkaError | None, Message], None]:
    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)

    return delivered


def _flush(producer: Producer, failures: list[KafkaError]) -> None:
    remaining = producer.flush(30)
    if failures or remaining:
        raise KafkaException(f"{len(failures)} records failed and {remaining} were not delivered: {failures[:3]}")


def _send(
    producer: Producer, topic: str, key: bytes | None, value: bytes | None, delivered: Any, timestamp_ms: int = 0
) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, on_delivery=delivered, timestamp=timestamp_ms)
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.1)
