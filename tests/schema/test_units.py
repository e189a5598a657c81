"""The small parts: scalars, names, cursors, limits."""

from __future__ import annotations

import base64
import datetime as dt

import orjson
import pytest

from iqgraph.schema import Limits
from iqgraph.schema.naming import camel_case, pascal_case
from iqgraph.schema.pagination import Order, Resume, decode_cursor, encode_cursor
from iqgraph.schema.scalars import InvalidScalarValue, parse_datetime, parse_long, serialize_datetime
from iqgraph.stores import InvalidCursorError

ORDER = Order("order_count:key", lambda item: item[0], lambda key: isinstance(key, str))


@pytest.mark.parametrize(
    ("name", "camel", "pascal"),
    [
        ("order_count", "orderCount", "OrderCount"),
        ("orders_per_minute", "ordersPerMinute", "OrdersPerMinute"),
        ("URL_path", "urlPath", "URLPath"),
        ("orderID", "orderID", "OrderID"),
        ("2fa codes", "_2faCodes", "_2faCodes"),
        ("__", "_", "Value"),
    ],
)
def test_names_follow_graphql_conventions(name: str, camel: str, pascal: str) -> None:
    assert (camel_case(name), pascal_case(name)) == (camel, pascal)


def test_long_takes_integers_and_digit_strings_only() -> None:
    assert parse_long(9_223_372_036_854_775_807) == (1 << 63) - 1
    assert parse_long("-42") == -42
    for bad in ("4.2", "x", 4.0, True, None):
        with pytest.raises(InvalidScalarValue):
            parse_long(bad)


def test_datetime_is_utc_to_the_millisecond_or_microsecond() -> None:
    assert serialize_datetime(parse_datetime("2026-01-01T01:00:00.005+01:00")) == "2026-01-01T00:00:00.005Z"
    assert serialize_datetime(parse_datetime("2026-01-01 00:00:00")) == "2026-01-01T00:00:00.000Z"
    assert serialize_datetime(parse_datetime(1_767_225_600_005)) == "2026-01-01T00:00:00.005Z"
    micro = dt.datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=dt.UTC)
    assert serialize_datetime(micro) == "2026-01-01T00:00:00.000005Z"
    for bad in ("tomorrow", 10**20, 1.5):
        with pytest.raises(InvalidScalarValue):
            parse_datetime(bad)


def test_cursors_round_trip_and_refuse_forgeries() -> None:
    resume = Resume("store-cursor", 3, "customer-07")
    assert decode_cursor(ORDER, encode_cursor(ORDER, resume), max_skip=100) == resume
    assert decode_cursor(ORDER, None, max_skip=100) == Resume(None)
    other = Order("total_spend:key", ORDER.sort_key, ORDER.valid_key)
    forged = [
        "not base64!",
        base64.urlsafe_b64encode(b"iq1:[1, 2]").decode(),
        encode_cursor(other, resume),  # another store's
        encode_cursor(ORDER, Resume(None, 2, 17)),  # a sort key of the wrong type
        encode_cursor(ORDER, Resume(None, 2, None)),  # a skip without a sort key
        encode_cursor(ORDER, Resume(None, -1, "a")),
    ]
    for cursor in forged:
        with pytest.raises(InvalidCursorError):
            decode_cursor(ORDER, cursor, max_skip=100)


def test_a_forged_skip_only_sizes_the_read_and_is_capped() -> None:
    body = orjson.dumps({"s": ORDER.scope, "b": None, "n": 10**9, "k": "a"})
    cursor = base64.urlsafe_b64encode(b"iq1:" + body).decode()
    assert decode_cursor(ORDER, cursor, max_skip=100) == Resume(None, 100, "a")


def test_limits_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match="default_page_size"):
        Limits(max_page_size=10, default_page_size=20)
    with pytest.raises(ValueError, match="max_keys"):
        Limits(max_keys=0)
