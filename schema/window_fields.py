"""The object type of a window store: fetch, fetchAll, fetchRange, count.

Every field returns ``<Base>Window {key, start, end, value}``: one key's value in the window
[start, end). Time bounds are inclusive bounds on the window start, as Kafka Streams' ``fetch`` has
them; left out, they are unbounded. ``fetch`` returns a key's windows oldest first; ``fetchAll`` is a
connection ordered by start then key, ``fetchRange`` one ordered by key then start.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import strawberry

from iqgraph.schema.dynamic import Arg, Field, data_field, list_of, object_type, optional, resolved_field, resolver_with
from iqgraph.schema.errors import store_errors
from iqgraph.schema.pagination import ConnectionType, Order, read_slice
from iqgraph.schema.resolving import StorePlan, bound, context, load_one, queries
from iqgraph.schema.scalars import INT64_MAX, INT64_MIN, DateTime, Long, from_epoch_ms, to_epoch_ms
from iqgraph.stores import WindowedValue

_FIRST = "How many windows at most (the page size)."
_AFTER = "Resume after this cursor (an edge's cursor or pageInfo.endCursor)."
_FROM = "The earliest window start (inclusive); none: unbounded."
_TO = "The latest window start (inclusive); none: unbounded."


def time_bounds(time_from: dt.datetime | None, time_to: dt.datetime | None) -> tuple[int, int]:
    """Return the bounds on window start in epoch milliseconds (a fraction of a ms rounds inward)."""
    lower = INT64_MIN if time_from is None else _ceil_ms(time_from)
    upper = INT64_MAX if time_to is None else to_epoch_ms(time_to)
    return lower, upper


def _ceil_ms(value: dt.datetime) -> int:
    floor = to_epoch_ms(value)
    return floor if value.microsecond % 1000 == 0 else floor + 1


@dataclass(frozen=True)
class WindowNode:
    """The ``<Base>Window`` type of a window store, and how a stored window becomes one."""

    type: type
    convert: Callable[[WindowedValue], Any]

    def convert_list(self, found: list[WindowedValue]) -> list[Any]:
        """Return the objects of a key's windows."""
        convert = self.convert
        return [convert(w) for w in found]


def window_node(plan: StorePlan) -> WindowNode:
    """Return the window type of window store plan (fetch, the connections and entities share it)."""
    value_annotation, convert = plan.value.nullable()
    window = object_type(
        plan.node_name,
        [
            data_field("key", plan.key.annotation, "The key."),
            data_field("start", DateTime, "The window's start (inclusive)."),
            data_field("end", DateTime, "The window's end (exclusive)."),
            data_field("value", value_annotation, "The key's value in the window."),
            *plan.entry_fields,
        ],
        f"One key's value in one window of {plan.label()}.",
    )

    def node(w: WindowedValue) -> Any:
        return window(f0=w.key, f1=from_epoch_ms(w.start), f2=from_epoch_ms(w.end), f3=convert(w.value))

    return WindowNode(window, node)


def window_type(plan: StorePlan, made: WindowNode | None = None) -> type:
    """Return the object type of window store plan (with made, its window type, if made already)."""
    made = made or window_node(plan)
    window, node = made.type, made.convert
    connection = ConnectionType(plan.edge_name, plan.connection_name, window, f"A page of windows of {plan.label()}.")
    by_time = Order(f"{plan.name}:time", lambda w: [w.start, w.key], _pair(plan, time_first=True))
    by_key = Order(f"{plan.name}:key", lambda w: [w.key, w.start], _pair(plan, time_first=False))

    async def page(info: strawberry.Info, order: Order, read: Any, first: int, after: str | None) -> Any:
        ctx = context(info)
        size = ctx.limits.page_size(first)
        with store_errors():
            found = await read_slice(read, order, size, after, ctx.limits.max_page_size)
            return connection.make(found, node)

    fields = [
        _fetch_field(plan, made),
        *_scan_fields(plan, connection.type, page, by_time, by_key),
        _count_field(plan),
    ]
    return object_type(plan.type_name, fields, _describe(plan))


def _pair(plan: StorePlan, time_first: bool) -> Any:
    def valid(value: Any) -> bool:
        if not isinstance(value, list) or len(value) != 2:
            return False
        start, key = (value[0], value[1]) if time_first else (value[1], value[0])
        return isinstance(start, int) and not isinstance(start, bool) and plan.key.valid(key)

    return valid


def _describe(plan: StorePlan) -> str:
    info = plan.info
    size = f", windows of {info.window_size_ms} ms" if info.window_size_ms else ""
    hop = (
        f" every {info.window_advance_ms} ms"
        if info.window_advance_ms and info.window_advance_ms != info.window_size_ms
        else ""
    )
    about = f": {info.description}" if info.description else ""
    return f"Window store {plan.name}{size}{hop}{about}"


def _fetch_field(plan: StorePlan, made: WindowNode) -> Field:
    name, window, convert = plan.name, made.type, made.convert_list

    async def fetch(
        root: Any, info: strawberry.Info, key: Any, from_: dt.datetime | None = None, to: dt.datetime | None = None
    ) -> Any:
        lower, upper = time_bounds(from_, to)
        return await load_one(context(info).loaders.windows(name, bound(root)), (key, lower, upper), convert)

    args = [
        Arg("key", "key", plan.key.annotation, "The key."),
        Arg("from_", "from", DateTime | None, _FROM),
        Arg("to", "to", DateTime | None, _TO),
    ]
    return resolved_field(
        "fetch",
        resolver_with(fetch, args, optional(list_of(window))),
        "The key's windows with start in [from, to], oldest first.",
    )


def _count_field(plan: StorePlan) -> Field:
    name = plan.name

    async def count(root: Any, info: strawberry.Info) -> int:
        with store_errors():
            return await context(info).queries.count(name, bound(root))

    scope = "" if plan.info.co_partitioned else " (keyed by a column: a pair several partitions hold counts once)"
    return resolved_field(
        "count",
        resolver_with(count, [], Long | None),
        f"How many distinct (key, window) pairs the store holds{scope}: exact.",
    )


def _scan_fields(plan: StorePlan, connection: Any, page: Any, by_time: Order, by_key: Order) -> list[Field]:
    name, default = plan.name, plan.limits.default_page_size

    async def fetch_all(
        root: Any, info: strawberry.Info, from_: Any = None, to: Any = None, first: int = default, after: Any = None
    ) -> Any:
        lower, upper = time_bounds(from_, to)
        return await page(
            info, by_time, partial(queries(info).fetch_all, name, lower, upper, max_lag=bound(root)), first, after
        )

    async def fetch_range(
        root: Any,
        info: strawberry.Info,
        from_key: Any = None,
        to_key: Any = None,
        from_: Any = None,
        to: Any = None,
        first: int = default,
        after: Any = None,
    ) -> Any:
        lower, upper = time_bounds(from_, to)
        read = partial(queries(info).fetch_range, name, from_key, to_key, lower, upper, max_lag=bound(root))
        return await page(info, by_key, read, first, after)

    key = optional(plan.key.annotation)
    times = [Arg("from_", "from", DateTime | None, _FROM), Arg("to", "to", DateTime | None, _TO)]
    paging = [Arg("first", "first", int, _FIRST), Arg("after", "after", str | None, _AFTER)]
    keys = [
        Arg("from_key", "fromKey", key, "The smallest key (inclusive); none: from the first."),
        Arg("to_key", "toKey", key, "The largest key (inclusive); none: to the last."),
    ]
    return [
        resolved_field(
            "fetchAll",
            resolver_with(fetch_all, times + paging, optional(connection)),
            "Every key's windows with start in [from, to], by start then key.",
        ),
        resolved_field(
            "fetchRange",
            resolver_with(fetch_range, keys + times + paging, optional(connection)),
            "The windows of keys in [fromKey, toKey] with start in [from, to], by key then start.",
        ),
    ]
