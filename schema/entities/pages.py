"""The page of an entity: ``customersPage(first, after, maxLag)``, a Relay connection of entities in key order.

It lists the keys of the entity's table, else of its first store. A key-value scan hands its values too:
they become the page's read of that store, so a page of customers with their columns reads the table once.
A window store lists windows (key then start); the page takes each key once, its cursor carrying the
last key seen so that a key whose windows straddle two reads is not listed twice. A page can then hold
fewer keys than ``first`` (pageInfo.hasNextPage says whether more follow).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
import strawberry

from iqgraph.schema.dynamic import Arg, Field, optional, resolved_field, resolver_with
from iqgraph.schema.entities.batches import EntityBatch, EntityRef, Reads, read_ahead
from iqgraph.schema.errors import store_errors
from iqgraph.schema.pagination import ConnectionType, Order, read_slice
from iqgraph.schema.resolving import checked_bound, context
from iqgraph.schema.scalars import INT64_MAX, INT64_MIN
from iqgraph.schema.selection import reads_ahead
from iqgraph.stores import InvalidCursorError, Page

if TYPE_CHECKING:
    from iqgraph.schema.entities.fields import EntityPlan
    from iqgraph.schema.types import StoreQueries

_FIRST = "How many entities at most (the page size)."
_AFTER = "Resume after this cursor (an edge's cursor or pageInfo.endCursor)."
ReadKeys = Callable[[int, "str | None"], Awaitable[Page[Any]]]


def page_field(plan: EntityPlan, cls: type, reads: Reads, max_lag: Arg) -> Field:
    """Return the root field listing an entity's keys a page at a time."""
    source, kind = plan.source, plan.key
    connection = ConnectionType(
        plan.edge_name, plan.connection_name, cls, f"A page of {plan.name} entities, in key order."
    )
    scans_values = source.info.kind == "key_value"
    order = Order(f"{plan.name}:key", (lambda item: item[0]) if scans_values else (lambda key: key), kind.valid)
    default = source.limits.default_page_size

    @reads_ahead
    async def page(
        root: Any, info: strawberry.Info, first: int = default, after: str | None = None, max_lag: Any = None
    ) -> Any:
        ctx = context(info)
        size = ctx.limits.page_size(first)
        bound = checked_bound(max_lag)
        scan = _read_entries if scans_values else _read_keys
        read = scan(ctx.queries, source.name, bound)
        with store_errors():
            found = await read_slice(read, order, size, after, ctx.limits.max_page_size)
        items = [item for _, item in found.edges]
        batch = EntityBatch([item[0] for item in items] if scans_values else items, bound)
        if scans_values:
            batch.seed(source.name, [item[1] for item in items])
        await read_ahead(info, batch, reads, ("edges", "node"))
        return connection.of_nodes(found, [EntityRef(key, i, batch) for i, key in enumerate(batch.keys)])

    args = [
        Arg("first", "first", int, _FIRST),
        Arg("after", "after", str | None, _AFTER),
        max_lag,
    ]
    return resolved_field(
        plan.page,
        resolver_with(page, args, optional(connection.type)),
        f"Every {plan.name}, a page at a time, in key order: the keys of store {source.name}.",
    )


def _read_entries(queries: StoreQueries, store: str, bound: int | None) -> ReadKeys:
    async def read(count: int, cursor: str | None) -> Page[Any]:
        return await queries.range(store, None, None, count, cursor, bound)

    return read


def _read_keys(queries: StoreQueries, store: str, bound: int | None) -> ReadKeys:
    """Return a read of a window store's distinct keys, in key order, behind cursors [store cursor, last key]."""

    async def read(count: int, cursor: str | None) -> Page[Any]:
        base, last = _decode(cursor)
        page = await queries.fetch_range(store, None, None, INT64_MIN, INT64_MAX, count, base, bound)
        keys: list[Any] = []
        for window in page.items:
            if window.key != (keys[-1] if keys else last):
                keys.append(window.key)
        tail = keys[-1] if keys else last
        return Page(keys, None if page.next_cursor is None else orjson.dumps([page.next_cursor, tail]).decode())

    return read


def _decode(cursor: str | None) -> tuple[str | None, Any]:
    if cursor is None:
        return None, None
    try:
        base, last = orjson.loads(cursor)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        raise InvalidCursorError(f"after: {cursor!r} is not a cursor this API issued") from None
    if not isinstance(base, str):
        raise InvalidCursorError(f"after: {cursor!r} is not a cursor this API issued")
    return base, last
