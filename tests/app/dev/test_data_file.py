"""JSON-lines records for `produce --file` and `dev --data`: each line a record or a BadLine that says what
to fix — never an exception."""

from __future__ import annotations

from iqgraph.app.dev.data_file import BadLine, FileRecord, read_records
from iqgraph.examples.shop import build_app
from iqgraph.streaming.definitions import App, Topic, key_value_store, latest

SHOP = build_app("orders", 3)
LONGS = App(
    name="longs",
    topics=[Topic("ids", schema="n LONG", key_format="long", partitions=2), Topic("names", value_format="string")],
    stores=[key_value_store("last_id", "ids", latest())],
)


def records(app: App, *lines: bytes) -> list[FileRecord | BadLine]:
    return list(read_records(lines, app))


def reasons(app: App, *lines: bytes) -> list[str]:
    return [str(r) for r in records(app, *lines)]


def test_a_record_is_serialized_as_its_topic_expects() -> None:
    [record] = records(SHOP, b'{"key": "c-1", "value": {"item": "x"}, "timestamp": "2026-01-01T00:00:00Z"}')
    assert record == FileRecord("orders", b"c-1", b'{"item":"x"}', 1_767_225_600_000, 1)
    [long_key, text] = records(LONGS, b'{"key": -2, "value": {"n": 1}, "timestamp": 5}',
                               b'{"key": null, "value": "hello", "topic": "names"}')  # fmt: skip
    assert long_key.key == (-2).to_bytes(8, "big", signed=True) and long_key.timestamp_ms == 5  # type: ignore[union-attr]
    assert text == FileRecord("names", None, b"hello", None, 2)


def test_a_null_value_is_a_tombstone_and_blank_lines_are_skipped() -> None:
    assert records(SHOP, b"", b'{"key": "c-1", "value": null}', b"  ") == [FileRecord("orders", b"c-1", None, None, 2)]


def test_each_bad_line_says_its_number_and_what_to_fix() -> None:
    unknown_field = b'{"key": "a", "value": {}, "extra": 1}'
    assert reasons(SHOP, b'{"key": "a", "value": ', b"\xff\xfe", b"[1, 2]", unknown_field) == [
        "line 1: not JSON (unexpected end of data: line 1 column 23 (char 22))",
        "line 2: not JSON (str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0))",
        'line 3: expected an object {"key": …, "value": …} with optional "timestamp" and "topic"',
        'line 4: expected an object {"key": …, "value": …} with optional "timestamp" and "topic"',
    ]
    assert reasons(SHOP, b'{"key": "a", "value": {}, "topic": [1]}', b'{"key": 7, "value": {}}',
                   b'{"key": "a", "value": [1]}', b'{"key": "a", "value": {}, "timestamp": "soon"}') == [
        "line 1: unknown topic [1]; the app's topics: ['orders']",
        "line 2: key 7 must be a string for 'orders'",
        "line 3: value must be a JSON object for topic 'orders'",
        "line 4: timestamp 'soon' must be epoch milliseconds or ISO 8601",
    ]  # fmt: skip
    assert reasons(LONGS, b'{"key": 9223372036854775808, "value": {}}', b'{"key": "7", "value": {}}') == [
        "line 1: key 9223372036854775808 is out of the 64-bit range of a long key",
        "line 2: key '7' must be an integer for 'ids'",
    ]
