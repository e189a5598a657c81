"""Something changed in a store: the count of changed keys per committed batch, from this node's change feed.

What a subscription that re-reads a whole result (a ranking's top) follows instead of keys
(``schema.types.LiveQueries.store_changes``): it subscribes to every key of the store, yields 0 once it
follows (read after that: nothing committed later is missed), then, as batches commit, the number of
changed keys it saw since its last yield — everything buffered is drained first, so the batches that
commit while the subscriber is busy (reading, sending) make ONE yield. A subscriber more than its buffer
behind (``SubscriptionOverflowError``) is told that something changed (a count of at least 1) and goes on.

Only the partitions this node hosts as the active copy count: a standby's batches are its active's,
counted on that node (following a store through any node is issue 13's part 3). A partition handed over
stops counting here at once; the subscription stays open, quiet until a partition comes back.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from iqgraph.app.catalog import definition_of
from iqgraph.app.live.follow import Hosted
from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.schema.errors import api_error, limit_exceeded
from iqgraph.stores import StoreError
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.definitions import App
from iqgraph.streaming.feed_errors import (
    SubscriptionClosedError,
    SubscriptionOverflowError,
    TooManySubscriptionsError,
)
from iqgraph.streaming.subscription import Subscription


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
