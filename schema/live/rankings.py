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

A ranking never goes backwards unmarked: each event says in ``lag`` how far behind the copies that answered
were (a standby serving a partition within ``maxLag`` while its active node is down; null: every partition's
active copy), and a read that saw any partition at an offset BEFORE the one the last event showed (a lagging
standby taking over after a kill) is held, not sent: the next batch's read is tried instead, so the values a
subscriber sees only move forward. A standby's top that is no older than the last one sent is sent, marked.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import strawberry

from iqgraph.schema.dynamic import Arg, Field, data_field, list_of, object_type, optional, resolver_with
from iqgraph.schema.errors import store_errors
from iqgraph.schema.live.fields import Seen, Shown, fresh_reads, live_queries, seen_by, stream_of, subscription_field
from iqgraph.schema.naming import TypeNames, pascal_case
from iqgraph.schema.ranking_fields import RankingEntry
from iqgraph.schema.resolving import StorePlan, context
from iqgraph.schema.types import Ranked

_LAG = (
    "How many records the furthest-behind copy that answered was behind (a standby serving a partition within maxLag "
    "while its active node is down); null: every partition's active copy."
)
_MAX_LAG = (
    "How many records a standby may be behind to serve a partition while its active node is down (absent: the "
    "node's --max-lag; none set: only active copies)."
)


def watch_top_field(plan: StorePlan, entry: RankingEntry, names: TypeNames) -> Field:
    """Return ``<ranking>WatchTop(group, first)``: the top first members of group, again each time it changes."""
    change = object_type(
        names.new(f"{pascal_case(plan.name)}TopChange"),
        [
            data_field("group", str | None, "The group followed (null: every member, whatever its group)."),
            data_field("entries", list_of(entry.type), "The top now, from the greatest value down."),
            data_field("lag", int | None, _LAG),
        ],
        f"The top of {plan.label()} as it is now.",
    )
    name, node = plan.name, entry.convert

    async def watch_top(
        root: Any, info: strawberry.Info, group: str | None = None, first: int | None = None, max_lag: int | None = None
    ) -> AsyncGenerator[Any, None]:
        ctx = context(info)
        size = ctx.limits.page_size(first)

        async def read() -> Top:
            fresh_reads(ctx)  # what this read reports: the positions and lags of the copies that answered
            ranked = await ctx.queries.top(name, group, size, None, max_lag)
            lags = [e["lag"] for e in ctx.reports.staleness if e["store"] == name]
            return Top(ranked, seen_by(ctx), max(lags) if lags else None)

        with store_errors():
            async with aclosing(live_queries(ctx).store_changes(name, principal=ctx.principal)) as ticks:
                async with aclosing(changed_tops(ticks, read)) as tops:
                    async for top in tops:
                        yield change(f0=group, f1=[node(r) for r in top.ranked], f2=top.lag)

    arguments = [
        Arg("group", "group", str | None, "The group (absent: every member, whatever its group)."),
        Arg(
            "first",
            "first",
            int | None,
            f"How many members (default {plan.limits.default_page_size}, at most {plan.limits.max_page_size}).",
        ),
        Arg("max_lag", "maxLag", int | None, _MAX_LAG),
    ]
    return subscription_field(
        f"{plan.field}WatchTop",
        resolver_with(watch_top, arguments, stream_of(optional(change))),
        f"The first members of group in {plan.label()} now, then again each time a batch changes them (their "
        "order, a value, who is in): a change below them sends nothing.",
    )


@dataclass(frozen=True)
class Top:
    """One read of a top: its members, the offset each topic-partition was read at, the largest standby lag."""

    ranked: list[Ranked]
    positions: Seen
    lag: int | None


async def changed_tops(
    ticks: AsyncGenerator[int, None], read: Callable[[], Awaitable[Top]]
) -> AsyncGenerator[Top, None]:
    """Yield read() after each tick (the first: the start) when its top or lag differs from the last one yielded,
    unless it saw a partition at an offset before the last yielded one's (an older view: held, see the module)."""
    last: Top | None = None
    shown = Shown()
    async for _ in ticks:
        top = await read()
        if shown.older(top.positions):
            continue
        shown.advance(top.positions)
        if last is None or (top.ranked, top.lag) != (last.ranked, last.lag):
            last = top
            yield top
