"""Rankings and entities followed live, in process: ``<ranking>WatchTop`` and ``<entity>Watch`` over Live, the real
StoreSink publishing each committed batch of real RocksDB partitions to the node's ChangeFeed (no Spark).

watchTop sends the top when it starts, then again only when a batch changes the top N (order, a value, who is in);
a batch that moves only members below it sends nothing; batches written while the subscriber is busy make one
event; group and first are respected; FORBIDDEN without the scope. An entity watch sends each watched key's entity
(its fields read by the entity's resolvers) and then the entity again, with the new values, after a batch changes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iqgraph.schema import Limits
from iqgraph.schema.access import Principal
from iqgraph.streaming.definitions import App, Entity, ranking_store
from iqgraph.streaming.sink import PartitionBatch
from tests.support.apps import iso
from tests.support.feed_shop import Orders, shop_app
from tests.support.live_shop import MINUTE, START_MS, LiveShop, open_live_shop, where

WATCH_TOP = """subscription($group: String, $first: Int) {
  %s(group: $group, first: $first) { group entries { member value rank } lag }
}"""
TOP = WATCH_TOP % "topWatchTop"
TOP_BY_ITEM = WATCH_TOP % "topByItemWatchTop"
WATCH_CUSTOMERS = """subscription($keys: [String!]!) {
  customerWatch(keys: $keys) { key perKey perMinute { start value } }
}"""


def ranked_app() -> App:
    """The change feed tests' shop, plus a ranking of per_key per item and a Customer entity over two stores."""
    base = shop_app()
    by_item = ranking_store("top_by_item", base.store("per_key"), group="item")
    customer = Entity("Customer", stores=["per_key", "per_minute"])
    return App(base.name, base.topics, [*base.stores, by_item], entities=[customer])


class RankedOrders(Orders):
    """Orders' batches, plus each customer's latest item: its group in top_by_item."""

    def batches(self, orders: Any) -> dict[int, PartitionBatch]:
        batches = super().batches(orders)
        for p, batch in batches.items():
            latest = {key: item for key, item, _ in orders if where(key) == p}
            batch.partials["top_by_item"] = [(key, None, {"item": item}, 1) for key, item in latest.items()]
        return batches


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[LiveShop]:
    limits = Limits(max_page_size=10, default_page_size=5)
    shop = open_live_shop(tmp_path, app=ranked_app(), orders=RankedOrders(), limits=limits)
    yield shop
    shop.close()


def orders(*counts: tuple[str, int], item: str = "pen") -> list[tuple[str, str, int]]:
    """Return count orders of item for each customer (one batch)."""
    return [(key, item, 0) for key, n in counts for _ in range(n)]


def top_now(shop: LiveShop, first: int, members: list[str]) -> list[dict[str, Any]]:
    """Return the top first of members by the order counts the store holds (ties by member), as the entries show it."""
    ranked = sorted(((shop.count(m), m) for m in members if shop.count(m)), key=lambda cm: (-cm[0], cm[1]))
    return [{"member": m, "value": c, "rank": i + 1} for i, (c, m) in enumerate(ranked[:first])]


CUSTOMERS = [f"c{i}" for i in range(8)]


async def test_watch_top_sends_the_top_then_again_only_when_the_top_changes(shop: LiveShop) -> None:
    shop.write(orders(("c0", 5), ("c1", 4), ("c2", 3), ("c3", 2), ("c4", 1)))
    events = await shop.subscribe(TOP, {"first": 3})
    (first,) = await events.take(1)
    assert first == {"group": None, "entries": top_now(shop, 3, CUSTOMERS), "lag": None}  # the actives answered
    assert [e["member"] for e in first["entries"]] == ["c0", "c1", "c2"]

    shop.write(orders(("c2", 3)))  # the order changes: c2 first
    (reordered,) = await events.take(1)
    assert [e["member"] for e in reordered["entries"]] == ["c2", "c0", "c1"]
    assert reordered["entries"] == top_now(shop, 3, CUSTOMERS)

    shop.write(orders(("c3", 1), ("c5", 2)))  # only members below the top 3 move: nothing to send
    shop.write(orders(("c1", 1)))  # a value in the top changes, the order does not
    (revalued,) = await events.take(1)  # the next event is this batch's: none came for the one before
    assert revalued["entries"] == top_now(shop, 3, CUSTOMERS)
    assert [(e["member"], e["value"]) for e in revalued["entries"]] == [("c2", 6), ("c0", 5), ("c1", 5)]

    shop.write(orders(("c7", 9)))  # a new member comes in at the top
    (entered,) = await events.take(1)
    assert [e["member"] for e in entered["entries"]] == ["c7", "c2", "c0"]
    assert entered["entries"] == top_now(shop, 3, CUSTOMERS)
    await events.close()
    assert shop.feed.stats().subscriptions == 0


async def test_batches_written_while_the_subscriber_is_busy_make_one_event(shop: LiveShop) -> None:
    shop.write(orders(("c0", 1)))
    events = await shop.subscribe(TOP, {"first": 2})
    await events.take(1)
    for i in range(10):  # the subscriber reads nothing meanwhile: ten batches, each changing the top
        shop.write(orders((f"c{i % 4}", i + 1)))
    (caught_up,) = await events.take(1)
    assert caught_up["entries"] == top_now(shop, 2, CUSTOMERS)
    shop.write(orders(("c6", 100)))
    (latest,) = await events.take(1)  # the next event is this batch's: the ten made one
    assert latest["entries"] == top_now(shop, 2, CUSTOMERS)
    assert latest["entries"][0] == {"member": "c6", "value": 100, "rank": 1}
    await events.close()


async def test_watch_top_follows_one_group_and_sends_at_most_first_members(shop: LiveShop) -> None:
    shop.write(orders(("c0", 3), ("c2", 1), ("c3", 2)) + orders(("c1", 5), item="ink"))
    events = await shop.subscribe(TOP_BY_ITEM, {"group": "pen", "first": 2})
    (first,) = await events.take(1)
    assert first == {
        "group": "pen",
        "entries": [{"member": "c0", "value": 3, "rank": 1}, {"member": "c3", "value": 2, "rank": 2}],
        "lag": None,
    }
    shop.write(orders(("c1", 4), item="ink"))  # another group's member: nothing to send
    shop.write(orders(("c2", 3)))  # c2 (pen) rises to 4: first of pen
    (risen,) = await events.take(1)
    assert risen == {
        "group": "pen",
        "entries": [{"member": "c2", "value": 4, "rank": 1}, {"member": "c0", "value": 3, "rank": 2}],
        "lag": None,
    }
    await events.close()


async def test_watch_top_errors_are_coded(shop: LiveShop) -> None:
    reader = Principal.from_scopes("reader", ["read:per_key"])
    forbidden = await shop.subscribe(TOP, {"first": 3}, principal=reader)
    assert (await forbidden.error())["extensions"]["code"] == "FORBIDDEN"
    too_many = await shop.subscribe(TOP, {"first": 11})
    assert (await too_many.error())["extensions"]["code"] == "LIMIT_EXCEEDED"
    assert shop.feed.stats().subscriptions == 0


async def test_entity_watch_sends_each_key_then_its_new_values_after_a_batch(shop: LiveShop) -> None:
    watched = ["c1", "c2"]
    events = await shop.subscribe(WATCH_CUSTOMERS, {"keys": watched})
    start = await events.take(2)
    assert start == [{"key": key, "perKey": None, "perMinute": []} for key in watched]

    shop.write([("c1", "pen", 0), ("c1", "ink", 1), ("c3", "pen", 0)])  # c3 is not watched
    shop.write([("c2", "pen", 1)])
    got: list[dict[str, Any]] = []
    while not got or got[-1]["key"] != "c2":
        got += await events.take(1)
    minute = iso(START_MS), iso(START_MS + MINUTE)
    c1 = {"key": "c1", "perKey": 2, "perMinute": [{"start": minute[0], "value": 1}, {"start": minute[1], "value": 1}]}
    assert got[0] == c1  # read after the batch: every store's new value at once
    assert all(e == c1 for e in got[:-1])  # a second store's change of the same batch may send it again, as it is
    assert got[-1] == {"key": "c2", "perKey": 1, "perMinute": [{"start": minute[1], "value": 1}]}
    assert shop.count("c1") == 2 and shop.count("c3") == 1
    await events.close()
    assert shop.feed.stats().subscriptions == 0


async def test_entity_watch_of_stores_the_caller_may_not_read_is_forbidden(shop: LiveShop) -> None:
    nobody = Principal.from_scopes("nobody", ["read:items"])
    events = await shop.subscribe(WATCH_CUSTOMERS, {"keys": ["c1"]}, principal=nobody)
    assert (await events.error())["extensions"]["code"] == "FORBIDDEN"


async def test_watch_top_takes_a_staleness_bound(shop: LiveShop) -> None:
    shop.write(orders(("c0", 2), ("c1", 1)))
    bounded = "subscription { topWatchTop(first: 2, maxLag: 0) { entries { member value } lag } }"
    events = await shop.subscribe(bounded, {})
    (first,) = await events.take(1)
    assert first == {"entries": [{"member": "c0", "value": 2}, {"member": "c1", "value": 1}], "lag": None}
    await events.close()


async def test_a_top_read_from_an_older_view_is_held_and_a_standbys_is_marked() -> None:
    """A standby lagging behind what the last event showed takes over (the active was killed): its top is held until
    it has caught up, never sent backwards; a standby's top no older than the last sent goes out with its lag."""
    from iqgraph.schema.live.rankings import Top, changed_tops
    from iqgraph.schema.types import Ranked

    def top(value: int, offsets: tuple[int, int], lag: int | None = None) -> Top:
        return Top([Ranked("c0", value, 1, "x")], {("orders", 0): offsets[0], ("orders", 1): offsets[1]}, lag)

    reads = iter([
        top(10, (40, 30)),  # the actives
        top(12, (44, 30)),
        top(9, (38, 30), lag=6),  # node killed: its standby is behind what was shown (38 < 44): held
        top(11, (42, 30), lag=2),  # still behind: held
        top(12, (44, 31), lag=0),  # caught up (its top as shown, but now marked): sent, marked
        top(13, (45, 31), lag=0),
        top(13, (46, 31)),  # the active back: same top, unmarked again: sent
    ])  # fmt: skip

    async def ticks() -> Any:
        for _ in range(7):
            yield 1

    async def read() -> Top:
        return next(reads)

    sent = [(t.ranked[0].value, t.lag) async for t in changed_tops(ticks(), read)]
    assert sent == [(10, None), (12, None), (12, 0), (13, 0), (13, None)]


async def test_an_entity_read_from_an_older_view_is_read_again_until_it_is_not() -> None:
    """An entity watch's round (its keys changed) read while a lagging standby serves a partition it had shown at a
    later offset is read again, not sent; the first read no older than what was shown is sent, and moves it on."""
    from iqgraph.schema.live.entities import read_forward
    from iqgraph.schema.live.fields import Shown

    shown = Shown()
    shown.advance({("orders", 0): 44, ("orders", 1): 30})
    views = iter([
        ({("orders", 0): 38}, "from the standby, 6 behind"),
        ({("orders", 0): 42, ("orders", 1): 30}, "2 behind"),
        ({("orders", 0): 44, ("orders", 1): 31}, "caught up"),
    ])  # fmt: skip
    seen: dict[tuple[str, int], int] = {}
    reads = 0

    async def read() -> str:
        nonlocal seen, reads
        reads += 1
        seen, value = next(views)
        return value

    assert await read_forward(read, lambda: seen, shown, hold_s=0.01) == "caught up"
    assert reads == 3 and shown.offsets == {("orders", 0): 44, ("orders", 1): 31}


async def test_an_entity_event_names_the_standbys_that_answered_its_own_reads(
    shop: LiveShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entity event's extensions.staleness names the standbys its reads came from (as a query's does), and only
    its own: an event read from the actives after one read from a standby carries none."""
    from iqgraph.app.query.store_queries import ClusterStoreQueries

    standby: list[bool] = [True]
    lookup = ClusterStoreQueries.lookup

    async def from_a_standby(self: ClusterStoreQueries, store: str, *args: Any, **kwargs: Any) -> Any:
        found = await lookup(self, store, *args, **kwargs)
        if standby[0] and store == "per_key":  # as if node-9's standby copy of partition 0 had answered, 4 behind
            self.reports.stale(store, 0, "node-9", 4)
        return found

    monkeypatch.setattr(ClusterStoreQueries, "lookup", from_a_standby)
    results = await shop.schema.subscribe(WATCH_CUSTOMERS, {"keys": ["c1"]}, context_value=shop.context())
    first = await anext(results)  # type: ignore[arg-type]
    assert first.data == {"customerWatch": {"key": "c1", "perKey": None, "perMinute": []}}
    assert first.extensions == {"staleness": [{"store": "per_key", "partition": 0, "node": "node-9", "lag": 4}]}
    standby[0] = False
    shop.write([("c1", "pen", 0)])
    later = await asyncio.wait_for(anext(results), 5)  # type: ignore[arg-type]
    assert later.data["customerWatch"]["perKey"] == 1 and not later.extensions  # type: ignore[index]
    await results.aclose()  # type: ignore[union-attr]
