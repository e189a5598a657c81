"""What every subscription field shares: how it is declared, the LiveQueries it follows, fresh reads per event.

A subscription's operation keeps one context while it lasts (``Context.for_operation``); an event whose
fields read stores (a ranking's relations, an entity) must not be answered from the DataLoader cache of an
earlier event, so each batch of events starts with ``fresh_reads``, which also clears what the request reports
(``schema.reports``): an event's ``extensions.staleness`` names the standbys that answered ITS reads.

A subscription that re-reads through the query path (a ranking's top, an entity) never sends an older view after
a fresher one: ``Shown`` keeps per topic-partition the furthest offset an event was read at, and a read that saw
any partition before it (a lagging standby taking over after a kill) is an older view, not sent.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import strawberry

from iqgraph.schema.dynamic import Field
from iqgraph.schema.entities.batches import OpenBatches
from iqgraph.schema.errors import STORE_NOT_AVAILABLE, ApiError
from iqgraph.schema.loaders import Loaders

if TYPE_CHECKING:
    from iqgraph.schema.context import Context
    from iqgraph.schema.types import LiveQueries


def stream_of(item: Any) -> Any:
    """Return the annotation of a subscription resolver yielding item (a type known only at run time)."""
    return AsyncGenerator[item, None]


def subscription_field(name: str, resolver: Callable[..., Any], description: str) -> Field:
    """Return a subscription field streamed by resolver (an async generator made with ``resolver_with``)."""
    annotation = resolver.__annotations__["return"]
    return Field(name, annotation, strawberry.subscription(resolver=resolver, name=name, description=description))


def live_queries(ctx: Context) -> LiveQueries:
    """Return what the request's subscriptions follow; STORE_NOT_AVAILABLE if this endpoint serves none."""
    if ctx.live is None:
        raise ApiError("this endpoint serves no subscriptions", STORE_NOT_AVAILABLE)
    return ctx.live


def fresh_reads(ctx: Context) -> None:
    """Give the context new DataLoaders and relation batches, and clear its reports: the next events read anew."""
    ctx.loaders = Loaders(ctx.queries, ctx.limits.max_keys, ctx.principal)
    ctx.entities = OpenBatches()
    ctx.reports.positions.clear()
    ctx.reports.staleness.clear()


#: Per (topic, partition), the offset a read saw it at.
Seen = dict[tuple[str, int], int]


def seen_by(ctx: Context) -> Seen:
    """Return the offsets the reads since the last fresh_reads saw each topic-partition at."""
    return {(t, int(p)): offset for t, seen in ctx.reports.positions.items() for p, offset in seen.items()}


class Shown:
    """Per topic-partition, the furthest offset a subscription's events were read at (see the module)."""

    def __init__(self) -> None:
        self.offsets: Seen = {}

    def older(self, seen: Seen) -> bool:
        """Return whether a read that saw seen is an older view than an event sent already."""
        return any(offset < self.offsets.get(at, offset) for at, offset in seen.items())

    def advance(self, seen: Seen) -> None:
        """Record that an event read at seen is sent."""
        for at, offset in seen.items():
            self.offsets[at] = max(offset, self.offsets.get(at, offset))
