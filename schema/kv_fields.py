"""The object type of a key-value store: get, getMany, range, prefix, all, count, approximateCount.

``range``, ``prefix`` and ``all`` are Relay connections of ``<Base>Entry {key, value}`` in the keys'
natural order (numeric for Long keys, code point order for String keys); ``prefix`` exists only on
stores with String keys.
"""

from __future__ import annotations

from typing import Any

import strawberry

from iqgraph.schema.dynamic import Arg, Field, data_field, list_of, object_type, optional, resolved_field, resolver_with
from iqgraph.schema.errors import store_errors
from iqgraph.schema.pagination import ConnectionType, Order, read_slice
from iqgraph.schema.resolving import StorePlan, bound, context, load_each, load_one, queries
from iqgraph.schema.scalars import Long

_FIRST = "How many entries at most (the page size)."
_AFTER = "Resume after this cursor (an edge's cursor or pageInfo.endCursor)."


def key_value_type(plan: StorePlan) -> type:
    """Return the object type of key-value store plan."""
    value_annotation, convert = plan.value.nullable()
    entry = object_type(
        plan.node_name,
        [
            data_field("key", plan.key.annotation, "The key."),
            data_field("value", value_annotation, "Its value."),
            *plan.entry_fields,
        ],
        f"A key of {plan.label()} and its value.",
    )
    connection = ConnectionType(
        plan.edge_name, plan.connection_name, entry, f"A page of the entries of {plan.label()}, in key order."
    )
    order = Order(f"{plan.name}:key", lambda item: item[0], plan.key.valid)

    def node(item: tuple[Any, Any]) -> Any:
        return entry(f0=item[0], f1=convert(item[1]))

    async def page(info: strawberry.Info, read: Any, first: int | None, after: str | None) -> Any:
        ctx = context(info)
        size = ctx.limits.page_size(first)
        with store_errors():
            found = await read_slice(read, order, size, after, ctx.limits.max_page_size)
            return connection.make(found, node)

    point = _point_fields(plan, value_annotation, convert)
    fields = point[:2] + _scan_fields(plan, connection.type, page) + point[2:]
    return object_type(plan.type_name, fields, _describe(plan))


def _describe(plan: StorePlan) -> str:
    aggregation = f" ({plan.info.aggregation} per key)" if plan.info.aggregation else ""
    about = f": {plan.info.description}" if plan.info.description else ""
    return f"Key-value store {plan.name}{aggregation}{about}"


def _count_description(plan: StorePlan) -> str:
    if plan.info.co_partitioned:
        return "How many keys the store holds: exact, kept with every write."
    return (
        "How many distinct keys the store holds: exact. The store is keyed by a column, not the record key, so "
        "one key can live in several partitions: it counts once (the partitions' keys are compared)."
    )


def _point_fields(plan: StorePlan, value_annotation: Any, convert: Any) -> list[Field]:
    name, key = plan.name, plan.key.annotation

    async def get(root: Any, info: strawberry.Info, key: Any) -> Any:
        return await load_one(context(info).loaders.values(name, bound(root)), key, convert)

    async def get_many(root: Any, info: strawberry.Info, keys: list[Any]) -> list[Any]:
        ctx = context(info)
        ctx.limits.check_keys(keys)
        return await load_each(ctx.loaders.values(name, bound(root)), keys, convert)

    async def count(root: Any, info: strawberry.Info) -> int:
        with store_errors():
            return await context(info).queries.count(name, bound(root))

    async def approximate_count(root: Any, info: strawberry.Info) -> int:
        with store_errors():
            return await context(info).queries.approximate_count(name, bound(root))

    return [
        resolved_field(
            "get",
            resolver_with(get, [Arg("key", "key", key, "The key.")], value_annotation),
            "The value of key; null if the store has none.",
        ),
        resolved_field(
            "getMany",
            resolver_with(
                get_many, [Arg("keys", "keys", list_of(key), "The keys.")], optional(list_of(value_annotation))
            ),
            f"The value of each key, in the order given; null for a missing key (at most {plan.limits.max_keys}).",
        ),
        resolved_field("count", resolver_with(count, [], Long | None), _count_description(plan)),
        resolved_field(
            "approximateCount",
            resolver_with(approximate_count, [], Long | None),
            "About how many keys the store holds (RocksDB's estimate: fast, grows with updates; use count).",
        ),
    ]


def _scan_fields(plan: StorePlan, connection: Any, page: Any) -> list[Field]:
    name, key = plan.name, plan.key.annotation
    default = plan.limits.default_page_size
    paging = [Arg("first", "first", int, _FIRST), Arg("after", "after", str | None, _AFTER)]

    async def range_(
        root: Any, info: strawberry.Info, from_: Any = None, to: Any = None, first: int = default, after: Any = None
    ) -> Any:
        return await page(info, lambda n, c: queries(info).range(name, from_, to, n, c, bound(root)), first, after)

    async def prefix(root: Any, info: strawberry.Info, prefix: str, first: int = default, after: Any = None) -> Any:
        return await page(info, lambda n, c: queries(info).prefix(name, prefix, n, c, bound(root)), first, after)

    async def all_(root: Any, info: strawberry.Info, first: int = default, after: Any = None) -> Any:
        return await page(info, lambda n, c: queries(info).range(name, None, None, n, c, bound(root)), first, after)

    bounds = [
        Arg("from_", "from", optional(key), "The smallest key (inclusive); none: from the first."),
        Arg("to", "to", optional(key), "The largest key (inclusive); none: to the last."),
    ]
    fields = [
        resolved_field(
            "range",
            resolver_with(range_, bounds + paging, optional(connection)),
            "Entries with from <= key <= to, in key order.",
        ),
        resolved_field("all", resolver_with(all_, paging, optional(connection)), "Every entry, in key order."),
    ]
    if plan.key.graphql == "String":
        arg = Arg("prefix", "prefix", str, "What the keys start with.")
        fields.insert(
            1,
            resolved_field(
                "prefix",
                resolver_with(prefix, [arg, *paging], optional(connection)),
                "Entries whose key starts with prefix, in key order.",
            ),
        )
    return fields
