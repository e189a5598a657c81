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
column's ``comment`` metadata as the field's description. A store's value struct may carry ``Link``s:
fields computed from a column's stored value (relations, schema.entities.relations), after the column or instead
of it; its objects keep that stored value in a private attribute. Stores hand back what their codec stores:
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
class Column:
    """One column of a struct: its field (GraphQL name, annotation, description) and how to read it from a row."""

    name: str  # the column's name
    field: str  # its GraphQL field name
    annotation: Any  # nullable as Spark declares the column
    description: str | None
    index: int  # its position in a row stored as a list
    width: int  # how many columns the struct has
    convert: Convert  # the column's stored value (None included) -> its GraphQL value

    def stored(self, row: Any) -> Any:
        """Return the column's stored value in a stored row (an object, or a list of every column)."""
        if isinstance(row, dict):
            return row.get(self.name)
        if isinstance(row, list | tuple) and len(row) == self.width:
            return row[self.index]
        raise _bad(row, "row")

    def read(self, row: Any) -> Any:
        """Return the column's GraphQL value in a stored row."""
        return self.convert(self.stored(row))


@dataclass(frozen=True)
class Link:
    """A field computed from one column's stored value (a relation), after the column or instead of it.

    make(attribute) returns the field, given the attribute in which the struct's objects keep the stored
    value. label names the link in errors ("store 'orders' relation 'customer'").
    """

    column: str
    field: str  # its GraphQL name
    replaces: bool  # the column's own field is left out
    make: Callable[[str], Field]
    label: str


class LinkError(ValueError):
    """A link that cannot be added to its struct (no such column, a field name taken)."""


@dataclass(frozen=True)
class ValueType:
    """A GraphQL type for values of one Spark type, and how to convert a stored value into it."""

    annotation: Any  # the Python annotation Strawberry maps to the GraphQL type (non-null form)
    convert: Convert  # stored value (never None) -> Python value of the annotation
    graphql: str  # the GraphQL type as SDL writes it, e.g. "LatestOrder", "[Long!]"
    columns: tuple[Column, ...] = ()  # a struct's columns, in order (the fields not replaced by a link)

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

    def of(
        self, data_type: DataType, name: str, description: str | None = None, links: Sequence[Link] = ()
    ) -> ValueType:
        """Return the GraphQL type of data_type; object types it needs are named after name.

        links: fields computed from the columns of data_type, a struct (relations); LinkError if one cannot be.
        """
        if links and not isinstance(data_type, StructType):
            raise LinkError(
                f"{links[0].label}: column {links[0].column!r} set, but the value is a "
                f"{data_type.simpleString()}, not a struct"
            )
        for spark_types, annotation, convert, graphql in _ATOMIC:
            if isinstance(data_type, spark_types):
                return ValueType(annotation, convert, graphql)
        if isinstance(data_type, StructType):
            return self._struct(data_type, name, description, links)
        if isinstance(data_type, ArrayType):
            return self._array(data_type, name)
        if isinstance(data_type, MapType):
            return self._map(data_type, name)
        return ValueType(JSON, lambda v: v, "JSON")

    def _struct(self, struct: StructType, name: str, description: str | None, links: Sequence[Link]) -> ValueType:
        type_name = self.names.new(name)
        _check_links(struct, links, type_name)
        taken = {link.field for link in links}
        fields: list[Field] = []
        columns: list[Column] = []
        linked: list[tuple[str, Column]] = []  # (attribute, column) of each link
        width = len(struct.fields)
        for index, column in enumerate(struct.fields):
            own = [link for link in links if link.column == column.name]
            if not any(link.replaces for link in own):
                graphql_name = unique(camel_case(column.name), taken)
                inner = self.of(column.dataType, type_name + pascal_case(column.name))
                convert = _checked(inner.convert, column.nullable, f"field {column.name!r} of {type_name}")
                slot = _slot(inner, column.nullable)
                about = _column_description(column)
                fields.append(data_field(graphql_name, slot, about))
                columns.append(Column(column.name, graphql_name, slot, about, index, width, convert))
            for link in own:
                attribute = f"r{len(linked)}"
                fields.append(link.make(attribute))
                linked.append((attribute, Column(column.name, link.field, None, None, index, width, _same)))
        cls = object_type(type_name, fields, description, [attribute for attribute, _ in linked])
        attrs = field_names(cls)
        shown = [(attrs[c.field], c) for c in columns]
        convert = _struct_converter(cls, shown, linked, width, type_name)
        return ValueType(cls, convert, type_name, tuple(columns))

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


def _same(value: Any) -> Any:
    return value


def _check_links(struct: StructType, links: Sequence[Link], type_name: str) -> None:
    names = [c.name for c in struct.fields]
    for link in links:
        if link.column not in names:
            raise LinkError(f"{link.label}: {link.column!r} is not a column of its value (columns: {', '.join(names)})")
    kept = {camel_case(c.name) for c in struct.fields if not any(k.replaces and k.column == c.name for k in links)}
    seen: set[str] = set()
    for link in links:
        if link.field in seen or (link.field in kept and not link.replaces):
            raise LinkError(f"{link.label}: {type_name} already has a field {link.field!r}: rename the relation")
        seen.add(link.field)


def _struct_converter(
    cls: type, shown: list[tuple[str, Column]], linked: list[tuple[str, Column]], width: int, type_name: str
) -> Convert:
    by_name = [(attr, c.name, c.convert) for attr, c in shown]
    by_index = [(attr, c.index, c.convert) for attr, c in shown]
    links_by_name = [(attr, c.name) for attr, c in linked]
    links_by_index = [(attr, c.index) for attr, c in linked]

    def convert(raw: Any) -> Any:
        if isinstance(raw, dict):
            values = {attr: conv(raw.get(column)) for attr, column, conv in by_name}
            for attr, column in links_by_name:
                values[attr] = raw.get(column)
            return cls(**values)
        if isinstance(raw, list | tuple) and len(raw) == width:
            values = {attr: conv(raw[i]) for attr, i, conv in by_index}
            for attr, i in links_by_index:
                values[attr] = raw[i]
            return cls(**values)
        raise _bad(raw, type_name)

    return convert
