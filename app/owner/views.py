"""Read-only views of the stores an owner-side field's function may read, on the node running it.

The classes here implement streaming.types' Protocols (``iqgraph.StoreViews`` and its views), which is what the
function is written against.

``views.kv(store)``, ``views.window(store)`` and ``views.bloom(store)`` return views with read methods
only (there is nothing to write with): values are finalized (an average, not its sum and count; a user
aggregation's value, not its state), as a client reads them. Which partitions a view reads:

- a store of the routing store's topic, or of a topic co-partitioned with it (the same partition count and
  key format), keyed by the record key: the partition(s) of the call's key, hosted here — the key, and any
  key that lives with it;
- a global table: every partition of its topic (each node holds them all);
- anything else (a store keyed by a column, a topic partitioned otherwise) has no local copy of the key's
  data: the view refuses it with OwnerViewError (the function fails: INTERNAL, logged).

A partition that is not hosted here or not queryable raises the stores' STORE_MIGRATED / STORE_NOT_READY
errors, which the routing core retries on another replica, as for a lookup.

What "read-only" means: a view keeps only the stores' *read* methods (bound, per partition), never a
partition's stores or database handle, and has no write method; the views object keeps a closure that opens
views, not the node's partitions. That is an API guarantee, not a sandbox: Python code that digs through
dunder internals (a bound method's ``__self__``, a closure's cells) reaches the live stores, and nothing
stops it writing — the function is trusted code of the app, run in the node's process.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from iqgraph.app.catalog import FAR_FUTURE, FAR_PAST, definition_of
from iqgraph.app.query.merging import combiner, finalize, key_codec
from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.stores import BloomStore, Key, KeyCodec, KeyValueStore, StoreView, WindowedValue, WindowStore
from iqgraph.streaming.types import DEFAULT_LIMIT

if TYPE_CHECKING:
    from iqgraph.app.query.partitions import LocalPartitions
    from iqgraph.stores import PartitionStores
    from iqgraph.streaming.definitions import StoreDefinition

#: Per partition, the read methods one view kind keeps (bound methods of that store of the partition).
ReadMethods = dict[str, tuple[Callable[..., Any], ...]]


class OwnerViewError(Exception):
    """A store an owner-side field cannot read on the key's owner (no local copy of the key's data)."""


def _finalized(definition: StoreDefinition, state: Any) -> Any:
    """Return a state's value; raise the INTERNAL error in its place if the store's finalize failed (logged)."""
    value = finalize(definition, state)
    if isinstance(value, Exception):
        raise value
    return value


class _View:
    """One store's read methods over the partitions this call reads, and how their states combine."""

    __slots__ = ("_combine", "_definition", "_encode", "_reads")
    _METHODS: tuple[str, ...] = ()
    #: the kind of store the view reads (its class: ``stores.kinds``)
    _STORE: ClassVar[type[StoreView]]

    def __init__(self, definition: StoreDefinition, reads: ReadMethods, codec: KeyCodec) -> None:
        self._definition = definition
        self._reads = reads
        self._combine = combiner(definition)
        self._encode = codec.encode

    def _merged(self, read: Callable[[Callable[..., Any]], list[Any]], method: str) -> list[Any]:
        merged: list[Any] | None = None
        for partition_read in self._reads[method]:
            values = read(partition_read)
            merged = values if merged is None else [self._combine(a, b) for a, b in zip(merged, values, strict=True)]
        return merged or []


def _read_methods(cls: type[_View], definition: StoreDefinition, partitions: Sequence[PartitionStores]) -> ReadMethods:
    """Return the read methods a kind of view keeps, per partition (bound to that partition's store)."""
    stores = [s.store(definition.name) for s in partitions]
    return {name: tuple(getattr(store, name) for store in stores) for name in cls._METHODS}


class LocalKeyValueView(_View):
    """Read a key-value store: ``get``, ``get_many``, ``range``, ``prefix``."""

    __slots__ = ()
    _METHODS = ("multi_get", "range", "prefix")
    _STORE = KeyValueStore

    def get(self, key: Key) -> Any:
        """Return the value of key (None if absent)."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[Key]) -> list[Any]:
        """Return the value of each key, in key order (None where absent)."""
        states = self._merged(lambda multi_get: multi_get(list(keys), states=True), "multi_get")
        return [_finalized(self._definition, s) for s in states] if states else [None] * len(keys)

    def range(self, from_key: Key | None = None, to_key: Key | None = None, limit: int = DEFAULT_LIMIT) -> list[Any]:
        """Return up to limit (key, value) with from_key <= key <= to_key (None: open), in key order."""
        pages = [read(from_key, to_key, limit, states=True).items for read in self._reads["range"]]
        return self._entries(pages, limit)

    def prefix(self, prefix: str, limit: int = DEFAULT_LIMIT) -> list[Any]:
        """Return up to limit (key, value) whose string key starts with prefix, in key order."""
        pages = [read(prefix, limit, states=True).items for read in self._reads["prefix"]]
        return self._entries(pages, limit)

    def _entries(self, pages: list[list[Any]], limit: int) -> list[Any]:
        encode = self._encode
        merged: list[list[Any]] = []
        for key, state in heapq.merge(*pages, key=lambda e: encode(e[0])):
            if merged and merged[-1][0] == key:
                merged[-1][1] = self._combine(merged[-1][1], state)
            elif len(merged) == limit:
                break
            else:
                merged.append([key, state])
        return [(key, _finalized(self._definition, state)) for key, state in merged]


class LocalWindowView(_View):
    """Read a window store: ``fetch``."""

    __slots__ = ()
    _METHODS = ("fetch",)
    _STORE = WindowStore

    def fetch(self, key: Key, time_from: int | None = None, time_to: int | None = None) -> list[WindowedValue]:
        """Return key's windows (key, start, end, value; times in epoch ms) with start in the range, oldest first."""
        lo, hi = FAR_PAST if time_from is None else time_from, FAR_FUTURE if time_to is None else time_to
        windows: list[WindowedValue] | None = None
        for read in self._reads["fetch"]:
            found = read(key, lo, hi, states=True)
            windows = found if windows is None else self._combine(windows, found)
        return _finalized(self._definition, windows or [])


class LocalBloomView(_View):
    """Read a bloom store: ``might_contain``, ``might_contain_many``."""

    __slots__ = ()
    _METHODS = ("might_contain_many",)
    _STORE = BloomStore

    def might_contain(self, key: Key) -> bool:
        """Return False if key was never added, True if it probably was."""
        return self.might_contain_many([key])[0]

    def might_contain_many(self, keys: Sequence[Key]) -> list[bool]:
        """Return, per key, whether it was probably added."""
        found = self._merged(lambda read: list(read(list(keys))), "might_contain_many")
        return [bool(f) for f in found] if found else [False] * len(keys)


class LocalStoreViews:
    """The read-only views one call of an owner-side field gets: the stores on this node, for its key.

    It keeps a closure that opens a store's view (``_open``), not the node's partitions. A store the caller
    may not read is FORBIDDEN when the function opens it (schema.access): that key's error.
    """

    __slots__ = ("_cache", "_open")

    def __init__(
        self,
        local: LocalPartitions,
        routing: StoreDefinition,
        partitions: Sequence[int],
        caller: Principal = ANONYMOUS,
    ) -> None:
        self._cache: dict[tuple[str, type[_View]], Any] = {}
        self._open = _opener(local, routing, tuple(partitions), caller)

    def kv(self, store: str) -> LocalKeyValueView:
        """Return a read-only view of the key-value store called store."""
        return self._view(store, LocalKeyValueView)

    def window(self, store: str) -> LocalWindowView:
        """Return a read-only view of the window store called store."""
        return self._view(store, LocalWindowView)

    def bloom(self, store: str) -> LocalBloomView:
        """Return a read-only view of the bloom store called store."""
        return self._view(store, LocalBloomView)

    def _view(self, store: str, cls: type[_View]) -> Any:
        found = self._cache.get((store, cls))
        if found is None:
            found = self._cache[store, cls] = self._open(store, cls)
        return found


def _opener(
    local: LocalPartitions, routing: StoreDefinition, partitions: tuple[int, ...], caller: Principal
) -> Callable[[str, type[_View]], _View]:
    """Return a function opening a view of a store for the call's partitions (local is only in its closure)."""

    def open_view(store: str, cls: type[_View]) -> _View:
        check_read(caller, store)
        app = local.app
        definition = definition_of(app, store, cls._STORE.kind)
        # the partitions' own checks: not hosted -> STORE_MIGRATED, not queryable -> STORE_NOT_READY
        hosted = [local.hosted(definition, p) for p in _partitions_of(local, routing, partitions, definition)]
        return cls(definition, _read_methods(cls, definition, hosted), key_codec(app, definition))

    return open_view


def _partitions_of(
    local: LocalPartitions, routing: StoreDefinition, partitions: tuple[int, ...], definition: StoreDefinition
) -> Sequence[int]:
    app = local.app
    topic, routed = app.topic(definition.topic), app.topic(routing.topic)
    if topic.global_table:
        return range(topic.partitions)
    if not definition.co_partitioned:
        raise OwnerViewError(
            f"store {definition.name!r} is keyed by column {definition.key!r}: its keys are in every partition, "
            f"not with the key of {routing.name!r}; an owner-side field reads stores keyed by the record "
            "key of a co-partitioned topic, and global tables"
        )
    if (topic.partitions, topic.key_format) != (routed.partitions, routed.key_format):
        raise OwnerViewError(
            f"store {definition.name!r} reads topic {topic.name!r}, not co-partitioned with {routed.name!r} "
            f"({topic.partitions} vs {routed.partitions} partitions): the key's data is not on this node"
        )
    return partitions
