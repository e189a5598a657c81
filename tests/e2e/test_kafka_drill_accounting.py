"""The Kafka drill's accounting of an order the input topic holds twice (librdkafka#4953: an idempotent producer's
retry after an epoch bump), on a scripted read-back: no brokers, no nodes. The drill itself meets such a duplicate
in about 1 run of 12, so its tolerance is pinned down here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from iqgraph.examples.shop import build_app
from tests.support.cluster_load import Answered
from tests.support.kafka_drill import AckedIngest, Drill, wrong

ORDERS = [("customer-1", {"id": "o-1"}), ("customer-2", {"id": "o-2"}), ("customer-1", {"id": "o-3"})]


def scripted_ingest() -> AckedIngest:
    """Return an AckedIngest that handed ORDERS over and had each acknowledged, without a producer."""
    ingest = AckedIngest.__new__(AckedIngest)
    ingest.keys, ingest.values, ingest.sent, ingest.handed_at, ingest.acked = [], [], {}, [], []
    ingest.at = {}
    for index, (key, value) in enumerate(ORDERS):
        ingest.at.setdefault(key, []).append(index)
        ingest.keys.append(key)
        ingest.values.append(value)
        ingest.sent[orjson.dumps(value)] = index
        ingest.handed_at.append(float(index))
        ingest.acked.append((index, 0, index, float(index)))
    return ingest


def drill_holding(held: list[bytes], answers: Sequence[tuple[str, int]] = ()) -> Drill:
    """Return a Drill whose input topic held the values held (partition 0, in offset order) and whose reader got
    answers (key, count) after every order was handed over."""
    reader: Any = type("Reader", (), {})()  # what wrong() reads of a Reader: its answers
    after = len(ORDERS)  # every order handed over before each answer was sent
    reader.answers = [
        Answered("node-0", (key,), True, 9.0, 9.5, after, after, {"data": {"orderCount": {"getMany": [n]}}})
        for key, n in answers
    ]
    ready: Any = None  # not read here
    drill = Drill(build_app("orders", 1), "orders", [], scripted_ingest(), reader, ready, [], 0, Path("."))
    drill.held = {0: [(offset, None, value) for offset, value in enumerate(held)]}
    return drill


def test_an_order_held_twice_is_counted_twice_in_the_ground_truth_and_bounds() -> None:
    values = [orjson.dumps(v) for _, v in ORDERS]
    drill = drill_holding([values[0], values[1], values[0], values[2]])  # o-1 again, after o-2
    assert drill.doubled == {0: 1}
    assert drill.held_events() == [ORDERS[0], ORDERS[1], ORDERS[0], ORDERS[2]]
    assert drill.most("customer-1", before=1) == 2 and drill.most("customer-1", before=3) == 3
    assert drill.most("customer-2", before=3) == 1  # another key's duplicate raises no bound


def test_an_answer_may_count_a_duplicate_the_topic_holds_and_no_more() -> None:
    values = [orjson.dumps(v) for _, v in ORDERS]
    doubled = drill_holding([values[0], values[1], values[0], values[2]], [("customer-1", 3), ("customer-2", 1)])
    assert wrong(doubled) == []
    single = drill_holding(values, [("customer-1", 3)])
    assert wrong(single) == ["node-0 customer-1: 3 not in [0, 2]"]


def test_a_record_that_is_no_order_handed_over_fails_the_read_back() -> None:
    drill = drill_holding([orjson.dumps({"id": "invented"})])
    with pytest.raises(AssertionError, match="holds no order handed over"):
        drill.held_orders()


def test_an_order_acknowledged_without_an_offset_need_only_be_in_its_partition() -> None:
    values = [orjson.dumps(v) for _, v in ORDERS]
    drill = drill_holding(values)
    assert drill.misplaced() == []
    index, partition, _, when = drill.ingest.acked[1]
    drill.ingest.acked[1] = (index, partition, -1, when)  # a retry found o-2 written (librdkafka#4438)
    assert drill.misplaced() == [] and drill.ingest.without_offset() == [(1, 0, -1, 1.0)]
    drill.held = {0: [(0, None, values[0]), (2, None, values[2])]}  # o-2 is not there after all
    assert drill.misplaced() == [(1, 0, -1, 1.0)]
    drill.ingest.acked[2] = (2, partition, 0, 2.0)  # o-3 said to be at offset 0, which holds o-1
    assert drill.misplaced() == [(1, 0, -1, 1.0), (2, 0, 0, 2.0)]
