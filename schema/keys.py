"""The GraphQL type of a store's keys: ``String`` for string keys, ``Long`` for integer keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iqgraph.schema.scalars import Long
from iqgraph.stores import InvalidKeyError, Key


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_int(text: str) -> Key:
    if text.strip().lstrip("+-").isdigit():
        return int(text)
    raise InvalidKeyError(f"key {text!r} is not an integer; this store's keys are integers")


@dataclass(frozen=True)
class KeyKind:
    """How one store's keys appear in the schema."""

    annotation: Any  # the Python annotation of the GraphQL key type
    graphql: str  # "String" or "Long"
    valid: Callable[[Any], bool]  # whether a decoded (JSON) value is such a key
    parse: Callable[[str], Key]  # a key given as text (keyMetadata) -> the key


STRING_KEYS = KeyKind(str, "String", lambda v: isinstance(v, str), lambda text: text)
INT_KEYS = KeyKind(Long, "Long", _is_int, _parse_int)


def key_kind(key_type: str) -> KeyKind:
    """Return the key kind of a store whose StoreInfo.key_type is key_type ("string" or "int")."""
    if key_type == "string":
        return STRING_KEYS
    if key_type == "int":
        return INT_KEYS
    raise ValueError(f"unknown key type {key_type!r}: expected 'string' or 'int'")
