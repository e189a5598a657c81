"""Avro values through the real pipeline: plain and Confluent-framed records decoded alike, bad Avro counted."""

from __future__ import annotations

import datetime as dt
import io
import random
import struct
from pathlib import Path
from typing import Any

import fastavro

from iqgraph.stores import StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import App, Topic, count, key_value_store, latest, sum_
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from iqgraph.streaming.value_types import value_types
from tests.conftest import MakeTopic

SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "item", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def _encode(record: dict[str, Any], framed: bool) -> bytes:
    out = io.BytesIO()
    if framed:
        out.write(b"\x00" + struct.pack(">I", 7))
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), record)
    return out.getvalue()


def test_avro_orders_plain_and_framed_equal_ground_truth_and_bad_avro_is_counted(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(2, prefix="avro")
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(__import__("json").dumps(SCHEMA))
    app = App(
        name="avro",
        topics=[Topic(topic, schema=str(schema_file), value_format="avro", event_time="ts", partitions=2)],
        stores=[
            key_value_store("orders", topic, count()),
            key_value_store("spend", topic, sum_("amount")),
            key_value_store("last", topic, latest("item", "note", "ts")),
        ],
    )
    assert value_types(app, spark)["last"].simpleString() == "struct<item:string,note:string,ts:timestamp>"
    rng = random.Random(2)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    orders = []
    for i in range(200):
        customer = f"c-{rng.randrange(12)}"
        note = None if i % 3 else f"n{i}"
        order = {"item": rng.choice("abc"), "amount": float(i), "note": note, "ts": start + dt.timedelta(seconds=i)}
        orders.append((customer, order))
    records = [(c.encode(), _encode(o, framed=i % 2 == 0), None) for i, (c, o) in enumerate(orders)]
    records += [(b"c-1", b"\x02garbage-not-avro", 0), (b"c-2", b"\x00\x00\x00\x00\x07\xff", 0)]
    produce(broker.bootstrap_servers, topic, records)

    settings = RunnerSettings(broker.bootstrap_servers)
    runner = StreamRunner(app, spark, StateDirectory(tmp_path / "state", "avro"), settings)
    try:
        runner.start({topic: [0, 1]})
        runner.wait_until_caught_up(timeout=180)
        found: dict[str, dict[str, Any]] = {"orders": {}, "spend": {}, "last": {}}
        for stores in runner.partitions[topic].values():
            for name, into in found.items():
                into.update(stores.kv(name).all(limit=1000).items)
        counts: dict[str, int] = {}
        spend: dict[str, float] = {}
        last: dict[str, Any] = {}
        for customer, order in orders:
            counts[customer] = counts.get(customer, 0) + 1
            spend[customer] = spend.get(customer, 0.0) + order["amount"]
            last[customer] = order
        assert found["orders"] == counts
        assert found["spend"] == spend
        for customer, order in last.items():
            value = found["last"][customer]
            assert value["item"] == order["item"] and value.get("note") == order["note"]
            stamp = dt.datetime.fromisoformat(value["ts"].replace("Z", "+00:00"))
            assert stamp == order["ts"]
        bad = sum(p.db.counter("bad:orders") for p in runner.partitions[topic].values())
        assert bad == 2
    finally:
        runner.stop()


def test_producers_send_avro_to_an_avro_topic_and_a_misfit_line_is_a_bad_line(tmp_path: Path) -> None:
    from iqgraph.app.dev.data_file import BadLine, read_records
    from iqgraph.streaming.avro import decode_avro, load_avro_schema
    from iqgraph.streaming.decode import serialize_value

    topic = Topic("orders", schema=SCHEMA, value_format="avro", event_time="ts")
    app = App(name="avro", topics=[topic], stores=[key_value_store("orders", "orders", count())])
    order = {"item": "a", "amount": 2.5, "note": None, "ts": 1_767_225_600_000}
    decoded = decode_avro(serialize_value(topic, order), load_avro_schema(SCHEMA, topic="orders"))
    assert decoded is not None and decoded["item"] == "a" and decoded["amount"] == 2.5
    lines = [
        b'{"key": "c-1", "value": {"item": "a", "amount": 1.0, "note": null, "ts": 1767225600000}}\n',
        b'{"key": "c-2", "value": {"item": "a", "amount": "lots", "ts": 1767225600000}}\n',
    ]
    good = list(read_records(lines, app))
    bad = [r for r in good if isinstance(r, BadLine)]
    assert len(good) == 2 and len(bad) == 1 and "does not fit the Avro schema" in str(bad[0])
