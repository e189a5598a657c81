"""An answer read while its node cannot reach Kafka says so (issue 42 part 2): the serving node's Kafka outage
travels with its answers (``Answer.kafka_away_since``, over the peer wire as ``kafkaAwaySince``) and every read it
served is reported in ``extensions.staleness`` with ``kafkaUnreachableSinceSeconds`` — an active's too, not only a
standby's. The node end to end: tests/app/cluster/test_kafka_reach.py (a broker killed under a running node)."""

from __future__ import annotations

from iqgraph.schema import wire
from iqgraph.schema.reports import Reports
from iqgraph.schema.types import Answer
from iqgraph.stores import Page

SINCE = 1_790_000_000.5


def test_the_outage_travels_with_every_kind_of_peer_answer() -> None:
    lookup = wire.decode_lookup(wire.encode_lookup(Answer([3], {0: 7}, {0: 2}, SINCE)), windowed=False)
    assert (lookup.value, lookup.positions, lookup.lags, lookup.kafka_away_since) == ([3], {0: 7}, {0: 2}, SINCE)
    counted = wire.decode_count(wire.encode_count(Answer({1: 40}, {1: 7}, {1: 0}, SINCE)))
    assert counted.kafka_away_since == SINCE
    scanned = wire.decode_scan(wire.encode_scan(Answer({0: Page([], None)}, {0: 1}, {0: 0}, SINCE)), windowed=False)
    assert scanned.kafka_away_since == SINCE
    called = wire.decode_call_answer(wire.encode_call_answer(Answer([wire.Owned(True, 5)], kafka_away_since=SINCE)))
    assert called.kafka_away_since == SINCE


def test_an_answer_from_a_node_that_reaches_kafka_carries_nothing_more() -> None:
    encoded = wire.encode_lookup(Answer([3], {0: 7}, {0: 2}))
    assert "kafkaAwaySince" not in encoded
    assert wire.decode_lookup(encoded, windowed=False).kafka_away_since is None


def test_a_read_served_while_kafka_is_away_is_reported_with_since_when() -> None:
    reports = Reports()
    reports.stale("order_count", 2, "node-1", 4, SINCE)  # an active cut off from Kafka
    reports.stale("order_count", 0, "node-2", 9)  # a standby, Kafka reached
    assert reports.extensions()["staleness"] == [
        {"store": "order_count", "partition": 0, "node": "node-2", "lag": 9},
        {"store": "order_count", "partition": 2, "node": "node-1", "lag": 4, "kafkaUnreachableSinceSeconds": SINCE},
    ]
