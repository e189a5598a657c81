"""Bad records mixed into good ones: the good are applied, the bad counted and dead-lettered."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer

from iqgraph.examples.shop import build_app
from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import KafkaSettings
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from tests.conftest import MakeTopic
from tests.support.ground_truth import expected
from tests.support.pipeline import BAD, START_MS
from tests.support.readback import read_back


def _dead_letters(broker: KafkaBroker, topic: str, expected_count: int) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": f"dlq-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    found: list[Any] = []
    try:
        for _ in range(60):
            found += [m for m in consumer.consume(100, timeout=0.5) if m.error() is None]
            if len(found) >= expected_count:
                break
    finally:
        consumer.close()
    return found


def test_bad_records_are_counted_and_dead_lettered(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(2, prefix="orders")
    dlq = make_topic(1, prefix="dlq")
    base = build_app(topic, 2)
    app = dataclasses.replace(
        base,
        topics=[dataclasses.replace(base.topics[0], max_value_bytes=4096)],
        kafka=KafkaSettings(dead_letter_topic=dlq),
    )
    assert app.generator is not None
    good = list(itertools.islice(app.generator(5, START_MS), 400))
    records = [(k.encode(), orjson.dumps(v), None) for k, v in good[:200]]
    records += [(key, value, 0) for key, value, _ in BAD]
    records += [(k.encode(), orjson.dumps(v), None) for k, v in good[200:]]
    produce(broker.bootstrap_servers, topic, records)

    settings = RunnerSettings(broker.bootstrap_servers)
    runner = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "shop"), settings)
    try:
        runner.start({topic: [0, 1]})
        runner.wait_until_caught_up(timeout=180)
        partitions = runner.partitions[topic]
        actual = read_back(app, partitions.values())
        truth = expected(app, good)
        assert actual.kv["order_count"] == truth.kv["order_count"]
        for store in app.stores:
            assert sum(p.db.counter(f"bad:{store.name}") for p in partitions.values()) == len(BAD), store.name
    finally:
        runner.stop()

    letters = _dead_letters(broker, dlq, len(BAD))
    assert len(letters) == len(BAD)
    errors = sorted(dict(m.headers())["iq.error"].decode() for m in letters)
    assert errors == sorted(reason for _, _, reason in BAD)
    offsets = []
    for message in letters:
        headers = dict(message.headers())
        assert headers["iq.topic"].decode() == topic
        assert headers["iq.partition"] == b"0"
        offsets.append(int(headers["iq.offset"]))
    assert sorted(offsets) == list(range(min(offsets), min(offsets) + len(BAD)))
    assert {m.value() for m in letters} == {value for _, value, _ in BAD}


def test_a_record_bad_for_one_store_only_is_dead_lettered_with_its_bytes_and_counted_there(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    # items_sold and item_orders_per_minute are keyed by the item column: an order without an item is bad for
    # them (counted for each), good for the others, and dead-lettered once
    topic = make_topic(1, prefix="orders")
    dlq = make_topic(1, prefix="dlq")
    app = dataclasses.replace(build_app(topic, 1), kafka=KafkaSettings(dead_letter_topic=dlq))
    assert app.generator is not None
    good = list(itertools.islice(app.generator(9, START_MS), 30))
    no_item = orjson.dumps({**good[0][1], "item": None})
    records = [(k.encode(), orjson.dumps(v), None) for k, v in good] + [(b"customer-0009", no_item, None)]
    produce(broker.bootstrap_servers, topic, records)
    settings = RunnerSettings(broker.bootstrap_servers)
    runner = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "shop"), settings)
    try:
        runner.start({topic: [0]})
        runner.wait_until_caught_up(timeout=180)
        db = runner.partitions[topic][0].db
        assert db.counter("bad:items_sold") == 1 and db.counter("bad:item_orders_per_minute") == 1
        assert db.counter("bad:order_count") == 0
        counted = sum(v for _, v in runner.partitions[topic][0].kv("order_count").all(limit=1000).items)
        assert counted == len(records)  # the order counts for the stores it is good for
    finally:
        runner.stop()
    [letter] = _dead_letters(broker, dlq, 1)  # both bad stores flushed their letters before the batch committed
    assert dict(letter.headers())["iq.error"] == b"null key"
    assert (letter.key(), letter.value()) == (b"customer-0009", no_item)
