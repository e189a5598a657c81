"""Avro values: schema loading and checks, the Spark type, decoding plain and Confluent-framed bytes, JSON text."""

from __future__ import annotations

import base64
import io
import json
import math
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fastavro
import orjson
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from iqgraph.streaming.avro import (
    avro_json,
    avro_json_column,
    avro_struct_type,
    decode_avro,
    load_avro_schema,
)
from iqgraph.streaming.definitions import DefinitionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"]}],
}
SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},  # first, so that id 0 makes a plain record start with byte 0
        {"name": "paid", "type": "boolean"},
        {"name": "qty", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "amount", "type": "double"},
        {"name": "customer", "type": "string"},
        {"name": "note", "type": ["null", "string"]},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "blob", "type": "bytes"},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {"name": "address", "type": ADDRESS},
        {"name": "billing", "type": ["null", "Address"]},
        {"name": "items", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}
EXPECTED_TYPE = StructType(
    [
        StructField("id", LongType()),
        StructField("paid", BooleanType()),
        StructField("qty", IntegerType()),
        StructField("ratio", FloatType()),
        StructField("amount", DoubleType()),
        StructField("customer", StringType()),
        StructField("note", StringType()),
        StructField("status", StringType()),
        StructField("blob", StringType()),
        StructField("hash", StringType()),
        StructField("address", StructType([StructField("city", StringType()), StructField("zip", IntegerType())])),
        StructField("billing", StructType([StructField("city", StringType()), StructField("zip", IntegerType())])),
        StructField("items", ArrayType(StringType())),
        StructField("attrs", MapType(StringType(), LongType())),
        StructField("ts", TimestampType()),
        StructField("ts_us", TimestampType()),
        StructField("day", DateType()),
        StructField("price", DecimalType(10, 2)),
        StructField("ref", StringType()),
    ]
)


def _record(id_: int, **changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": id_,
        "paid": True,
        "qty": -3,
        "ratio": 0.5,
        "amount": 1234.5678,
        "customer": "customer-0001 ✓",
        "note": None,
        "status": "PAID",
        "blob": b"\x00\x01\xfe\xff",
        "hash": b"abcd",
        "address": {"city": "Lisbon", "zip": 1100},
        "billing": None,
        "items": ["book", "pen"],
        "attrs": {"a": 1, "b": -(2**40)},
        "ts": datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
        "ts_us": datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        "day": date(2026, 2, 28),
        "price": Decimal("-12345678.90"),
        "ref": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    }
    return {**record, **changes}


@pytest.fixture(scope="module")
def parsed() -> dict[str, Any]:
    return load_avro_schema(SCHEMA, topic="orders")


def _plain(record: dict[str, Any], parsed: dict[str, Any]) -> bytes:
    stream = io.BytesIO()
    fastavro.schemaless_writer(stream, parsed, record)
    return stream.getvalue()


def _framed(record: dict[str, Any], parsed: dict[str, Any], schema_id: int = 42) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + _plain(record, parsed)


def test_the_struct_type_maps_every_supported_avro_type(parsed: dict[str, Any]) -> None:
    assert avro_struct_type(parsed) == EXPECTED_TYPE
    assert all(field.nullable for field in avro_struct_type(parsed).fields)


def test_plain_and_framed_values_round_trip(parsed: dict[str, Any]) -> None:
    record = _record(7, note="gift", billing={"city": "Porto", "zip": None}, ts_us=None)
    assert decode_avro(_plain(record, parsed), parsed) == record
    assert decode_avro(_framed(record, parsed), parsed) == record
    assert decode_avro(_framed(record, parsed, schema_id=0), parsed) == record


def test_a_plain_record_whose_first_byte_is_zero_still_decodes(parsed: dict[str, Any]) -> None:
    record = _record(0)
    data = _plain(record, parsed)
    assert data[0] == 0 and len(data) >= 5
    assert decode_avro(data, parsed) == record


def test_a_tiny_plain_record_starting_with_zero_decodes() -> None:
    tiny = load_avro_schema({"type": "record", "name": "T", "fields": [{"name": "n", "type": "long"}]}, topic="t")
    assert decode_avro(b"\x00", tiny) == {"n": 0}
    assert decode_avro(b"\x00\x00\x00\x00\x00\x02", tiny) == {"n": 1}  # framed, schema id 0
    assert decode_avro(b"\x00\x00\x00\x00\x00", tiny) is None  # framed with an empty body, and 5 bytes plain


@pytest.mark.parametrize(
    "make_bad",
    [
        pytest.param(lambda plain, framed: None, id="none"),
        pytest.param(lambda plain, framed: b"", id="empty"),
        pytest.param(lambda plain, framed: b"\xff" * 20, id="garbage"),
        pytest.param(lambda plain, framed: b"not avro at all, just text", id="text"),
        pytest.param(lambda plain, framed: plain[:-1], id="truncated"),
        pytest.param(lambda plain, framed: plain + b"\x00", id="trailing"),
        pytest.param(lambda plain, framed: framed[:-1], id="framed-truncated"),
        pytest.param(lambda plain, framed: framed + b"\x00", id="framed-trailing"),
    ],
)
def test_bad_values_decode_to_none(make_bad: Callable[[bytes, bytes], bytes | None], parsed: dict[str, Any]) -> None:
    data = make_bad(_plain(_record(7), parsed), _framed(_record(7), parsed))
    assert decode_avro(data, parsed) is None
    assert avro_json(data, parsed) is None


def test_a_huge_garbage_array_count_ends_in_none() -> None:
    arrays = load_avro_schema(
        {"type": "record", "name": "A", "fields": [{"name": "xs", "type": {"type": "array", "items": "int"}}]},
        topic="t",
    )
    count = io.BytesIO()
    fastavro.schemaless_writer(count, {"type": "long"}, 2**62)
    assert decode_avro(count.getvalue() + b"\x02\x04", arrays) is None


def test_json_text_carries_every_type_as_from_json_reads_it(parsed: dict[str, Any]) -> None:
    text = avro_json(_plain(_record(7), parsed), parsed)
    assert text is not None
    assert orjson.loads(text) == {
        "id": 7,
        "paid": True,
        "qty": -3,
        "ratio": 0.5,
        "amount": 1234.5678,
        "customer": "customer-0001 ✓",
        "note": None,
        "status": "PAID",
        "blob": base64.b64encode(b"\x00\x01\xfe\xff").decode(),
        "hash": base64.b64encode(b"abcd").decode(),
        "address": {"city": "Lisbon", "zip": 1100},
        "billing": None,
        "items": ["book", "pen"],
        "attrs": {"a": 1, "b": -(2**40)},
        "ts": "2026-01-02T03:04:05.678000Z",
        "ts_us": "1969-12-31T23:59:59.999999Z",
        "day": "2026-02-28",
        "price": -12345678.90,
        "ref": "12345678-1234-5678-1234-567812345678",
    }
    assert '"price":-12345678.90' in text  # a JSON number with every digit of the decimal


def test_non_finite_floats_become_the_strings_from_json_reads(parsed: dict[str, Any]) -> None:
    record = _record(7, ratio=math.nan, amount=-math.inf)
    text = avro_json(_plain(record, parsed), parsed)
    assert text is not None
    assert orjson.loads(text)["ratio"] == "NaN" and orjson.loads(text)["amount"] == "-Infinity"


def test_the_schema_loads_from_an_avsc_file_a_dict_and_json_text(tmp_path: Path, parsed: dict[str, Any]) -> None:
    path = tmp_path / "order.avsc"
    path.write_text(json.dumps(SCHEMA))
    other = tmp_path / "order.schema"
    other.write_text(json.dumps(SCHEMA))
    assert load_avro_schema(str(path), topic="orders") == parsed
    assert load_avro_schema(str(other), topic="orders") == parsed  # any existing path
    assert load_avro_schema(json.dumps(SCHEMA), topic="orders") == parsed
    assert load_avro_schema("\n  " + json.dumps(SCHEMA, indent=2), topic="orders") == parsed
    assert parsed["type"] == "record" and parsed["name"] == "shop.Order"


def _with_field(avro_type: Any) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "R",
        "fields": [{"name": "ok", "type": "int"}, {"name": "bad", "type": avro_type}],
    }


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        pytest.param("/no/such/dir/order.avsc", "cannot read Avro schema file '/no/such/dir/order.avsc'", id="missing"),
        pytest.param("{not json", "is not valid JSON", id="bad-json"),
        pytest.param({"type": "array", "items": "int"}, "top level must be a record, not 'array'", id="array"),
        pytest.param('"string"', "top level must be a record, not 'string'", id="primitive"),
        pytest.param(_with_field("Nope"), "invalid Avro schema", id="unknown-type"),
        pytest.param(_with_field(["int", "string"]), "field 'bad': union ['int', 'string']", id="two-types"),
        pytest.param(
            _with_field(["null", {"type": "record", "name": "In", "fields": [{"name": "x", "type": ["int", "long"]}]}]),
            "field 'bad.x': union ['int', 'long']",
            id="nested-two-types",
        ),
        pytest.param(_with_field("null"), "field 'bad': type \"null\" alone", id="null"),
        pytest.param(
            _with_field({"type": "int", "logicalType": "time-millis"}), "logicalType 'time-millis'", id="time-millis"
        ),
        pytest.param(
            _with_field({"type": "int", "logicalType": "timestamp-millis"}),
            "logicalType 'timestamp-millis' must annotate long",
            id="logical-on-wrong-base",
        ),
        pytest.param(
            _with_field({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}),
            "precision 40 is above Spark's maximum",
            id="wide-decimal",
        ),
        pytest.param(
            _with_field({"type": "array", "items": "null"}),
            "field 'bad': array items that take no bytes",
            id="null-items",
        ),
        pytest.param(
            {
                "type": "record",
                "name": "Node",
                "fields": [{"name": "next", "type": ["null", "Node"]}],
            },
            "field 'next': record 'Node' is recursive",
            id="recursive",
        ),
    ],
)
def test_unusable_schemas_raise_definition_errors_naming_the_topic(schema: Any, expected: str) -> None:
    with pytest.raises(DefinitionError) as raised:
        load_avro_schema(schema, topic="orders")
    message = str(raised.value)
    assert message.startswith("topic 'orders': ") and expected in message and "\n" not in message


def test_unknown_logical_types_are_read_as_their_base_type() -> None:
    custom = load_avro_schema(_with_field({"type": "string", "logicalType": "postcode"}), topic="t")
    assert avro_struct_type(custom)["bad"].dataType == StringType()
    stream = io.BytesIO()
    fastavro.schemaless_writer(stream, custom, {"ok": 1, "bad": "1100-001"})
    assert avro_json(stream.getvalue(), custom) == '{"ok":1,"bad":"1100-001"}'


def test_spark_from_json_reads_back_avro_json_column(spark: SparkSession, parsed: dict[str, Any]) -> None:
    plain = _record(0, note="gift", billing={"city": "Porto", "zip": None})
    framed = _record(1, ratio=math.nan, amount=math.inf, ts_us=None)
    rows = [
        (0, _plain(plain, parsed)),
        (1, _framed(framed, parsed)),
        (2, b"\xff" * 20),
        (3, _plain(plain, parsed) + b"\x00"),
        (4, None),
    ]
    frame = spark.createDataFrame(rows, "n INT, value BINARY")
    decoded = frame.select(
        "n", F.from_json(avro_json_column(F.col("value"), parsed), avro_struct_type(parsed)).alias("v")
    )
    got = {row["n"]: row["v"] for row in decoded.collect()}
    assert got[2] is None and got[3] is None and got[4] is None
    assert got[0].asDict(recursive=True) == _as_spark_reads_it(plain)
    framed_row = got[1].asDict(recursive=True)
    assert math.isnan(framed_row.pop("ratio"))
    assert framed_row == _as_spark_reads_it({key: item for key, item in framed.items() if key != "ratio"})


def _as_spark_reads_it(record: dict[str, Any]) -> dict[str, Any]:
    """Return record as Spark collects it: naive local datetimes (as pyspark converts), base64 text, str UUIDs."""
    converted: dict[str, Any] = {}
    for key, item in record.items():
        if isinstance(item, datetime):
            converted[key] = item.astimezone().replace(tzinfo=None)
        elif isinstance(item, bytes):
            converted[key] = base64.b64encode(item).decode()
        elif isinstance(item, uuid.UUID):
            converted[key] = str(item)
        else:
            converted[key] = item
    return converted
