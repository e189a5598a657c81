"""One subscriber's follow of the change feed: its buffer, conflation, positions per partition, and overflow.

Per subscription, items arrive in offset order per partition. A slow subscriber's items conflate per
(store, key, window, partition): the latest state wins and moves to the back of the line (offset order
kept), and the number of states it replaced is reported with it (``Change.dropped``) and in ``stats()``.
A subscription buffers at most ``capacity`` distinct (store, key, window, partition) items. One that
overflows drops its buffer; its next read raises ``SubscriptionOverflowError`` once, after which it buffers
again and the subscriber re-reads the store (``read_then_follow``): the store is the conflation of
everything it missed. Its positions stay where its subscriber's view was consistent.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from iqgraph.streaming.change_set import Change
from iqgraph.streaming.feed_errors import SubscriptionClosedError, SubscriptionOverflowError

if TYPE_CHECKING:
    from iqgraph.streaming.change_feed import ChangeFeed


@dataclass(frozen=True)
class SubscriptionStats:
    """What one subscription buffered, delivered and dropped."""

    pending: int
    delivered: int
    conflated: int  # states replaced by a later state of the same key before delivery
    overflows: int


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
        older than the subscriber's position (a lagging replica) leaves the position where it is. If the buffer
        overflowed again since the overflow this re-read answers, the next poll raises it and the position stays
        at this snapshot's until the store is read again.
        """
        with self._lock:
            cursor = self._cursors.get(partition)
            if cursor is None:
                cursor = self._cursors[partition] = _Cursor(None)
            have = cursor.position()
            removed = self._trim(partition, position)
            cursor.drop_through(position)
            newer = have is None or position > have
            cursor.start = position if newer or have is None else have
            # overflowed again while the store was read: what came after it was dropped, the view stays at it
            cursor.frozen = cursor.start if self._overflowed else None
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
