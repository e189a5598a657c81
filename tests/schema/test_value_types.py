"""Spark types → GraphQL types, and stored values → typed answers (the lab app: Long keys, rich values)."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from iqgraph.schema import Limits, SchemaDefinitionError, StoreInfo, build_schema
from iqgraph.schema.value_types import to_datetime, to_decimal, to_float, to_int
from iqgraph.stores import ValueFormatError
from tests.schema.conftest import Api, Hosted
from tests.support.apps import READING, START_MS, fill_lab

FIELDS = "sensorId value takenAt localTime day raw samples tags { key value } place { lat lon } history { at ok } span"
FIELDS += " urlPath"


async def test_every_spark_type_is_answered_typed(lab: Api, lab_hosted: Hosted) -> None:
    fill_lab(lab_hosted, {7: READING, -3: {**READING, "tags": [["z", 26]], "value": "12345678901234567890.123"}})
    data = await lab.data(f"{{ reading {{ getMany(keys: [7, -3, 8]) {{ {FIELDS} }} }} }}")
    seven, minus_three, missing = data["reading"]["getMany"]
    assert seven == {
        "sensorId": "s-7",
        "value": "12.345",
        "takenAt": "2026-01-01T00:00:00.005Z",
        "localTime": "2026-01-01T10:30:00.000Z",
        "day": "2026-01-01",
        "raw": "aGVsbG8=",
        "samples": [1, 2, 3],
        "tags": [{"key": "a", "value": 1}, {"key": "b", "value": 2}],
        "place": {"lat": 1.5, "lon": -2.25},
        "history": [{"at": "2025-12-31T23:00:01.000Z", "ok": True}, None],
        "span": "INTERVAL '1' DAY",
        "urlPath": "/x",
    }
    assert minus_three["tags"] == [{"key": "z", "value": 26}]
    assert minus_three["value"] == "12345678901234567890.123"
    assert missing is None


async def test_long_keys_in_every_store_kind(lab: Api, lab_hosted: Hosted) -> None:
    fill_lab(lab_hosted, {k: READING for k in (-5, 0, 3, 1 << 40)})
    data = await lab.data(
        """{
          labCount { range(from: -5, to: 3) { edges { node { key value } } } }
          labPerSecond { fetch(key: 1099511627776) { key start end value } }
          labSeen { mightContain(key: 0) no: mightContain(key: 1) }
        }"""
    )
    assert [e["node"] for e in data["labCount"]["range"]["edges"]] == [
        {"key": -5, "value": 1},
        {"key": 0, "value": 1},
        {"key": 3, "value": 1},
    ]
    assert data["labPerSecond"]["fetch"] == [
        {"key": 1 << 40, "start": "2026-01-01T00:00:01.000Z", "end": "2026-01-01T00:00:02.000Z", "value": 1}
    ]
    assert data["labSeen"] == {"mightContain": True, "no": False}


async def test_a_null_in_a_non_nullable_field_is_a_value_format_error(lab: Api, lab_hosted: Hosted) -> None:
    fill_lab(lab_hosted, {1: {**READING, "sensor_id": None}})
    errors = await lab.errors("{ reading { get(key: 1) { sensorId } } }")
    assert [e["extensions"]["code"] for e in errors] == ["VALUE_FORMAT_ERROR"]
    assert "sensor_id" in errors[0]["message"]


def test_value_types_in_the_sdl(lab: Api) -> None:
    sdl = lab.schema.as_str()
    for expected in (
        "type Reading {",
        '"""Which sensor read it"""\n  sensorId: String!',
        "value: Decimal",
        "takenAt: DateTime",
        "day: Date",
        '"""Bytes, base64-encoded."""\n  raw: String',
        "samples: [Long!]",
        "tags: [ReadingTagsEntry!]",
        "place: ReadingPlace",
        "history: [ReadingHistory]",
        "span: JSON",
        "urlPath: String",
        'get(\n    """The key."""\n    key: Long!\n  ): Reading',
        "type ReadingTagsEntry {\n  key: String!\n  value: Int\n}",
    ):
        assert expected in sdl, expected
    assert "prefix(" not in sdl.split("type LabCountStore")[1].split("}")[0]  # no prefix scans of Long keys


def test_store_names_that_would_clash_are_refused() -> None:
    def info(name: str) -> StoreInfo:
        return StoreInfo(name, "key_value", "string", LongType(), "t", 1, True)

    with pytest.raises(SchemaDefinitionError, match="both be the field 'orderCount'"):
        build_schema([info("order_count"), info("orderCount")])
    with pytest.raises(SchemaDefinitionError, match="metadata"):
        build_schema([info("key_metadata")])


def test_type_names_stay_unique() -> None:
    nested = StructType([StructField("store", StructType([StructField("x", LongType())]))])
    schema = build_schema(
        [StoreInfo("order", "key_value", "string", nested, "t", 1, True)], Limits(), description="clash"
    )
    sdl = schema.as_str()
    assert 'type OrderStore {\n  """The value of key' in sdl  # the store's type keeps its name
    assert "type OrderStore2 {\n  x: Long" in sdl  # the nested struct field "store" gets a suffix


@pytest.mark.parametrize(
    ("convert", "raw", "expected"),
    [
        (to_int, "42", 42),
        (to_int, 3.0, 3),
        (to_float, 3, 3.0),
        (to_decimal, 0.1, "0.1"),
        (to_datetime, START_MS, "2026-01-01 00:00:00+00:00"),
    ],
)
def test_converters_accept_what_stores_hold(convert: Any, raw: Any, expected: Any) -> None:
    assert str(convert(raw)) == str(expected)


@pytest.mark.parametrize(
    ("convert", "raw"),
    [(to_int, "4x"), (to_int, True), (to_float, "nan"), (to_decimal, "abc"), (to_datetime, "yesterday")],
)
def test_converters_refuse_what_does_not_fit(convert: Any, raw: Any) -> None:
    with pytest.raises(ValueFormatError):
        convert(raw)
