"""Entities read together: the entity objects one field makes share a batch; a store is read once per batch.

``customers(keys)`` makes one EntityRef per key, all in one EntityBatch, and reads ahead: for every store
its selection asks (schema.selection), ALL the batch's keys as ONE loader item (``loader.load(keys)``: one
future, whatever the number of keys), awaited before it returns. The entities' fields then take their
key's result at once (``take``: no future, no task per field). A field whose read was not started ahead
(one the selection hint missed) starts it for the whole batch, and the same field on the other entities
awaits that same future (``read_one``). A key's failure (an exception in its place) is that entity's
field's error only.

Relations gather their targets in an open batch per request, entity and bound (``OpenBatches``): a
relation's resolver joins the batch at once and returns an awaitable (``arriving``) whose first run starts
the batch's reads, which closes it (the next relation starts another batch). The executors call every
resolver of a level before they run any awaitable, so the targets of one depth are read together: one
StoreQueries call per store per depth.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from iqgraph.schema.errors import ApiError, api_error
from iqgraph.schema.resolving import context
from iqgraph.schema.selection import selection_key, subfields
from iqgraph.stores import Key, StoreError

if TYPE_CHECKING:
    import strawberry

    from iqgraph.schema.loaders import Loaders

#: Starts the read of a batch's keys (in order) and returns its future (or, for a request whose loaders read at
#: once, its coroutine): one result per key, in key order.
StartRead = Callable[[tuple[Key, ...]], Awaitable[list[Any]]]


@dataclass(frozen=True)
class Read:
    """One read of a batch: its name (a store, or a window store and time range) and how to start it."""

    name: Hashable
    start: Callable[[Loaders, int | None], StartRead]  # (the request's loaders, the bound) -> start(keys)


#: Per field of an entity type, its read given the field's coerced (GraphQL) arguments.
Reads = Mapping[str, Callable[[dict[str, Any]], Read]]


class EntityBatch:
    """The keys of entities made together, their staleness bound, and the reads started for them (per store)."""

    __slots__ = ("keys", "max_lag", "reads", "done", "_arrivals", "_positions")

    def __init__(self, keys: Sequence[Key], max_lag: int | None, *, open_: bool = False) -> None:
        self.keys = list(keys)
        self.max_lag = max_lag
        self.reads: dict[Hashable, asyncio.Future[list[Any]]] = {}
        self.done: dict[Hashable, list[Any]] = {}  # the reads that succeeded, by name: one result per key
        self._arrivals: dict[tuple[Hashable, ...], asyncio.Future[Any]] = {}
        self._positions: dict[Key, int] | None = {k: i for i, k in enumerate(self.keys)} if open_ else None

    @property
    def open(self) -> bool:
        """Return whether keys may still join (an open batch no read has started for)."""
        return self._positions is not None and not self.reads

    def add(self, key: Key) -> int:
        """Add key to an open batch (once) and return its position."""
        assert self._positions is not None  # noqa: S101 - only open batches take keys
        index = self._positions.get(key)
        if index is None:
            index = self._positions[key] = len(self.keys)
            self.keys.append(key)
        return index

    def read(self, name: Hashable, start: StartRead) -> asyncio.Future[list[Any]]:
        """Return the read called name of every key of the batch, started (once) by start(keys)."""
        found = self.reads.get(name)
        if found is None:
            found = self.reads[name] = asyncio.ensure_future(start(tuple(self.keys)))  # a loader's future as it is
        return found

    def seed(self, name: Hashable, results: list[Any]) -> None:
        """Record results (one per key, in key order) as the read called name: a scan has them already."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        future.set_result(results)
        self.reads[name] = future
        self.done[name] = results

    def arrival(self, reads: Sequence[Read], loaders: Loaders) -> asyncio.Future[Any] | None:
        """Return a future done when every read is (each started once, the batch's keys all in it); None if done.

        A read that failed is left to its fields to raise; those that succeeded are in ``done`` by then.
        """
        names = tuple(read.name for read in reads if read.name not in self.done)
        if not names:
            return None
        arrival = self._arrivals.get(names)
        if arrival is None:
            futures = [self._start(r, loaders) for r in reads if r.name in names]
            arrival = self._arrivals[names] = asyncio.gather(*futures, return_exceptions=True)  # futures: no task
            arrival.add_done_callback(lambda _: self._record(names))  # before any awaiter resumes
        return arrival

    def _start(self, read: Read, loaders: Loaders) -> asyncio.Future[list[Any]]:
        try:
            start = read.start(loaders, self.max_lag)
        except ApiError as exc:  # e.g. FORBIDDEN: this read's fields raise it, the others answer
            failed: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return self.reads.setdefault(read.name, failed)
        return self.read(read.name, start)

    def _record(self, names: tuple[Hashable, ...]) -> None:
        for name in names:
            future = self.reads[name]
            if not future.cancelled() and future.exception() is None:
                self.done[name] = future.result()


class EntityRef:
    """One entity object: its key (``f0``, the attribute the type's ``key`` field reads), position and batch."""

    __slots__ = ("f0", "index", "batch")

    def __init__(self, key: Key, index: int, batch: EntityBatch) -> None:
        self.f0 = key
        self.index = index
        self.batch = batch


class OpenBatches:
    """The open batch of relation targets per entity and bound, of one request (in its context)."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, int | None], EntityBatch] = {}
        self.wanted: dict[tuple[int, int], list[Read]] = {}  # the reads a relation field's selection asks

    def join(self, entity: str, max_lag: int | None, key: Key) -> EntityRef:
        """Return the entity of key in the open batch of entity and max_lag (a new batch if none is open)."""
        batch = self._open.get((entity, max_lag))
        if batch is None or not batch.open:
            batch = self._open[entity, max_lag] = EntityBatch((), max_lag, open_=True)
        return EntityRef(key, batch.add(key), batch)


def wanted_reads(info: strawberry.Info, reads: Reads, through: Sequence[str] = ()) -> list[Read]:
    """Return the reads of the entity fields selected under the resolved field (under ``through``), once each."""
    found: dict[Hashable, Read] = {}
    for name, args in subfields(info, through):
        read_of = reads.get(name)
        if read_of is not None:
            read = read_of(args)
            found.setdefault(read.name, read)
    return list(found.values())


async def read_ahead(info: strawberry.Info, batch: EntityBatch, reads: Reads, through: Sequence[str] = ()) -> None:
    """Start, for every key of batch, the reads of the fields selected under the resolved field; await them."""
    if batch.keys:
        arrival = batch.arrival(wanted_reads(info, reads, through), context(info).loaders)
        if arrival is not None:
            await arrival


def arriving(info: strawberry.Info, ref: EntityRef, reads: Reads) -> Any:
    """Return ref, or an awaitable of it once its batch's reads that the selection asks are done.

    The reads start when the awaitable first runs, not now: until then, more targets join the batch.
    """
    ctx = context(info)
    key = (selection_key(info), id(reads))
    wanted = ctx.entities.wanted.get(key)
    if wanted is None:
        wanted = ctx.entities.wanted[key] = wanted_reads(info, reads)
    if not wanted or all(read.name in ref.batch.done for read in wanted):
        return ref
    return _Arrival(ref, wanted, ctx.loaders)


class _Arrival:
    """An entity once its batch's reads are done: awaitable, and nothing made until awaited — a request cancelled
    (or a list whose other item failed) drops it without a never-awaited coroutine's warning."""

    __slots__ = ("loaders", "ref", "wanted")

    def __init__(self, ref: EntityRef, wanted: list[Read], loaders: Loaders) -> None:
        self.ref, self.wanted, self.loaders = ref, wanted, loaders

    def __await__(self) -> Generator[Any, None, EntityRef]:
        return _arrive(self.ref, self.wanted, self.loaders).__await__()


async def _arrive(ref: EntityRef, wanted: list[Read], loaders: Loaders) -> EntityRef:
    arrival = ref.batch.arrival(wanted, loaders)
    if arrival is not None:
        await arrival
    return ref


def take(results: list[Any], index: int, convert: Callable[[Any], Any]) -> Any:
    """Return the converted result at index of a finished read; raise its API error if its key failed."""
    found = results[index]
    if isinstance(found, Exception):
        raise found
    try:
        return convert(found)
    except StoreError as exc:
        translated = api_error(exc)
        if translated is exc:
            raise
        raise translated from exc


async def read_one(ref: EntityRef, name: Hashable, start: StartRead, convert: Callable[[Any], Any]) -> Any:
    """Return ref's converted result of its batch's read called name, started now if not yet."""
    return take(await ref.batch.read(name, start), ref.index, convert)
