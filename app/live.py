"""Live queries on the owner: a store's keys followed on this node's change feed (schema.types.LiveQueries).

A watch checks the caller may read the store (``schema.access.check_read``), routes its keys to their
partitions as reads do (``app.routing``: the producers' partitioner), subscribes to the node's
``ChangeFeed``, reads the partitions' current states and follows the feed from there
(``read_then_follow``: nothing missed, nothing sent twice), then yields each change as the feed delivers it
(``app.live_values`` turns states into values). A subscriber more than its buffer behind
(``SubscriptionOverflowError``) is caught up by reading the store again.

Only keys whose partitions this node hosts as the active copy are followed: a key elsewhere fails
STORE_NOT_AVAILABLE naming its partition before anything is sent — following keys through any node
(forwarded to their owner) is issue 13's part 3 — and a partition that moves away while it is followed
(checked every ``check_every_s`` while nothing comes) ends the subscription with STORE_MIGRATED. A partition
not queryable yet (restoring) fails STORE_NOT_READY. The node's feed bounds the subscriptions it holds
(``ChangeFeed.max_subscriptions``): one more is LIMIT_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence

from iqgraph.app import routing
from iqgraph.app.live_values import WatchedKeys
from iqgraph.app.local_partitions import definition_of
from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.schema.errors import STORE_NOT_AVAILABLE, ApiError, api_error, invalid_argument, limit_exceeded
from iqgraph.schema.types import LiveChange
from iqgraph.stores import Key, PartitionStores, StoreError, StoreKind, StoreMigratedError
from iqgraph.streaming.change_feed import (
    Change,
    ChangeFeed,
    Subscription,
    SubscriptionClosedError,
    SubscriptionOverflowError,
    TooManySubscriptionsError,
    read_then_follow,
)
from iqgraph.streaming.definitions import App, StoreDefinition

WATCHABLE = (StoreKind.KEY_VALUE, StoreKind.WINDOW, StoreKind.BLOOM)
Hosted = Mapping[str, Mapping[int, PartitionStores]]


class LocalLive:
    """Follow the keys of the partitions this node owns, from its change feed (``watch``)."""

    def __init__(
        self,
        app: App,
        partitions: Hosted,
        feed: ChangeFeed,
        *,
        partitioner: Callable[[str], str],
        role: Callable[[str, int], str] | None = None,
        node_id: str = "node-0",
        check_every_s: float = 2.0,
    ) -> None:
        """Args:
        partitions: topic → partition → stores this node hosts, now (the runner's live dict).
        partitioner: the partitioner a topic's keys are routed by (configured, or detected).
        role: "active" or "standby" of this node's copy of a topic-partition (default: active).
        """
        self.app = app
        self.partitions = partitions
        self.feed = feed
        self.partitioner = partitioner
        self.role = role or (lambda topic, partition: "active")
        self.node_id = node_id
        self.check_every_s = check_every_s

    async def watch(
        self,
        store: str,
        keys: Sequence[Key],
        *,
        after: Mapping[int, int] | None = None,
        window_from: int | None = None,
        principal: Principal = ANONYMOUS,
    ) -> AsyncGenerator[LiveChange, None]:
        """Yield the keys' values newer than after, then every change, until the subscriber goes away."""
        check_read(principal, store)
        definition = self._definition(store)
        routed = self._route(definition, keys)
        hosted = self._owned(definition, routed)
        try:
            subscription = self.feed.subscribe(definition.topic, {store: keys}, after=after)
        except TooManySubscriptionsError:
            limit = self.feed.max_subscriptions
            raise limit_exceeded("subscriptions on this node", limit, limit + 1) from None
        watched = WatchedKeys(definition, routed, window_from)
        try:
            for change in await self._snapshot(subscription, watched, hosted):
                yield change
            while True:
                try:
                    found = await self._next(subscription, definition, hosted)
                except SubscriptionOverflowError:
                    for change in await self._snapshot(subscription, watched, hosted):
                        yield change
                    continue
                except SubscriptionClosedError:
                    return
                position = subscription.positions().get(found.partition, found.offset)
                made = watched.change(found, position)
                if made is not None:
                    yield made
        finally:
            subscription.close()

    def _definition(self, store: str) -> StoreDefinition:
        try:
            definition = definition_of(self.app, store)
        except StoreError as exc:
            raise api_error(exc) from None
        if definition.kind not in WATCHABLE:
            raise invalid_argument("store", f"{store} is a {definition.kind.value} store, which cannot be followed")
        return definition

    def _route(self, definition: StoreDefinition, keys: Sequence[Key]) -> dict[int, list[Key]]:
        """Return per partition the keys a read asks it for; the first key that cannot be routed fails."""
        found = routing.store_keys_partitions(self.app, definition, keys, self.partitioner(definition.topic))
        routed: dict[int, list[Key]] = {}
        for key, partitions in zip(keys, found, strict=True):
            if isinstance(partitions, Exception):
                raise api_error(partitions)
            for p in partitions:
                routed.setdefault(p, []).append(key)
        return routed

    def _owned(self, definition: StoreDefinition, routed: Mapping[int, Sequence[Key]]) -> dict[int, PartitionStores]:
        """Return the stores of each partition routed to; STORE_NOT_AVAILABLE for one this node does not own."""
        topic, hosted = definition.topic, self.partitions.get(definition.topic, {})
        owned: dict[int, PartitionStores] = {}
        for p in sorted(routed):
            stores = hosted.get(p)
            if stores is None or self.role(topic, p) != "active":
                copy = "is not hosted" if stores is None else "is only a standby copy"
                raise ApiError(
                    f"partition {topic}-{p} (key {routed[p][0]!r}) {copy} on {self.node_id}: subscribe on the node "
                    "that owns it (keyMetadata names it)",
                    STORE_NOT_AVAILABLE,
                    partition=p,
                    retryAfterMs=1000,
                )
            owned[p] = stores
        return owned

    async def _snapshot(
        self, subscription: Subscription, watched: WatchedKeys, hosted: Mapping[int, PartitionStores]
    ) -> list[LiveChange]:
        """Read the watched keys' partitions and follow on from there; return what the read has to send."""
        before = subscription.positions()
        databases = {p: stores.db for p, stores in hosted.items()}
        read = functools.partial(watched.read, hosted)
        try:
            snapshots = await asyncio.to_thread(read_then_follow, self.feed, subscription, databases, read)
        except StoreError as exc:
            raise api_error(exc) from None
        return watched.snapshot(snapshots, before)

    async def _next(
        self, subscription: Subscription, definition: StoreDefinition, hosted: Mapping[int, PartitionStores]
    ) -> Change:
        """Return the next change; while none comes, check every check_every_s that the partitions are still here."""
        while True:
            found = subscription.poll()
            if found is not None:
                return found
            try:
                return await asyncio.wait_for(subscription.next(), self.check_every_s)
            except TimeoutError:
                self._check_still_owned(definition, hosted)

    def _check_still_owned(self, definition: StoreDefinition, hosted: Mapping[int, PartitionStores]) -> None:
        """Raise STORE_MIGRATED if a followed partition was closed or handed over (its changes would stop)."""
        now = self.partitions.get(definition.topic, {})
        for p, stores in hosted.items():
            if now.get(p) is not stores or self.role(definition.topic, p) != "active":
                moved = StoreMigratedError(
                    f"partition {definition.topic}-{p} moved away from {self.node_id} while it was followed: "
                    "subscribe again with after (your last positions) on its owner"
                )
                raise api_error(moved)
