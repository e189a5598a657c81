"""Review of issue 13 part 3 (helper-R): defects of the relay path of ``app.live.watch``, each a failing test.

No Spark, no HTTP: node B's ``Live`` follows every partition on a peer "node-a" through its ``Relays``; the
upstream is either a controllable fake (``Upstreams``: the rows a test pushes) or node A's real
``Serving.follow`` (``app.live.serving``) over the in-process shop (``tests.support.live_shop``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from iqgraph.app.live import follow
from iqgraph.app.live.follow import Interest, Rows
from iqgraph.app.live.relay import Relays
from iqgraph.app.live.serving import Serving
from iqgraph.app.live.watch import Live
from iqgraph.app.query import routing
from iqgraph.schema.access import ANONYMOUS, Principal
from iqgraph.schema.types import LiveChange
from iqgraph.streaming.change_feed import ChangeFeed
from tests.support.feed_shop import shop_app
from tests.support.live_shop import KEYS, MINUTE, START_MS, TOPIC, TYPES, LiveShop, open_live_shop, where
from tests.support.queries import single_node

PEER = "node-a"


class Upstreams:
    """Fake upstreams of a relay: each opening is recorded with its interest; a test pushes its rows."""

    def __init__(self) -> None:
        self.opened: list[tuple[Interest, Mapping[str, int | None]]] = []
        self.queues: list[asyncio.Queue[Rows]] = []
        self.closed = 0
        self.changed = asyncio.Event()

    def open(self, interest: Interest, window_from: Mapping[str, int | None]) -> AsyncIterator[Rows]:
        queue: asyncio.Queue[Rows] = asyncio.Queue()
        self.opened.append((interest, window_from))
        self.queues.append(queue)
        self.changed.set()
        return self._rows(queue)

    async def _rows(self, queue: asyncio.Queue[Rows]) -> AsyncGenerator[Rows, None]:
        try:
            while True:
                yield await queue.get()
        finally:
            self.closed += 1

    async def opening(self, n: int, timeout: float = 5.0) -> asyncio.Queue[Rows]:
        """Return the queue of the n-th opening (1-based), waiting for it."""
        async with asyncio.timeout(timeout):
            while len(self.opened) < n:
                self.changed.clear()
                await self.changed.wait()
        return self.queues[n - 1]


class _Fixed:
    """Replicas (app.query.executor.Replicas) whose choice is a fixed function of the partition."""

    node_id = "node-b"

    def __init__(self, serving: Callable[[str, int], routing.Server]) -> None:
        self.serving = serving

    def choose(self, topic: str, partition: int, bound: int | None, excluded: Any) -> routing.Server:
        return self.serving(topic, partition)

    def mark_down(self, node: str) -> None:
        pass

    def refresh(self) -> None:
        pass


class RelayedLive(Live):
    """Node B: hosts nothing, every partition served by PEER (the active) through B's relays."""

    def __init__(
        self,
        open_stream: Callable[[Principal], Callable[..., Any]],
        app: Any = None,
        *,
        hosted: Mapping[int, Any] | None = None,
        feed: ChangeFeed | None = None,
        types: Mapping[str, Any] = TYPES,
    ) -> None:
        app = app or shop_app()
        served = {TOPIC: dict(hosted or {})}
        queries = single_node(app, types, served)  # the node's kind; who serves is fixed by replicas below
        super().__init__(
            app, served, feed or ChangeFeed(), partitioner=lambda topic: "murmur2", queries=queries, node_id="node-b"
        )
        self._opener = open_stream

    @property
    def replicas(self) -> Any:  # the executor plans over these: here, who serves is fixed by server_of()
        return _Fixed(self.server_of)

    def server_of(self, topic: str, partition: int) -> routing.Server:
        return routing.Server(PEER, "active")

    def _open_stream(self, node: str, topic: str, standby: bool, caller: Principal) -> Callable[..., Any]:
        return self._opener(caller)


async def settle(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


# -- 1. a relay's upstream outlives its last member ---------------------------------------------------------


async def test_the_upstream_is_closed_when_the_last_member_leaves() -> None:
    """Relay._run: the last member leaving cancels the relay's task while it waits in asyncio.wait; ``done`` is
    unbound in the finally (UnboundLocalError), so the upstream task is never cancelled: it keeps its HTTP
    stream (a pooled connection) and the owner keeps a feed subscription, for ever."""
    upstreams = Upstreams()
    relays = Relays()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    member = relays.join((PEER, TOPIC, ANONYMOUS, False), upstreams.open, {"per_key": {0: ["k"]}}, {}, queue, 1)
    await upstreams.opening(1)
    await asyncio.sleep(0.05)  # the relay streams
    member.leave()
    await asyncio.sleep(0.2)
    assert len(relays) == 0
    assert upstreams.closed == 1, "the relay's upstream is still open after its last member left"


async def test_subscribers_coming_and_going_leave_no_upstream_behind() -> None:
    """The same through Live.watch: each subscriber that closes its watch leaves one upstream open."""
    upstreams = Upstreams()
    live = RelayedLive(lambda caller: upstreams.open)
    key = KEYS[0]
    for n in range(1, 4):
        watch = live.watch("per_key", [key])
        first = asyncio.ensure_future(anext(watch))
        (await upstreams.opening(n)).put_nowait(Rows(where(key), 1, [("per_key", key, None, 1, 0, 0)], True))
        assert (await first).value == 1
        await watch.aclose()
    await asyncio.sleep(0.2)
    assert upstreams.closed == 3, f"{3 - upstreams.closed} upstreams left open by 3 subscribers gone"


# -- 2. windows through a relay: a member gets the windows of another member's ``from`` -----------------------


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[LiveShop]:
    shop = open_live_shop(tmp_path)
    yield shop
    shop.close()


def served_by(owner: LiveShop) -> RelayedLive:
    """Return node B following owner's partitions through its relays (owner's Serving.follow, in process)."""

    def opener(caller: Principal) -> Callable[..., Any]:
        def open_stream(interest: Interest, window_from: Mapping[str, int | None]) -> AsyncIterator[Rows]:
            return owner.live.serving.follow(TOPIC, interest, {}, window_from, False, caller)

        return open_stream

    return RelayedLive(opener, owner.app)


async def take(watch: AsyncGenerator[LiveChange, None], n: int, timeout: float = 5.0) -> list[LiveChange]:
    async with asyncio.timeout(timeout):
        return [await anext(watch) for _ in range(n)]


async def quiet(watch: AsyncGenerator[LiveChange, None], seconds: float = 0.3) -> list[LiveChange]:
    """Return what watch sends within seconds (the read is cancelled after)."""
    found: list[LiveChange] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                found.append(await anext(watch))
    return found


async def test_a_watch_through_a_relay_gets_no_window_before_its_from(owner: LiveShop) -> None:
    """Relay._union takes the smallest windowFrom of its members, and Member.deliver filters rows by key only;
    WatchedKeys.snapshot does not filter by window_from either: a watch from minute 2 gets minute 0's window."""
    key = KEYS[0]
    owner.write([(key, "pen", 0), (key, "pen", 2)])
    live = served_by(owner)
    every = live.watch("per_minute", [key])  # from: none (every window)
    assert {c.window_start for c in await take(every, 2)} == {START_MS, START_MS + 2 * MINUTE}
    late = live.watch("per_minute", [key], window_from=START_MS + 2 * MINUTE)
    try:
        got = await take(late, 1) + await quiet(late)
        starts = sorted(c.window_start or 0 for c in got)
        assert starts == [START_MS + 2 * MINUTE], f"windows sent: {[(s - START_MS) // MINUTE for s in starts]}"
    finally:
        await late.aclose()
        await every.aclose()


# -- 3. a member joining gets the old upstream's changes before its snapshot: its other keys are never sent ----


async def test_a_joining_watch_gets_every_key_even_when_a_change_of_a_shared_key_comes_first() -> None:
    """Relay.join adds the member at once, and the upstream of the old union keeps delivering until the restart:
    a change of a key the new member shares with an old one reaches it first (it takes the batch's position);
    the restarted upstream's snapshot at that same position is then 'not newer' and dropped by _Watch._apply —
    the new member's other keys are never sent."""
    upstreams = Upstreams()
    live = RelayedLive(lambda caller: upstreams.open)
    p = where(KEYS[0])
    shared, other = [k for k in KEYS if where(k) == p][:2]
    first = live.watch("per_key", [shared])
    reading = asyncio.ensure_future(anext(first))
    (await upstreams.opening(1)).put_nowait(Rows(p, 5, [("per_key", shared, None, 1, 0, 4)], True))
    assert (await reading).value == 1
    second = live.watch("per_key", [shared, other])
    taking = asyncio.ensure_future(quiet(second, 1.5))  # what it gets in 1.5 s
    relay = next(iter(live.relays._relays.values()))
    while len(relay.members) < 2:  # the turn it joins: before the relay's task restarts the upstream
        await asyncio.sleep(0)
    upstreams.queues[0].put_nowait(Rows(p, 6, [("per_key", shared, None, 2, 0, 5)], False))  # a batch, as it joins
    restarted = await upstreams.opening(2)
    restarted.put_nowait(Rows(p, 6, [("per_key", shared, None, 2, 0, 5), ("per_key", other, None, 7, 0, 3)], True))
    try:
        got = await taking
    finally:
        taking.cancel()
        await second.aclose()
        await first.aclose()
    assert {c.key: c.value for c in got} == {shared: 2, other: 7}, f"the joining watch got only {got}"


# -- 4. a key held by several partitions, some local and some relayed: a partial value is sent first ----------


class SplitKeyLive(RelayedLive):
    """Node B: hosts partition 1 (served here), partition 0 served by PEER through a relay."""

    def server_of(self, topic: str, partition: int) -> routing.Server:
        return routing.Server(self.node_id if partition == 1 else PEER, "active")


async def test_a_key_of_several_partitions_is_first_sent_with_its_whole_value(tmp_path: Path) -> None:
    """_Watch.run sends the snapshots that are in its queue together; a local snapshot comes well before a relay's
    (RESTART_AFTER_S, the HTTP round trip), so a column-keyed store's key (in every partition) is first sent with
    the state of the local partition alone: a wrong value (here 1, not 3), flagged snapshot."""
    from pyspark.sql.types import LongType

    from iqgraph.stores import PartitionState, StateDirectory
    from iqgraph.streaming.definitions import App, Topic, count, key_value_store
    from iqgraph.streaming.sink import PartitionBatch, StoreSink

    app = App(
        "split",
        [Topic(TOPIC, schema="amount DOUBLE, item STRING", partitions=2)],
        [key_value_store("per_item", TOPIC, count(), key="item")],
    )
    state = StateDirectory(tmp_path / "state", "split")
    partitions = {p: state.open(TOPIC, p, app.specs(TOPIC)) for p in (0, 1)}
    try:
        for stores in partitions.values():
            stores.db.set_state(PartitionState.RUNNING)
        feed = ChangeFeed()
        sink = StoreSink(app, app.topic(TOPIC), partitions, change_feed=feed)
        batches = {0: PartitionBatch(0, 1), 1: PartitionBatch(0, 0)}
        batches[0].partials["per_item"] = [("pen", None, 2, 2)]
        batches[1].partials["per_item"] = [("pen", None, 1, 1)]
        sink.apply(batches)
        owner = Serving(app, {TOPIC: partitions}, feed, node_id=PEER)

        def opener(caller: Principal) -> Callable[..., Any]:
            def open_stream(interest: Interest, window_from: Mapping[str, int | None]) -> AsyncIterator[Rows]:
                return owner.follow(TOPIC, interest, {}, window_from, False, caller)

            return open_stream

        here = SplitKeyLive(opener, app, hosted={1: partitions[1]}, feed=feed, types={"per_item": LongType()})
        watch = here.watch("per_item", ["pen"])
        try:
            got = await take(watch, 1) + await quiet(watch)
        finally:
            await watch.aclose()
        assert [c.value for c in got] == [3], f"values sent for pen (2 in partition 0, 1 in partition 1): {got}"
    finally:
        for stores in partitions.values():
            stores.close()


# -- 5. one subscriber's keys end every other subscriber's watch of the same relay -----------------------------


async def test_one_subscribers_many_keys_do_not_end_the_others_watches(
    owner: LiveShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every watch of one (peer, topic, caller, copy) shares ONE upstream whose interest is the union of their keys;
    past what a peer accepts (wire.MAX_FOLLOW_KEYS) the owner refused it with LIMIT_EXCEEDED, fatal for every
    member: a subscriber following 2 keys was ended because another (with auth off: anyone) asked for more. Shown
    with MAX_FOLLOW_KEYS = 3: the relays now open another upstream past it (100,000 in production)."""
    from iqgraph.schema import wire

    monkeypatch.setattr(wire, "MAX_FOLLOW_KEYS", 3)  # the relays of served_by's Live are made after this
    live = served_by(owner)
    first = live.watch("per_key", KEYS[:2])
    try:
        assert len(await take(first, 2)) == 2
        other = live.watch("per_key", KEYS[2:4])
        with contextlib.suppress(Exception):
            await take(other, 1, timeout=2.0)  # its own refusal is fair: it asked for the keys past the limit
        await other.aclose()
        ended: list[BaseException] = []
        try:
            await quiet(first, 1.0)
        except Exception as exc:  # noqa: BLE001
            ended.append(exc)
        assert not ended, f"the first subscriber's watch ended with {ended[0]!r}"
    finally:
        await first.aclose()


# -- each change carries its own position; a replica's batch ending elsewhere re-sends nothing the subscriber has --


async def test_each_change_carries_its_records_position_and_a_replica_re_sends_nothing_the_watch_has() -> None:
    """A snapshot's values come in position order, each at the offset of the record that produced it; a replica
    whose batches end elsewhere sends changes at positions the subscriber has (none is pushed, whatever its value),
    then changes past them (each pushed at its own position)."""
    upstreams = Upstreams()
    live = RelayedLive(lambda caller: upstreams.open)
    p = where(KEYS[0])
    a, b = [k for k in KEYS if where(k) == p][:2]
    watch = live.watch("per_key", [a, b])
    try:
        reading = asyncio.ensure_future(take(watch, 2))
        queue = await upstreams.opening(1)
        queue.put_nowait(Rows(p, 5, [("per_key", a, None, 1, 0, 3), ("per_key", b, None, 1, 0, 1)], True))
        assert [(c.key, c.value, c.position) for c in await reading] == [(b, 1, 1), (a, 1, 3)]
        queue.put_nowait(Rows(p, 6, [("per_key", a, None, 9, 0, 4)], False))  # before the snapshot's 5: it has it
        queue.put_nowait(Rows(p, 9, [("per_key", a, None, 2, 0, 6), ("per_key", b, None, 3, 0, 8)], False))
        got = await take(watch, 2)
    finally:
        await watch.aclose()
    assert [(c.key, c.value, c.position) for c in got] == [(a, 2, 6), (b, 3, 8)]


# -- a follower cancelled just as a change comes ends (its connection closes) -----------------------------------------


async def test_a_follower_cancelled_as_a_change_comes_ends() -> None:
    """A subscriber that leaves as a batch is published: its follower is cancelled while the feed wakes it. Each
    interleaving of the wake-up and the cancellation ends the follower (asyncio.wait_for on Python 3.11 swallowed the
    cancellation when the change won the race: the follower went on following, its task and connection never ended)."""
    feed = ChangeFeed()
    for turns in range(4):  # the loop's turns between the change's wake-up and the cancellation
        for _ in range(10):
            subscription = feed.subscribe(TOPIC, {"per_key": None})
            follower = asyncio.ensure_future(follow._next(subscription, 5.0, lambda: None))
            await asyncio.sleep(0.001)  # it waits in the feed
            feed.publish(TOPIC, 0, 1, {"per_key": [("a", None, 1, 0)]})
            for _ in range(turns):
                await asyncio.sleep(0)
            if follower.done():  # it had the change before it was cancelled: nothing to check
                subscription.close()
                continue
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(follower), 1.0)
            assert follower.cancelled(), f"the follower went on after its cancellation ({turns} turns)"
            subscription.close()
