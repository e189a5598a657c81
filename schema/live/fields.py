"""What every subscription field shares: how it is declared, the LiveQueries it follows, fresh reads per event.

A subscription's operation keeps one context while it lasts (``Context.for_operation``); an event whose
fields read stores (a ranking's relations, an entity) must not be answered from the DataLoader cache of an
earlier event, so each batch of events starts with ``fresh_reads``.
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
    """Give the context new DataLoaders and relation batches: the next events read the stores anew."""
    ctx.loaders = Loaders(ctx.queries, ctx.limits.max_keys, ctx.principal)
    ctx.entities = OpenBatches()
