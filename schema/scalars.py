"""The custom scalars of the API: Long (64-bit integers) and DateTime (UTC instants).

GraphQL's ``Int`` is 32-bit, so counts, sums and integer keys are ``Long``: a JSON number on output; on
input an integer literal or a string of decimal digits (JavaScript clients cannot hold every 64-bit
integer in a number). ``DateTime`` is an RFC 3339 instant in UTC, ``2026-01-01T00:00:00.005Z``
(milliseconds, or microseconds when the value has them); on input an RFC 3339 string (a missing
offset means UTC) or an integer of epoch milliseconds.

``Date`` (ISO date), ``Decimal`` (exact, as a string) and ``JSON`` are Strawberry's built-in scalars.
Values of a store's value type are converted to these Python types by ``schema.value_types``.
"""

from __future__ import annotations

import datetime as dt
from typing import NewType

import strawberry
from strawberry.types.scalar import ScalarDefinition

Long = NewType("Long", int)
DateTime = NewType("DateTime", dt.datetime)

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class InvalidScalarValue(ValueError):
    """An input value that a scalar cannot represent (reported as a validation error)."""


def parse_long(value: object) -> int:
    """Return the integer an input Long holds: an integer, or a string of decimal digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise InvalidScalarValue(f"Long cannot represent {value!r}: give an integer or a string of digits")


def serialize_long(value: object) -> int:
    """Return value as a JSON integer."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"Long cannot represent {type(value).__name__} {value!r}")


def to_utc(value: dt.datetime) -> dt.datetime:
    """Return value in UTC; a naive value is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def from_epoch_ms(ms: int) -> dt.datetime:
    """Return the UTC instant ms milliseconds after the epoch."""
    return _EPOCH + dt.timedelta(milliseconds=ms)


def to_epoch_ms(value: dt.datetime) -> int:
    """Return the epoch milliseconds of value, rounded down."""
    return (to_utc(value) - _EPOCH) // dt.timedelta(milliseconds=1)


def parse_iso(text: str) -> dt.datetime:
    """Return the UTC instant an RFC 3339 / ISO 8601 string names (no offset: UTC)."""
    return to_utc(dt.datetime.fromisoformat(text.strip()))


def parse_datetime(value: object) -> dt.datetime:
    """Return the UTC instant an input DateTime holds: an ISO string or epoch milliseconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return from_epoch_ms(value)
        except OverflowError:
            raise InvalidScalarValue(f"DateTime cannot represent {value} ms since the epoch") from None
    if isinstance(value, str):
        try:
            return parse_iso(value)
        except ValueError:
            pass
    raise InvalidScalarValue(
        f"DateTime cannot represent {value!r}: give an RFC 3339 string such as "
        "'2026-01-01T00:00:00Z' or an integer of epoch milliseconds"
    )


def serialize_datetime(value: object) -> str:
    """Return value as RFC 3339 in UTC with a Z, to the millisecond (microsecond if it has them)."""
    if not isinstance(value, dt.datetime):
        raise TypeError(f"DateTime cannot represent {type(value).__name__} {value!r}")
    utc = to_utc(value)
    timespec = "milliseconds" if utc.microsecond % 1000 == 0 else "microseconds"
    return utc.replace(tzinfo=None).isoformat(timespec=timespec) + "Z"


SCALARS: dict[object, ScalarDefinition] = {
    Long: strawberry.scalar(
        name="Long",
        description="A 64-bit signed integer. Input: an integer or a string of decimal digits.",
        serialize=serialize_long,
        parse_value=parse_long,
    ),
    DateTime: strawberry.scalar(
        name="DateTime",
        description=(
            "An instant, as RFC 3339 in UTC (2026-01-01T00:00:00.005Z). "
            "Input: an RFC 3339 string (no offset means UTC) or an integer of epoch milliseconds."
        ),
        serialize=serialize_datetime,
        parse_value=parse_datetime,
    ),
}
