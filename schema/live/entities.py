"""Entities followed live: ``<entity>Watch(keys)``, each key's entity again whenever one of its stores changes it.

For the entity ``Product`` (root field ``product(key)``)::

    productWatch(keys: [String!]!): Product

The events are the entity objects themselves, resolved by the entity's own fields (so nested fields,
relations and FORBIDDEN per store work as in ``products(keys)``), read anew for each event. First every
key's entity once, read after its key-value stores' current values have come (the subscription follows from
there: nothing committed later is missed); then, each time a batch changes a key in one of the entity's
stores, that key's entity once (the changes that come while events are read or sent make one event per key).
Two stores changed by one batch may send the key twice. An entity never goes backwards unmarked: an event whose
reads a standby answered says so in the event's ``extensions.staleness`` (store, partition, node, lag, as a
query's), and a read that saw a partition before the offset an earlier event was read at (a lagging standby taking
over after a kill) is read again until it does not (``read_forward``). The stores are followed by
``LiveQueries.watch`` (key-value, window, bloom); a ranking composed into an entity is not followed (its
field is read with each event, not a reason for one). A store the caller may not read is not followed (its
field is FORBIDDEN in each event); none readable: FORBIDDEN. There is no ``after``: a resumed subscription
starts again with every key's entity.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, TypeVar

import strawberry

from iqgraph.schema.access import Principal, check_read
from iqgraph.schema.dynamic import Arg, Field, list_of, optional, resolver_with
from iqgraph.schema.entities.batches import EntityBatch, EntityRef, Reads, read_ahead
from iqgraph.schema.errors import store_errors
from iqgraph.schema.live.fields import Seen, Shown, fresh_reads, live_queries, seen_by, stream_of, subscription_field
from iqgraph.schema.resolving import StorePlan, context
from iqgraph.schema.types import LiveChange, LiveQueries
from iqgraph.stores import Key

if TYPE_CHECKING:
    from iqgraph.schema.entities.fields import EntityPlan

WATCHED_KINDS = ("key_value", "window", "bloom")
HOLD_S = 0.1  # how soon an entity read that saw an older view than the last event's is read again
T = TypeVar("T")


def entity_watch_field(plan: EntityPlan, cls: type, reads: Reads) -> Field | None:
    """Return ``<entity>Watch(keys)`` (None if none of the entity's stores can be followed)."""
    followed = [s for s in plan.stores if s.info.kind in WATCHED_KINDS]
    if not followed:
        return None
    kind = plan.key

    async def watch(root: Any, info: strawberry.Info, keys: list[Any]) -> AsyncGenerator[Any, None]:
        ctx = context(info)
        ctx.limits.check_keys(keys)
        with store_errors():
            checked = list(dict.fromkeys(kind.check(key) for key in keys))
        stores = _readable(followed, ctx.principal)
        changed = changed_keys(live_queries(ctx), stores, checked, ctx.principal)
        shown = Shown()

        async def read(dirty: list[Key]) -> EntityBatch:
            fresh_reads(ctx)
            batch = EntityBatch(dirty, None)
            await read_ahead(info, batch, reads)  # every store the selection asks: one read per round
            return batch

        with store_errors():
            async with aclosing(changed) as rounds:
                async for dirty in rounds:
                    batch = await read_forward(functools.partial(read, dirty), functools.partial(seen_by, ctx), shown)
                    for index, key in enumerate(dirty):
                        yield EntityRef(key, index, batch)

    skipped = [s.name for s in plan.stores if s not in followed]
    about = (
        f"Each key's {plan.name} now, then again each time a batch changes it in {', '.join(s.name for s in followed)}"
        f" (at most {plan.source.limits.max_keys} keys; no after: a new subscription starts with every key)."
    )
    if skipped:
        about += f" Not followed (read with each event, not a reason for one): {', '.join(skipped)}."
    args = [Arg("keys", "keys", list_of(kind.annotation), "The keys to follow.")]
    return subscription_field(f"{plan.field}Watch", resolver_with(watch, args, stream_of(optional(cls))), about)


async def read_forward(
    read: Callable[[], Awaitable[T]], seen: Callable[[], Seen], shown: Shown, hold_s: float = HOLD_S
) -> T:
    """Return read() once what it saw is no older than what earlier events showed (``schema.live.fields.Shown``):
    an older view (a lagging standby that took over after a kill) is read again hold_s later, not sent — the
    round's keys changed, so the event is due, but never with values from before the ones already sent."""
    while True:
        found = await read()
        if not shown.older(now := seen()):
            shown.advance(now)
            return found
        await asyncio.sleep(hold_s)


def _readable(stores: Sequence[StorePlan], principal: Principal) -> list[StorePlan]:
    """Return the stores principal may read; FORBIDDEN (the first store's) if none."""
    readable = [s for s in stores if principal.may_read(s.name)]
    if not readable:
        check_read(principal, stores[0].name)
    return readable


async def changed_keys(
    live: LiveQueries, stores: Sequence[StorePlan], keys: list[Key], principal: Principal
) -> AsyncGenerator[list[Key], None]:
    """Yield every key once the key-value stores' current values have come, then the keys the batches change.

    The stores' watches are merged: what comes while the subscriber is busy is one round, each key once (so a
    slow subscriber holds at most the keys, whatever the rate of batches). A watch's failure ends the rounds.
    """
    merged = _Merged({s.name: set(keys) for s in stores if s.info.kind == "key_value"}, len(stores))
    pumps = [asyncio.create_task(merged.pump(s.name, live.watch(s.name, keys, principal=principal))) for s in stores]
    try:
        await merged.started()
        merged.take()  # what came before is in the first round: every key, read now
        yield keys
        while dirty := await merged.changed():
            yield dirty
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


class _Merged:
    """The keys the watches of several stores changed since the subscriber last took them."""

    def __init__(self, awaited: dict[str, set[Key]], watches: int) -> None:
        """Args:
        awaited: per key-value store, the keys whose current value its watch has still to send (the start).
        """
        self.awaited = awaited
        self.running = watches
        self.failure: Exception | None = None
        self.dirty: dict[Key, None] = {}
        self._wake = asyncio.Event()

    async def pump(self, store: str, changes: AsyncGenerator[LiveChange, None]) -> None:
        """Mark each key one store's watch changes, until it ends (or fails: the subscription ends with it)."""
        try:
            async with aclosing(changes):
                async for change in changes:
                    self.dirty[change.key] = None
                    if change.snapshot:
                        self.awaited.get(store, set()).discard(change.key)
                    self._wake.set()
        except Exception as exc:  # noqa: BLE001 - handed to the subscription, which ends with it
            self.failure = self.failure or exc
        self.running -= 1
        self._wake.set()

    async def started(self) -> None:
        """Wait until every key-value watch has sent every key's current value (or every watch ended)."""
        await self._until(lambda: not any(self.awaited.values()))

    async def changed(self) -> list[Key]:
        """Return the keys changed since they were last taken, waiting for one; [] once every watch ended."""
        await self._until(lambda: bool(self.dirty))
        return self.take()

    def take(self) -> list[Key]:
        """Return the keys changed since they were last taken, in the order they first changed."""
        dirty, self.dirty = list(self.dirty), {}
        return dirty

    async def _until(self, ready: Callable[[], bool]) -> None:
        while True:
            if self.failure is not None:
                raise self.failure
            if ready() or not self.running:
                return
            self._wake.clear()
            await self._wake.wait()
