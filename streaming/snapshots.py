"""Read the store, then follow: a subscriber's snapshot of each partition and the position it follows from.

A subscriber that starts late registers, reads the store, then follows the feed from the position it read
(``read_then_follow``): nothing is missed and nothing is delivered twice. The sink holds the topic's batch
lock from collecting to publishing, so the snapshot (``ChangeFeed.settle``) never misses a batch that began
before the subscription and so collected nothing for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from iqgraph.stores import PartitionDB
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.feed_errors import SnapshotRaceError
from iqgraph.streaming.subscription import Subscription

T = TypeVar("T")


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
