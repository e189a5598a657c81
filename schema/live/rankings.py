"""Rankings followed live: ``<ranking>WatchTop(group, first)``, the top N sent again each time it changes.

For a ranking ``top_customers``::

    topCustomersWatchTop(group: String, first: Int): TopCustomersTopChange
    type TopCustomersTopChange { group: String  entries: [TopCustomersEntry!]! }

``entries`` are the ranking's own entries (``top``'s type: member, value, rank, cursor and the members'
relations). The first event is the top when the subscription starts; then, each time a batch changes the
ranking (``LiveQueries.store_changes``), the top is read again through the normal query path
(``StoreQueries.top``: every partition, wherever it is served) and sent if it differs from the last one sent
— a batch that moves only members below the top N sends nothing. Batches committed while a read or a send
runs cause one more read, not one per batch. Relations of the entries are read anew for each event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import strawberry

from iqgraph.schema.dynamic import Arg, Field, data_field, list_of, object_type, optional, resolver_with
from iqgraph.schema.errors import store_errors
from iqgraph.schema.live.fields import fresh_reads, live_queries, stream_of, subscription_field
from iqgraph.schema.naming import TypeNames, pascal_case
from iqgraph.schema.ranking_fields import RankingEntry
from iqgraph.schema.resolving import StorePlan, context
from iqgraph.schema.types import Ranked


def watch_top_field(plan: StorePlan, entry: RankingEntry, names: TypeNames) -> Field:
    """Return ``<ranking>WatchTop(group, first)``: the top first members of group, again each time it changes."""
    change = object_type(
        names.new(f"{pascal_case(plan.name)}TopChange"),
        [
            data_field("group", str | None, "The group followed (null: every member, whatever its group)."),
            data_field("entries", list_of(entry.type), "The top now, from the greatest value down."),
        ],
        f"The top of {plan.label()} as it is now.",
    )
    name, node = plan.name, entry.convert

    async def watch_top(
        root: Any, info: strawberry.Info, group: str | None = None, first: int | None = None
    ) -> AsyncGenerator[Any, None]:
        ctx = context(info)
        size = ctx.limits.page_size(first)
        with store_errors():
            async with aclosing(live_queries(ctx).store_changes(name, principal=ctx.principal)) as ticks:
                async with aclosing(_changed_tops(ticks, lambda: ctx.queries.top(name, group, size, None))) as tops:
                    async for ranked in tops:
                        fresh_reads(ctx)  # the entries' relations: read for this event, not from the last one's
                        yield change(f0=group, f1=[node(r) for r in ranked])

    arguments = [
        Arg("group", "group", str | None, "The group (absent: every member, whatever its group)."),
        Arg(
            "first",
            "first",
            int | None,
            f"How many members (default {plan.limits.default_page_size}, at most {plan.limits.max_page_size}).",
        ),
    ]
    return subscription_field(
        f"{plan.field}WatchTop",
        resolver_with(watch_top, arguments, stream_of(optional(change))),
        f"The first members of group in {plan.label()} now, then again each time a batch changes them (their "
        "order, a value, who is in): a change below them sends nothing.",
    )


async def _changed_tops(
    ticks: AsyncGenerator[int, None], read: Callable[[], Awaitable[list[Ranked]]]
) -> AsyncGenerator[list[Ranked], None]:
    """Yield read() after each tick (the first: the start) when it differs from the last one yielded."""
    last: list[Ranked] | None = None
    async for _ in ticks:
        ranked = await read()
        if ranked != last:
            last = ranked
            yield ranked
