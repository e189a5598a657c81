"""Expected store contents computed in plain Python from the events a test produced.

Independent of the pipeline: records are ordered per partition as produced, stream time is the running
maximum of event times (per partition), windows are found by brute force. Rankings hold no values of their own.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from iqgraph.stores import StoreKind
from iqgraph.streaming.definitions import App
from iqgraph.streaming.partitioner import partition_for


def event_ms(value: dict[str, Any], column: str) -> int:
    """Return the epoch milliseconds of an ISO timestamp field."""
    stamp = dt.datetime.fromisoformat(value[column].replace("Z", "+00:00"))
    return int(stamp.timestamp() * 1000)


@dataclass
class Expected:
    """Per store: kv values by key, window values by (key, start), late counts, bloom key sets."""

    kv: dict[str, dict[Any, Any]] = field(default_factory=lambda: defaultdict(dict))
    windows: dict[str, dict[tuple[Any, int], Any]] = field(default_factory=lambda: defaultdict(dict))
    late: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bloom: dict[str, set[Any]] = field(default_factory=lambda: defaultdict(set))


def _fold(kind: str, old: Any, value: Any) -> Any:
    if kind == "count":
        return (old or 0) + 1
    if kind == "latest":
        return value
    if value is None:
        return old
    if kind == "sum":
        return value if old is None else old + value
    if kind == "min":
        return value if old is None else min(old, value)
    if kind == "max":
        return value if old is None else max(old, value)
    if kind == "avg":
        total, n = old or (0.0, 0)
        return (total + value, n + 1)
    raise AssertionError(kind)


def _final(kind: str, state: Any) -> Any:
    return state[0] / state[1] if kind == "avg" else state


def by_partition(events: Sequence[tuple[str, dict[str, Any]]], partitions: int) -> dict[int, list[Any]]:
    """Return the events of each partition in produce order (murmur2 on the UTF-8 key)."""
    result: dict[int, list[Any]] = defaultdict(list)
    for key, value in events:
        result[partition_for(key, partitions, "string", "murmur2")].append((key, value))
    return result


def expected(app: App, events: Sequence[tuple[str, dict[str, Any]]]) -> Expected:
    """Return what every store of app should hold after applying events."""
    topic = app.topics[0]
    out = Expected()
    for records in by_partition(events, topic.partitions).values():
        for store in app.stores:
            _apply(out, store, records, str(topic.event_time))
    for store in app.stores:
        kind = store.aggregate.kind
        if store.kind is StoreKind.KEY_VALUE:
            out.kv[store.name] = {k: _final(kind, v) for k, v in out.kv[store.name].items()}
        if store.kind is StoreKind.WINDOW:
            out.windows[store.name] = {k: _final(kind, v) for k, v in out.windows[store.name].items()}
    return out


def _apply(out: Expected, store: Any, records: list[Any], time_column: str) -> None:
    agg = store.aggregate
    column_value = (lambda v: v.get(agg.column)) if agg.column else (lambda v: v)
    if store.kind is StoreKind.BLOOM:
        out.bloom[store.name].update(v[store.key] if store.key else k for k, v in records)
    elif store.kind is StoreKind.KEY_VALUE:
        table = out.kv[store.name]
        for key, value in records:
            table[key] = _fold(agg.kind, table.get(key), column_value(value))
    elif store.kind is StoreKind.WINDOW:
        size, advance, grace = store.window.size_ms, store.window.advance, store.window.grace_ms
        table = out.windows[store.name]
        stream_time = None
        for record_key, value in records:
            key = value[store.key] if store.key else record_key  # a column's key: partitions' values add up
            ts = event_ms(value, time_column)
            stream_time = ts if stream_time is None else max(stream_time, ts)
            start = (ts - size) // advance * advance
            while start <= ts:
                if start <= ts < start + size:
                    if start + size + grace <= stream_time:
                        out.late[store.name] += 1
                    else:
                        table[(key, start)] = _fold(agg.kind, table.get((key, start)), column_value(value))
                start += advance
