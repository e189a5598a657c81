"""The partitions this node hosts, read as a peer serves them (schema.types.PeerQueries).

Construct with ``LocalPartitions(app, partitions, node_id=…, url=…, end_offset=…)``: ``partitions`` maps
topic → partition → PartitionStores and changes as partitions move (the runner's live dict);
``end_offset(topic, partition)`` is the topic-partition's end offset as last seen (None: unknown), for lags.

It reads exactly the partitions it is told — routing is the cluster queries' job (``app.query.routing``) — and
answers *states* (mergeable), each answer with the position (applied offset, read before the data) and
lag of every partition it read. It never waits: a partition that is not hosted fails STORE_MIGRATED, one
that is not queryable yet STORE_NOT_READY — per read, per page, per count, in place of that partition's
result — and the caller decides whether another replica answers or
it retries. The cluster queries read this node's partitions through it in place; peers, through
the internal fields.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, cast

from iqgraph.app.catalog import definition_of
from iqgraph.app.query.merging import combiner
from iqgraph.schema.access import ANONYMOUS, Principal
from iqgraph.schema.errors import INTERNAL, ApiError
from iqgraph.schema.types import (
    Answer,
    NodeInfo,
    PartitionInfo,
    PipelineInfo,
    Read,
    Scan,
)
from iqgraph.stores import Page, PartitionState, PartitionStores, StoreError, StoreMigratedError
from iqgraph.stores.distinct import Distinct
from iqgraph.streaming.definitions import App, StoreDefinition

if TYPE_CHECKING:
    from iqgraph.stores import Key

EndOffset = Callable[[str, int], int | None]


class OwnerFieldCalls(Protocol):
    """What runs owner-side fields over this node's partitions (``app.owner.runner.OwnerFieldRunner``)."""

    async def call(
        self, field: str, calls: Sequence[tuple[Key, tuple[int, ...]]], caller: Principal
    ) -> Answer[list[Any]]:
        """Return the field's value per (key, partitions), run here for caller."""
        ...


class LocalPartitions:
    """Read the partition databases this node hosts, as told; report positions and lags."""

    def __init__(
        self,
        app: App,
        partitions: Mapping[str, Mapping[int, PartitionStores]],
        *,
        node_id: str = "node-0",
        url: str = "http://127.0.0.1:8000",
        end_offset: EndOffset | None = None,
        state: Callable[[], str] | None = None,
        role: Callable[[str, int], str] | None = None,
        pipeline: Callable[[], PipelineInfo | None] | None = None,
        stall_timeout_s: float | None = None,
        clock: Callable[[], float] = time.time,
        owner: Callable[[LocalPartitions], OwnerFieldCalls] | None = None,
        kafka_away_since: Callable[[], float | None] | None = None,
    ) -> None:
        """Args (beyond the module's docstring): owner makes the runner of the app's owner-side fields over
        these partitions (``app.owner.runner.OwnerFieldRunner``; None: this node runs none); kafka_away_since
        says since when this node has not reached Kafka (None: it does), which every answer carries."""
        self.app = app
        self.partitions = partitions
        self.node_id = node_id
        self.url = url
        self._end_offset = end_offset or (lambda topic, partition: None)
        self._state = state or (lambda: "RUNNING")
        self._role = role or (lambda topic, partition: "active")
        self._pipeline = pipeline or (lambda: None)
        self.stall_timeout_s = stall_timeout_s
        self._clock = clock
        self._owner = owner
        self.kafka_away_since = kafka_away_since or (lambda: None)

    # -- what this node hosts -----------------------------------------------------------------------

    def node(self) -> NodeInfo:
        """Return this node with the role, state and lag of every partition it hosts."""
        infos = []
        now = self._clock()
        for topic, hosted in sorted(self.partitions.items()):
            for p, stores in sorted(hosted.items()):
                db = stores.db
                applied = db.next_offset()
                end = max(self._end_offset(topic, p) or 0, applied)
                since = max(now - db.applied_at, 0.0)
                stalled = self.stall_timeout_s is not None and end > applied and since > self.stall_timeout_s
                infos.append(
                    PartitionInfo(topic, p, self._role(topic, p), db.state.value, applied, end, since, stalled, db.lost)
                )
        return NodeInfo(self.node_id, self.url, self._state(), tuple(infos), self._pipeline())

    def replica(self, topic: str, partition: int) -> tuple[str, int | None] | None:
        """Return the state and lag of this node's copy of topic-partition (None: not hosted)."""
        stores = self.partitions.get(topic, {}).get(partition)
        if stores is None:
            return None
        return stores.db.state.value, self._lag(topic, partition, stores.db.next_offset())

    def _lag(self, topic: str, partition: int, applied: int) -> int | None:
        end = self._end_offset(topic, partition)
        return None if end is None else max(end - applied, 0)

    def hosted(self, definition: StoreDefinition, partition: int) -> PartitionStores:
        """Return the stores of a partition this node hosts and can read now; raise why not (coded)."""
        stores = self.partitions.get(definition.topic, {}).get(partition)
        if stores is None:
            raise StoreMigratedError(f"partition {definition.topic}-{partition} is not hosted by {self.node_id}")
        if stores.db.state is not PartitionState.RUNNING:
            raise stores.db.not_queryable(f" on {self.node_id}")
        return stores

    def positions(
        self, definition: StoreDefinition, partitions: Sequence[int]
    ) -> tuple[dict[int, PartitionStores | StoreError], dict[int, int], dict[int, int]]:
        """Return the stores of each partition (or why it cannot be read), positions and lags, before any data."""
        stores: dict[int, PartitionStores | StoreError] = {}
        positions: dict[int, int] = {}
        lags: dict[int, int] = {}
        for p in partitions:
            try:
                found = stores[p] = self.hosted(definition, p)
            except StoreError as exc:
                stores[p] = exc
                continue
            positions[p] = found.db.next_offset()
            lag = self._lag(definition.topic, p, positions[p])
            if lag is not None:
                lags[p] = lag
        return stores, positions, lags

    # -- reads ----------------------------------------------------------------------------------------

    def read_states(self, store: str, reads: Sequence[Read]) -> Answer[list[Any]]:
        """Return each read's state combined over its partitions (an exception in place of a failed one)."""
        definition = definition_of(self.app, store)
        results: list[Any] = [None] * len(reads)
        positions: dict[int, int] = {}
        lags: dict[int, int] = {}
        combine: Callable[[Any, Any], Any] | None = None  # made when a read needs several partitions
        for partitions, indexes in _by_partitions(reads):
            stores, read_at, lagging = self.positions(definition, partitions)
            failed = None
            for found in stores.values():
                if isinstance(found, StoreError):
                    failed = found
                    break
            if failed is not None:
                for i in indexes:
                    results[i] = failed
                continue
            positions |= read_at
            lags |= lagging
            requests = [reads[i][0] for i in indexes]
            merged: list[Any] | None = None
            for p in partitions:
                values = cast("PartitionStores", stores[p]).store(store).read_states(requests)
                if merged is None:
                    merged = values
                    continue
                combine = combine or combiner(definition)
                merged = [combine(a, b) for a, b in zip(merged, values, strict=True)]
            for i, value in zip(indexes, merged or [None] * len(indexes), strict=True):
                results[i] = value
        return Answer(results, positions, lags, self.kafka_away_since())

    def scan_pages(
        self, store: str, scan: Scan, positions: Mapping[int, str | None], first: int, partitions: Sequence[int]
    ) -> Answer[dict[int, Page[Any] | StoreError]]:
        """Return one page of states per given partition, each resumed at its position (or why it failed)."""
        definition = definition_of(self.app, store)
        stores, read_at, lags = self.positions(definition, partitions)
        pages: dict[int, Page[Any] | StoreError] = {}
        for p, found in stores.items():
            try:
                pages[p] = (
                    found if isinstance(found, StoreError) else found.store(store).page(scan, first, positions.get(p))
                )
            except StoreError as exc:
                pages[p] = exc
        return Answer(pages, read_at, lags, self.kafka_away_since())

    def count(
        self, store: str, partitions: Sequence[int], exact: bool = True
    ) -> Answer[dict[int, int | Distinct | StoreError]]:
        """Return the entries in the given partitions: exact for key-value and window stores, else estimates.

        exact=False: RocksDB's estimate (fast; grows with updates). A bloom store's count is always its
        filters' estimate: an exact count would need the keys. A store keyed by a column (a key in several
        partitions) gives what counting the union needs instead of a number (``stores.distinct``).
        """
        definition = definition_of(self.app, store)
        distinct = not definition.co_partitioned  # a key may be in several partitions: count their union
        stores, read_at, lags = self.positions(definition, partitions)
        counts: dict[int, int | Distinct | StoreError] = {}
        for p, found in stores.items():
            try:
                counts[p] = found if isinstance(found, StoreError) else found.store(store).read_count(exact, distinct)
            except StoreError as exc:
                counts[p] = exc
        return Answer(counts, read_at, lags, self.kafka_away_since())

    # -- owner-side fields ----------------------------------------------------------------------------

    @cached_property
    def owner_fields(self) -> OwnerFieldCalls:
        """Return the runner of the app's owner-side fields over these partitions (made on first use)."""
        if self._owner is None:
            raise ApiError("this node's partitions run no owner-side fields", INTERNAL)
        return self._owner(self)

    async def call(
        self, field: str, calls: Sequence[tuple[Key, tuple[int, ...]]], caller: Principal = ANONYMOUS
    ) -> Answer[list[Any]]:
        """Return an owner-side field's value per (key, partitions), run on this node for caller."""
        return await self.owner_fields.call(field, calls, caller)


def _by_partitions(reads: Sequence[Read]) -> Iterable[tuple[tuple[int, ...], list[int]]]:
    """Return the indexes of reads grouped by the partitions they read (sorted): a caller's reads of one batch come
    in a row, with the same partitions, and a point read or a batch of one partition is one group at once."""
    first = reads[0][1] if reads else ()
    if all(partitions == first for _, partitions in reads):
        return [(tuple(sorted(first)), list(range(len(reads))))] if reads else []
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    last: Sequence[int] | None = None
    bucket: list[int] = []
    for i, (_, partitions) in enumerate(reads):
        if partitions != last:
            bucket, last = groups[tuple(sorted(partitions))], partitions
        bucket.append(i)
    return list(groups.items())
