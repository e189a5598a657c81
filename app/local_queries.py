"""StoreQueries over the partitions this node hosts (schema.types.StoreQueries, answered locally).

Construct with ``LocalStoreQueries(app, value_types, partitions, node_id=…, url=…, end_offsets=…)``:
``partitions`` maps topic → partition → PartitionStores and may change as partitions move (the
runner's live ``partitions`` dict); ``end_offsets(topic, partitions)`` gives each partition's end offset
for lag reporting (None: report the applied offset as the end).

Two levels: ``lookup_states`` and ``scan_pages`` read mergeable states, optionally from a given set of
partitions only (what the cluster layer routes here); the StoreQueries methods on top read every
partition of the topic, combine and finalize (app.merging). Keys are routed with the producers'
partitioner; a partition that is not queryable yet is retried with backoff until a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from iqgraph.app.merging import Request, combiner, finalize, finalize_items, key_codec, scan_merge
from iqgraph.app.point_lookups import PointLookups
from iqgraph.app.scatter import Position, decode_positions, merge_pages, merged_page
from iqgraph.schema.types import KeyQueryMetadata, NodeInfo, PartitionInfo, Scan, StoreInfo
from iqgraph.stores import (
    Key,
    Page,
    PartitionStores,
    StoreError,
    StoreKind,
    StoreMigratedError,
    StoreNotReadyError,
    UnknownStoreError,
    WindowedValue,
)
from iqgraph.streaming.definitions import App, StoreDefinition
from iqgraph.streaming.partitioner import partition_for

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

T = TypeVar("T")
EndOffsets = Callable[[str, Sequence[int]], Mapping[int, int]]
FAR_PAST, FAR_FUTURE = -(1 << 62), 1 << 62


@dataclass(frozen=True)
class RetryPolicy:
    """How long a lookup waits for a partition that is not queryable yet (invariant 6)."""

    deadline_ms: int = 2_000
    first_backoff_ms: int = 25
    max_backoff_ms: int = 400


def store_info(app: App, store: StoreDefinition, value_type: DataType) -> StoreInfo:
    """Return the metadata the schema shows for a store."""
    topic = app.topic(store.topic)
    return StoreInfo(
        name=store.name,
        kind=store.kind.value,
        key_type=store.resolved_key_type(topic),
        value_type=value_type,
        topic=topic.name,
        partitions=topic.partitions,
        co_partitioned=store.co_partitioned,
        description=store.description,
        aggregation=None if store.kind is StoreKind.BLOOM else store.aggregate.kind,
        window_size_ms=store.window.size_ms if store.window else None,
        window_advance_ms=store.window.advance if store.window else None,
        false_positive_rate=store.bloom.error_rate if store.bloom else None,
    )


class LocalStoreQueries(PointLookups):
    """Answer store queries from the partition databases this node hosts."""

    def __init__(
        self,
        app: App,
        value_types: Mapping[str, DataType],
        partitions: Mapping[str, Mapping[int, PartitionStores]],
        *,
        node_id: str = "node-0",
        url: str = "http://127.0.0.1:8000",
        end_offsets: EndOffsets | None = None,
        retry: RetryPolicy | None = None,
        state: Callable[[], str] | None = None,
        role: Callable[[str, int], str] | None = None,
    ) -> None:
        self.app = app
        self.partitions = partitions
        self.node_id = node_id
        self.url = url
        self.end_offsets = end_offsets
        self.retry = retry or RetryPolicy()
        self._state = state or (lambda: "RUNNING")
        self._role = role or (lambda topic, partition: "active")
        self._infos = [store_info(app, s, value_types[s.name]) for s in app.stores]
        # Per store: its topic and key codec, looked up once rather than for every key routed.
        self._routes = {s.name: (app.topic(s.topic), key_codec(app, s)) for s in app.stores}

    # -- metadata -------------------------------------------------------------------------------

    def stores(self) -> Sequence[StoreInfo]:
        """Return every store of the app."""
        return self._infos

    def node(self) -> NodeInfo:
        """Return this node with the role, state and lag of every partition it hosts."""
        infos = []
        for topic, hosted in sorted(self.partitions.items()):
            owned = sorted(hosted)
            ends = self.end_offsets(topic, owned) if self.end_offsets and owned else {}
            for p in owned:
                db = hosted[p].db
                applied = db.next_offset()
                role = self._role(topic, p)
                infos.append(PartitionInfo(topic, p, role, db.state.value, applied, ends.get(p, applied)))
        return NodeInfo(self.node_id, self.url, self._state(), tuple(infos))

    def nodes(self) -> Sequence[NodeInfo]:
        """Return the nodes known here: only this one."""
        return [self.node()]

    def definition(self, store: str, kind: StoreKind | None = None) -> StoreDefinition:
        """Return the definition of store (of kind, if given); raise UnknownStoreError otherwise."""
        try:
            definition = self.app.store(store)
        except KeyError:
            known = ", ".join(s.name for s in self.app.stores)
            raise UnknownStoreError(f"no store named {store!r} (stores: {known})") from None
        if kind is not None and definition.kind is not kind:
            raise UnknownStoreError(f"store {store!r} is a {definition.kind.value} store, not {kind.value}")
        return definition

    def partition_of(self, definition: StoreDefinition, key: Key) -> int | None:
        """Return the partition holding key of a co-partitioned store (None: any partition may)."""
        topic, codec = self._routes[definition.name]
        codec.check(key)
        if not definition.co_partitioned:
            return None
        return partition_for(key, topic.partitions, topic.key_format, self.app.kafka.partitioner)

    def key_metadata(self, store: str, key: Key) -> KeyQueryMetadata:
        """Return where key of store lives."""
        definition = self.definition(store)
        partition = self.partition_of(definition, key)
        hosted = self.partitions.get(definition.topic, {})
        active = self.node_id if (partition in hosted if partition is not None else bool(hosted)) else None
        return KeyQueryMetadata(store, partition, active)

    def placement(self, store: str) -> list[KeyQueryMetadata]:
        """Return, per partition of store, this node if it hosts the partition."""
        definition = self.definition(store)
        hosted = self.partitions.get(definition.topic, {})
        count = self.app.topic(definition.topic).partitions
        return [KeyQueryMetadata(store, p, self.node_id if p in hosted else None) for p in range(count)]

    # -- hosting and retries ----------------------------------------------------------------------

    def hosted(self, definition: StoreDefinition, partition: int) -> PartitionStores:
        """Return the stores of a partition hosted here; raise StoreMigratedError if it is not."""
        stores = self.partitions.get(definition.topic, {}).get(partition)
        if stores is None:
            raise StoreMigratedError(f"partition {definition.topic}-{partition} is not hosted by {self.node_id}")
        return stores

    def _wanted(self, definition: StoreDefinition, partitions: Collection[int] | None) -> list[int]:
        return sorted(range(self.app.topic(definition.topic).partitions) if partitions is None else partitions)

    async def retrying(self, read: Callable[[], T]) -> T:
        """Run read, retrying with backoff while a partition is not ready, until the deadline."""
        deadline = time.monotonic() + self.retry.deadline_ms / 1000
        backoff = self.retry.first_backoff_ms / 1000
        while True:
            try:
                return read()
            except StoreNotReadyError as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or isinstance(exc, StoreMigratedError):
                    raise
                await asyncio.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, self.retry.max_backoff_ms / 1000)

    # -- state level ------------------------------------------------------------------------------

    def _read(self, stores: PartitionStores, definition: StoreDefinition, requests: list[Request]) -> list[Any]:
        name = definition.name
        keys = [r[0] for r in requests]
        if definition.kind is StoreKind.KEY_VALUE:
            return stores.kv(name).multi_get(keys, states=True)
        if definition.kind is StoreKind.BLOOM:
            return list(stores.bloom(name).might_contain_many(keys))
        view = stores.window(name)
        return [
            view.fetch(k, FAR_PAST if lo is None else lo, FAR_FUTURE if hi is None else hi, states=True)
            for k, lo, hi in requests
        ]

    def _read_group(self, definition: StoreDefinition, partitions: list[int], requests: list[Request]) -> list[Any]:
        combine = combiner(definition)
        merged: list[Any] | None = None
        for partition in partitions:
            values = self._read(self.hosted(definition, partition), definition, requests)
            merged = values if merged is None else [combine(a, b) for a, b in zip(merged, values, strict=True)]
        return merged if merged is not None else [None] * len(requests)

    async def lookup_states(
        self, store: str, requests: Sequence[Request], partitions: Collection[int] | None = None
    ) -> list[Any]:
        """Return the state of each lookup (an exception in place of a failed one), from partitions only."""
        definition = self.definition(store)
        wanted = self._wanted(definition, partitions)
        results: list[Any] = [None] * len(requests)
        groups: dict[int | None, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            try:
                partition = self.partition_of(definition, request[0])
                if partition is not None and partition not in wanted:
                    raise StoreMigratedError(f"partition {definition.topic}-{partition} is not served here")
                groups[partition].append(i)
            except StoreError as exc:
                results[i] = exc
        for partition, indexes in groups.items():
            batch = [requests[i] for i in indexes]
            group = wanted if partition is None else [partition]
            try:
                values = await self.retrying(partial(self._read_group, definition, group, batch))
            except StoreError as exc:
                values = [exc] * len(indexes)
            for i, value in zip(indexes, values, strict=True):
                results[i] = value
        return results

    def _page(
        self, stores: PartitionStores, definition: StoreDefinition, scan: Scan, first: int, after: str | None
    ) -> Page[Any]:
        a, name = scan.args, definition.name
        if scan.kind == "range":
            return stores.kv(name).range(a.get("from_key"), a.get("to_key"), first, after, states=True)
        if scan.kind == "prefix":
            return stores.kv(name).prefix(a["prefix"], first, after, states=True)
        window = stores.window(name)
        lo, hi = a.get("time_from", FAR_PAST), a.get("time_to", FAR_FUTURE)
        if scan.kind == "fetch_all":
            return window.fetch_all(lo, hi, first, after, states=True)
        return window.fetch_range(a.get("from_key"), a.get("to_key"), lo, hi, first, after, states=True)

    async def scan_pages(
        self,
        store: str,
        scan: Scan,
        positions: Mapping[str, Position],
        first: int,
        partitions: Collection[int] | None = None,
    ) -> dict[str, Page[Any]]:
        """Return one page of states per partition not yet exhausted, each resumed at its position."""
        definition = self.definition(store)
        wanted = [p for p in self._wanted(definition, partitions) if positions.get(str(p), "") is not None]

        def pages() -> dict[str, Page[Any]]:
            return {
                str(p): self._page(self.hosted(definition, p), definition, scan, first, positions.get(str(p)))
                for p in wanted
            }

        return await self.retrying(pages)

    # -- StoreQueries ---------------------------------------------------------------------------

    async def _lookup(self, store: str, kind: StoreKind, requests: Sequence[Request]) -> list[Any]:
        definition = self.definition(store, kind)
        return [finalize(definition, r) for r in await self.lookup_states(store, requests)]

    async def scan(self, store: str, scan: Scan, first: int, after: str | None) -> Page[Any]:
        """Return one merged page of a scan over every partition, values finalized."""
        definition = self.definition(store)
        before = decode_positions(after)
        pages = await self.scan_pages(store, scan, before, first)
        items, positions = merge_pages(pages, first, scan_merge(self.app, definition, scan))
        page = merged_page(items, positions, before)
        return Page(finalize_items(definition, scan, page.items), page.next_cursor)

    async def range(
        self, store: str, from_key: Key | None, to_key: Key | None, first: int, after: str | None
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) with from_key <= key <= to_key, in key order, over all partitions."""
        self.definition(store, StoreKind.KEY_VALUE)
        return await self.scan(store, Scan("range", {"from_key": from_key, "to_key": to_key}), first, after)

    async def prefix(self, store: str, prefix: str, first: int, after: str | None) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) whose string key starts with prefix, over all partitions."""
        self.definition(store, StoreKind.KEY_VALUE)
        return await self.scan(store, Scan("prefix", {"prefix": prefix}), first, after)

    async def fetch_all(
        self, store: str, time_from: int, time_to: int, first: int, after: str | None
    ) -> Page[WindowedValue]:
        """Return a page of every key's windows with start in [time_from, time_to], by start then key."""
        self.definition(store, StoreKind.WINDOW)
        return await self.scan(store, Scan("fetch_all", {"time_from": time_from, "time_to": time_to}), first, after)

    async def fetch_range(
        self,
        store: str,
        from_key: Key | None,
        to_key: Key | None,
        time_from: int,
        time_to: int,
        first: int,
        after: str | None,
    ) -> Page[WindowedValue]:
        """Return a page of windows of keys in [from_key, to_key] with start in the range, by key then time."""
        self.definition(store, StoreKind.WINDOW)
        args = {"from_key": from_key, "to_key": to_key, "time_from": time_from, "time_to": time_to}
        return await self.scan(store, Scan("fetch_range", args), first, after)

    async def count_states(self, store: str, partitions: Collection[int] | None = None) -> int:
        """Return the approximate number of keys in the given partitions (all by default)."""
        definition = self.definition(store)
        wanted = self._wanted(definition, partitions)

        def count() -> int:
            total = 0
            for p in wanted:
                stores = self.hosted(definition, p)
                if definition.kind is StoreKind.KEY_VALUE:
                    total += stores.kv(store).approximate_num_entries()
                elif definition.kind is StoreKind.BLOOM:
                    total += stores.bloom(store).approximate_count()
                else:
                    stores.db.check_queryable()
                    total += stores.db.family(store).property_int_value("rocksdb.estimate-num-keys") or 0
            return total

        return await self.retrying(count)

    async def approximate_count(self, store: str) -> int:
        """Return about how many keys the store holds over all partitions."""
        return await self.count_states(store)
