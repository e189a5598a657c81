"""Following partitions this node hosts: their watched keys' states now, then what each batch changes.

``follow_partitions`` is the one loop that turns a node's change feed (``streaming.change_feed``) into the
events of a live source: a ``Rows`` per partition snapshot (the watched keys' states read from the store,
at the position read), then a ``Rows`` per committed batch (the watched keys it changed, at the batch's
position). Both a subscription's own partitions (``app.live.watch``) and a peer's upstream (``app.live.stream``:
the owner side of a subscription relayed through another node) follow partitions with it.

What is followed is an ``Interest``: per store, per partition, the keys. Positions (``after``) are where the
follower stands: a partition snapshots only if the store is newer, and changes at or before it are not
sent. A follower that falls too far behind (the feed's ``SubscriptionOverflowError``) gets its partitions
read again. A partition that closes or changes role under the follower (``still_serves``, checked every
``check_every_s`` while nothing comes, and before each event) ends it with STORE_MIGRATED: the caller
follows it elsewhere, from its last position.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence

from iqgraph.schema.errors import STORE_NOT_READY, ApiError, api_error, limit_exceeded
from iqgraph.schema.live.peer_streams import Interest, Row, Rows
from iqgraph.stores import Key, PartitionStores, StoreError, StoreMigratedError
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.change_set import Change
from iqgraph.streaming.definitions import App
from iqgraph.streaming.feed_errors import (
    SubscriptionClosedError,
    SubscriptionOverflowError,
    TooManySubscriptionsError,
)
from iqgraph.streaming.snapshots import read_then_follow
from iqgraph.streaming.subscription import Subscription

#: Topic → partition → the stores this node hosts, now (the runner's live dict).
Hosted = Mapping[str, Mapping[int, PartitionStores]]


def keys_of(interest: Interest) -> dict[str, set[Key]]:
    """Return every key of interest, per store (what the feed is asked to watch)."""
    return {store: {k for keys in by_partition.values() for k in keys} for store, by_partition in interest.items()}


def partitions_of(interest: Interest) -> list[int]:
    """Return the partitions interest follows."""
    return sorted({p for by_partition in interest.values() for p in by_partition})


def read_rows(
    app: App,
    interest: Interest,
    stores: PartitionStores,
    partition: int,
    window_from: Mapping[str, int | None],
) -> list[Row]:
    """Return the states of partition's watched keys and their positions (blocks on RocksDB: run it in a worker
    thread).

    Key-value keys a store does not hold are rows with state None (position -1 if never written, else where a
    tombstone deleted it); a bloom's keys only when contained, with no position (``stores.positions``): each store's
    view answers for its kind (``stores.types.StoreReads.followed``).
    """
    rows: list[Row] = []
    for name, by_partition in interest.items():
        keys = list(by_partition.get(partition, ()))
        if not keys:
            continue
        found = stores.store(name).followed(keys, window_from.get(name))
        rows += [(name, key, start, state, 0, at) for key, start, state, at in found]
    return rows


def subscribe(feed: ChangeFeed, topic: str, interest: Interest, after: Mapping[int, int]) -> Subscription:
    """Return the feed's subscription to interest's keys; LIMIT_EXCEEDED when the node holds all it may."""
    try:
        return feed.subscribe(topic, keys_of(interest), after=after)
    except TooManySubscriptionsError:
        limit = feed.max_subscriptions
        raise limit_exceeded("subscriptions on this node", limit, limit + 1) from None
    except SubscriptionClosedError:  # the node stops: the follower follows elsewhere
        raise ApiError("this node is stopping", STORE_NOT_READY, retryAfterMs=1000) from None


async def follow_partitions(
    app: App,
    feed: ChangeFeed,
    topic: str,
    hosted: Mapping[int, PartitionStores],
    interest: Interest,
    *,
    after: Mapping[int, int] | None = None,
    window_from: Mapping[str, int | None] | None = None,
    still_serves: Callable[[int, PartitionStores], bool] = lambda p, stores: True,
    lag: Callable[[int], int | None] = lambda p: None,
    check_every_s: float = 2.0,
) -> AsyncGenerator[Rows, None]:
    """Yield the snapshots of interest's partitions newer than after, then each batch's changes, until closed.

    hosted: the stores of each partition followed (this node's copies). lag: the lag to report with a
    partition's rows (None: an active copy, up to date).
    """
    window_from = window_from or {}
    partitions = partitions_of(interest)
    subscription = subscribe(feed, topic, interest, after or {})
    try:
        for rows in await _snapshot(app, feed, subscription, hosted, interest, partitions, window_from, lag):
            yield rows
        while True:
            try:
                changes = await _next(subscription, check_every_s, lambda: _check(topic, hosted, still_serves))
            except SubscriptionOverflowError:
                for rows in await _snapshot(app, feed, subscription, hosted, interest, partitions, window_from, lag):
                    yield rows
                continue
            except SubscriptionClosedError:
                return
            _check(topic, hosted, still_serves)
            for rows in _batches(changes, lag):
                yield rows
    finally:
        subscription.close()


async def _snapshot(
    app: App,
    feed: ChangeFeed,
    subscription: Subscription,
    hosted: Mapping[int, PartitionStores],
    interest: Interest,
    partitions: Sequence[int],
    window_from: Mapping[str, int | None],
    lag: Callable[[int], int | None],
) -> list[Rows]:
    databases = {p: hosted[p].db for p in partitions}

    def read(partition: int) -> list[Row]:
        return read_rows(app, interest, hosted[partition], partition, window_from)

    try:
        snapshots = await asyncio.to_thread(read_then_follow, feed, subscription, databases, read)
    except StoreError as exc:
        raise api_error(exc) from None
    return [Rows(p, s.position, s.value, True, lag(p)) for p, s in sorted(snapshots.items())]  # the follower skips
    # what it has already (a snapshot not past its position): every partition sends one, so it knows each is followed


async def _next(subscription: Subscription, check_every_s: float, check: Callable[[], None]) -> list[Change]:
    """Return the changes buffered now, waiting for one if there are none (checking every check_every_s)."""
    while True:
        found = subscription.poll()
        if found is None:
            try:
                # not asyncio.wait_for: on Python 3.11 it swallows a cancellation that comes as a change does, and the
                # follower (a closed subscription's source) would go on following, its connection never closed
                async with asyncio.timeout(check_every_s):
                    found = await subscription.next()
            except TimeoutError:
                check()
                continue
        changes = [found]
        while (more := subscription.poll()) is not None:  # a batch is buffered whole: never split
            changes.append(more)
        return changes


def _batches(changes: Sequence[Change], lag: Callable[[int], int | None]) -> list[Rows]:
    """Return changes as Rows, one per run of the same (partition, offset): the feed delivers them in order."""
    found: list[Rows] = []
    for change in changes:
        row = (change.store, change.key, change.window_start, change.state, change.dropped, change.position)
        last = found[-1] if found else None
        if last is not None and last.partition == change.partition and last.position == change.offset:
            last.rows.append(row)
        else:
            found.append(Rows(change.partition, change.offset, [row], False, lag(change.partition)))
    return found


def _check(
    topic: str, hosted: Mapping[int, PartitionStores], still_serves: Callable[[int, PartitionStores], bool]
) -> None:
    """Raise STORE_MIGRATED if a followed partition is no longer served here as it was."""
    for p, stores in hosted.items():
        if not still_serves(p, stores):
            moved = StoreMigratedError(
                f"partition {topic}-{p} moved while it was followed: follow it on its new owner from the last position"
            )
            raise api_error(moved)
