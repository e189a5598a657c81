"""Change feeds on the owner: what each committed batch changed in a partition's stores, pushed in process.

After a partition's WriteBatch commits, the sink publishes the keys of each watched store that the batch
changed, with their new mergeable (un-finalized) states and the partition's new position (its next offset).
The feed keeps no history: it is not a second source of truth. A subscriber that starts late registers,
reads the store, then follows the feed from the position it read (``read_then_follow``): nothing is missed
and nothing is delivered twice.

Per subscription, items arrive in offset order per partition. A slow subscriber's items conflate per
(store, key, window, partition): the latest state wins and moves to the back of the line (offset order
kept), and the number of states it replaced is reported with it (``Change.dropped``) and in ``stats()``.

Bounds (memory never grows with a subscriber's lag):
- a subscription buffers at most ``capacity`` distinct (store, key, window, partition) items (default 1,024);
- the feed buffers at most ``max_pending`` items over all subscriptions (default 262,144; measured ~180 B per
  buffered item plus ~120 B per distinct Change, so under ~80 MB, plus the states, which are shared between
  subscriptions, not copied), exceeded at most by the batch being published; when it is full, the
  subscription with the longest buffer overflows first;
- at most ``max_subscriptions`` subscriptions at once (default 2,048; ``TooManySubscriptionsError``).
A subscription that overflows drops its buffer; its next read raises ``SubscriptionOverflowError`` once,
after which it buffers again and the subscriber re-reads the store (``read_then_follow``): the store is
the conflation of everything it missed. Its positions stay where its subscriber's view was consistent.

Nothing is built for nobody: the sink asks ``writing(topic)`` which stores are watched (a dict read and an
uncontended lock per partition and batch, < 1 µs) and collects changes only for those, only for the watched
keys. The sink holds that lock from the question to the publish, so a subscriber's snapshot (``settle``)
never misses a batch that began before the subscription and so collected nothing for it.
What a change holds per store kind: key-value — the key's new state, ``None`` once a table's tombstone
deleted it; window — each changed (key, window start) and its new state; bloom — ``True`` for each key the
batch added (possibly already contained); ranking — a ``RankEntry`` for each member whose group or value
changed. Windows dropped by retention are not published. States are shared: consumers must not mutate them.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, NamedTuple, TypeVar

from iqgraph.stores import Key, KeyCodec, PartitionDB, PartitionTransaction
from iqgraph.stores.codecs import decode_values

DEFAULT_CAPACITY = 1_024
DEFAULT_MAX_PENDING = 262_144
DEFAULT_MAX_SUBSCRIPTIONS = 2_048

#: Per watched store, the keys watched (a container), or None: every key.
Interest = Mapping[str, Container[Any] | None]
#: One changed key as the sink reports it: (key, window start or None, new state).
KeyChange = tuple[Any, int | None, Any]
T = TypeVar("T")


class ChangeFeedError(Exception):
    """Root of the change feed's errors.

    ChangeFeedError
    ├── TooManySubscriptionsError   the feed already has max_subscriptions
    ├── SubscriptionOverflowError   the subscriber fell too far behind: re-read the store, then go on
    ├── SubscriptionClosedError     the subscription was closed and everything before was read
    └── SnapshotRaceError           batches kept committing while a snapshot was read: try again
    """


class TooManySubscriptionsError(ChangeFeedError):
    """The feed already has as many subscriptions as it allows."""


class SubscriptionOverflowError(ChangeFeedError):
    """The subscription's buffer overflowed and was dropped: re-read the store (read_then_follow)."""


class SubscriptionClosedError(ChangeFeedError):
    """The subscription is closed and drained."""


class SnapshotRaceError(ChangeFeedError):
    """A partition kept applying batches while its snapshot was read."""


class RankEntry(NamedTuple):
    """A ranking member's new index entry, and the group it left (a top of that group may have lost it)."""

    group: str | None
    value: Any
    previous_group: str | None


class Change(NamedTuple):
    """One key's new state in one store after a committed batch of one partition.

    offset is the partition's position once the batch is applied (its next offset: last record + 1), as
    ``Subscription.positions()`` and the read path's positions report it. dropped counts the earlier states of
    this (store, key, window, partition) the subscription conflated away since it delivered the last one.
    """

    store: str
    key: Any
    window_start: int | None
    state: Any  # None: the key was deleted
    topic: str
    partition: int
    offset: int
    dropped: int = 0


@dataclass(frozen=True)
class SubscriptionStats:
    """What one subscription buffered, delivered and dropped."""

    pending: int
    delivered: int
    conflated: int  # states replaced by a later state of the same key before delivery
    overflows: int


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


class _Cursor:
    """Where a subscription stands in one partition: what it skips, what it has seen, what it still holds."""

    __slots__ = ("start", "seen", "pending", "before", "frozen")

    def __init__(self, start: int | None) -> None:
        self.start = start  # items at or before it are already in the subscriber's view
        self.seen = start  # the last batch published (or the snapshot read)
        self.pending: dict[int, int] = {}  # offset -> items of that batch buffered; oldest first
        self.before: dict[int, int | None] = {}  # offset -> seen before that batch
        self.frozen: int | None = None  # after an overflow: the position until the subscriber re-reads

    def position(self) -> int | None:
        """Return the offset through which every change was delivered (or superseded by one delivered).

        None for a partition not started from a position (a resume's, a snapshot's): what came before is unknown.
        """
        if self.start is None:
            return None
        if self.frozen is not None:
            return self.frozen
        for offset in self.pending:
            return self.before[offset]
        return self.seen

    def hold(self, offset: int, previous: int | None) -> None:
        count = self.pending.get(offset)
        if count is None:
            self.before[offset] = previous
        self.pending[offset] = (count or 0) + 1

    def release(self, offset: int) -> None:
        left = self.pending[offset] - 1
        if left:
            self.pending[offset] = left
        else:
            del self.pending[offset], self.before[offset]

    def drop_through(self, offset: int) -> None:
        for held in [o for o in self.pending if o <= offset]:
            del self.pending[held], self.before[held]


_Slot = tuple[str, Any, int | None, int]  # what conflates: store, key, window start, partition


class Subscription:
    """Changes of some keys (or all) of some stores of one topic, buffered and conflated for one subscriber.

    Read with ``await next()`` (or ``async for``) on one event loop; ``poll()`` reads without waiting.
    """

    def __init__(
        self,
        feed: ChangeFeed,
        topic: str,
        stores: Mapping[str, frozenset[Any] | None],
        after: Mapping[int, int],
        capacity: int,
    ) -> None:
        self.topic = topic
        self.stores = dict(stores)
        self.capacity = capacity
        self._feed = feed
        self._lock = threading.Lock()
        self._buffer: OrderedDict[_Slot, Change] = OrderedDict()
        self._dropped: dict[_Slot, int] = {}  # conflated states per slot still buffered
        self._cursors = {p: _Cursor(offset) for p, offset in after.items()}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._overflowed = self._closed = False
        self._delivered = self._conflated = self._overflows = 0

    def __repr__(self) -> str:
        return f"Subscription({self.topic}, {sorted(self.stores)}, pending={len(self._buffer)})"

    # -- the publisher's side (the sink's thread) ---------------------------------------------------

    def _offer(self, partition: int, offset: int, changes: Sequence[Change]) -> int:
        """Buffer one batch's changes for this subscription; return how many more items it holds."""
        with self._lock:
            cursor = self._cursors.get(partition)
            if cursor is None:
                cursor = self._cursors[partition] = _Cursor(None)
            if self._closed or (cursor.start is not None and offset <= cursor.start):
                return 0
            previous, cursor.seen = cursor.seen, offset
            if self._overflowed:
                return 0
            held = len(self._buffer)
            for change in changes:
                self._put(cursor, change, previous)
            added = len(self._buffer) - held
            if len(self._buffer) > self.capacity:
                added -= self._overflow()
            waiter = self._take_waiter() if self._buffer or self._overflowed else None
        if waiter is not None:
            self._wake(waiter)
        return added

    def _take_waiter(self) -> asyncio.Future[None] | None:
        waiter, self._waiter = self._waiter, None
        return waiter

    def _put(self, cursor: _Cursor, change: Change, previous: int | None) -> None:
        slot = (change.store, change.key, change.window_start, change.partition)
        replaced = self._buffer.pop(slot, None)
        if replaced is not None:
            cursor.release(replaced.offset)
            self._dropped[slot] = self._dropped.get(slot, 0) + 1
            self._conflated += 1
        self._buffer[slot] = change
        cursor.hold(change.offset, previous)

    def _overflow(self) -> int:
        """Drop the buffer (under the lock); return how many items were dropped."""
        dropped = len(self._buffer)
        for cursor in self._cursors.values():
            if cursor.frozen is None:
                cursor.frozen = cursor.position()
            cursor.pending.clear()
            cursor.before.clear()
        self._buffer.clear()
        self._dropped.clear()
        self._overflowed = True
        self._overflows += 1
        return dropped

    def _overflow_now(self) -> int:
        """Overflow at the feed's request (its budget is spent); return how many items were dropped."""
        with self._lock:
            dropped = self._overflow()
            waiter = self._take_waiter()
        if waiter is not None:
            self._wake(waiter)
        return dropped

    def _wake(self, waiter: asyncio.Future[None]) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(_set_done, waiter)
        except RuntimeError:  # the subscriber's loop is closed: nobody is waiting any more
            pass

    # -- the subscriber's side --------------------------------------------------------------------

    def poll(self) -> Change | None:
        """Return the next change without waiting (None if none is buffered).

        Raises SubscriptionOverflowError once after an overflow, SubscriptionClosedError once closed and drained.
        """
        with self._lock:
            if self._overflowed:
                self._overflowed = False
                raise SubscriptionOverflowError(
                    f"subscription to {sorted(self.stores)} fell more than its buffer behind; re-read the store"
                )
            if not self._buffer:
                if self._closed:
                    raise SubscriptionClosedError("subscription closed")
                return None
            slot, change = self._buffer.popitem(last=False)
            self._cursors[change.partition].release(change.offset)
            self._delivered += 1
            dropped = self._dropped.pop(slot, 0)
        self._feed._budget.give(1)
        return change._replace(dropped=dropped) if dropped else change

    async def next(self) -> Change:
        """Return the next change, waiting for one (see poll for what it raises)."""
        while True:
            change = self.poll()
            if change is not None:
                return change
            loop = asyncio.get_running_loop()
            with self._lock:
                if self._buffer or self._overflowed or self._closed:
                    continue
                self._loop = loop
                waiter = self._waiter = loop.create_future()
            try:
                await waiter
            finally:
                with self._lock:
                    if self._waiter is waiter:
                        self._waiter = None

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Change:
        try:
            return await self.next()
        except SubscriptionClosedError:
            raise StopAsyncIteration from None

    def positions(self) -> dict[int, int]:
        """Return per partition the offset through which this subscriber has every change (a resume's ``after``)."""
        with self._lock:
            found = {p: cursor.position() for p, cursor in self._cursors.items()}
        return {p: offset for p, offset in found.items() if offset is not None}

    def start_from(self, partition: int, position: int) -> bool:
        """Follow partition from position (a snapshot's): drop what is buffered at or before it.

        Return whether position is past where the subscriber was (its snapshot is news to it); a snapshot
        older than the subscriber's position (a lagging replica) leaves the position where it is.
        """
        with self._lock:
            cursor = self._cursors.get(partition)
            if cursor is None:
                cursor = self._cursors[partition] = _Cursor(None)
            have = cursor.position()
            removed = self._trim(partition, position)
            cursor.drop_through(position)
            cursor.frozen = None
            newer = have is None or position > have
            cursor.start = position if newer or have is None else have
            cursor.seen = position if cursor.seen is None else max(position, cursor.seen)
        self._feed._budget.give(removed)
        return newer

    def _trim(self, partition: int, position: int) -> int:
        stale = [slot for slot, c in self._buffer.items() if c.partition == partition and c.offset <= position]
        for slot in stale:
            del self._buffer[slot]
            self._dropped.pop(slot, None)
        return len(stale)

    def stats(self) -> SubscriptionStats:
        """Return what this subscription buffers, delivered, conflated and how often it overflowed."""
        with self._lock:
            return SubscriptionStats(len(self._buffer), self._delivered, self._conflated, self._overflows)

    def close(self) -> None:
        """Stop following and drop what is buffered; a subscriber waiting in next() gets SubscriptionClosedError."""
        self._feed._unsubscribe(self)
        with self._lock:
            self._closed = True
            dropped = len(self._buffer)
            self._buffer.clear()
            self._dropped.clear()
            waiter = self._take_waiter()
        self._feed._budget.give(dropped)
        if waiter is not None:
            self._wake(waiter)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _set_done(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


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
            if self._count >= self.max_subscriptions:
                raise TooManySubscriptionsError(f"this node follows {self._count} subscriptions, its limit")
            self._topic(topic).add(sub)
            self._count += 1
        return sub

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
            made = [Change(store, *item, topic, partition, offset) for item in items]
            for sub in every:
                routed.setdefault(sub, []).extend(made)
        if index:
            keyed = [Change(store, *item, topic, partition, offset) for item in items if item[0] in index]
            _route_keyed(routed, index, keyed)
    return routed


def _route_keyed(
    routed: dict[Subscription, list[Change]], index: Mapping[Any, set[Subscription]], changes: list[Change]
) -> None:
    for change in changes:
        for sub in index[change.key]:
            routed.setdefault(sub, []).append(change)


# -- what a batch changed: collected by the sink for the watched stores and keys only -------------


class ChangeSet:
    """The watched changes of one partition's batch, as the sink merges it (publish them once committed)."""

    def __init__(self, interest: Interest) -> None:
        self.interest = interest
        self.by_store: dict[str, list[KeyChange]] = {}

    def watches(self, store: str) -> bool:
        """Return whether anyone watches store."""
        return store in self.interest

    def selected(self, store: str, keys: Iterable[Any]) -> list[Any]:
        """Return the distinct keys of keys that store's subscriptions watch, in order."""
        if store not in self.interest:
            return []
        watched = self.interest[store]
        return list(dict.fromkeys(keys if watched is None else (key for key in keys if key in watched)))

    def states(self, store: str, codec: KeyCodec, keys: Iterable[Any], states: Mapping[bytes, Any]) -> None:
        """Record the new states of the watched keys; states by encoded key (as KeyValueStore.merge returns)."""
        chosen = self.selected(store, keys)
        if chosen:
            found = [(key, states.get(encoded)) for key, encoded in zip(chosen, codec.encode_many(chosen), strict=True)]
            self._add(store, [(key, None, state) for key, state in found if state is not None])

    def constant(self, store: str, keys: Iterable[Any], state: Any) -> None:
        """Record state for each watched key of keys (True for a bloom's adds, None for a table's deletes)."""
        self._add(store, [(key, None, state) for key in self.selected(store, keys)])

    def rows(
        self,
        store: str,
        tx: PartitionTransaction,
        family: str,
        rows: Sequence[tuple[Any, int | None, bytes]],
        state: Callable[[Any, Any], Any] | None = None,
    ) -> Callable[[], None]:
        """Read rows (key, window start, stored key) of family now; return what records those changed, later.

        For stores whose merge does not return the new states (windows, rankings): the second read comes from
        the transaction's pending writes; a row left as it was (a late window) is not a change. state makes a
        change's state of the stored values before and after (default: the one after).
        """
        if not rows:
            return _nothing
        encoded = [row[2] for row in rows]
        before = tx.multi_get(family, encoded)

        def after() -> None:
            now = tx.multi_get(family, encoded)
            changed = [(row, old, new) for row, old, new in zip(rows, before, now, strict=True) if old != new]
            states = decode_values(new for _, _, new in changed)
            if state is not None:
                olds = decode_values(old for _, old, _ in changed)
                states = [state(old, new) for old, new in zip(olds, states, strict=True)]
            self._add(store, [(row[0], row[1], s) for (row, _, _), s in zip(changed, states, strict=True)])

        return after

    def _add(self, store: str, items: list[KeyChange]) -> None:
        if items:
            self.by_store.setdefault(store, []).extend(items)


def _nothing() -> None:
    return None


def rank_entry(old: Any, new: Any) -> RankEntry:
    """Return a ranking member's change from its stored entries ([group, value]) before and after the batch."""
    group, value = new
    return RankEntry(group, value, None if old is None else old[0])


# -- read the store, then follow ---------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot(Generic[T]):
    """What a read of one partition returned, and the position it was read at."""

    position: int
    value: T
    newer: bool  # past the subscriber's position (deliver it); False: the subscriber has newer already


def consistent_read(db: PartitionDB, read: Callable[[], T], attempts: int = 8) -> tuple[int, T]:
    """Return (position, read()) such that read saw exactly the batches before position.

    The position is read before and after: equal, no batch committed in between (positions only grow).
    """
    for _ in range(attempts):
        position = db.next_offset()
        value = read()
        if db.next_offset() == position:
            return position, value
    raise SnapshotRaceError(f"{db.topic}-{db.partition} applied a batch during each of {attempts} reads")


def read_then_follow(
    feed: ChangeFeed,
    subscription: Subscription,
    partitions: Mapping[int, PartitionDB],
    read: Callable[[int], T],
) -> dict[int, Snapshot[T]]:
    """Read each partition (read(partition)) and make subscription follow it from there: no gap, no duplicate.

    Subscribe first, then call this (also after a SubscriptionOverflowError). It blocks on RocksDB reads and on
    a batch being applied: call it from a worker thread. Bloom filters are read from memory, which a batch
    updates just before it commits: a bloom snapshot may hold a key whose add is delivered again after it.
    """
    feed.settle(subscription.topic)
    snapshots: dict[int, Snapshot[T]] = {}
    for partition, db in partitions.items():
        position, value = consistent_read(db, functools.partial(read, partition))
        snapshots[partition] = Snapshot(position, value, subscription.start_from(partition, position))
    return snapshots
