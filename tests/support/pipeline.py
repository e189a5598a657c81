"""What the end-to-end pipeline tests send and check: the first event's time, events produced to a topic, bad
records among them, and a node's stores compared with the ground truth."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import App
from tests.support.ground_truth import expected

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

#: Records a pipeline must count and dead-letter, not apply: (key, value, the reason the dead letter gives).
BAD = [
    (b"customer-0001", b"{not json", "undecodable value"),
    (
        b"customer-0002",
        orjson.dumps({"customer": "customer-0002", "amount": "lots", "ts": "2026-01-01T00:00:01Z"}),
        "undecodable value",
    ),
    (None, orjson.dumps({"customer": "x", "amount": 1.0, "ts": "2026-01-01T00:00:02Z"}), "null key"),
    (b"customer-0003", b'{"pad": "' + b"x" * 5000 + b'"}', "value too large"),
    (b"customer-0004", None, "null value"),
    # epoch milliseconds in the TIMESTAMP column: Spark reads a number as seconds, the year 58884
    (
        b"customer-0005",
        orjson.dumps({"customer": "customer-0005", "amount": 1.0, "ts": 1_796_040_000_000}),
        "ts: a time outside the years 1 to 9999",
    ),
]


def send(broker: KafkaBroker, topic: str, events: list[tuple[str, dict[str, Any]]]) -> None:
    produce(broker.bootstrap_servers, topic, [(k.encode(), orjson.dumps(v), None) for k, v in events])


def assert_equal_to_ground_truth(app: App, actual: Any, events: list[tuple[str, dict[str, Any]]]) -> None:
    truth = expected(app, events)
    for name, table in truth.kv.items():
        got = actual.kv[name]
        assert got.keys() == table.keys(), name
        for key, value in table.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-9), (name, key)
            elif isinstance(value, dict):
                assert {k: v for k, v in got[key].items() if k != "ts"} == {
                    k: v for k, v in value.items() if k != "ts"
                }, (name, key)
            else:
                assert got[key] == value, (name, key)
    for name, table in truth.windows.items():
        got = actual.windows[name]
        assert got.keys() == table.keys(), name
        assert all(got[k] == pytest.approx(v, rel=1e-9) for k, v in table.items()), name
        assert actual.late[name] == truth.late[name], name
