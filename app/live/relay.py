"""One upstream per peer: every local subscription's keys on that peer, followed over one stream.

A node serving subscriptions for keys another node holds does not open a stream per subscription: a
``Relay`` per (peer, topic, caller, copy) follows the union of its members' ``Interest`` over ONE stream
(``app.live.stream``) and hands each member the rows of its own keys. The caller is part of the relay's
identity because the peer checks what the carried caller may read (``schema.access``); the copy (active
only, or a standby allowed) because the peer checks the role it serves in.

A member that joins needs the current states of its keys: the relay restarts its upstream for the new
union without positions, so the peer reads every followed partition again (joins arriving together are
restarted for once: ``RESTART_AFTER_S``). Members that had followed already are given those snapshots too;
``app.live.watch``'s watches skip what is not newer than their own positions, so they see no duplicate and no gap.

A member whose queue holds more than ``MAX_QUEUED`` events (its subscriber stopped reading) is let go with
``MemberOverflowError``, and a failure of the upstream (the peer unreachable or gone silent, a coded
refusal, a partition moved) ends the relay, every member getting the error: each watch then follows its
partitions again, on whichever node now serves them, from its own positions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from iqgraph.app.live.follow import Interest, Row, Rows
from iqgraph.schema import wire
from iqgraph.schema.errors import limit_exceeded
from iqgraph.stores import Key

log = logging.getLogger(__name__)

RESTART_AFTER_S = 0.02
MAX_QUEUED = 1_024
MAX_COUNTS = 64
MAX_UPSTREAMS = 256  # upstreams of one node (each one long-lived connection)
MAX_MEMBERS = 2_048  # watches of one node followed on peers

#: Opens the upstream of an interest: (interest, window_from) → the rows the peer streams.
OpenStream = Callable[[Interest, Mapping[str, int | None]], AsyncIterator[Rows]]


class MemberOverflowError(Exception):
    """A member's subscriber fell more than MAX_QUEUED events behind: it follows again from its positions."""


class Member:
    """One watch's share of a relay: its interest and where its rows go."""

    def __init__(
        self,
        relay: Relay,
        interest: Interest,
        window_from: Mapping[str, int | None],
        queue: asyncio.Queue[Any],
        tag: Any,
    ) -> None:
        self.relay = relay
        self.interest = {s: {p: frozenset(keys) for p, keys in ps.items()} for s, ps in interest.items()}
        self.window_from = dict(window_from)
        self.queue = queue
        self.tag = tag
        self.snapshotted: set[int] = set()  # partitions whose snapshot it had: their changes follow on from it

    def leave(self) -> None:
        """Stop following (the relay ends with its last member)."""
        self.relay.leave(self)

    def deliver(self, rows: Rows) -> bool:
        """Queue the rows of this member's keys; return False (and end it) if its subscriber is too far behind.

        A partition's changes reach a member only after its snapshot of that partition (a member that joined
        while the upstream ran waits for the restarted upstream's): its other keys are never skipped.
        """
        if rows.snapshot:
            self.snapshotted.add(rows.partition)
        elif rows.partition not in self.snapshotted:
            return True
        mine = [row for row in rows.rows if self._wants(row, rows.partition)]
        if self.queue.qsize() >= MAX_QUEUED:
            self.queue.put_nowait((self.tag, MemberOverflowError(f"more than {MAX_QUEUED} events behind")))
            return False
        self.queue.put_nowait((self.tag, Rows(rows.partition, rows.position, mine, rows.snapshot, rows.lag)))
        return True

    def _wants(self, row: Row, partition: int) -> bool:
        store, key, start = row[0], row[1], row[2]
        lower = self.window_from.get(store)
        return key in self.interest.get(store, {}).get(partition, ()) and (
            start is None or lower is None or start >= lower
        )

    def fail(self, error: BaseException) -> None:
        self.queue.put_nowait((self.tag, error))

    def keys(self) -> int:
        return sum(len(keys) for ps in self.interest.values() for keys in ps.values())

    def follows(self, partition: int) -> bool:
        return any(partition in ps for ps in self.interest.values())


class Relay:
    """The members following one peer's partitions of one topic, and the one upstream that serves them."""

    def __init__(self, open_stream: OpenStream, on_end: Callable[[Relay], None]) -> None:
        self.open_stream = open_stream
        self.on_end = on_end
        self.members: set[Member] = set()
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ended = False

    def join(
        self, interest: Interest, window_from: Mapping[str, int | None], queue: asyncio.Queue[Any], tag: Any
    ) -> Member:
        """Add a member; its rows (then the error that ends it, if any) go to queue as (tag, item)."""
        member = Member(self, interest, window_from, queue, tag)
        self.members.add(member)
        self._wanted.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        return member

    def keys(self) -> int:
        """Return how many keys the members follow (counted per member: an upper bound of the union's)."""
        return sum(member.keys() for member in self.members)

    def leave(self, member: Member) -> None:
        self.members.discard(member)
        if not self.members and self._task is not None:
            self._ended = True  # at once: a watch joining now gets a new relay, not this one being cancelled
            self.on_end(self)
            self._task.cancel()

    async def _run(self) -> None:
        error: BaseException | None = None
        try:
            while self.members:
                await asyncio.sleep(RESTART_AFTER_S)  # joins arriving together: one restart
                self._wanted.clear()
                interest, window_from = self._union()
                stream = asyncio.create_task(self._follow(interest, window_from))
                wanted = asyncio.create_task(self._wanted.wait())
                try:
                    await asyncio.wait({stream, wanted}, return_when=asyncio.FIRST_COMPLETED)
                finally:  # cancelled (the last member left) included: the upstream closes with it
                    wanted.cancel()
                    if not stream.done():
                        stream.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await stream
                if stream.done() and not stream.cancelled():
                    stream.result()  # the upstream ended: raise why
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - every member learns why the upstream failed
            error = exc
        finally:
            self._ended = True
            self.on_end(self)
            for member in list(self.members):
                member.fail(error or ConnectionError("the relay stopped"))
            self.members.clear()

    async def _follow(self, interest: Interest, window_from: Mapping[str, int | None]) -> None:
        async with contextlib.aclosing(self.open_stream(interest, window_from)) as stream:  # type: ignore[type-var]
            async for rows in stream:
                for member in [m for m in self.members if m.follows(rows.partition)]:
                    if not member.deliver(rows):
                        self.members.discard(member)
                if not self.members:
                    return  # every member fell behind and went: the relay ends
        raise ConnectionError("the upstream ended")

    def _union(self) -> tuple[dict[str, dict[int, list[Key]]], dict[str, int | None]]:
        union: dict[str, dict[int, dict[Key, None]]] = {}
        window_from: dict[str, int | None] = {}
        for member in self.members:
            for store, ps in member.interest.items():
                for p, keys in ps.items():
                    union.setdefault(store, {}).setdefault(p, {}).update(dict.fromkeys(keys))
            for store, lower in member.window_from.items():
                known = window_from.get(store, lower)
                window_from[store] = None if known is None or lower is None else min(known, lower)
        return {s: {p: list(ks) for p, ks in ps.items()} for s, ps in union.items()}, window_from


class Relays:
    """This node's relays, one per (peer, topic, caller, copy), made on the first join and gone with the last.

    Bounded: a relay follows at most ``max_keys`` keys (more: another relay for the same peer), the node at most
    ``max_upstreams`` relays and ``max_members`` watches through them; one more is LIMIT_EXCEEDED for that watch.
    """

    def __init__(
        self, max_keys: int | None = None, max_upstreams: int = MAX_UPSTREAMS, max_members: int = MAX_MEMBERS
    ) -> None:
        self.max_keys = wire.MAX_FOLLOW_KEYS if max_keys is None else max_keys  # what a peer accepts
        self.max_upstreams = max_upstreams
        self.max_members = max_members
        self._relays: dict[tuple[Any, ...], Relay] = {}

    def join(
        self,
        key: tuple[Any, ...],
        open_stream: OpenStream,
        interest: Interest,
        window_from: Mapping[str, int | None],
        queue: asyncio.Queue[Any],
        tag: Any,
    ) -> Member:
        """Join a relay of key with room for interest (made with open_stream if there is none)."""
        members = sum(len(r.members) for r in self._relays.values())
        if members >= self.max_members:
            raise limit_exceeded("watches of this node followed on peers", self.max_members, members + 1)
        wanted = sum(len(keys) for ps in interest.values() for keys in ps.values())
        if wanted > self.max_keys:
            raise limit_exceeded("keys of one watch followed on a peer", self.max_keys, wanted)
        for shard in itertools.count():
            relay = self._relays.get((*key, shard))
            if relay is None or relay._ended:
                if len(self._relays) >= self.max_upstreams:
                    raise limit_exceeded("upstreams of this node to peers", self.max_upstreams, len(self._relays) + 1)
                relay = self._relays[(*key, shard)] = Relay(open_stream, functools.partial(self._end, (*key, shard)))
            elif relay.keys() + wanted > self.max_keys:
                continue
            return relay.join(interest, window_from, queue, tag)
        raise AssertionError("unreachable")  # pragma: no cover

    def _end(self, key: tuple[Any, ...], relay: Relay) -> None:
        if self._relays.get(key) is relay:
            del self._relays[key]

    def __len__(self) -> int:
        return len(self._relays)


class Broadcast:
    """One peer's counts of a store's changed keys (``/internal/changes``), shared by every local listener.

    A listener's queue gets each count, then the error the upstream ended with; a listener more than
    ``MAX_COUNTS`` counts behind misses the next ones (a count only says "read again": it has one already).
    """

    def __init__(self, open_counts: Callable[[], AsyncIterator[int]], on_end: Callable[[Broadcast], None]) -> None:
        self.open_counts = open_counts
        self.on_end = on_end
        self.listeners: set[asyncio.Queue[int | BaseException]] = set()
        self.started = asyncio.Event()  # the peer follows the store: a listener that joins now misses nothing
        self.ended = False
        self._task: asyncio.Task[None] | None = None

    def listen(self) -> asyncio.Queue[int | BaseException]:
        queue: asyncio.Queue[int | BaseException] = asyncio.Queue()
        self.listeners.add(queue)
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        return queue

    def leave(self, queue: asyncio.Queue[int | BaseException]) -> None:
        self.listeners.discard(queue)
        if not self.listeners and self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        error: BaseException = ConnectionError("the peer ended the stream")
        try:
            async with contextlib.aclosing(self.open_counts()) as counts:  # type: ignore[type-var]
                async for n in counts:
                    self.started.set()
                    for queue in self.listeners:
                        if queue.qsize() < MAX_COUNTS:
                            queue.put_nowait(n)
        except asyncio.CancelledError:
            error = ConnectionError("nobody listens")
        except Exception as exc:  # noqa: BLE001 - every listener learns why
            error = exc
        finally:
            self.ended = True
            self.on_end(self)
            for queue in self.listeners:
                queue.put_nowait(error)


class Broadcasts:
    """This node's broadcasts, one per (peer, store, caller), made for the first listener and gone with the last."""

    def __init__(self) -> None:
        self._broadcasts: dict[tuple[Any, ...], Broadcast] = {}

    def get(self, key: tuple[Any, ...], open_counts: Callable[[], AsyncIterator[int]]) -> Broadcast:
        found = self._broadcasts.get(key)
        if found is None or found.ended:
            if len(self._broadcasts) >= MAX_UPSTREAMS:
                raise limit_exceeded("change streams of this node to peers", MAX_UPSTREAMS, len(self._broadcasts) + 1)
            found = self._broadcasts[key] = Broadcast(open_counts, lambda ended: self._end(key, ended))
        return found

    def _end(self, key: tuple[Any, ...], broadcast: Broadcast) -> None:
        if self._broadcasts.get(key) is broadcast:
            del self._broadcasts[key]

    def __len__(self) -> int:
        return len(self._broadcasts)
