"""Records from a JSON-lines file, for ``iqgraph produce --file`` and ``iqgraph dev --data``.

One record per line::

    {"key": "customer-1", "value": {"item": "widget", "amount": 9.5}, "timestamp": 1767225600000}

- ``key``: a string, or an integer for a topic with ``key_format="long"``; null for no key.
- ``value``: an object for JSON topics (a string for string topics); null is a tombstone.
- ``timestamp`` (optional): the record's Kafka timestamp, epoch milliseconds or ISO 8601; default: now.
- ``topic`` (optional): one of the app's topics; default: its first.

A line that is not such a record is a ``BadLine`` with its number and what to fix; blank lines are skipped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from iqgraph.streaming.decode import serialize_value
from iqgraph.streaming.definitions import App, Topic
from iqgraph.streaming.partitioner import serialize_key

RECORD_FIELDS = frozenset({"key", "value", "timestamp", "topic"})


@dataclass(frozen=True)
class FileRecord:
    """One record to produce, serialized as the topic expects."""

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    line: int


class BadLine(ValueError):
    """A line that is not a record; the message names the line and what is wrong."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line


def read_records(lines: Iterable[bytes], app: App) -> Iterator[FileRecord | BadLine]:
    """Yield each line's record (lines as bytes: invalid UTF-8 is a bad line, not an exception), or a BadLine."""
    topics = {t.name: t for t in app.topics}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            yield _record(number, text, topics, app.topics[0])
        except BadLine as bad:
            yield bad


def _record(number: int, text: bytes, topics: dict[str, Topic], default: Topic) -> FileRecord:
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadLine(number, f"not JSON ({exc})") from None
    if not isinstance(raw, dict) or "value" not in raw or not set(raw) <= RECORD_FIELDS:
        raise BadLine(number, 'expected an object {"key": …, "value": …} with optional "timestamp" and "topic"')
    name = raw.get("topic", default.name)
    topic = topics.get(name) if isinstance(name, str) else None
    if topic is None:
        raise BadLine(number, f"unknown topic {raw['topic']!r}; the app's topics: {sorted(topics)}")
    return FileRecord(topic.name, _key(number, raw.get("key"), topic), _value(number, raw["value"], topic),
                      _timestamp(number, raw.get("timestamp")), number)  # fmt: skip


def _key(number: int, key: Any, topic: Topic) -> bytes | None:
    if key is None:
        return None
    expected = int if topic.key_format == "long" else str
    if type(key) is not expected:
        kind = "an integer" if expected is int else "a string"
        raise BadLine(number, f"key {key!r} must be {kind} for {topic.name!r}")
    if isinstance(key, int) and not -(2**63) <= key < 2**63:
        raise BadLine(number, f"key {key} is out of the 64-bit range of a long key")
    return serialize_key(key, topic.key_format)


def _value(number: int, value: Any, topic: Topic) -> bytes | None:
    if value is None:
        return None
    if topic.value_format in ("json", "avro"):
        if not isinstance(value, dict):
            raise BadLine(number, f"value must be a JSON object for topic {topic.name!r}")
        try:
            return serialize_value(topic, value)
        except ValueError as exc:
            raise BadLine(number, f"value for topic {topic.name!r} {exc}") from None
    if not isinstance(value, str):
        raise BadLine(number, f"value must be a string for topic {topic.name!r} ({topic.value_format})")
    return value.encode()


def _timestamp(number: int, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return int(parsed.replace(tzinfo=parsed.tzinfo or dt.UTC).timestamp() * 1000)
    raise BadLine(number, f"timestamp {value!r} must be epoch milliseconds or ISO 8601")
