"""Byte encodings for keys and values.

Keys are encoded so that byte order is the natural order (invariant 3):
- strings: UTF-8 (UTF-8 byte order is code point order);
- integers: 64-bit big-endian with the sign bit flipped, so negatives sort before positives;
- window keys: the key, made self-delimiting, then the window start as a sign-flipped big-endian int64.
  Strings in window keys escape NUL as ``00 FF`` and end with ``00 00`` (after the FoundationDB tuple rule), so
  ``"a"``'s windows never interleave with ``"ab"``'s and the order stays natural.

Values are orjson behind a one-byte format version. orjson is the fastest JSON codec for Python on
the dict/number values our aggregates hold, and JSON is also what the GraphQL layer sends, so a stored
value can be passed to a peer or a client without re-encoding. The version byte makes a format change
detectable (UnknownFormatError) instead of misread.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterable
from typing import Any, Literal

import orjson

from iqgraph.stores.exceptions import CorruptValueError, InvalidKeyError, UnknownFormatError

Key = str | int
KeyType = Literal["string", "int"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_SIGN = 1 << 63
VALUE_FORMAT_ORJSON = 1
_VERSION_BYTE = bytes([VALUE_FORMAT_ORJSON])


def encode_int64(value: int) -> bytes:
    """Encode an int64 as 8 bytes whose byte order is numeric order."""
    return (value + _SIGN).to_bytes(8, "big")


def decode_int64(data: bytes) -> int:
    """Decode 8 bytes written by encode_int64."""
    return int.from_bytes(data, "big") - _SIGN


class KeyCodec:
    """Encode and decode the keys of one store, checking their type."""

    def __init__(self, key_type: KeyType) -> None:
        if key_type not in ("string", "int"):
            raise ValueError(f"unknown key type {key_type!r}: use 'string' or 'int'")
        self.key_type: KeyType = key_type

    def check(self, key: object) -> Key:
        """Return key if the store can hold it, else raise InvalidKeyError."""
        if self.key_type == "string":
            if not isinstance(key, str):
                raise InvalidKeyError(f"key {key!r} is a {type(key).__name__}; this store's keys are strings")
            return key
        if not isinstance(key, int) or isinstance(key, bool):
            raise InvalidKeyError(f"key {key!r} is a {type(key).__name__}; this store's keys are integers")
        if not _INT64_MIN <= key <= _INT64_MAX:
            raise InvalidKeyError(f"key {key} is outside the 64-bit integer range")
        return key

    def encode(self, key: object) -> bytes:
        """Return the order-preserving bytes of key."""
        checked = self.check(key)
        if isinstance(checked, str):
            return checked.encode("utf-8")
        return encode_int64(checked)

    def encode_many(self, keys: Iterable[object]) -> list[bytes]:
        """Return encode(key) of each key (string keys: one pass, the per-key checks only if one is not a str)."""
        keys = list(keys)
        if self.key_type == "string" and all(type(key) is str for key in keys):
            return [key.encode("utf-8") for key in keys]  # type: ignore[attr-defined]
        return [self.encode(key) for key in keys]

    def decode(self, data: bytes) -> Key:
        """Return the key whose bytes are data."""
        if self.key_type == "string":
            return data.decode("utf-8")
        return decode_int64(data)

    def encode_prefix(self, prefix: object) -> bytes:
        """Return the bytes every key starting with prefix starts with (string keys only)."""
        if self.key_type != "string":
            raise InvalidKeyError("prefix scans need string keys; this store's keys are integers")
        return self.encode(prefix)

    def encode_window_prefix(self, key: object) -> bytes:
        """Return the self-delimiting form of key that starts each of its window keys."""
        checked = self.check(key)
        if isinstance(checked, str):
            return checked.encode("utf-8").replace(b"\x00", b"\x00\xff") + b"\x00\x00"
        return encode_int64(checked)

    def encode_window_key(self, key: object, window_start: int) -> bytes:
        """Return the window key: the delimited key, then the big-endian window start."""
        return self.encode_window_prefix(key) + encode_int64(window_start)

    def decode_window_key(self, data: bytes) -> tuple[Key, int]:
        """Return (key, window start) of a window key."""
        start = decode_int64(data[-8:])
        head = data[:-8]
        if self.key_type == "string":
            return head[:-2].replace(b"\x00\xff", b"\x00").decode("utf-8"), start
        return decode_int64(head), start


def _default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"cannot store a value of type {type(value).__name__}")


def encode_value(value: Any) -> bytes:
    """Return the stored bytes of value: the format version, then orjson."""
    return _VERSION_BYTE + orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS)


def encode_values(values: Iterable[Any]) -> list[bytes]:
    """Return encode_value of each value."""
    dumps, option = orjson.dumps, orjson.OPT_NON_STR_KEYS
    return [_VERSION_BYTE + dumps(value, default=_default, option=option) for value in values]


def decode_values(raws: Iterable[bytes | None]) -> list[Any]:
    """Return decode_value of each stored value (None stays None), in one pass when all are well formed."""
    raws = list(raws)
    if all(raw is None or raw[:1] == _VERSION_BYTE for raw in raws):
        try:
            return [None if raw is None else orjson.loads(raw[1:]) for raw in raws]
        except orjson.JSONDecodeError:
            pass  # decode_value names the error
    return [None if raw is None else decode_value(raw) for raw in raws]


def decode_value(data: bytes) -> Any:
    """Return the value stored as data; raise a ValueFormatError if it cannot be read."""
    if not data:
        raise CorruptValueError("empty stored value")
    if data[0] != VALUE_FORMAT_ORJSON:
        raise UnknownFormatError(
            f"stored value has format version {data[0]}; this code reads version {VALUE_FORMAT_ORJSON}"
        )
    try:
        return orjson.loads(data[1:])
    except orjson.JSONDecodeError as exc:
        raise CorruptValueError(f"stored value is not valid JSON: {exc}") from exc
