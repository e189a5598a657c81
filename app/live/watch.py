"""A subscriber's watch: a store's keys followed wherever their partitions are served, through any node.

``Live.watch`` (``schema.types.LiveQueries``) checks the caller may read the store
(``schema.access.check_read``), routes the keys to their partitions as reads do (``app.query.routing``: the
producers' partitioner) and follows each partition on the replica the failover rules choose
(``app.query.executor.Failover`` over the cluster's replicas: the active copy, or a standby within the staleness
bound when the active is down). Partitions served here are followed on this node's change feed
(``app.live.serving``); partitions served by a peer through that peer's relay (``app.live.relay``: one upstream
per peer, every local subscription's keys on it). Every source sends ``Rows`` (a snapshot read at a position, or
one batch's changes); the watch keeps, per partition, the position its subscriber has, and passes on only what is
newer — so a source replaced mid-stream (a peer killed, a partition moved, a subscriber that fell behind)
is followed again from those positions on whichever replica serves now: no gap, no duplicate.
``app.live.values`` turns states into the values sent; a change read from a standby carries its lag.

A partition no replica can serve is retried until the queries' deadline (``RetryPolicy.deadline_ms``), then
ends the subscription with its coded error (STORE_NOT_AVAILABLE, STALE_BEYOND_BOUND, …); a single node is a
one-member cluster. Beside its watches, ``Live`` holds the owner's side of a watch (``Live.serving``,
``app.live.serving``) and the counts of store changes (``Live.changes``, ``app.live.store_changes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from iqgraph.app.cluster.peers import PeerUnavailableError
from iqgraph.app.live.follow import Hosted, Interest, Rows
from iqgraph.app.live.relay import MemberOverflowError, Relays
from iqgraph.app.live.serving import Serving, watchable
from iqgraph.app.live.store_changes import StoreChanges
from iqgraph.app.live.values import WatchedKeys
from iqgraph.app.query import routing
from iqgraph.app.query.batches import batches
from iqgraph.app.query.executor import Failover, Replicas
from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.schema.errors import ApiError, api_error
from iqgraph.schema.live import peer_streams
from iqgraph.schema.types import LiveChange
from iqgraph.stores import Key
from iqgraph.streaming.change_feed import ChangeFeed
from iqgraph.streaming.change_set import Change
from iqgraph.streaming.definitions import App, StoreDefinition
from iqgraph.streaming.snapshots import Snapshot

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from iqgraph.app.cluster.peers import PeerClient
    from iqgraph.app.query.store_queries import ClusterStoreQueries

MAX_QUEUED = 1_024  # a source's events a watch may hold before the source is made to start again
PROMOTE_EVERY_S = 2.0  # how often a watch served by a standby checks whether the active serves again
MAX_AHEAD = 2  # events a local source reads ahead of its subscriber (the rest stays in the feed, conflated)


@dataclass
class _Source:
    """Where a watch follows some of its partitions: this node's feed (a task) or a peer's relay (a member)."""

    node: str
    partitions: list[int]
    stop: Callable[[], None]
    standby: bool = False  # a standby copy serves them (the active was down): moved back once it serves again


class Live:
    """Follow stores' keys on the nodes that serve them (``watch``); serve this node's partitions to watches
    (``serving``) and count store changes (``changes``, ``store_changes``)."""

    def __init__(
        self,
        app: App,
        partitions: Hosted,
        feed: ChangeFeed,
        *,
        partitioner: Callable[[str], str],
        queries: ClusterStoreQueries,
        role: Callable[[str, int], str] | None = None,
        node_id: str | None = None,
        peers: PeerClient | None = None,
        lag: Callable[[str, int], int | None] | None = None,
        check_every_s: float = 2.0,
    ) -> None:
        """Args:
        partitions: topic → partition → stores this node hosts, now (the runner's live dict).
        partitioner: the partitioner a topic's keys are routed by (configured, or detected).
        queries: the cluster's routing, the node's own (a single node: a one-member cluster).
        role: "active" or "standby" of this node's copy of a topic-partition (default: active).
        node_id: this node (default: the queries'). peers: the client of peers' endpoints (their relays'
        upstreams; default: the queries'). lag: this node's lag of a partition.
        """
        self.app = app
        self.feed = feed
        self.partitioner = partitioner
        self.queries = queries
        self.node_id = node_id if node_id is not None else queries.node_id
        self.peers = peers if peers is not None else queries.peers
        self.serving = Serving(
            app, partitions, feed, node_id=self.node_id, role=role, lag=lag, check_every_s=check_every_s
        )
        self.changes = StoreChanges(
            app, partitions, feed, self.serving.role, node_id=self.node_id, queries=queries, peers=self.peers
        )
        self.broadcasts = self.changes.broadcasts  # the peers' store-change counts: one per (peer, store, caller)
        self.relays = Relays()
        self._tags = itertools.count()
        self.stopped = False
        self._on_stop: set[Callable[[], None]] = set()  # how each watch here is told to end

    def stop(self) -> None:
        """End every subscription this node serves (each completes: its stream ends cleanly) and close the feed, so
        that peers' upstreams end too: the node stops (``app.http.server`` calls it as the server shuts down)."""
        self.stopped = True
        for end in list(self._on_stop):
            end()
        self.changes.stop()
        self.feed.close()

    def store_changes(self, store: str, *, principal: Principal = ANONYMOUS) -> AsyncGenerator[int, None]:
        """Yield 0 once store is followed on every node, then how many of its keys batches changed on any active
        (``StoreChanges.everywhere``)."""
        return self.changes.everywhere(store, principal=principal)

    # -- a subscriber's watch --------------------------------------------------------------------------

    async def watch(
        self,
        store: str,
        keys: Sequence[Key],
        *,
        after: Mapping[int, int] | None = None,
        window_from: int | None = None,
        principal: Principal = ANONYMOUS,
        max_lag: int | None = None,
    ) -> AsyncGenerator[LiveChange, None]:
        """Yield the keys' values newer than after, then every change, until the subscriber goes away."""
        check_read(principal, store)
        definition = watchable(self.app, store)
        routed = self._route(definition, keys)
        watch = _Watch(self, definition, routed, after or {}, window_from, principal, max_lag)
        self._on_stop.add(watch.stop)
        try:
            if not self.stopped:
                async for change in watch.run():
                    yield change
        finally:
            self._on_stop.discard(watch.stop)
            await watch.close()

    def _route(self, definition: StoreDefinition, keys: Sequence[Key]) -> dict[int, list[Key]]:
        """Return per partition the keys a read asks it for; the first key that cannot be routed fails."""
        routed = batches(self.app, definition, keys, self.partitioner(definition.topic))
        if routed.errors:
            raise api_error(routed.errors[min(routed.errors)])
        where = {i: ps for ps, members in zip(routed.partitions, routed.members, strict=True) for i in members}
        found: dict[int, list[Key]] = {}
        for i, key in enumerate(keys):
            for p in where[i]:
                found.setdefault(p, []).append(key)
        return found

    @property
    def replicas(self) -> Replicas:
        """Return the replicas a watch is planned over: the cluster's."""
        return self.queries.replicas

    def failover(self, topic: str, max_lag: int | None) -> Failover:
        """Return the failover state of a watch's partitions of topic, until they are all followed again."""
        return Failover(self.replicas, topic, self.bound(max_lag), self.queries.retry, patient=True)

    def bound(self, max_lag: int | None) -> int | None:
        """Return a watch's staleness bound: its maxLag, else the node's."""
        return self.queries.bound(max_lag)

    def _open_stream(self, node: str, topic: str, standby: bool, caller: Principal) -> Callable[..., Any]:
        """Return how a relay opens its upstream to node (a signed follow request)."""
        queries, peers = self.queries, self.peers

        def open_stream(interest: Interest, window_from: Mapping[str, int | None]) -> Any:
            url = queries.url_of(node)
            if url is None:
                raise PeerUnavailableError(f"node {node} is not a member of the cluster any more")
            body = peer_streams.encode_follow(topic, interest, {}, window_from, standby)
            return peers.follow(url, body, caller)

        return open_stream


_NOTHING = object()
_STOP = -1  # the tag of the event that ends a watch (the node stops); sources' tags count from 0
_LOCAL = Principal("iqgraph-node", None)  # this node following its own partitions: the watch checked its caller


class _Watch:
    """One subscription's sources and positions (see the module's docstring)."""

    def __init__(
        self,
        live: Live,
        definition: StoreDefinition,
        routed: Mapping[int, Sequence[Key]],
        after: Mapping[int, int],
        window_from: int | None,
        principal: Principal,
        max_lag: int | None,
    ) -> None:
        self.live = live
        self.definition = definition
        self.topic = definition.topic
        self.routed = routed
        self.watched = WatchedKeys(definition, routed, window_from)
        self.window_from = {definition.name: window_from}
        #: per partition: the next offset the subscriber's values stand for (it has every change before it; sources
        #: resume there): a resume's after is the last change it got, so one past it
        self.positions = {p: offset + 1 for p, offset in after.items()}
        self.principal = principal
        self.max_lag = max_lag
        self.queue: asyncio.Queue[tuple[int, Rows | BaseException]] = asyncio.Queue()
        self.sources: dict[int, _Source] = {}
        self.tasks: set[asyncio.Task[None]] = set()  # the local sources' pumps
        self.promote_at = 0.0  # when a watch served by a standby next checks whether the active serves again
        self.started = False  # every partition has sent its first snapshot (until then: held, see _first)
        self.initial: dict[int, Rows] = {}
        self.early: list[Rows] = []
        self.taken = asyncio.Event()  # the subscriber took an event: a local source may read on
        self.sent: dict[tuple[Key, int | None], Any] = {}  # the last value sent of each key (window)
        self.by_partition: dict[int, int] = {}  # partition → the tag of its source
        self.pending: set[int] = set(routed)
        self.bound = live.bound(max_lag)
        #: the executor's failover state while a partition has no source that sends (from then to the deadline)
        self.failover: Failover | None = None
        self.failures = 0  # sources failed in a row (the backoff grows with them)
        self.retry_at = 0.0
        self.fatal: ApiError | None = None

    def stop(self) -> None:
        """End the watch at its next turn: the node stops (``Live.stop``)."""
        self.queue.put_nowait((_STOP, ConnectionError("the node stops")))

    async def run(self) -> AsyncGenerator[LiveChange, None]:
        held: list[tuple[int, Rows | BaseException]] = []  # taken from the queue, not yet handled
        while True:
            if held:
                tag, item = held.pop(0)
            else:
                delay = self._plan()
                if any(source.standby for source in self.sources.values()):
                    now = time.monotonic()
                    if now >= self.promote_at:  # however busy the stream: events may never leave a quiet moment
                        self.promote_at = now + PROMOTE_EVERY_S
                        self._promote()
                        continue
                    delay = min(delay or PROMOTE_EVERY_S, self.promote_at - now)
                try:
                    # not asyncio.wait_for: on Python 3.11 it swallows a cancellation that comes as the item does
                    # (and loses the item), so a subscriber's watch would outlive its connection
                    async with asyncio.timeout(delay or None):
                        tag, item = await self.queue.get()
                except TimeoutError:
                    continue
                self.taken.set()
            if tag == _STOP:
                return
            source = self.sources.get(tag)
            if source is None:
                continue  # a source replaced already
            if isinstance(item, BaseException):
                self._failed(tag, source, item)
                continue
            if self.queue.qsize() > MAX_QUEUED:
                self._failed(tag, source, MemberOverflowError("the subscriber fell behind"))
                continue
            found = [item]
            if item.snapshot:  # the snapshots read together are sent together: a key of several partitions once
                while not held and not self.queue.empty():
                    more = self.queue.get_nowait()
                    known = {rows.partition for rows in found}
                    if isinstance(more[1], Rows) and more[1].snapshot and more[1].partition not in known:
                        if self.sources.get(more[0]) is not None:
                            found.append(more[1])
                    else:
                        held.append(more)
                self.taken.set()
            for rows in found:
                if self.failover is not None:
                    self.failover.served(rows.partition)
            if not self.pending:
                self.failover, self.failures = None, 0
            groups = [found] if self.started else self._first(found)
            for group in groups:  # snapshots read together are sent together, a batch alone
                for change in self._apply(group):
                    yield change

    def _first(self, found: list[Rows]) -> list[list[Rows]]:
        """Hold rows until every partition has sent its first snapshot; then return them to send: the snapshots
        together (a key several partitions hold is sent once, merged, not first with one partition's state), then
        the batches that came meanwhile."""
        for rows in found:
            if not rows.snapshot:
                self.early.append(rows)
            elif rows.position >= getattr(self.initial.get(rows.partition), "position", -1):
                self.initial[rows.partition] = rows
        if not set(self.routed) <= set(self.initial):
            return []
        self.started = True
        ready = [list(self.initial.values()), *([rows] for rows in self.early)]
        self.initial, self.early = {}, []
        return ready

    async def close(self) -> None:
        """Stop every source; a local one's feed subscription is closed when this returns."""
        for source in self.sources.values():
            source.stop()
        self.sources.clear()
        tasks, self.tasks = list(self.tasks), set()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- sources ----------------------------------------------------------------------------------------

    def _plan(self) -> float | None:
        """Start sources for the partitions without one; return how long to wait before planning again.

        Raises the error that ends the watch: a source's that retrying cannot cure (FORBIDDEN, LIMIT_EXCEEDED, …),
        or, past the deadline without rows, why a partition could not be followed (``app.query.executor``).
        """
        if self.fatal is not None:
            raise self.fatal
        if not self.pending:
            return None
        failover = self.failover = self.failover or self.live.failover(self.topic, self.max_lag)
        now = time.monotonic()
        if now < self.retry_at:
            return self.retry_at - now
        chosen: dict[routing.Server, list[int]] = {}
        refused: dict[int, routing.Refusal] = {}
        for p in sorted(self.pending):
            found = failover.choose(p)
            if isinstance(found, routing.Refusal):
                refused[p] = found
            else:
                chosen.setdefault(found, []).append(p)
        for _, refusal in sorted(refused.items()):
            error = failover.refused(refusal)
            if error is not None:
                raise error
        if self.failures and failover.expired():
            raise failover.given_up(sorted(self.pending))
        for server, partitions in chosen.items():
            self._start(server, partitions)
            self.pending -= set(partitions)
        if not refused:
            return None
        failover.forget(refused)  # a failed node may serve again once it is back
        return failover.next_round()

    def _start(self, server: routing.Server, partitions: list[int]) -> None:
        tag = next(self.live._tags)
        interest = {self.definition.name: {p: list(self.routed[p]) for p in partitions}}
        standby = server.stale
        if server.node == self.live.node_id:
            after = {p: self.positions[p] for p in partitions if p in self.positions}
            task = asyncio.create_task(
                self._pump(
                    tag, self.live.serving.follow(self.topic, interest, after, self.window_from, standby, _LOCAL)
                )
            )
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            source = _Source(server.node, partitions, functools.partial(_cancel, task), standby)
        else:
            key = (server.node, self.topic, self.principal, standby)
            open_stream = self.live._open_stream(server.node, self.topic, standby, self.principal)
            member = self.live.relays.join(key, open_stream, interest, self.window_from, self.queue, tag)
            source = _Source(server.node, partitions, member.leave, standby)
        self.sources[tag] = source
        for p in partitions:
            self.by_partition[p] = tag

    def _promote(self) -> None:
        """Follow partitions a standby serves on their active again once it serves (from the positions held)."""
        for tag, source in list(self.sources.items()):
            if not source.standby:
                continue
            back = [p for p in source.partitions if self._active_serves(p)]
            if back:
                log.info("partitions %s of %s: their active serves again, leaving the standby", back, self.topic)
                source.stop()
                del self.sources[tag]
                for p in source.partitions:
                    if self.by_partition.get(p) == tag:
                        del self.by_partition[p]
                        self.pending.add(p)

    def _active_serves(self, partition: int) -> bool:
        found = self.live.replicas.choose(self.topic, partition, self.bound, ())
        return isinstance(found, routing.Server) and not found.stale

    async def _pump(self, tag: int, rows: AsyncGenerator[Rows, None]) -> None:
        try:
            async with contextlib.aclosing(rows) as found:
                async for item in found:
                    self.queue.put_nowait((tag, item))
                    while self.queue.qsize() > MAX_AHEAD:  # the subscriber reads first: the feed conflates meanwhile
                        self.taken.clear()
                        await self.taken.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the watch follows the partitions again
            self.queue.put_nowait((tag, exc))
            return
        self.queue.put_nowait((tag, ConnectionError("the source ended")))

    def _failed(self, tag: int, source: _Source, error: BaseException) -> None:
        """Follow a failed source's partitions again: after a backoff, elsewhere if the node failed; or end the
        watch with an error that retrying cannot cure (the executor's rules: ``Failover.failed``)."""
        source.stop()
        del self.sources[tag]
        log.warning("a source of %s on %s failed (%r): following again", self.topic, source.node, error)
        mine = [p for p in source.partitions if self.by_partition.get(p) == tag]
        for p in mine:
            del self.by_partition[p]
            self.pending.add(p)
        if isinstance(error, MemberOverflowError):
            return  # the subscriber fell behind: follow again at once, from its positions (a snapshot)
        failover = self.failover = self.failover or self.live.failover(self.topic, self.max_lag)
        final = failover.failed(source.node, mine, error)
        if final is not None:
            self.fatal = final  # retrying cannot cure it: the watch ends with it
            return
        self.failures += 1
        self.retry_at = time.monotonic() + failover.next_round()

    # -- what the subscriber gets -------------------------------------------------------------------

    def _apply(self, found: Sequence[Rows]) -> list[LiveChange]:
        """Return what rows (one batch, or snapshots) bring the subscriber: only what is newer than its positions."""
        newer = [rows for rows in found if rows.position > self.positions.get(rows.partition, -1)]
        if not newer:
            return []  # a replica behind the subscriber, or a relay's snapshot for a newer member
        name = self.definition.name
        if newer[0].snapshot:
            snapshots = {rows.partition: Snapshot(rows.position, _own(rows, name), True) for rows in newer}
            since = {p: self.positions[p] for p in snapshots if p in self.positions}
            made = self._unsent(self.watched.snapshot(snapshots, since))
        else:
            (rows,) = newer
            made = self._changes(rows)
        for change in made:
            self.sent[(change.key, change.window_start)] = change.value
        lags = {rows.partition: rows.lag for rows in newer}
        for rows in newer:
            self.positions[rows.partition] = rows.position
        if all(lag is None for lag in lags.values()):
            return made
        return [dataclasses.replace(c, lag=lags.get(c.partition)) for c in made]

    def _unsent(self, made: list[LiveChange]) -> list[LiveChange]:
        """Return a snapshot's changes but the values the subscriber has already (a value with no position, read
        again when a source is replaced mid-stream)."""
        if not self.started or not self.sent:
            return made
        return [c for c in made if self.sent.get((c.key, c.window_start), _NOTHING) != c.value]

    def _changes(self, rows: Rows) -> list[LiveChange]:
        """Return one batch's changes of the watched keys the subscriber does not have, each at its own position."""
        made = []
        since = self.positions.get(rows.partition)
        for store, key, start, state, dropped, position in rows.rows:
            if store != self.definition.name:
                continue
            if since is not None and position is not None and position < since:
                continue  # a replica whose batches end elsewhere: a change the subscriber has
            change = Change(store, key, start, state, self.topic, rows.partition, rows.position, dropped, position)
            found = self.watched.change(change, rows.position - 1)
            if found is not None and self.sent.get((key, start), _NOTHING) != found.value:
                made.append(found)
        return made


def _own(rows: Rows, store: str) -> list[tuple[Key, int | None, Any, int | None]]:
    """Return the rows of store as the watched keys read them: (key, window start, state, position)."""
    return [(key, start, state, at) for name, key, start, state, _, at in rows.rows if name == store]


def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
