"""Bounded collections: the last (or first) K records per key by an order column, a built-in user aggregation.

``collect("item", "amount", "ts", max_items=20, order_by="ts")`` keeps a key's 20 records with the greatest
``ts`` (``keep="first"``: the smallest), ties broken by Kafka partition, then offset. Its state is the sorted
list of ``[order, partition, offset, row]`` trimmed to K: merging two states is sorting their union and
trimming it again, so a store keyed by a column (one key's records in several partitions, and nodes) merges
to exactly the K that one sort of all the records would keep. A null order sorts before every value.
The value is the list of rows (the columns named, without the order column unless named) in ascending order.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from iqgraph.streaming.definitions import Aggregate, DefinitionError
from iqgraph.streaming.user_aggregations import UserAggregation, aggregate

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

Keep = Literal["last", "first"]
#: Spark types whose JSON form orders like the values (timestamps are ISO strings in UTC, the session's zone).
_ORDERABLE = ("numeric", "string", "date", "timestamp", "timestamp_ntz", "boolean")


def _position(item: list[Any]) -> tuple[Any, ...]:
    """Return the sort key of a state item [order, partition, offset, row]: nulls first, then by value."""
    return (item[0] is not None, item[0], item[1], item[2])


@dataclass(frozen=True)
class _Bounded:
    """The functions of one collect(...): a sorted list of items kept to max_items."""

    columns: tuple[str, ...]
    order_by: str
    max_items: int
    keep: Keep

    def _trimmed(self, items: list[Any]) -> list[Any]:
        if len(items) <= self.max_items:
            return items
        return items[-self.max_items :] if self.keep == "last" else items[: self.max_items]

    def add(self, state: list[Any], row: dict[str, Any]) -> list[Any]:
        item = [row[self.order_by], row["_partition"], row["_offset"], {c: row[c] for c in self.columns}]
        bisect.insort(state, item, key=_position)
        return self._trimmed(state)

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return self._trimmed(sorted(a + b, key=_position))

    def finalize(self, state: list[Any]) -> list[Any]:
        return [item[3] for item in state]

    def value_type(self, row: StructType) -> DataType:
        from pyspark.sql.types import ArrayType, NumericType, StructType

        order = row[self.order_by].dataType
        if not isinstance(order, NumericType) and order.typeName() not in _ORDERABLE:
            raise DefinitionError(
                f"collect(order_by={self.order_by!r}): {self.order_by!r} is {order.simpleString()}; "
                "order by a number, string, date or timestamp column"
            )
        return ArrayType(StructType([row[c] for c in self.columns]), containsNull=False)


def collect(*columns: str, max_items: int, order_by: str, keep: Keep = "last") -> Aggregate:
    """Keep the last (or first) max_items records per key by column order_by: their columns, in order."""
    if not columns:
        raise DefinitionError(
            f"collect needs the columns to keep: collect('item', max_items=..., order_by={order_by!r})"
        )
    if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
        raise DefinitionError(f"collect(max_items={max_items!r}): keep at least 1 record per key")
    if keep not in ("last", "first"):
        raise DefinitionError(f"collect(keep={keep!r}): keep 'last' or 'first'")
    if not isinstance(order_by, str) or not order_by:
        raise DefinitionError("collect needs order_by: the column whose order picks the last or first records")
    bounded = _Bounded(tuple(columns), order_by, max_items, keep)
    user = UserAggregation(
        "collect",
        init=list,
        add=bounded.add,
        merge=bounded.merge,
        finalize=bounded.finalize,
        value_type=bounded.value_type,
        columns=bounded.columns if order_by in columns else (*bounded.columns, order_by),
        with_position=True,
    )
    return aggregate(user)
