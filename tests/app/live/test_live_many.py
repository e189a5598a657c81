"""A thousand subscriptions on one node, in process: the public schema's subscriptions over Live, the real
StoreSink publishing each committed batch of real RocksDB partitions to the node's ChangeFeed (no Spark).

Each of 1,000 subscriptions (different key sets, some the same, many overlapping) gets each change of its keys
once, in offset order per partition, with the value the store holds. With all of them far behind, the feed
stays within max_pending and memory does not grow with the changes they miss: each one's missed states are
conflated (counted in ``dropped``) or, once its buffer is dropped, it catches up from the store (a snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from iqgraph.app.live import watch as live_module
from iqgraph.streaming.change_feed import ChangeFeed
from tests.support.live_shop import WATCH, Events, LiveShop, open_live_shop, where

SUBSCRIPTIONS = 1_000
KEYS = [f"k{i}" for i in range(200)]
HOT = ["k0", "k1"]  # the key set every 50th subscription watches: the same set, many times
MAX_PENDING = 2_000  # under the ~2,500 keys the subscriptions watch in all: far behind, the longest buffers go
CAPACITY = 16  # the laggard watches more keys than that: it overflows on its own
MAX_GROWTH = 1_000_000  # bytes; buffering ~150 B per missed change would add far more (asserted below)
Batch = list[tuple[str, str, int]]


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[LiveShop]:
    shop = open_live_shop(tmp_path, feed=ChangeFeed(capacity=CAPACITY, max_pending=MAX_PENDING))
    yield shop
    shop.close()


def key_sets(rng: random.Random) -> list[list[str]]:
    """Return each subscription's keys: 1 to 4 of KEYS, every 50th the hot pair."""
    return [HOT if i % 50 == 0 else rng.sample(KEYS, rng.randint(1, 4)) for i in range(SUBSCRIPTIONS)]


def batches(rng: random.Random, count: int, size: int) -> list[Batch]:
    """Return count batches of size orders each, on random keys, one of them hot."""
    return [[(HOT[0], "pen", 0)] + [(rng.choice(KEYS), "pen", 0) for _ in range(size - 1)] for _ in range(count)]


@contextlib.asynccontextmanager
async def opened(shop: LiveShop, sets: Sequence[list[str]]) -> AsyncIterator[list[Events]]:
    """Subscribe to each key set and read the first snapshot (nothing written yet: no values); close them after."""
    subscriptions = [await shop.subscribe(WATCH, {"keys": keys}) for keys in sets]
    try:
        firsts = await asyncio.gather(*(s.take(len(keys)) for s, keys in zip(subscriptions, sets, strict=True)))
        for keys, first in zip(sets, firsts, strict=True):
            assert {e["key"]: e["value"] for e in first} == dict.fromkeys(keys)
        yield subscriptions
    finally:
        await asyncio.gather(*(s.close() for s in subscriptions))
    assert (shop.feed.stats().subscriptions, shop.feed.stats().pending) == (0, 0)


def assert_in_offset_order(events: Sequence[dict[str, Any]]) -> None:
    for p in (0, 1):
        offsets = [e["position"]["offset"] for e in events if e["position"]["partition"] == p]
        assert offsets == sorted(offsets)
    assert all(e["position"]["partition"] == where(e["key"]) for e in events)


async def test_a_thousand_subscriptions_each_get_every_change_of_their_keys_once_in_order(shop: LiveShop) -> None:
    rng = random.Random(13)
    sets = key_sets(rng)
    async with opened(shop, sets) as subscriptions:
        truth: Counter[str] = Counter()
        seen: list[list[dict[str, Any]]] = [[] for _ in sets]
        for batch in batches(rng, 30, 20):
            shop.write(batch)
            truth.update(key for key, _, _ in batch)
            changed = {key for key, _, _ in batch}
            expected = [{k: truth[k] for k in keys if k in changed} for keys in sets]
            got = await asyncio.gather(*(s.take(len(e)) for s, e in zip(subscriptions, expected, strict=True)))
            for events, want, log in zip(got, expected, seen, strict=True):
                assert {e["key"]: e["value"] for e in events} == want and len(events) == len(want)  # each key once
                assert not any(e["snapshot"] or e["dropped"] for e in events)
                log += events
        assert all(await asyncio.gather(*(s.quiet() for s in subscriptions)))  # nothing more: no duplicate
        for events in seen:
            assert_in_offset_order(events)
        assert {k: shop.count(k) for k in truth} == dict(truth)  # the ground truth is what the store holds
        assert sum(map(len, seen)) > 5_000


async def test_a_thousand_subscriptions_far_behind_hold_bounded_memory_then_catch_up(
    shop: LiveShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a watch takes a few of its source's events ahead of its subscriber (1,024 / 2 in production): with 8 the
    # steady state (every watch's queue full, the feed conflating behind it) comes after a few batches
    monkeypatch.setattr(live_module, "MAX_QUEUED", 8)
    rng = random.Random(17)
    laggard = rng.sample(KEYS, 40)  # more than CAPACITY keys: overflows by itself
    sets = [*key_sets(rng), laggard]
    async with opened(shop, sets) as subscriptions:
        warm_up, measured = batches(rng, 15, 50), batches(rng, 60, 50)
        pending: list[int] = []

        def write(found: list[Batch]) -> None:  # the sink's thread, while the watches run on the loop
            for batch in found:
                shop.write(batch)
                pending.append(shop.feed.stats().pending)

        tracemalloc.start()
        try:
            await asyncio.to_thread(write, warm_up)
            gc.collect()
            filled = tracemalloc.get_traced_memory()[0]
            await asyncio.to_thread(write, measured)
            gc.collect()
            growth = tracemalloc.get_traced_memory()[0] - filled
        finally:
            tracemalloc.stop()
        assert max(pending) <= MAX_PENDING
        missed = sum(len({k for k, _, _ in batch} & set(keys)) for batch in measured for keys in sets)
        assert missed * 150 > 5 * MAX_GROWTH  # growing per missed change would fail the bound by far
        assert growth < MAX_GROWTH, f"{growth} B more after {missed} more changes missed"

        truth = Counter(key for batch in warm_up + measured for key, _, _ in batch)
        changes = Counter(key for batch in warm_up + measured for key in {k for k, _, _ in batch})  # one per batch
        caught = await asyncio.gather(*(catch_up(s, keys, truth) for s, keys in zip(subscriptions, sets, strict=True)))
        assert all(await asyncio.gather(*(s.quiet() for s in subscriptions)))
        snapshotted = assert_caught_up(caught, sets, changes)
        assert snapshotted[-1]  # the laggard overflowed and caught up from the store
        assert 0 < sum(snapshotted) < len(sets)  # the feed dropped the longest buffers, not all
        assert any(e["dropped"] for events in caught for e in events)


def assert_caught_up(
    caught: Sequence[list[dict[str, Any]]], sets: Sequence[list[str]], changes: Counter[str]
) -> list[bool]:
    """Check each subscription's catch-up; return which ones caught up from a snapshot (their buffer dropped).

    The others have every change of their keys delivered, or counted (dropped) in a later one of the same key.
    """
    snapshotted = []
    for events, keys in zip(caught, sets, strict=True):
        assert_in_offset_order(events)
        snapshotted.append(any(e["snapshot"] for e in events))
        if not snapshotted[-1]:
            delivered = Counter({k: 0 for k in keys})
            for e in events:
                delivered[e["key"]] += 1 + e["dropped"]
            assert delivered == Counter({k: changes[k] for k in keys})
    return snapshotted


async def catch_up(subscription: Events, keys: Sequence[str], truth: Counter[str]) -> list[dict[str, Any]]:
    """Return what subscription sends until each of its keys has its true value (values only grow)."""
    events: list[dict[str, Any]] = []
    values: dict[str, int | None] = {}
    while any(values.get(k) != truth.get(k) for k in keys):
        (event,) = await subscription.take(1)
        assert (event["value"] or 0) >= (values.get(event["key"]) or 0)
        values[event["key"]] = event["value"]
        events.append(event)
    return events
