"""The GraphQL type of a store's keys: ``String`` for string keys, ``Long`` for integer keys.

An entity key given as an argument is checked as a store would check it (``KeyKind.check``: its type and
range, and not empty), so that a bad key is one INVALID_KEY error on the field that took it. A relation's
target key comes from a stored value and may have another type than the entity's keys: ``KeyKind.target``
converts what converts without guessing (an integer to its decimal text, a string of decimal digits to an
integer) and refuses the rest with INVALID_KEY.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iqgraph.schema.scalars import Long
from iqgraph.stores import InvalidKeyError, Key, KeyCodec


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_int(text: str) -> Key:
    if text.strip().lstrip("+-").isdigit():
        return int(text)
    raise InvalidKeyError(f"key {text!r} is not an integer; this store's keys are integers")


def _as_string(value: Any) -> Key:
    if isinstance(value, str):
        return value
    if _is_int(value):
        return str(value)
    raise InvalidKeyError(f"key {value!r} is a {type(value).__name__}: the keys are strings")


def _as_int(value: Any) -> Key:
    if _is_int(value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return _parse_int(value)
    raise InvalidKeyError(f"key {value!r} is a {type(value).__name__}: the keys are integers")


@dataclass(frozen=True)
class KeyKind:
    """How one store's keys appear in the schema."""

    annotation: Any  # the Python annotation of the GraphQL key type
    graphql: str  # "String" or "Long"
    valid: Callable[[Any], bool]  # whether a decoded (JSON) value is such a key
    parse: Callable[[str], Key]  # a key given as text (keyMetadata) -> the key
    codec: KeyCodec  # the stores' own check of a key's type and range
    convert: Callable[[Any], Key]  # a stored value -> such a key (InvalidKeyError if it is none)

    def check(self, key: Any) -> Key:
        """Return key if a store of this kind can hold it; raise InvalidKeyError otherwise."""
        checked = self.codec.check(key)
        if checked == "":
            raise InvalidKeyError("the key is empty: give a non-empty key")
        return checked

    def target(self, value: Any) -> Key:
        """Return the key a stored value (a relation's column, another store's key) names; InvalidKeyError if none."""
        return self.check(self.convert(value))


STRING_KEYS = KeyKind(str, "String", lambda v: isinstance(v, str), lambda text: text, KeyCodec("string"), _as_string)
INT_KEYS = KeyKind(Long, "Long", _is_int, _parse_int, KeyCodec("int"), _as_int)


def key_kind(key_type: str) -> KeyKind:
    """Return the key kind of a store whose StoreInfo.key_type is key_type ("string" or "int")."""
    if key_type == "string":
        return STRING_KEYS
    if key_type == "int":
        return INT_KEYS
    raise ValueError(f"unknown key type {key_type!r}: expected 'string' or 'int'")
