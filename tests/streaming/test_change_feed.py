"""The change feed: ordering per partition, conflation and its bounds, a publishing thread and an asyncio consumer,
positions and resume, read-the-store-then-follow without gap or duplicate; and through the real StoreSink.apply on
real RocksDB (no Spark: batches are built as the partials would bring them)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.streaming import sink as sink_module
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.change_set import Change, KeyChange, RankEntry
from iqgraph.streaming.definitions import App
from iqgraph.streaming.feed_errors import SubscriptionClosedError, SubscriptionOverflowError, TooManySubscriptionsError
from iqgraph.streaming.sink import PartitionBatch, StoreSink
from iqgraph.streaming.snapshots import read_then_follow
from tests.support.feed_shop import KEYS, MINUTE, START_MS, TOPIC, Orders, shop_app, where


def drain(sub: Any) -> list[Change]:
    """Return every buffered change of sub."""
    found = []
    while (change := sub.poll()) is not None:
        found.append(change)
    return found


def kv(*pairs: tuple[Any, Any]) -> list[KeyChange]:
    return [(key, None, state, None) for key, state in pairs]


# -- the feed alone ------------------------------------------------------------------------------


def test_changes_arrive_in_offset_order_per_partition_and_only_the_watched_keys() -> None:
    feed = ChangeFeed()
    every = feed.subscribe(TOPIC, {"counts": None})
    some = feed.subscribe(TOPIC, {"counts": ["a"]})
    feed.publish(TOPIC, 0, 5, {"counts": kv(("a", 1), ("b", 1))})
    feed.publish(TOPIC, 1, 3, {"counts": kv(("c", 1))})
    feed.publish(TOPIC, 0, 9, {"counts": kv(("d", 1))})
    feed.publish(TOPIC, 1, 4, {"counts": kv(("e", 1)), "other": kv(("a", 7))})
    got = drain(every)
    assert [(c.key, c.partition, c.offset) for c in got] == [
        ("a", 0, 5),
        ("b", 0, 5),
        ("c", 1, 3),
        ("d", 0, 9),
        ("e", 1, 4),
    ]
    assert got[0] == Change("counts", "a", None, 1, TOPIC, 0, 5)
    assert [(c.key, c.offset) for c in drain(some)] == [("a", 5)]
    assert feed.stats().pending == 0


def test_a_slow_subscriber_gets_the_latest_state_once_with_the_number_dropped() -> None:
    feed = ChangeFeed()
    sub = feed.subscribe(TOPIC, {"counts": None})
    feed.publish(TOPIC, 0, 1, {"counts": kv(("a", 1), ("b", 1))})
    feed.publish(TOPIC, 0, 2, {"counts": kv(("a", 2))})
    feed.publish(TOPIC, 0, 3, {"counts": kv(("c", 1))})
    feed.publish(TOPIC, 0, 4, {"counts": kv(("a", 3))})
    # a moved behind c: offset order is kept, and nothing before offset 1 is owed to anyone
    got = drain(sub)
    assert [(c.key, c.state, c.offset, c.dropped) for c in got] == [("b", 1, 1, 0), ("c", 1, 3, 0), ("a", 3, 4, 2)]
    stats = sub.stats()
    assert (stats.delivered, stats.conflated, stats.pending, stats.overflows) == (3, 2, 0, 0)


def test_a_window_key_conflates_per_window_and_a_column_keyed_key_per_partition() -> None:
    feed = ChangeFeed()
    sub = feed.subscribe(TOPIC, {"per_minute": None})
    feed.publish(TOPIC, 0, 1, {"per_minute": [("a", 0, 1, 0), ("a", MINUTE, 1, 0)]})
    feed.publish(TOPIC, 1, 1, {"per_minute": [("a", 0, 5, 0)]})
    feed.publish(TOPIC, 0, 2, {"per_minute": [("a", 0, 2, 1)]})
    got = [(c.key, c.window_start, c.partition, c.state, c.dropped) for c in drain(sub)]
    assert got == [("a", MINUTE, 0, 1, 0), ("a", 0, 1, 5, 0), ("a", 0, 0, 2, 1)]


def test_a_subscriber_past_its_buffer_overflows_once_and_follows_again_from_a_re_read() -> None:
    feed = ChangeFeed(capacity=3)
    sub = feed.subscribe(TOPIC, {"counts": None}, after={0: 10})
    feed.publish(TOPIC, 0, 11, {"counts": kv(("a", 1), ("b", 1))})
    assert sub.poll() == Change("counts", "a", None, 1, TOPIC, 0, 11)
    feed.publish(TOPIC, 0, 12, {"counts": kv(("c", 1), ("d", 1), ("e", 1))})  # b, c, d, e: 4 > 3
    assert feed.stats().pending == 0  # memory given back at once
    assert sub.positions() == {0: 10}  # b of offset 11 was never delivered
    feed.publish(TOPIC, 0, 13, {"counts": kv(("f", 1))})  # dropped: the subscriber has not seen the overflow yet
    with pytest.raises(SubscriptionOverflowError):
        sub.poll()
    feed.publish(TOPIC, 0, 14, {"counts": kv(("g", 1))})  # buffered again, but the view is stale until re-read
    assert sub.positions() == {0: 10}
    assert sub.start_from(0, 13) is True  # the store re-read at 13 holds everything before
    assert [(c.key, c.offset) for c in drain(sub)] == [("g", 14)]
    assert sub.positions() == {0: 14}
    assert sub.stats().overflows == 1


def test_an_overflow_while_the_store_is_re_read_makes_the_next_re_read_news() -> None:
    feed = ChangeFeed(capacity=2)
    sub = feed.subscribe(TOPIC, {"counts": None}, after={0: 10})
    feed.publish(TOPIC, 0, 11, {"counts": kv(("a", 1), ("b", 1), ("c", 1))})
    with pytest.raises(SubscriptionOverflowError):
        sub.poll()
    # the subscriber re-reads the store at 11; before it says so, the buffer overflows again
    feed.publish(TOPIC, 0, 12, {"counts": kv(("a", 2), ("b", 2), ("c", 2))})
    assert sub.start_from(0, 11) is True
    feed.publish(TOPIC, 0, 13, {"counts": kv(("d", 1))})  # dropped: the second overflow is not seen yet
    assert sub.positions() == {0: 11}  # what the subscriber has: the re-read, not 12 or 13
    with pytest.raises(SubscriptionOverflowError):
        sub.poll()
    assert sub.start_from(0, 13) is True  # the store at 13 is news: 12 and 13 were never delivered
    assert sub.positions() == {0: 13}
    feed.publish(TOPIC, 0, 14, {"counts": kv(("e", 1))})
    assert [(c.key, c.offset) for c in drain(sub)] == [("e", 14)]
    assert sub.stats().overflows == 2


def test_the_feed_wide_bound_overflows_the_longest_buffer_first() -> None:
    feed = ChangeFeed(capacity=100, max_pending=10)
    slow = feed.subscribe(TOPIC, {"counts": None})
    fast = feed.subscribe(TOPIC, {"counts": None})
    for offset in range(1, 6):
        feed.publish(TOPIC, 0, offset, {"counts": kv((f"k{offset}", 1))})
        assert fast.poll() is not None
    assert slow.stats().pending == 5
    feed.publish(TOPIC, 0, 6, {"counts": kv(*((f"x{i}", 1) for i in range(4)))})  # 5 + 4 + 4 > 10
    assert slow.stats().overflows == 1 and fast.stats().overflows == 0
    assert [c.key for c in drain(fast)] == ["x0", "x1", "x2", "x3"]
    assert feed.stats().pending == 0


def test_subscriptions_are_limited_and_closing_one_frees_its_place_and_memory() -> None:
    feed = ChangeFeed(max_subscriptions=2)
    first = feed.subscribe(TOPIC, {"counts": ["a"]})
    second = feed.subscribe(TOPIC, {"counts": None})
    with pytest.raises(TooManySubscriptionsError):
        feed.subscribe(TOPIC, {"counts": None})
    feed.publish(TOPIC, 0, 1, {"counts": kv(("a", 1))})
    first.close()
    with pytest.raises(SubscriptionClosedError):
        first.poll()
    assert feed.stats().subscriptions == 1 and feed.stats().pending == 1  # the other one's
    third = feed.subscribe(TOPIC, {"counts": ["a", "b"]})
    with feed.writing(TOPIC) as interest:
        assert interest == {"counts": None}  # every key: a key set adds nothing
    second.close()
    with feed.writing(TOPIC) as interest:
        keys = interest["counts"]
        assert set(interest) == {"counts"} and keys is not None
        assert ("a" in keys, "b" in keys, "c" in keys) == (True, True, False)
    third.close()
    with feed.writing(TOPIC) as interest:
        assert interest == {}


def test_positions_resume_without_gap_or_duplicate() -> None:
    feed = ChangeFeed()
    first = feed.subscribe(TOPIC, {"counts": None}, after={0: 0, 1: 0})
    feed.publish(TOPIC, 0, 2, {"counts": kv(("a", 1), ("b", 1))})
    feed.publish(TOPIC, 1, 1, {"counts": kv(("c", 1))})
    feed.publish(TOPIC, 0, 3, {})  # a batch with nothing watched still moves the position
    assert first.poll() == Change("counts", "a", None, 1, TOPIC, 0, 2)
    assert first.positions() == {0: 0, 1: 0}  # b of the same batch is not delivered yet
    assert first.poll() is not None and first.poll() is not None
    assert first.positions() == {0: 3, 1: 1}
    feed.publish(TOPIC, 0, 4, {"counts": kv(("a", 2))})
    assert first.positions() == {0: 3, 1: 1}  # a@4 is not delivered yet
    # the subscriber goes away; a new subscription resumes after what it had (here, on the same feed: a replica
    # behind it may publish offsets it has already, which are skipped)
    resumed = feed.subscribe(TOPIC, {"counts": None}, after=first.positions())
    first.close()
    feed.publish(TOPIC, 0, 3, {"counts": kv(("b", 9))})  # at or before its position: skipped
    feed.publish(TOPIC, 0, 5, {"counts": kv(("a", 3))})
    feed.publish(TOPIC, 1, 5, {"counts": kv(("c", 2))})
    assert [(c.key, c.partition, c.offset) for c in drain(resumed)] == [("a", 0, 5), ("c", 1, 5)]
    assert resumed.positions() == {0: 5, 1: 5}
    # a snapshot older than what the subscriber has (a lagging replica's) is not news, and moves nothing back
    assert resumed.start_from(0, 4) is False
    assert resumed.positions() == {0: 5, 1: 5}


async def test_an_asyncio_consumer_follows_a_publishing_thread() -> None:
    feed = ChangeFeed()
    sub = feed.subscribe(TOPIC, {"counts": None})
    rng = random.Random(3)
    batches = [(p, offset, [(f"k{rng.randrange(40)}", offset) for _ in range(rng.randint(1, 5))])
               for offset in range(1, 800) for p in (0, 1)]  # fmt: skip
    last: dict[tuple[str, int], int] = {}
    for p, _, keys in batches:
        for key, state in keys:
            last[(key, p)] = state

    def publish() -> None:
        for p, offset, keys in batches:
            feed.publish(TOPIC, p, offset, {"counts": kv(*keys)})
        for p in (0, 1):
            feed.publish(TOPIC, p, 10_000, {"counts": kv(("end", None))})

    publisher = threading.Thread(target=publish)
    publisher.start()
    got: dict[tuple[str, int], int] = {}
    offsets: dict[int, list[int]] = {0: [], 1: []}
    ends, delivered, dropped = 0, 0, 0
    async with asyncio.timeout(30):
        async for change in sub:
            delivered, dropped = delivered + 1, dropped + change.dropped
            offsets[change.partition].append(change.offset)
            if change.key == "end":
                ends += 1
                if ends == 2:
                    break
                continue
            got[(change.key, change.partition)] = change.state
    publisher.join()
    assert got == last
    assert all(seen == sorted(seen) for seen in offsets.values())
    assert delivered + dropped == sum(len(keys) for _, _, keys in batches) + 2  # every state delivered or counted
    assert sub.stats().conflated == dropped


async def test_next_wakes_on_a_publish_from_another_thread_and_ends_on_close() -> None:
    feed = ChangeFeed()
    sub = feed.subscribe(TOPIC, {"counts": ["a"]})
    waiting = asyncio.create_task(sub.next())
    await asyncio.sleep(0.01)
    threading.Thread(target=feed.publish, args=(TOPIC, 0, 1, {"counts": kv(("a", 1))})).start()
    assert (await asyncio.wait_for(waiting, 5)).state == 1
    waiting = asyncio.create_task(sub.next())
    await asyncio.sleep(0.01)
    threading.Thread(target=sub.close).start()
    with pytest.raises(SubscriptionClosedError):
        await asyncio.wait_for(waiting, 5)


# -- through the sink, on real RocksDB ---------------------------------------------------------------


class RecordingFeed(ChangeFeed):
    """A ChangeFeed that keeps what the sink published."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[tuple[int, int, dict[str, list[KeyChange]]]] = []

    def publish(self, topic: str, partition: int, next_offset: int, changes: Mapping[str, Sequence[KeyChange]]) -> None:
        self.published.append((partition, next_offset, {s: list(c) for s, c in changes.items()}))
        super().publish(topic, partition, next_offset, changes)


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[tuple[App, dict[int, PartitionStores]]]:
    app = shop_app()
    state = StateDirectory(tmp_path / "state", "shop")
    partitions = {p: state.open(TOPIC, p, app.specs(TOPIC)) for p in (0, 1)}
    for stores in partitions.values():
        stores.db.set_state(PartitionState.RUNNING)
    yield app, partitions
    for stores in partitions.values():
        stores.close()


def test_the_sink_publishes_each_committed_batch_per_store_kind(shop: Any) -> None:
    app, partitions = shop
    feed = RecordingFeed()
    sink = StoreSink(app, app.topic(TOPIC), partitions, change_feed=feed)
    sub = feed.subscribe(TOPIC, {"per_key": ["c1"], "per_minute": ["c1"], "items": None, "top": None})
    orders = Orders()
    p = where("c1")
    other = next(k for k in KEYS if where(k) == p and k != "c1")
    sink.apply(orders.batches([("c1", "pen", 0), ("c1", "ink", 1), (other, "pen", 0)]))
    got = {(c.store, c.key, c.window_start): c for c in drain(sub)}
    assert set(got) == {
        ("per_key", "c1", None),
        ("per_minute", "c1", START_MS),
        ("per_minute", "c1", START_MS + MINUTE),
        ("items", "pen", None),
        ("items", "ink", None),
        ("top", "c1", None),
        ("top", other, None),
    }
    assert {c.offset for c in got.values()} == {3} and {c.partition for c in got.values()} == {p}
    assert got[("per_key", "c1", None)].state == 2
    # each change is at the offset of the record that changed it: c1's second order, the ink order's window
    assert got[("per_key", "c1", None)].position == 1 and got[("top", other, None)].position is None  # a ranking's
    assert got[("per_minute", "c1", START_MS + MINUTE)].position == 1 and got[("items", "pen", None)].position == 2
    assert got[("items", "pen", None)].state is True
    assert got[("top", "c1", None)].state == RankEntry(None, 2, None)
    assert got[("per_minute", "c1", START_MS)].state == 1
    # only the watched stores and keys were collected
    assert {s: {k for k, *_ in c} for s, c in feed.published[-1][2].items() if s in ("per_key", "per_minute")} == {
        "per_key": {"c1"},
        "per_minute": {"c1"},
    }
    # states equal the stores' (mergeable, un-finalized)
    stores = partitions[p]
    assert stores.kv("per_key").multi_get(["c1"], states=True) == [2]
    window = stores.window("per_minute").fetch("c1", START_MS, START_MS + MINUTE, states=True)
    assert [(w.start, w.value) for w in window] == [(START_MS, 1), (START_MS + MINUTE, 1)]

    # a late window (closed before the batch) is not a change; a value that did not move is not a ranking change
    late = orders.batches([("c1", "pen", 1), ("c1", "pen", -30)])
    sink.apply(late)
    got = {(c.store, c.key, c.window_start): c.state for c in drain(sub)}
    assert got == {
        ("per_key", "c1", None): 4,
        ("per_minute", "c1", START_MS + MINUTE): 2,
        ("items", "pen", None): True,
        ("top", "c1", None): RankEntry(None, 4, None),
    }


def test_a_table_tombstone_is_published_as_a_deletion(tmp_path: Path) -> None:
    app = shop_app(table=True)
    stores = StateDirectory(tmp_path / "state", "shop").open(TOPIC, 0, app.specs(TOPIC))
    try:
        feed = ChangeFeed()
        sink = StoreSink(app, app.topic(TOPIC), {0: stores}, change_feed=feed)
        sub = feed.subscribe(TOPIC, {"names": None})
        first = PartitionBatch(0, 1)
        first.partials["names"] = [("a", None, {"name": "Ann"}, 1, 0), ("b", None, {"name": "Bob"}, 1, 1)]
        second = PartitionBatch(2, 3)
        second.partials["names"] = [("a", None, None, 1, 2), ("never", None, None, 1, 3)]  # tombstones
        sink.apply({0: first})
        sink.apply({0: second})
        got = [(c.key, c.state, c.offset, c.position) for c in drain(sub)]
        # a's first state conflated into its deletion, at the tombstone's position; a key never stored: no change
        assert got == [("b", {"name": "Bob"}, 2, 1), ("a", None, 4, 2)]
        view = stores.kv("names")  # the deleted key keeps its position: a resume learns it was deleted after
        assert view.positions.read(view.codec.encode_many(["a", "b", "never"])) == [2, 1, None]
    finally:
        stores.close()


def test_without_subscribers_the_sink_builds_and_publishes_nothing(shop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app, partitions = shop
    feed = RecordingFeed()
    sink = StoreSink(app, app.topic(TOPIC), partitions, change_feed=feed)

    def no_change_set(interest: Any) -> None:
        raise AssertionError("a change set was built for nobody")

    monkeypatch.setattr(sink_module, "ChangeSet", no_change_set)
    orders = Orders()
    sink.apply(orders.batches([(key, "pen", 0) for key in KEYS]))
    feed.subscribe(TOPIC, {"per_key": ["c1"]}).close()  # subscribed, then gone
    sink.apply(orders.batches([(key, "pen", 0) for key in KEYS]))
    assert feed.published == []


def test_read_then_follow_has_no_gap_and_no_duplicate_while_batches_apply(shop: Any) -> None:
    app, partitions = shop
    feed = ChangeFeed()
    sink = StoreSink(app, app.topic(TOPIC), partitions, change_feed=feed)
    orders, rng, rng_reader = Orders(), random.Random(5), random.Random(6)
    watched = KEYS[:6]
    done = threading.Event()

    def write() -> None:
        for _ in range(60):
            sink.apply(orders.batches([(rng.choice(KEYS), "pen", 0) for _ in range(rng.randint(1, 8))]))
            time.sleep(0.002)  # the reader's turns too, on two busy cores (it once made only 3 runs in 60 batches)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()

    def read(partition: int) -> dict[str, Any]:
        states = partitions[partition].kv("per_key").multi_get(watched, states=True)
        return {k: v for k, v in zip(watched, states, strict=True) if where(k) == partition and v is not None}

    runs = []
    while not done.is_set() or not runs:
        sub = feed.subscribe(TOPIC, {"per_key": watched})
        runs.append((sub, read_then_follow(feed, sub, {p: s.db for p, s in partitions.items()}, read)))
        time.sleep(rng_reader.random() / 1000)  # land the snapshots at every point of a batch
    writer.join()
    final = read(0) | read(1)
    assert len(runs) > 3 and final
    for sub, snapshots in runs:
        seen: dict[str, Any] = {}
        for snapshot in snapshots.values():
            assert snapshot.newer
            seen.update(snapshot.value)
        delivered = drain(sub)
        assert all(c.offset > snapshots[c.partition].position for c in delivered)  # nothing the snapshot had
        assert len({(c.key, c.offset) for c in delivered}) == len(delivered)
        seen.update({c.key: c.state for c in delivered})
        assert seen == final
        assert sub.positions() == {p: s.db.next_offset() for p, s in partitions.items()}
        sub.close()


class SubscribingMidBatch(ChangeFeed):
    """A ChangeFeed on which, once, a subscriber registers while a batch is being applied and reads the store."""

    def __init__(self, subscriber: Any) -> None:
        super().__init__()
        self.subscriber = subscriber
        self.thread: threading.Thread | None = None

    def writing(self, topic: str) -> Any:
        feed, outer = super().writing(topic), self

        class During:
            def __enter__(self) -> Any:
                interest = feed.__enter__()  # what the batch collects is decided before the subscriber comes
                if outer.thread is None:
                    subscribed = threading.Event()
                    outer.thread = threading.Thread(target=outer.subscriber, args=(subscribed,))
                    outer.thread.start()
                    subscribed.wait(5)
                    time.sleep(0.05)  # the subscriber's snapshot, if it did not wait for this batch
                return interest

            def __exit__(self, *exc: Any) -> None:
                feed.__exit__(*exc)

        return During()


def test_a_subscriber_that_comes_during_a_batch_reads_the_store_after_it(shop: Any) -> None:
    app, partitions = shop
    found: dict[str, Any] = {}

    def subscriber(subscribed: threading.Event) -> None:
        sub = feed.subscribe(TOPIC, {"per_key": ["c1"]})
        subscribed.set()
        p = where("c1")
        found.update(
            read_then_follow(feed, sub, {p: partitions[p].db}, lambda _: partitions[p].kv("per_key").get("c1"))
        )
        found["sub"] = sub

    feed = SubscribingMidBatch(subscriber)
    sink = StoreSink(app, app.topic(TOPIC), partitions, change_feed=feed)
    orders = Orders()
    sink.apply(orders.batches([("c1", "pen", 0)]))  # nobody watched when it began: nothing collected, not published
    assert feed.thread is not None
    feed.thread.join(5)
    snapshot = found[where("c1")]
    assert (snapshot.position, snapshot.value) == (1, 1)  # so the snapshot must hold it
    sink.apply(orders.batches([("c1", "pen", 0)]))
    assert [(c.state, c.offset) for c in drain(found["sub"])] == [(2, 2)]


def test_a_snapshot_read_while_a_batch_commits_is_read_again(shop: Any) -> None:
    app, partitions = shop
    feed = ChangeFeed()
    sink = StoreSink(app, app.topic(TOPIC), partitions, change_feed=feed)
    orders = Orders()
    p = where("c1")
    sink.apply(orders.batches([("c1", "pen", 0)]))
    sub = feed.subscribe(TOPIC, {"per_key": ["c1"]})
    reads = []

    def read(_: int) -> Any:
        if not reads:  # a batch commits between the read of the position and the read of the data
            sink.apply(orders.batches([("c1", "pen", 0)]))
        reads.append(partitions[p].kv("per_key").get("c1"))
        return reads[-1]

    snapshot = read_then_follow(feed, sub, {p: partitions[p].db}, read)[p]
    assert (snapshot.position, snapshot.value, len(reads)) == (2, 2, 2)
    assert drain(sub) == []  # the batch published during the read is in the snapshot: not delivered again
