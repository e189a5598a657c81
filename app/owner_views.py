"""Read-only views of the stores an owner-side field's function may read, on the node running it.

``views.kv(store)``, ``views.window(store)`` and ``views.bloom(store)`` return views with read methods
only (there is nothing to write with): values are finalized (an average, not its sum and count), as a
client reads them. Which partitions a view reads:

- a store of the routing store's topic, or of a topic co-partitioned with it (the same partition count and
  key format), keyed by the record key: the partition(s) of the call's key, hosted here — the key, and any
  key that lives with it;
- a global table: every partition of its topic (each node holds them all);
- anything else (a store keyed by a column, a topic partitioned otherwise) has no local copy of the key's
  data: the view refuses it with OwnerViewError (the function fails: INTERNAL, logged).

A partition that is not hosted here or not queryable raises the stores' STORE_MIGRATED / STORE_NOT_READY
errors, which the routing core retries on another replica, as for a lookup.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from iqgraph.app.local_partitions import FAR_FUTURE, FAR_PAST, definition_of
from iqgraph.app.merging import combiner, final_window, finalize, key_codec, merge_windows
from iqgraph.stores import Key, KeyCodec, PartitionStores, StoreKind, WindowedValue
from iqgraph.stores.aggregations import aggregation_named

if TYPE_CHECKING:
    from iqgraph.app.local_partitions import LocalPartitions
    from iqgraph.streaming.definitions import StoreDefinition

DEFAULT_LIMIT = 100


class OwnerViewError(Exception):
    """A store an owner-side field cannot read on the key's owner (no local copy of the key's data)."""


class _View:
    """A store's partitions this call reads, and how their states combine and finalize."""

    __slots__ = ("_codec", "_combine", "_definition", "_partitions")

    def __init__(self, definition: StoreDefinition, partitions: Sequence[PartitionStores], codec: KeyCodec) -> None:
        self._definition = definition
        self._partitions = tuple(partitions)
        self._combine = combiner(definition)
        self._codec = codec

    def _merged(self, read: Callable[[PartitionStores], list[Any]]) -> list[Any]:
        merged: list[Any] | None = None
        for stores in self._partitions:
            values = read(stores)
            merged = values if merged is None else [self._combine(a, b) for a, b in zip(merged, values, strict=True)]
        return merged or []


class KeyValueView(_View):
    """Read a key-value store: ``get``, ``get_many``, ``range``, ``prefix``."""

    __slots__ = ()

    def get(self, key: Key) -> Any:
        """Return the value of key (None if absent)."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[Key]) -> list[Any]:
        """Return the value of each key, in key order (None where absent)."""
        name = self._definition.name
        states = self._merged(lambda stores: stores.kv(name).multi_get(list(keys), states=True))
        return [finalize(self._definition, s) for s in states] if states else [None] * len(keys)

    def range(self, from_key: Key | None = None, to_key: Key | None = None, limit: int = DEFAULT_LIMIT) -> list[Any]:
        """Return up to limit (key, value) with from_key <= key <= to_key (None: open), in key order."""
        name = self._definition.name
        return self._entries(lambda stores: stores.kv(name).range(from_key, to_key, limit, states=True).items, limit)

    def prefix(self, prefix: str, limit: int = DEFAULT_LIMIT) -> list[Any]:
        """Return up to limit (key, value) whose string key starts with prefix, in key order."""
        name = self._definition.name
        return self._entries(lambda stores: stores.kv(name).prefix(prefix, limit, states=True).items, limit)

    def _entries(self, page: Callable[[PartitionStores], list[Any]], limit: int) -> list[Any]:
        encode = self._codec.encode
        merged: list[list[Any]] = []
        for key, state in heapq.merge(*(page(s) for s in self._partitions), key=lambda e: encode(e[0])):
            if merged and merged[-1][0] == key:
                merged[-1][1] = self._combine(merged[-1][1], state)
            elif len(merged) == limit:
                break
            else:
                merged.append([key, state])
        return [(key, finalize(self._definition, state)) for key, state in merged]


class WindowView(_View):
    """Read a window store: ``fetch``."""

    __slots__ = ()

    def fetch(self, key: Key, time_from: int | None = None, time_to: int | None = None) -> list[WindowedValue]:
        """Return key's windows (key, start, end, value; times in epoch ms) with start in the range, oldest first."""
        lo, hi = FAR_PAST if time_from is None else time_from, FAR_FUTURE if time_to is None else time_to
        name, agg = self._definition.name, aggregation_named(self._definition.aggregation)
        windows: list[WindowedValue] = []
        for stores in self._partitions:
            windows = merge_windows(agg, windows, stores.window(name).fetch(key, lo, hi, states=True))
        return [final_window(agg, w) for w in windows]


class BloomView(_View):
    """Read a bloom store: ``might_contain``, ``might_contain_many``."""

    __slots__ = ()

    def might_contain(self, key: Key) -> bool:
        """Return False if key was never added, True if it probably was."""
        return self.might_contain_many([key])[0]

    def might_contain_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return, per key, whether it was probably added."""
        name = self._definition.name
        found = self._merged(lambda stores: list(stores.bloom(name).might_contain_many(list(keys))))
        return [bool(f) for f in found] if found else [False] * len(keys)


class StoreViews:
    """The read-only views one call of an owner-side field gets: the stores on this node, for its key."""

    __slots__ = ("_cache", "_local", "_partitions", "_routing")

    def __init__(self, local: LocalPartitions, routing: StoreDefinition, partitions: Sequence[int]) -> None:
        self._local = local
        self._routing = routing
        self._partitions = tuple(partitions)
        self._cache: dict[tuple[str, StoreKind], Any] = {}

    def kv(self, store: str) -> KeyValueView:
        """Return a read-only view of the key-value store called store."""
        return self._view(store, StoreKind.KEY_VALUE, KeyValueView)

    def window(self, store: str) -> WindowView:
        """Return a read-only view of the window store called store."""
        return self._view(store, StoreKind.WINDOW, WindowView)

    def bloom(self, store: str) -> BloomView:
        """Return a read-only view of the bloom store called store."""
        return self._view(store, StoreKind.BLOOM, BloomView)

    def _view(self, store: str, kind: StoreKind, cls: type[_View]) -> Any:
        found = self._cache.get((store, kind))
        if found is None:
            definition = definition_of(self._local.app, store, kind)
            # the partitions' own checks: not hosted -> STORE_MIGRATED, not queryable -> STORE_NOT_READY
            hosted = [self._local._hosted(definition, p) for p in self._partitions_of(definition)]
            found = self._cache[store, kind] = cls(definition, hosted, key_codec(self._local.app, definition))
        return found

    def _partitions_of(self, definition: StoreDefinition) -> Sequence[int]:
        app = self._local.app
        topic, routing = app.topic(definition.topic), app.topic(self._routing.topic)
        if topic.global_table:
            return range(topic.partitions)
        if not definition.co_partitioned:
            raise OwnerViewError(
                f"store {definition.name!r} is keyed by column {definition.key!r}: its keys are in every partition, "
                f"not with the key of {self._routing.name!r}; an owner-side field reads stores keyed by the record "
                "key of a co-partitioned topic, and global tables"
            )
        if (topic.partitions, topic.key_format) != (routing.partitions, routing.key_format):
            raise OwnerViewError(
                f"store {definition.name!r} reads topic {topic.name!r}, not co-partitioned with {routing.name!r} "
                f"({topic.partitions} vs {routing.partitions} partitions): the key's data is not on this node"
            )
        return self._partitions
