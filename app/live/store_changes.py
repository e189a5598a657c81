"""Something changed in a store: the count of changed keys per committed batch, on this node and on every node.

What a subscription that re-reads a whole result (a ranking's top) follows instead of keys
(``schema.types.LiveQueries.store_changes``). ``store_changes`` counts this node's: it subscribes to every key of
the store, yields 0 once it follows (read after that: nothing committed later is missed), then, as batches
commit, the number of changed keys it saw since its last yield — everything buffered is drained first, so the
batches that commit while the subscriber is busy (reading, sending) make ONE yield. A subscriber more than its
buffer behind (``SubscriptionOverflowError``) is told that something changed (a count of at least 1) and goes on.

Only the partitions this node hosts as the active copy count: a standby's batches are its active's,
counted on that node. A partition handed over stops counting here at once; the subscription stays open, quiet
until a partition comes back.

``StoreChanges.everywhere`` sums every node's: this node's count, and each peer's streamed from its
``/internal/changes`` (``app.live.stream``; one ``Broadcast`` per peer, store and caller shared by every listener
here, ``app.live.relay``). A peer that fails is asked again every second, and its failure counts as a change.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING

from iqgraph.app.catalog import definition_of
from iqgraph.app.cluster.peers import PeerError, PeerUnavailableError
from iqgraph.app.live.follow import Hosted
from iqgraph.app.live.relay import Broadcasts
from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.schema.errors import ApiError, api_error, limit_exceeded, properties
from iqgraph.stores import StoreError
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.definitions import App
from iqgraph.streaming.feed_errors import (
    SubscriptionClosedError,
    SubscriptionOverflowError,
    TooManySubscriptionsError,
)
from iqgraph.streaming.subscription import Subscription

if TYPE_CHECKING:
    from iqgraph.app.cluster.peers import PeerClient
    from iqgraph.app.query.store_queries import ClusterStoreQueries

log = logging.getLogger(__name__)

CHANGES_START_S = 5.0  # how long everywhere waits for every node to follow before its first yield


async def store_changes(
    app: App,
    partitions: Hosted,
    feed: ChangeFeed,
    role: Callable[[str, int], str],
    store: str,
    *,
    principal: Principal = ANONYMOUS,
) -> AsyncGenerator[int, None]:
    """Yield 0 once following store, then per batch (coalesced) how many of its keys changed on active partitions.

    partitions: topic → partition → stores this node hosts, now; role: "active" or "standby" of a copy.
    """
    check_read(principal, store)
    try:
        topic = definition_of(app, store).topic
    except StoreError as exc:
        raise api_error(exc) from None
    try:
        subscription = feed.subscribe(topic, {store: None})
    except SubscriptionClosedError:  # the node stops
        return
    except TooManySubscriptionsError:
        limit = feed.max_subscriptions
        raise limit_exceeded("subscriptions on this node", limit, limit + 1) from None

    def active(partition: int) -> bool:
        return partition in partitions.get(topic, {}) and role(topic, partition) == "active"

    try:
        yield 0
        while True:
            try:
                changed = await _changed(subscription, active)
            except SubscriptionClosedError:
                return
            if changed:
                yield changed
    finally:
        subscription.close()


async def _changed(subscription: Subscription, active: Callable[[int], bool]) -> int:
    """Wait for a change, then drain what is buffered; return how many changes of active partitions it held.

    An overflow counts as one (at least one key changed; how many was dropped).
    """
    try:
        first = await subscription.next()
    except SubscriptionOverflowError:
        return 1 + _drain(subscription, active)
    return int(active(first.partition)) + _drain(subscription, active)


def _drain(subscription: Subscription, active: Callable[[int], bool]) -> int:
    """Return how many buffered changes of active partitions there were (an overflow counts one), taking them all."""
    count = 0
    while True:
        try:
            found = subscription.poll()
        except SubscriptionOverflowError:
            count += 1
            continue
        except SubscriptionClosedError:
            return count
        if found is None:
            return count
        count += active(found.partition)


class StoreChanges:
    """Counts of a store's changed keys: this node's (``here``: what peers stream from ``/internal/changes``), and
    every node's (``everywhere``: what a ranking's watchTop re-reads on, through any node)."""

    def __init__(
        self,
        app: App,
        partitions: Hosted,
        feed: ChangeFeed,
        role: Callable[[str, int], str],
        *,
        node_id: str,
        queries: ClusterStoreQueries,
        peers: PeerClient,
    ) -> None:
        """Args: partitions: topic → partition → stores this node hosts, now; role: "active" or "standby" of a
        copy; queries: the cluster's members and their URLs; peers: the client of their ``/internal/changes``."""
        self.app = app
        self.partitions = partitions
        self.feed = feed
        self.role = role
        self.node_id = node_id
        self.queries = queries
        self.peers = peers
        self.broadcasts = Broadcasts()  # the peers' counts: one upstream per (peer, store, caller)
        self.stopped = False
        self._on_stop: set[Callable[[], None]] = set()  # how each stream of counts here is told to end

    def stop(self) -> None:
        """End every stream of counts (the node stops)."""
        self.stopped = True
        for end in list(self._on_stop):
            end()

    def here(self, store: str, *, principal: Principal = ANONYMOUS) -> AsyncGenerator[int, None]:
        """Yield 0 once store is followed, then how many of its keys each batch changed on this node's active
        partitions (``store_changes``)."""
        return store_changes(self.app, self.partitions, self.feed, self.role, store, principal=principal)

    async def everywhere(self, store: str, *, principal: Principal = ANONYMOUS) -> AsyncGenerator[int, None]:
        """Yield 0 once store is followed on every node, then how many of its keys batches changed on any active.

        Each peer streams its own count (``/internal/changes``); a peer that fails is asked again every second
        (its partitions' batches are counted again once a node serves them as the active).
        """
        check_read(principal, store)
        try:
            definition_of(self.app, store)
        except StoreError as exc:
            raise api_error(exc) from None
        nodes = sorted(self.queries.membership.current().members)
        counts: asyncio.Queue[int | None] = asyncio.Queue()  # None: the node stops
        end = functools.partial(counts.put_nowait, None)
        self._on_stop.add(end)
        started = {node: asyncio.Event() for node in nodes}
        tasks = [asyncio.create_task(self._count(node, store, principal, counts, started[node])) for node in nodes]
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CHANGES_START_S):  # not wait_for: see app.live.watch's _Watch.run
                    await asyncio.gather(*(e.wait() for e in started.values()))
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if self.stopped:
                return
            yield 0
            while True:
                found = await counts.get()
                while found is not None and not counts.empty():
                    more = counts.get_nowait()
                    found = None if more is None else found + more
                if found is None:
                    return
                if found:
                    yield found
        finally:
            self._on_stop.discard(end)
            for task in tasks:
                task.cancel()
            for task in tasks:  # their feed subscriptions closed when this returns
                with contextlib.suppress(BaseException):
                    await task

    async def _count(
        self, node: str, store: str, principal: Principal, counts: asyncio.Queue[int | None], ready: asyncio.Event
    ) -> None:
        """Put node's counts of store's changed keys in counts (again after a failure), ready at its first."""
        while True:
            try:
                if node == self.node_id:
                    async with contextlib.aclosing(self.here(store, principal=principal)) as here:
                        async for n in here:
                            ready.set()
                            counts.put_nowait(n)
                else:
                    await self._count_peer(node, store, principal, counts, ready)
            except ApiError as exc:
                if not properties(exc.code).transient:
                    raise
            except (PeerError, OSError, ConnectionError) as exc:
                log.info("changes of %s on %s stopped (%r): asking again", store, node, exc)
            ready.set()
            counts.put_nowait(1)  # something may have changed while it was not followed
            await asyncio.sleep(1.0)

    async def _count_peer(
        self, node: str, store: str, principal: Principal, counts: asyncio.Queue[int | None], ready: asyncio.Event
    ) -> None:
        """Put a peer's counts in counts, from its one broadcast shared by every listener here."""
        queries, peers = self.queries, self.peers

        def open_counts() -> AsyncIterator[int]:
            url = queries.url_of(node)
            if url is None:
                raise PeerUnavailableError(f"node {node} is not a member of the cluster any more")
            return peers.changes(url, store, principal)

        broadcast = self.broadcasts.get((node, store, principal), open_counts)
        queue = broadcast.listen()
        try:
            while True:
                if broadcast.started.is_set():
                    ready.set()
                try:
                    async with asyncio.timeout(None if ready.is_set() else 0.1):  # not wait_for: see everywhere
                        item = await queue.get()
                except TimeoutError:
                    continue
                if isinstance(item, BaseException):
                    raise item
                ready.set()
                counts.put_nowait(item)
        finally:
            broadcast.leave(queue)
