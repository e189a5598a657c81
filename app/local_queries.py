"""StoreQueries over the partitions this node hosts (schema.types.StoreQueries, answered locally).

Construct with ``LocalStoreQueries(app, value_types, partitions, node_id=…, url=…, end_offsets=…)``:
``partitions`` maps topic → partition → PartitionStores and may change as partitions move (the
runner's live ``partitions`` dict); ``end_offsets(topic, partitions)`` gives each partition's end offset
for lag reporting (None: report the applied offset as the end).

Keys are routed with the producers' partitioner. A store keyed by another column than the record key
(not co-partitioned) may hold partial states of one key in several partitions: those are read from
every partition and merged, which is why every read here asks the views for states and finalizes them
only after merging. A partition that is not queryable yet is retried with backoff until a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from app.scatter import Merge, decode_positions, merge_pages, merged_page
from schema.types import KeyQueryMetadata, NodeInfo, PartitionInfo, StoreInfo
from stores import (
    Key,
    KeyCodec,
    Page,
    PartitionStores,
    StoreError,
    StoreKind,
    StoreMigratedError,
    StoreNotReadyError,
    UnknownStoreError,
    WindowedValue,
)
from stores.aggregations import Aggregation, aggregation_named, merge_state
from stores.codecs import encode_int64
from streaming.definitions import App, StoreDefinition
from streaming.partitioner import partition_for

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

T = TypeVar("T")
EndOffsets = Callable[[str, Sequence[int]], Mapping[int, int]]


@dataclass(frozen=True)
class RetryPolicy:
    """How long a lookup waits for a partition that is not queryable yet (invariant 6)."""

    deadline_ms: int = 2_000
    first_backoff_ms: int = 25
    max_backoff_ms: int = 400


class LocalStoreQueries:
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
    ) -> None:
        self.app = app
        self.partitions = partitions
        self.node_id = node_id
        self.url = url
        self.end_offsets = end_offsets
        self.retry = retry or RetryPolicy()
        self._state = state or (lambda: "RUNNING")
        self._infos = [self._store_info(s, value_types[s.name]) for s in app.stores]

    # -- metadata -------------------------------------------------------------------------------

    def _store_info(self, store: StoreDefinition, value_type: DataType) -> StoreInfo:
        topic = self.app.topic(store.topic)
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

    def stores(self) -> Sequence[StoreInfo]:
        """Return every store of the app."""
        return self._infos

    def node(self) -> NodeInfo:
        """Return this node with the state and lag of every partition it hosts."""
        infos = []
        for topic, hosted in sorted(self.partitions.items()):
            owned = sorted(hosted)
            ends = self.end_offsets(topic, owned) if self.end_offsets else {}
            for p in owned:
                db = hosted[p].db
                applied = db.next_offset()
                infos.append(PartitionInfo(topic, p, "active", db.state.value, applied, ends.get(p, applied)))
        return NodeInfo(self.node_id, self.url, self._state(), tuple(infos))

    def nodes(self) -> Sequence[NodeInfo]:
        """Return the nodes known here: only this one."""
        return [self.node()]

    def definition(self, store: str) -> StoreDefinition:
        """Return the definition of store; raise UnknownStoreError naming the known stores."""
        try:
            return self.app.store(store)
        except KeyError:
            known = ", ".join(s.name for s in self.app.stores)
            raise UnknownStoreError(f"no store named {store!r} (stores: {known})") from None

    def partition_of(self, definition: StoreDefinition, key: Key) -> int | None:
        """Return the partition holding key of a co-partitioned store (None: any partition may)."""
        topic = self.app.topic(definition.topic)
        KeyCodec(definition.resolved_key_type(topic)).check(key)
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

    # -- routing and retries ----------------------------------------------------------------------

    def _hosted(self, definition: StoreDefinition, partition: int) -> PartitionStores:
        stores = self.partitions.get(definition.topic, {}).get(partition)
        if stores is None:
            raise StoreMigratedError(f"partition {definition.topic}-{partition} is not hosted by {self.node_id}")
        return stores

    def _all_hosted(self, definition: StoreDefinition) -> dict[int, PartitionStores]:
        hosted = dict(self.partitions.get(definition.topic, {}))
        topic = self.app.topic(definition.topic)
        missing = sorted(set(range(topic.partitions)) - set(hosted))
        if missing:
            raise StoreMigratedError(f"partitions {missing} of {topic.name} are not hosted by {self.node_id}")
        return hosted

    async def _retrying(self, read: Callable[[], T]) -> T:
        """Run read, retrying with backoff while a partition is not ready, until the deadline."""
        deadline = time.monotonic() + self.retry.deadline_ms / 1000
        backoff = self.retry.first_backoff_ms / 1000
        while True:
            try:
                return read()
            except StoreNotReadyError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                await asyncio.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, self.retry.max_backoff_ms / 1000)

    def _aggregation(self, definition: StoreDefinition) -> Aggregation:
        return aggregation_named("latest" if definition.kind is StoreKind.BLOOM else definition.aggregate.kind)

    # -- point lookups ---------------------------------------------------------------------------

    async def _per_partition(
        self,
        definition: StoreDefinition,
        keys: Sequence[Key],
        read: Callable[[PartitionStores, list[Key], list[int]], list[Any]],
        combine: Callable[[Any, Any], Any],
    ) -> list[Any]:
        """Return read's results per key: one call per partition, combined across partitions if needed."""
        results: list[Any] = [None] * len(keys)
        groups: dict[int | None, list[int]] = defaultdict(list)
        for i, key in enumerate(keys):
            try:
                groups[self.partition_of(definition, key)].append(i)
            except StoreError as exc:
                results[i] = exc
        for partition, indexes in groups.items():
            try:
                values = await self._retrying(
                    partial(self._read_group, definition, partition, keys, indexes, read, combine)
                )
            except StoreError as exc:
                values = [exc] * len(indexes)
            for i, value in zip(indexes, values, strict=True):
                results[i] = value
        return results

    def _read_group(
        self,
        definition: StoreDefinition,
        partition: int | None,
        keys: Sequence[Key],
        indexes: list[int],
        read: Callable[[PartitionStores, list[Key], list[int]], list[Any]],
        combine: Callable[[Any, Any], Any],
    ) -> list[Any]:
        batch = [keys[i] for i in indexes]
        if partition is not None:
            return read(self._hosted(definition, partition), batch, indexes)
        merged: list[Any] | None = None
        for stores in self._all_hosted(definition).values():
            values = read(stores, batch, indexes)
            merged = values if merged is None else [combine(a, b) for a, b in zip(merged, values, strict=True)]
        return merged or [None] * len(batch)

    async def get_many(self, store: str, keys: Sequence[Key]) -> list[Any]:
        """Return the value of each key of a key-value store, in key order (None when absent)."""
        definition = self._kind(store, StoreKind.KEY_VALUE)
        agg = self._aggregation(definition)
        states = await self._per_partition(
            definition, keys, lambda s, b, _: s.kv(store).multi_get(b, states=True), lambda a, b: merge_state(agg, a, b)
        )
        return [s if isinstance(s, Exception) or s is None else agg.finalize(s) for s in states]

    async def might_contain_many(self, store: str, keys: Sequence[Key]) -> list[Any]:
        """Return, per key of a bloom store, whether it was probably added."""
        definition = self._kind(store, StoreKind.BLOOM)
        return await self._per_partition(
            definition, keys, lambda s, b, _: s.bloom(store).might_contain_many(b), lambda a, b: a or b
        )

    async def fetch_many(self, store: str, requests: Sequence[tuple[Key, int, int]]) -> list[Any]:
        """Return, per (key, time_from, time_to), the key's windows with start in that range."""
        definition = self._kind(store, StoreKind.WINDOW)
        agg = self._aggregation(definition)

        def read(stores: PartitionStores, batch: list[Key], indexes: list[int]) -> list[Any]:
            view = stores.window(store)
            return [
                view.fetch(k, requests[i][1], requests[i][2], states=True) for k, i in zip(batch, indexes, strict=True)
            ]

        keys = [key for key, _, _ in requests]
        found = await self._per_partition(definition, keys, read, lambda a, b: _merge_windows(agg, a, b))
        return [f if isinstance(f, Exception) else [_final_window(agg, w) for w in f] for f in found]

    def _kind(self, store: str, kind: StoreKind) -> StoreDefinition:
        definition = self.definition(store)
        if definition.kind is not kind:
            raise UnknownStoreError(f"store {store!r} is a {definition.kind.value} store, not {kind.value}")
        return definition

    # -- scans -----------------------------------------------------------------------------------

    async def _scan(
        self,
        definition: StoreDefinition,
        first: int,
        after: str | None,
        read: Callable[[PartitionStores, str | None], Page[T]],
        merge: Merge[T],
    ) -> Page[T]:
        before = decode_positions(after)

        def pages() -> dict[str, Page[T]]:
            hosted = self._all_hosted(definition)
            return {
                str(p): read(s, before.get(str(p))) for p, s in hosted.items() if before.get(str(p), "") is not None
            }

        found = await self._retrying(pages)
        items, positions = merge_pages(found, first, merge)
        return merged_page(items, positions, before)

    def _kv_merge(self, definition: StoreDefinition, codec: KeyCodec) -> Merge[tuple[Key, Any]]:
        agg = self._aggregation(definition)
        return Merge(
            sort_key=lambda item: codec.encode(item[0]),
            position_of=lambda item: codec.encode(item[0]),
            combine=lambda a, b: (a[0], merge_state(agg, a[1], b[1])),
        )

    async def _kv_scan(
        self, store: str, first: int, after: str | None, read: Callable[[Any, int, str | None], Page[tuple[Key, Any]]]
    ) -> Page[tuple[Key, Any]]:
        definition = self._kind(store, StoreKind.KEY_VALUE)
        codec = KeyCodec(definition.resolved_key_type(self.app.topic(definition.topic)))
        agg = self._aggregation(definition)
        page = await self._scan(
            definition, first, after, lambda s, a: read(s.kv(store), first, a), self._kv_merge(definition, codec)
        )
        return Page([(k, agg.finalize(v)) for k, v in page.items], page.next_cursor)

    async def range(
        self, store: str, from_key: Key | None, to_key: Key | None, first: int, after: str | None
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) with from_key <= key <= to_key, in key order, over all partitions."""
        return await self._kv_scan(store, first, after, lambda kv, n, a: kv.range(from_key, to_key, n, a, states=True))

    async def prefix(self, store: str, prefix: str, first: int, after: str | None) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) whose string key starts with prefix, over all partitions."""
        return await self._kv_scan(store, first, after, lambda kv, n, a: kv.prefix(prefix, n, a, states=True))

    async def approximate_count(self, store: str) -> int:
        """Return about how many keys the store holds over all partitions."""
        definition = self.definition(store)

        def count() -> int:
            hosted = self._all_hosted(definition).values()
            if definition.kind is StoreKind.KEY_VALUE:
                return sum(s.kv(store).approximate_num_entries() for s in hosted)
            if definition.kind is StoreKind.BLOOM:
                return sum(s.bloom(store).approximate_count() for s in hosted)
            return sum(s.db.family(store).property_int_value("rocksdb.estimate-num-keys") or 0 for s in hosted)

        return await self._retrying(count)

    def _window_merge(self, definition: StoreDefinition, by_time: bool) -> Merge[WindowedValue]:
        codec = KeyCodec(definition.resolved_key_type(self.app.topic(definition.topic)))
        agg = self._aggregation(definition)

        def window_key(w: WindowedValue) -> bytes:
            return codec.encode_window_key(w.key, w.start)

        def combine(a: WindowedValue, b: WindowedValue) -> WindowedValue:
            return WindowedValue(a.key, a.start, a.end, merge_state(agg, a.value, b.value))

        if by_time:

            def index_key(w: WindowedValue) -> bytes:
                return encode_int64(w.start) + window_key(w)

            return Merge(index_key, index_key, combine)
        return Merge(window_key, window_key, combine)

    async def fetch_all(
        self, store: str, time_from: int, time_to: int, first: int, after: str | None
    ) -> Page[WindowedValue]:
        """Return a page of every key's windows with start in [time_from, time_to], by start then key."""
        definition = self._kind(store, StoreKind.WINDOW)
        agg = self._aggregation(definition)
        page = await self._scan(
            definition,
            first,
            after,
            lambda s, a: s.window(store).fetch_all(time_from, time_to, first, a, states=True),
            self._window_merge(definition, by_time=True),
        )
        return Page([_final_window(agg, w) for w in page.items], page.next_cursor)

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
        definition = self._kind(store, StoreKind.WINDOW)
        agg = self._aggregation(definition)
        page = await self._scan(
            definition,
            first,
            after,
            lambda s, a: s.window(store).fetch_range(from_key, to_key, time_from, time_to, first, a, states=True),
            self._window_merge(definition, by_time=False),
        )
        return Page([_final_window(agg, w) for w in page.items], page.next_cursor)


def _merge_windows(agg: Aggregation, a: list[WindowedValue], b: list[WindowedValue]) -> list[WindowedValue]:
    by_start = {w.start: w for w in a}
    for w in b:
        old = by_start.get(w.start)
        by_start[w.start] = (
            w if old is None else WindowedValue(w.key, w.start, w.end, merge_state(agg, old.value, w.value))
        )
    return [by_start[s] for s in sorted(by_start)]


def _final_window(agg: Aggregation, window: WindowedValue) -> WindowedValue:
    return WindowedValue(window.key, window.start, window.end, agg.finalize(window.value))
