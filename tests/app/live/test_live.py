"""Subscriptions on the node that owns the keys, in process: the public schema's subscription fields over Live,
the real StoreSink publishing each committed batch of real RocksDB partitions to the node's ChangeFeed (no Spark).

Every change arrives once, in offset order per partition, with the value the store then holds; a resume with
positions has no gap and no duplicate; a slow subscriber's values conflate (bounded, counted); windows, bloom flips;
FORBIDDEN; a key this node does not own is a coded error naming its partition."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iqgraph.schema import Limits
from iqgraph.schema.access import Principal
from iqgraph.streaming.change_feed import ChangeFeed
from tests.support.apps import iso
from tests.support.live_shop import (
    KEYS,
    MINUTE,
    START_MS,
    WATCH,
    WATCH_CONTAINS,
    WATCH_WINDOWS,
    LiveShop,
    open_live_shop,
    where,
)


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[LiveShop]:
    shop = open_live_shop(tmp_path)
    yield shop
    shop.close()


def positions_of(events: list[dict[str, Any]]) -> list[dict[str, int]]:
    """Return the last position of each partition in events, as a resume's after."""
    last: dict[int, int] = {}
    for e in events:
        p = e["position"]["partition"]
        last[p] = max(last.get(p, -1), e["position"]["offset"])
    return [{"partition": p, "offset": offset} for p, offset in sorted(last.items())]


async def test_every_change_arrives_once_in_offset_order_with_the_value_the_store_holds(shop: LiveShop) -> None:
    watched = KEYS[:6]
    results = await shop.subscribe(WATCH, {"keys": watched})
    first = await results.take(len(watched))  # the store now: nothing yet
    assert {e["key"]: e["value"] for e in first} == dict.fromkeys(watched)
    assert all(e["snapshot"] and e["dropped"] == 0 for e in first)
    rng = random.Random(7)
    batches = [[(rng.choice(KEYS), "pen", 0) for _ in range(rng.randint(1, 6))] for _ in range(40)]
    changes = sum(len({(where(k), k) for k, _, _ in batch if k in watched}) for batch in batches)

    def write() -> None:
        for batch in batches:
            shop.write(batch)

    writer = asyncio.create_task(asyncio.to_thread(write))
    pushed: list[dict[str, Any]] = []
    while sum(1 + e["dropped"] for e in pushed) < changes:
        pushed += await results.take(1)
    await writer
    assert await results.quiet()
    assert sum(1 + e["dropped"] for e in pushed) == changes  # each change delivered, or counted in a later one
    assert not any(e["snapshot"] for e in pushed)
    for p in (0, 1):
        offsets = [e["position"]["offset"] for e in pushed if e["position"]["partition"] == p]
        assert offsets == sorted(offsets)
    for key in watched:
        values = [e["value"] for e in pushed if e["key"] == key]
        assert values == sorted(set(values))  # counts only grow: no value twice, none out of order
        assert (values[-1] if values else None) == shop.count(key)
    await results.close()
    assert shop.feed.stats().subscriptions == 0


async def test_a_resume_after_the_last_positions_has_no_gap_and_no_duplicate(shop: LiveShop) -> None:
    on_0 = [k for k in KEYS if where(k) == 0][:3]
    watched = on_0 + [k for k in KEYS if where(k) == 1][:3]
    quiet_on_0 = [k for k in KEYS if where(k) == 0 and k not in watched][0]
    held: dict[str, Any] = {}  # what the client shows

    def exact(events: list[dict[str, Any]]) -> None:
        """Each value is the store's at the offset of the key's last order, which its position names."""
        for e in events:
            assert e["position"]["offset"] == shop.orders.changed_at.get(e["key"], -1), e
            assert e["value"] == shop.count(e["key"]), e

    results = await shop.subscribe(WATCH, {"keys": watched})
    events = await results.take(len(watched))
    assert all(e["position"]["offset"] == -1 for e in events)  # no key has a value yet
    shop.write([(k, "pen", 0) for k in watched])
    pushed = await results.take(len(watched))
    exact(pushed)
    events += pushed
    held.update({e["key"]: e["value"] for e in events})
    await results.close()

    # nothing written since: the resume sends nothing until the next change, which it sends once
    results = await shop.subscribe(WATCH, {"keys": watched, "after": positions_of(events)})
    assert await results.quiet()
    shop.write([(on_0[0], "pen", 0)])
    (event,) = await results.take(1)
    assert (event["key"], event["value"], event["snapshot"]) == (on_0[0], 2, False)
    exact([event])
    events.append(event)
    held[event["key"]] = event["value"]
    await results.close()

    # written while away, in partition 0 only: exactly the keys that changed come back, at their own positions,
    # in position order; the quiet key and partition 1 send nothing, though partition 0 moved past them
    shop.write([(on_0[1], "pen", 0), (quiet_on_0, "pen", 0), (on_0[0], "pen", 0)])
    shop.write([(quiet_on_0, "pen", 0)])
    after = positions_of(events)
    results = await shop.subscribe(WATCH, {"keys": watched, "after": after})
    resumed = await results.take(2)
    assert [e["key"] for e in resumed] == [on_0[1], on_0[0]] and all(e["snapshot"] for e in resumed)
    exact(resumed)
    assert await results.quiet()
    held.update({e["key"]: e["value"] for e in resumed})
    assert held == {k: shop.count(k) for k in watched}
    last = {a["partition"]: a["offset"] for a in after}
    assert all(e["position"]["offset"] > last[e["position"]["partition"]] for e in resumed)  # none at or before

    # stopped halfway through a batch: changes come in position order, so a resume after the last one received is
    # sent exactly the rest of the batch
    shop.write([(k, "pen", 0) for k in on_0])
    half = await results.take(1)
    assert half[0]["key"] == on_0[0]
    exact(half)
    await results.close()
    results = await shop.subscribe(WATCH, {"keys": watched, "after": positions_of(events + resumed + half)})
    again = await results.take(2)
    assert [e["key"] for e in again] == on_0[1:]
    exact(again)
    assert await results.quiet()
    await results.close()


async def test_a_slow_subscriber_gets_the_latest_value_once_with_the_values_it_missed_counted(
    shop: LiveShop,
) -> None:
    key = KEYS[0]
    results = await shop.subscribe(WATCH, {"keys": [key]})
    await results.take(1)
    for _ in range(50):  # the subscriber reads nothing meanwhile
        shop.write([(key, "pen", 0)])
        assert shop.feed.stats().pending <= 1
    (event,) = await results.take(1)
    assert (event["value"], event["dropped"], event["snapshot"]) == (50, 49, False)
    assert await results.quiet()
    await results.close()


async def test_a_subscriber_past_its_buffer_catches_up_from_the_store(tmp_path: Path) -> None:
    shop = open_live_shop(tmp_path, feed=ChangeFeed(capacity=4))
    try:
        watched = KEYS[:8]
        results = await shop.subscribe(WATCH, {"keys": watched})
        await results.take(len(watched))
        for _ in range(3):
            shop.write([(k, "pen", 0) for k in watched])
            assert shop.feed.stats().pending <= 4
        caught_up = await results.take(len(watched))
        assert all(e["snapshot"] for e in caught_up)
        assert {e["key"]: e["value"] for e in caught_up} == {k: 3 for k in watched}
        shop.write([(watched[0], "pen", 0)])
        (event,) = await results.take(1)
        assert (event["key"], event["value"], event["snapshot"]) == (watched[0], 4, False)
        await results.close()
    finally:
        shop.close()


async def test_windows_from_a_start_and_bloom_keys_once_when_added(shop: LiveShop) -> None:
    key, minute = KEYS[1], [START_MS + i * MINUTE for i in range(4)]
    shop.write([(key, "pen", 0), (key, "pen", 1)])
    windows = await shop.subscribe(WATCH_WINDOWS, {"keys": [key], "from": minute[1]})
    (window,) = await windows.take(1)  # the store's windows from minute 1 on (minute 0 is before from)
    assert (window["start"], window["end"], window["value"], window["snapshot"]) == (
        iso(minute[1]),
        iso(minute[2]),
        1,
        True,
    )
    shop.write([(key, "pen", 1), (key, "ink", 2)])
    got = await windows.take(2)
    assert [(e["start"], e["end"], e["value"], e["snapshot"]) for e in got] == [
        (iso(minute[1]), iso(minute[2]), 2, False),
        (iso(minute[2]), iso(minute[3]), 1, False),
    ]
    await windows.close()

    contained = await shop.subscribe(WATCH_CONTAINS, {"keys": ["pen", "ink", "cap"]})
    first = await contained.take(2)  # added already
    assert {e["key"] for e in first} == {"pen", "ink"} and all(e["snapshot"] for e in first)
    shop.write([(KEYS[2], "pen", 0), (KEYS[3], "ink", 0)])  # already contained: not a flip
    shop.write([(KEYS[4], "cap", 0)])
    (flip,) = await contained.take(1)
    assert (flip["key"], flip["snapshot"]) == ("cap", False)
    shop.write([(KEYS[5], "cap", 0)])
    assert await contained.quiet()
    await contained.close()


async def test_a_store_the_caller_may_not_read_is_forbidden(shop: LiveShop) -> None:
    reader = Principal.from_scopes("reader", ["read:per_key"])
    denied = await shop.subscribe(WATCH_WINDOWS, {"keys": [KEYS[0]]}, principal=reader)
    error = await denied.error()
    assert error["extensions"] == {"code": "FORBIDDEN", "store": "per_minute"}
    allowed = await shop.subscribe(WATCH, {"keys": [KEYS[0]]}, principal=reader)
    assert (await allowed.take(1))[0]["key"] == KEYS[0]
    await allowed.close()
    assert shop.feed.stats().subscriptions == 0


async def test_a_key_this_node_does_not_own_fails_naming_its_partition(tmp_path: Path) -> None:
    shop = open_live_shop(tmp_path, hosted=(0,))
    try:
        elsewhere = next(k for k in KEYS if where(k) == 1)
        error = await (await shop.subscribe(WATCH, {"keys": [KEYS[0], elsewhere]})).error()
        # a one-member cluster: the map gives the node partition 1, which it does not host (yet): the watch ends,
        # at the queries' deadline, with the code a read of that key answers (one executor, one rule)
        assert error["extensions"]["code"] == "STORE_MIGRATED"
        assert error["extensions"]["partition"] == 1 and "not hosted" in error["message"]
        (read,) = await shop.queries.get_many("per_key", [elsewhere])
        assert read.extensions["code"] == error["extensions"]["code"]
        assert shop.feed.stats().subscriptions == 0

        # followed, then handed over: the subscription ends with STORE_MIGRATED
        here = next(k for k in KEYS if where(k) == 0)
        results = await shop.subscribe(WATCH, {"keys": [here]})
        await results.take(1)
        del shop.served["orders"][0]
        assert (await results.error())["extensions"]["code"] == "STORE_MIGRATED"
        assert shop.feed.stats().subscriptions == 0
    finally:
        shop.close()


async def test_a_standby_copy_is_not_followed(tmp_path: Path) -> None:
    shop = open_live_shop(tmp_path, role=lambda topic, partition: "standby")
    try:
        error = await (await shop.subscribe(WATCH, {"keys": [KEYS[0]]})).error()
        # the copy the one-member map names is asked, and refuses to serve a watch from a standby copy
        assert error["extensions"]["code"] == "STORE_MIGRATED" and "standby" in error["message"]
    finally:
        shop.close()


async def test_limits_and_bad_arguments_are_coded_errors(tmp_path: Path) -> None:
    shop = open_live_shop(tmp_path, feed=ChangeFeed(max_subscriptions=1), limits=Limits(max_keys=3))
    try:
        error = await (await shop.subscribe(WATCH, {"keys": KEYS[:4]})).error()
        assert error["extensions"] == {"code": "LIMIT_EXCEEDED", "limit": 3, "requested": 4}
        bad = [{"partition": 0, "offset": -2}]
        error = await (await shop.subscribe(WATCH, {"keys": KEYS[:1], "after": bad})).error()
        assert error["extensions"] == {"code": "INVALID_ARGUMENT", "argument": "after"}
        first = await shop.subscribe(WATCH, {"keys": KEYS[:1]})
        await first.take(1)
        error = await (await shop.subscribe(WATCH, {"keys": KEYS[:1]})).error()
        assert error["extensions"]["code"] == "LIMIT_EXCEEDED"
        await first.close()
    finally:
        shop.close()


def test_the_schema_has_a_subscription_field_per_followed_store(shop: LiveShop) -> None:
    subscription = shop.schema._schema.subscription_type
    assert subscription is not None
    fields = {name: (list(f.args), str(f.type)) for name, f in subscription.fields.items()}
    assert fields == {
        "perKeyWatch": (["keys", "after", "maxLag"], "PerKeyChange"),
        "perMinuteWatchWindows": (["keys", "from", "after", "maxLag"], "PerMinuteWindowChange"),
        "itemsWatchContains": (["keys", "maxLag"], "ItemsContained"),
        "topWatchTop": (["group", "first", "maxLag"], "TopTopChange"),  # tests/app/live/test_live_rankings
    }
    assert str(subscription.fields["perKeyWatch"].args["after"].type) == "[PositionInput!]"
