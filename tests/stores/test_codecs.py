"""Key codecs (byte order = natural order) and the versioned value codec."""

from __future__ import annotations

import datetime as dt
import decimal

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from iqgraph.stores import (
    CorruptValueError,
    InvalidKeyError,
    KeyCodec,
    UnknownFormatError,
    ValueFormatError,
    decode_value,
    encode_value,
)
from iqgraph.stores.codecs import decode_int64, decode_values, encode_int64, encode_values

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
int64s = st.integers(INT64_MIN, INT64_MAX)
# Realistic event times (ms): far past and far future, negatives included. Window starts whose encoded
# first byte is 0xFF (>= 0x7F00 << 48, ~290 million years) are covered by a separate test.
times = st.integers(-(1 << 62), 1 << 62)
# Strings that stress the window-key escaping: NUL, the escape byte's code point, prefixes of each other.
tricky_text = st.text(alphabet=["\x00", "\x01", "a", "b", "\xff", "é", "\U0001f600"], max_size=6)
STRING = KeyCodec("string")
INT = KeyCodec("int")


# -- key order ------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(), max_size=30))
def test_string_byte_order_is_code_point_order(keys: list[str]) -> None:
    assert sorted(keys, key=STRING.encode) == sorted(keys)


@settings(max_examples=200, deadline=None)
@given(st.lists(int64s, max_size=30))
@example([INT64_MIN, -1, 0, 1, INT64_MAX, -(1 << 32), 255, 256, -256])
def test_int_byte_order_is_numeric_order(keys: list[int]) -> None:
    assert sorted(keys, key=INT.encode) == sorted(keys)


@settings(max_examples=200, deadline=None)
@given(int64s)
def test_int_round_trip(key: int) -> None:
    encoded = INT.encode(key)
    assert len(encoded) == 8
    assert INT.decode(encoded) == key
    assert decode_int64(encode_int64(key)) == key


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_string_round_trip(key: str) -> None:
    assert STRING.decode(STRING.encode(key)) == key


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(tricky_text, st.text(max_size=4)), times), max_size=30))
@example([("a", 5), ("ab", -5), ("a\x00", 0), ("a", -(1 << 62)), ("a\x00\x00", 1 << 62), ("", 3), ("\x00", -1)])
def test_string_window_keys_sort_by_key_then_time(pairs: list[tuple[str, int]]) -> None:
    assert sorted(pairs, key=lambda p: STRING.encode_window_key(*p)) == sorted(pairs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(int64s, int64s), max_size=30))
def test_int_window_keys_sort_by_key_then_time(pairs: list[tuple[int, int]]) -> None:
    assert sorted(pairs, key=lambda p: INT.encode_window_key(*p)) == sorted(pairs)


@settings(max_examples=200, deadline=None)
@given(st.one_of(tricky_text, st.text()), times)
def test_string_window_key_round_trip(key: str, start: int) -> None:
    encoded = STRING.encode_window_key(key, start)
    assert encoded.startswith(STRING.encode_window_prefix(key))
    assert STRING.decode_window_key(encoded) == (key, start)


@settings(max_examples=200, deadline=None)
@given(int64s, int64s)
def test_int_window_key_round_trip(key: int, start: int) -> None:
    assert INT.decode_window_key(INT.encode_window_key(key, start)) == (key, start)


def test_windows_of_a_a_nul_and_ab_never_interleave() -> None:
    starts = [-(1 << 62), -1000, -1, 0, 1, 10, 1_700_000_000_000, 1 << 62]
    ordered = [STRING.encode_window_key(key, start) for key in ("a", "a\x00", "ab") for start in starts]
    assert sorted(ordered) == ordered
    assert max(STRING.encode_window_key("a", s) for s in starts) < STRING.encode_window_key("a\x00", starts[0])
    assert max(STRING.encode_window_key("a\x00", s) for s in starts) < STRING.encode_window_key("ab", starts[0])


@pytest.mark.parametrize("start", [INT64_MAX, 0x7F01 << 48])
def test_windows_of_a_sort_before_windows_of_a_nul_at_any_start(start: int) -> None:
    assert STRING.encode_window_key("a", start) < STRING.encode_window_key("a\x00", INT64_MIN)


# -- invalid keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codec", "key"),
    [
        (INT, True),
        (INT, False),
        (INT, 1.0),
        (INT, "1"),
        (INT, None),
        (INT, b"\x01"),
        (INT, INT64_MAX + 1),
        (INT, INT64_MIN - 1),
        (INT, 1 << 80),
        (STRING, 1),
        (STRING, True),
        (STRING, 1.5),
        (STRING, b"a"),
        (STRING, None),
    ],
)
def test_wrong_key_type_is_invalid(codec: KeyCodec, key: object) -> None:
    with pytest.raises(InvalidKeyError):
        codec.encode(key)
    with pytest.raises(InvalidKeyError):
        codec.encode_window_key(key, 0)


def test_int64_bounds_are_valid_keys() -> None:
    assert INT.encode(INT64_MIN) == b"\x00" * 8
    assert INT.encode(INT64_MAX) == b"\xff" * 8


def test_prefix_needs_string_keys() -> None:
    assert STRING.encode_prefix("ab") == b"ab"
    with pytest.raises(InvalidKeyError):
        INT.encode_prefix(1)


def test_unknown_key_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown key type"):
        KeyCodec("float")  # type: ignore[arg-type]


# -- values -------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | int64s | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_value_round_trip(value: object) -> None:
    encoded = encode_value(value)
    assert encoded[0] == 1
    assert decode_value(encoded) == value


@pytest.mark.parametrize(
    ("value", "decoded"),
    [
        ({"count": 3, "avg": [1.5, 2]}, {"count": 3, "avg": [1.5, 2]}),
        (0.1, 0.1),
        (-1e300, -1e300),
        (decimal.Decimal("12.3400"), "12.3400"),
        (dt.datetime(2024, 5, 6, 7, 8, 9, 123000), "2024-05-06T07:08:09.123000"),
        (dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC), "2024-05-06T07:08:09+00:00"),
        (dt.date(2024, 5, 6), "2024-05-06"),
        (b"bytes", "bytes"),
        ({1: "int keys become strings"}, {"1": "int keys become strings"}),
        ({"nested": {"d": decimal.Decimal("1.5")}}, {"nested": {"d": "1.5"}}),
    ],
)
def test_value_conversions(value: object, decoded: object) -> None:
    assert decode_value(encode_value(value)) == decoded


def test_unsupported_value_type_is_refused() -> None:
    with pytest.raises(TypeError):
        encode_value(object())


@pytest.mark.parametrize("data", [b"\x00{}", b"\x02{}", b"\xff1", b"{}", b"\x7b\x7d"])
def test_unknown_format_byte(data: bytes) -> None:
    with pytest.raises(UnknownFormatError):
        decode_value(data)


@pytest.mark.parametrize("data", [b"", b"\x01", b"\x01{", b"\x01{not json}", b"\x01\xff\xfe", b"\x01[1,]", b"\x011 2"])
def test_corrupt_value(data: bytes) -> None:
    with pytest.raises(CorruptValueError):
        decode_value(data)


def test_value_errors_share_a_root() -> None:
    assert issubclass(CorruptValueError, ValueFormatError)
    assert issubclass(UnknownFormatError, ValueFormatError)
    assert not issubclass(orjson.JSONDecodeError, ValueFormatError)


# -- the batch forms the merges use: the same bytes and the same errors as one at a time ------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | st.integers(-1000, 1000) | st.floats(allow_nan=False) | st.text(max_size=5), max_size=20))
def test_batch_encoding_and_decoding_equal_one_at_a_time(values: list[object]) -> None:
    encoded = encode_values(values)
    assert encoded == [encode_value(v) for v in values]
    raws = [None if i % 3 == 0 else raw for i, raw in enumerate(encoded)]
    assert decode_values(raws) == [None if raw is None else decode_value(raw) for raw in raws]


@pytest.mark.parametrize(
    ("raw", "error"), [(b"\x02{}", UnknownFormatError), (b"\x01{", CorruptValueError), (b"", CorruptValueError)]
)
def test_one_bad_value_in_a_batch_raises_as_alone(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_values([b"\x011", None, raw, b"\x012"])


def test_batch_key_encoding_checks_every_key() -> None:
    codec = KeyCodec("string")
    assert codec.encode_many(["a", "é"]) == [b"a", "é".encode()]
    with pytest.raises(InvalidKeyError, match="this store's keys are strings"):
        codec.encode_many(["a", 1])
    assert KeyCodec("int").encode_many([-1, 2]) == [encode_int64(-1), encode_int64(2)]
    with pytest.raises(InvalidKeyError):
        KeyCodec("int").encode_many([True])
