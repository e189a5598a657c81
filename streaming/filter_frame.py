"""A stand-in DataFrame on which a store's transform runs without Spark, when all it does is filter rows.

Spark's ``DataFrame.where``/``filter`` keeps its input's schema exactly (columns, types, nullability, comments),
so a transform that only filters — ``lambda frame: frame.where(frame.ms >= 0)``, or one that returns its
frame — leaves the store's records typed as they were. ``FilterFrame`` offers that much of the DataFrame API:
``columns``, ``schema``, a column by attribute or by name, and ``where``/``filter`` with a condition built from
columns (comparisons with a value or a column of a like type, ``isNull``, ``isin``, ``between``, ``like`` …,
combined with ``&``, ``|``, ``~``). Anything else raises ``Unsupported``: a SQL string, ``pyspark.sql.functions``
(they need a session), ``withColumn``, ``select``, a comparison Spark might refuse. The caller then asks Spark.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

#: Kinds of values a condition may compare: a column's type, or a Python value's, to the same kind.
_KINDS: tuple[tuple[str, tuple[type[DataType], ...], tuple[type, ...]], ...] = (
    ("boolean", (BooleanType,), (bool,)),
    ("number", (NumericType,), (int, float, decimal.Decimal)),
    ("string", (StringType,), (str,)),
    ("time", (DateType, TimestampType, TimestampNTZType), (dt.date,)),
)


class Unsupported(Exception):  # noqa: N818 - a signal to the caller, not an error of the user's
    """What the transform asked of its frame is more than filtering: only Spark can type it."""


def _kind(data_type: DataType | None, value: Any = None) -> str | None:
    """Return the kind of a column's type, or (data_type None) of a Python value; None: none we compare."""
    for kind, spark_types, python_types in _KINDS:  # boolean first: a bool is an int too
        if isinstance(data_type, spark_types) if data_type is not None else isinstance(value, python_types):
            return kind
    return None


class FilterColumn:
    """A column of a FilterFrame, or a condition built from its columns; ``boolean``: usable as a filter."""

    def __init__(self, data_type: DataType | None) -> None:
        self.data_type = data_type  # None: a condition
        self.boolean = data_type is None or isinstance(data_type, BooleanType)

    def _compare(self, other: Any) -> FilterColumn:
        mine = _kind(self.data_type)
        theirs = _kind(other.data_type) if isinstance(other, FilterColumn) else _kind(None, other)
        if mine is None or mine != theirs:
            raise Unsupported(f"a comparison of {self._shown()} with {other!r}")
        return FilterColumn(None)

    def _logic(self, *others: Any) -> FilterColumn:
        if not all(isinstance(c, FilterColumn) and c.boolean for c in (self, *others)):
            raise Unsupported("&, | or ~ of a column that is not a condition")
        return FilterColumn(None)

    def _shown(self) -> str:
        return "a condition" if self.data_type is None else f"a {self.data_type.simpleString()} column"

    # a comparison with a value or column of a like kind is a condition, as Column's operators build one
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare  # type: ignore[assignment]

    def __and__(self, other: Any) -> FilterColumn:
        return self._logic(other)

    def __or__(self, other: Any) -> FilterColumn:
        return self._logic(other)

    def __invert__(self) -> FilterColumn:
        return self._logic()

    def __bool__(self) -> bool:
        raise Unsupported("a column used as a Python bool (and, or, not, if)")

    __hash__ = None  # type: ignore[assignment]  # like a Column: == builds a condition

    def isNull(self) -> FilterColumn:  # noqa: N802 - PySpark's names
        """Return the condition that the column is null."""
        return FilterColumn(None)

    def isNotNull(self) -> FilterColumn:  # noqa: N802
        """Return the condition that the column is not null."""
        return FilterColumn(None)

    def isin(self, *values: Any) -> FilterColumn:
        """Return the condition that the column is one of values."""
        for value in values[0] if len(values) == 1 and isinstance(values[0], list | tuple | set) else values:
            self._compare(value)
        return FilterColumn(None)

    def between(self, low: Any, high: Any) -> FilterColumn:
        """Return the condition low <= column <= high."""
        self._compare(low)
        return self._compare(high)

    def _text(self, pattern: Any) -> FilterColumn:
        if _kind(self.data_type) != "string" or not isinstance(pattern, str):
            raise Unsupported(f"a text match of {self._shown()} with {pattern!r}")
        return FilterColumn(None)

    # the conditions PySpark's Column offers on text
    like = rlike = startswith = endswith = contains = _text


class FilterFrame:
    """A store's records as a transform sees them, for a transform that only filters (see the module)."""

    def __init__(self, schema: StructType) -> None:
        self.schema = schema
        self.columns = schema.fieldNames()

    def __getattr__(self, name: str) -> FilterColumn:
        # a name DataFrame has (count, filter, …) is that attribute in PySpark, not a column
        if name.startswith("__") or hasattr(DataFrame, name) or name not in self.columns:
            raise Unsupported(f"DataFrame.{name}")
        return FilterColumn(self.schema[name].dataType)

    def __getitem__(self, name: Any) -> FilterColumn:
        if not isinstance(name, str) or name not in self.columns:
            raise Unsupported(f"frame[{name!r}]")
        return FilterColumn(self.schema[name].dataType)

    def where(self, condition: Any) -> FilterFrame:
        """Return the frame's rows where condition holds: the same schema."""
        if not isinstance(condition, FilterColumn) or not condition.boolean:
            raise Unsupported(f"a filter by {condition!r}")
        return FilterFrame(self.schema)

    filter = where


def filtered_schema(transform: Any, records: StructType) -> StructType:
    """Return the schema of what transform returns for records, if it only filters them; Unsupported if not."""
    try:
        result = transform(FilterFrame(records))
    except Unsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code met a stand-in (e.g. pyspark.sql.functions): Spark's
        raise Unsupported(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
    if not isinstance(result, FilterFrame):
        raise Unsupported(f"it returns {type(result).__name__}, not its frame filtered")
    return result.schema
