"""Spark DataType → GraphQL type, and the converter from a stored (JSON-ish) value to that type.

========================  =============================================================
Spark                     GraphQL
========================  =============================================================
struct                    object type: the store's name in PascalCase (``LatestOrder``);
                          a nested struct adds its field's name (``LatestOrderAddress``)
long                      ``Long``
int, short, byte          ``Int``
double, float             ``Float``
decimal                   ``Decimal`` (exact, as a string)
string, char, varchar     ``String``
binary                    ``String``, base64
boolean                   ``Boolean``
timestamp, timestamp_ntz  ``DateTime`` (UTC; a timestamp without zone is read as UTC)
date                      ``Date``
array<T>                  ``[T]`` (``[T!]`` when Spark says the elements are never null)
map<K, V>                 ``[<Name>Entry!]`` of ``{key: K!, value: V}``
anything else             ``JSON``
========================  =============================================================

Struct fields are nullable as Spark declares them; column names become camelCase field names, with a
column's ``comment`` metadata as the field's description. Stores hand back what their codec stores:
JSON values, with timestamps as ISO strings (or epoch milliseconds), decimals as numbers or strings,
maps as objects (string keys) or lists of [key, value] pairs; a value that does not fit its declared
type raises ValueFormatError rather than being guessed at.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)
from strawberry.scalars import JSON

from iqgraph.schema.dynamic import Field, data_field, field_names, list_of, object_type, optional
from iqgraph.schema.naming import TypeNames, camel_case, pascal_case, unique
from iqgraph.schema.scalars import DateTime, Long, from_epoch_ms, parse_iso, to_utc
from iqgraph.stores import ValueFormatError

Convert = Callable[[Any], Any]
_EPOCH_DAY = dt.date(1970, 1, 1)


@dataclass(frozen=True)
class ValueType:
    """A GraphQL type for values of one Spark type, and how to convert a stored value into it."""

    annotation: Any  # the Python annotation Strawberry maps to the GraphQL type (non-null form)
    convert: Convert  # stored value (never None) -> Python value of the annotation
    graphql: str  # the GraphQL type as SDL writes it, e.g. "LatestOrder", "[Long!]"

    def nullable(self) -> tuple[Any, Convert]:
        """Return the nullable annotation, and a converter that keeps None as None."""
        convert = self.convert
        return optional(self.annotation), (lambda v: None if v is None else convert(v))


def _bad(value: Any, what: str) -> ValueFormatError:
    return ValueFormatError(f"stored value {value!r} is not a {what}")


def to_int(value: Any) -> int:
    """Return a stored integer as int."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise _bad(value, "integer")


def to_float(value: Any) -> float:
    """Return a stored number as a finite float."""
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None or not math.isfinite(number):
        raise _bad(value, "finite number")
    return number


def to_str(value: Any) -> str:
    """Return a stored string; numbers and booleans as their JSON text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise _bad(value, "string")


def to_bool(value: Any) -> bool:
    """Return a stored boolean (JSON object keys hold them as "true" / "false")."""
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return bool(value == "true")
    raise _bad(value, "boolean")


def to_datetime(value: Any) -> dt.datetime:
    """Return a stored timestamp (ISO string, epoch milliseconds or datetime) as a UTC datetime."""
    if isinstance(value, dt.datetime):
        return to_utc(value)
    try:
        if isinstance(value, str):
            return parse_iso(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return from_epoch_ms(value)
    except (ValueError, OverflowError):
        pass
    raise _bad(value, "timestamp")


def to_date(value: Any) -> dt.date:
    """Return a stored date (ISO string, days since the epoch or date) as a date."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    try:
        if isinstance(value, str):
            return dt.date.fromisoformat(value.strip())
        if isinstance(value, int) and not isinstance(value, bool):
            return _EPOCH_DAY + dt.timedelta(days=value)
    except (ValueError, OverflowError):
        pass
    raise _bad(value, "date")


def to_decimal(value: Any) -> decimal.Decimal:
    """Return a stored decimal exactly as written (a float by its shortest repr)."""
    if isinstance(value, decimal.Decimal):
        return value
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return decimal.Decimal(repr(value) if isinstance(value, float) else value)
        except decimal.InvalidOperation:
            pass
    raise _bad(value, "decimal")


def to_base64(value: Any) -> str:
    """Return stored bytes as base64 (the codec stores bytes as their UTF-8 text)."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, str):
        return base64.b64encode(value.encode("utf-8")).decode("ascii")
    raise _bad(value, "byte string")


_ATOMIC: Sequence[tuple[tuple[type[DataType], ...], Any, Convert, str]] = (
    ((BooleanType,), bool, to_bool, "Boolean"),
    ((ByteType, ShortType, IntegerType), int, to_int, "Int"),
    ((LongType,), Long, to_int, "Long"),
    ((FloatType, DoubleType), float, to_float, "Float"),
    ((DecimalType,), decimal.Decimal, to_decimal, "Decimal"),
    ((StringType, CharType, VarcharType), str, to_str, "String"),
    ((BinaryType,), str, to_base64, "String"),
    ((TimestampType, TimestampNTZType), DateTime, to_datetime, "DateTime"),
    ((DateType,), dt.date, to_date, "Date"),
)


def _checked(convert: Convert, nullable: bool, what: str) -> Convert:
    """Return convert for a slot that may (or must not) hold null."""
    if nullable:
        return lambda v: None if v is None else convert(v)

    def strict(value: Any) -> Any:
        if value is None:
            raise ValueFormatError(f"{what} is null, but its type says it never is")
        return convert(value)

    return strict


def _slot(value_type: ValueType, nullable: bool) -> Any:
    return optional(value_type.annotation) if nullable else value_type.annotation


class ValueTypes:
    """Builds the GraphQL types of store values, naming object types uniquely within one schema."""

    def __init__(self, names: TypeNames) -> None:
        self.names = names

    def of(self, data_type: DataType, name: str, description: str | None = None) -> ValueType:
        """Return the GraphQL type of data_type; object types it needs are named after name."""
        for spark_types, annotation, convert, graphql in _ATOMIC:
            if isinstance(data_type, spark_types):
                return ValueType(annotation, convert, graphql)
        if isinstance(data_type, StructType):
            return self._struct(data_type, name, description)
        if isinstance(data_type, ArrayType):
            return self._array(data_type, name)
        if isinstance(data_type, MapType):
            return self._map(data_type, name)
        return ValueType(JSON, lambda v: v, "JSON")

    def _struct(self, struct: StructType, name: str, description: str | None) -> ValueType:
        type_name = self.names.new(name)
        taken: set[str] = set()
        fields: list[Field] = []
        readers: list[tuple[str, str, Convert]] = []  # (GraphQL name, column, converter)
        for column in struct.fields:
            graphql_name = unique(camel_case(column.name), taken)
            inner = self.of(column.dataType, type_name + pascal_case(column.name))
            fields.append(data_field(graphql_name, _slot(inner, column.nullable), _column_description(column)))
            what = f"field {column.name!r} of {type_name}"
            readers.append((graphql_name, column.name, _checked(inner.convert, column.nullable, what)))
        cls = object_type(type_name, fields, description)
        attrs = field_names(cls)
        return ValueType(cls, _struct_converter(cls, [(attrs[g], c, f) for g, c, f in readers], type_name), type_name)

    def _array(self, array: ArrayType, name: str) -> ValueType:
        element = self.of(array.elementType, name)
        convert = _checked(element.convert, array.containsNull, f"an element of {name}")

        def convert_list(value: Any) -> list[Any]:
            if not isinstance(value, list | tuple):
                raise _bad(value, "list")
            return [convert(v) for v in value]

        bang = "" if array.containsNull else "!"
        return ValueType(list_of(_slot(element, array.containsNull)), convert_list, f"[{element.graphql}{bang}]")

    def _map(self, map_type: MapType, name: str) -> ValueType:
        entry_name = self.names.new(f"{name}Entry")
        key = self.of(map_type.keyType, f"{name}Key")
        value = self.of(map_type.valueType, f"{name}Value")
        entry = object_type(
            entry_name,
            [data_field("key", key.annotation), data_field("value", _slot(value, map_type.valueContainsNull))],
            f"One entry of a map in {name}.",
        )
        convert_key = key.convert
        convert_value = _checked(value.convert, map_type.valueContainsNull, f"a map value of {name}")

        def convert_map(raw: Any) -> list[Any]:
            if isinstance(raw, dict):
                pairs: Any = raw.items()
            elif isinstance(raw, list | tuple) and all(isinstance(p, list | tuple) and len(p) == 2 for p in raw):
                pairs = raw
            else:
                raise _bad(raw, "map")
            return [entry(f0=convert_key(k), f1=convert_value(v)) for k, v in pairs]

        return ValueType(list_of(entry), convert_map, f"[{entry_name}!]")


def _column_description(column: StructField) -> str | None:
    comment = column.metadata.get("comment") if column.metadata else None
    if isinstance(column.dataType, BinaryType):
        return f"{comment} (bytes, base64)" if comment else "Bytes, base64-encoded."
    return comment if isinstance(comment, str) else None


def _struct_converter(cls: type, readers: list[tuple[str, str, Convert]], type_name: str) -> Convert:
    def convert(raw: Any) -> Any:
        if isinstance(raw, dict):
            return cls(**{attr: conv(raw.get(column)) for attr, column, conv in readers})
        if isinstance(raw, list | tuple) and len(raw) == len(readers):
            return cls(**{attr: conv(v) for (attr, _, conv), v in zip(readers, raw, strict=True)})
        raise _bad(raw, type_name)

    return convert
