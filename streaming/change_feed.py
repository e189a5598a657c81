"""Change feeds on the owner: what each committed batch changed in a partition's stores, pushed in process.

After a partition's WriteBatch commits, the sink publishes the keys of each watched store that the batch
changed, with their new mergeable (un-finalized) states and the partition's new position (its next offset).
The feed keeps no history: it is not a second source of truth. A subscriber that starts late registers,
reads the store, then follows the feed from the position it read (``snapshots.read_then_follow``): nothing
is missed and nothing is delivered twice. What one subscriber buffers, conflates and delivers is its
``Subscription`` (``streaming.subscription``); what a batch changed is ``streaming.change_set``.

Bounds (memory never grows with a subscriber's lag):
- a subscription buffers at most ``capacity`` distinct (store, key, window, partition) items (default 1,024);
- the feed buffers at most ``max_pending`` items over all subscriptions (default 262,144; measured ~180 B per
  buffered item plus ~120 B per distinct Change, so under ~80 MB, plus the states, which are shared between
  subscriptions, not copied), exceeded at most by the batch being published; when it is full, the
  subscription with the longest buffer overflows first;
- at most ``max_subscriptions`` subscriptions at once (default 16,384; ``TooManySubscriptionsError``).
A subscription that overflows drops its buffer; its next read raises ``SubscriptionOverflowError`` once,
after which it buffers again and the subscriber re-reads the store (``read_then_follow``).

Nothing is built for nobody: the sink asks ``writing(topic)`` which stores are watched (a dict read and an
uncontended lock per partition and batch, < 1 µs) and collects changes only for those, only for the watched
keys. The sink holds that lock from the question to the publish, so a subscriber's snapshot (``settle``)
never misses a batch that began before the subscription and so collected nothing for it.
"""

from __future__ import annotations

import threading
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from iqgraph.stores import Key
from iqgraph.streaming.change_set import Change, Interest, KeyChange
from iqgraph.streaming.feed_errors import SubscriptionClosedError, TooManySubscriptionsError
from iqgraph.streaming.subscription import Subscription

DEFAULT_CAPACITY = 1_024
DEFAULT_MAX_PENDING = 262_144
DEFAULT_MAX_SUBSCRIPTIONS = 16_384  # a node answers 10,000 watches (bench/live.py: memory per subscription)


@dataclass(frozen=True)
class FeedStats:
    """The feed's subscriptions and buffered items, against its bounds."""

    subscriptions: int
    pending: int
    max_pending: int


class _Budget:
    """The feed-wide count of buffered items (taken by publishers, given back by consumers)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, amount: int) -> bool:
        """Count amount more; return whether the total is still within the limit."""
        with self._lock:
            self.used += amount
            return self.used <= self.limit

    def give(self, amount: int) -> None:
        with self._lock:
            self.used -= amount


class _TopicFeed:
    """One topic's subscriptions, indexed by store and key, and the lock a batch holds while it is applied."""

    def __init__(self) -> None:
        self.batch_lock = threading.Lock()
        self.subscriptions: set[Subscription] = set()
        self.by_key: dict[str, dict[Any, set[Subscription]]] = {}
        self.every_key: dict[str, set[Subscription]] = {}
        self.interest: Interest = {}

    def __enter__(self) -> Interest:
        self.batch_lock.acquire()
        return self.interest

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.batch_lock.release()

    def add(self, sub: Subscription) -> None:
        self.subscriptions.add(sub)
        for watchers in self._places(sub):
            watchers.add(sub)
        self._refresh()

    def remove(self, sub: Subscription) -> None:
        self.subscriptions.discard(sub)
        for watchers in self._places(sub):
            watchers.discard(sub)
        for store, keys in sub.stores.items():  # keys nobody watches any more are not collected
            index = self.by_key.get(store, {})
            for key in [k for k in keys or () if not index[k]]:
                del index[key]
        self._refresh()

    def _places(self, sub: Subscription) -> list[set[Subscription]]:
        """Return the sets of watchers sub belongs in, by store and key (created where missing)."""
        places = []
        for store, keys in sub.stores.items():
            if keys is None:
                places.append(self.every_key.setdefault(store, set()))
            else:
                index = self.by_key.setdefault(store, {})
                places.extend(index.setdefault(key, set()) for key in keys)
        return places

    def _refresh(self) -> None:
        """Swap in the stores watched now (the sink reads the mapping under batch_lock, without our lock)."""
        interest: dict[str, Container[Any] | None] = {s: None for s, subs in self.every_key.items() if subs}
        interest.update({s: index for s, index in self.by_key.items() if index and s not in interest})
        self.interest = interest


class ChangeFeed:
    """The node's change feeds: what each committed batch changed, to the subscriptions that watch it."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
    ) -> None:
        """Args:
        capacity: the default number of distinct items a subscription buffers before it overflows.
        max_pending: items buffered over all subscriptions before the longest buffer overflows.
        """
        self.capacity = capacity
        self.max_subscriptions = max_subscriptions
        self._budget = _Budget(max_pending)
        self._lock = threading.Lock()  # the registry: subscriptions in and out, and publish's look-ups
        self._topics: dict[str, _TopicFeed] = {}
        self._count = 0
        self._closed = False

    def subscribe(
        self,
        topic: str,
        stores: Mapping[str, Iterable[Key] | None],
        *,
        after: Mapping[int, int] | None = None,
        capacity: int | None = None,
    ) -> Subscription:
        """Follow stores of topic: per store, the keys to watch (None: every key).

        after: per partition, the position the subscriber has already (changes at or before it are skipped).
        Changes of batches published from now on are buffered; to start from the store's contents as well,
        use read_then_follow.
        """
        if not stores:
            raise ValueError("a subscription watches at least one store")
        watched = {store: None if keys is None else frozenset(keys) for store, keys in stores.items()}
        sub = Subscription(self, topic, watched, after or {}, capacity or self.capacity)
        with self._lock:
            if self._closed:
                raise SubscriptionClosedError("the node is stopping: its change feed is closed")
            if self._count >= self.max_subscriptions:
                raise TooManySubscriptionsError(f"this node follows {self._count} subscriptions, its limit")
            self._topic(topic).add(sub)
            self._count += 1
        return sub

    def close(self) -> None:
        """Close every subscription (each subscriber gets SubscriptionClosedError) and refuse new ones: the node
        stops, and whoever follows a store here ends instead of waiting for batches that will not come."""
        with self._lock:
            self._closed = True
            subscriptions = [sub for feed in self._topics.values() for sub in list(feed.subscriptions)]
        for sub in subscriptions:
            sub.close()

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            feed = self._topics.get(sub.topic)
            if feed is not None and sub in feed.subscriptions:
                feed.remove(sub)
                self._count -= 1

    def _topic(self, topic: str) -> _TopicFeed:
        feed = self._topics.get(topic)
        if feed is None:
            feed = self._topics[topic] = _TopicFeed()
        return feed

    def writing(self, topic: str) -> _TopicFeed:
        """Return what the sink holds while it applies one partition's batch: ``with feed.writing(t) as interest``.

        interest says which stores (and keys) to collect changes of; empty: publish nothing. A subscriber's
        snapshot waits for a batch in flight (settle), so a batch that began before a subscription is seen by it.
        """
        feed = self._topics.get(topic)
        if feed is None:
            with self._lock:
                feed = self._topic(topic)
        return feed

    def settle(self, topic: str) -> None:
        """Wait until a batch of topic being applied, if any, is committed and published (blocks)."""
        with self.writing(topic):
            pass

    def publish(self, topic: str, partition: int, next_offset: int, changes: Mapping[str, Sequence[KeyChange]]) -> None:
        """Hand a committed batch's changes to the subscriptions that watch them (the sink's thread)."""
        feed = self._topics.get(topic)
        if feed is None:
            return
        with self._lock:
            targets = _route(feed, topic, partition, next_offset, changes)
            subscriptions = list(feed.subscriptions)
        added = sum(sub._offer(partition, next_offset, targets.get(sub, ())) for sub in subscriptions)
        if not self._budget.take(added):
            self._relieve()

    def _relieve(self) -> None:
        """Overflow the longest buffers until the feed is back within its budget."""
        with self._lock:
            subscriptions = sorted(
                (s for f in self._topics.values() for s in f.subscriptions), key=lambda s: -len(s._buffer)
            )
        for sub in subscriptions:
            if self._budget.used <= self._budget.limit:
                return
            self._budget.give(sub._overflow_now())

    def stats(self) -> FeedStats:
        """Return how many subscriptions the feed has and how many items they buffer."""
        return FeedStats(self._count, self._budget.used, self._budget.limit)


def _route(
    feed: _TopicFeed, topic: str, partition: int, offset: int, changes: Mapping[str, Sequence[KeyChange]]
) -> dict[Subscription, list[Change]]:
    """Return each watching subscription's changes of the batch (one Change per key, shared)."""
    routed: dict[Subscription, list[Change]] = {}
    for store, items in changes.items():
        every, index = feed.every_key.get(store), feed.by_key.get(store)
        if every:  # every key to these: one list, shared
            made = [Change(store, k, w, state, topic, partition, offset, 0, at) for k, w, state, at in items]
            for sub in every:
                routed.setdefault(sub, []).extend(made)
        if index:
            mine = (item for item in items if item[0] in index)
            keyed = [Change(store, k, w, state, topic, partition, offset, 0, at) for k, w, state, at in mine]
            _route_keyed(routed, index, keyed)
    return routed


def _route_keyed(
    routed: dict[Subscription, list[Change]], index: Mapping[Any, set[Subscription]], changes: list[Change]
) -> None:
    for change in changes:
        for sub in index[change.key]:
            routed.setdefault(sub, []).append(change)
