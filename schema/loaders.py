"""Per-request DataLoaders, one per store and bound: point reads of one request go out as one batch per store.

A request's ``get``, ``getMany``, ``fetch``, ``mightContain`` and ``mightContainMany`` fields all load
through their store's loader, so N such fields make one StoreQueries call per store (which routes the
keys to partitions and replicas). A field's ``maxLag`` is part of its loader's identity: reads with
different staleness bounds are never batched together. Loaders live in the request context (made by the
context getter), never at module level: their cache is the request's, and a value is never served from another request.
``Loaders.observe``, when set (by the metrics extension), hears each batch's store and size.

A compiled plan that can never have two reads pending together (``CompiledQuery.one_read_at_a_time``: one field
per level, no list of objects above the last) has nothing to batch: its request's loaders read ``at_once``, the
same batch function called with the one item in the same turn, instead of waiting a turn of the event loop for
items that cannot come.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import aiodataloader

from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.schema.errors import api_error
from iqgraph.stores import Key, StoreError

if TYPE_CHECKING:
    from iqgraph.schema.types import StoreQueries

#: (key, time_from, time_to) of a window fetch, in epoch milliseconds.
WindowRequest = tuple[Key, int, int]
BatchRead = Callable[[str, Sequence[Any], int | None], Awaitable[list[Any]]]
BatchObserver = Callable[[str, int], None]
KeyT = TypeVar("KeyT")
ReturnT = TypeVar("ReturnT")


async def load_batch(
    read: BatchRead, store: str, max_lag: int | None, keys: list[Any], max_keys: int | None = None
) -> list[Any]:
    """Return one result per key, in key order: the value, or the API error in place of a failed key.

    With max_keys, a batch of more keys (one store's keys of several fields) is read in chunks of at most
    max_keys, together: a peer is never asked for more keys in one read than a client may ask for.
    """
    if max_keys is not None and len(keys) > max_keys:
        chunks = [keys[i : i + max_keys] for i in range(0, len(keys), max_keys)]
        answers = await asyncio.gather(*(load_batch(read, store, max_lag, chunk) for chunk in chunks))
        return [result for answer in answers for result in answer]
    try:
        results = await read(store, keys, max_lag)
    except StoreError as exc:  # the whole batch failed the same way: every key reports it
        return [api_error(exc) for _ in keys]
    return [api_error(r) if isinstance(r, Exception) else r for r in results]


class Loader(Protocol):
    """What a field reads through: ``load(item)``, awaited for the item's results."""

    def load(self, key: Any) -> Awaitable[Any]: ...


class _AtOnce:
    """A loader reading each item as it is asked for: its batch function called with that one item."""

    def __init__(self, batch: Callable[[list[Any]], Awaitable[list[Any]]]) -> None:
        self._batch = batch

    async def load(self, key: Any) -> Any:
        """Return item's result (an item failing as a whole raises, as DataLoader.load does)."""
        (found,) = await self._batch([key])
        if isinstance(found, Exception):
            raise found
        return found


class Loaders:
    """The DataLoaders of one request, made on first use (inside the running event loop).

    A loader's item is a tuple of keys — one field's keys (``getMany``) or one key (``get``) — so a field
    waits on ONE future whatever its number of keys. A batch reads the distinct keys of all its items in
    one StoreQueries call and hands each item its results, in its keys' order.
    """

    def __init__(self, queries: StoreQueries, max_keys: int | None = None, principal: Principal = ANONYMOUS) -> None:
        self._queries = queries
        self.max_keys = max_keys  # keys per read at most (Limits.max_keys)
        self.principal = principal  # a store it may not read: FORBIDDEN for the field asking, once
        self._loaders: dict[tuple[str, int | None], Loader] = {}
        self.observe: BatchObserver | None = None
        self.at_once = False  # no two reads of the request are ever pending together: nothing to batch

    def _loader(self, store: str, max_lag: int | None, read: BatchRead, is_store: bool = True) -> Loader:
        loader = self._loaders.get((store, max_lag))
        if loader is None:
            if is_store:  # (an owner-side field's store is checked by StoreQueries.call_many)
                check_read(self.principal, store)
            batch = partial(self._load, read, store, max_lag)
            loader = self._loaders[store, max_lag] = _AtOnce(batch) if self.at_once else aiodataloader.DataLoader(batch)
        return loader

    async def _load(
        self, read: BatchRead, store: str, max_lag: int | None, items: list[tuple[Any, ...]]
    ) -> list[list[Any]]:
        keys = list(dict.fromkeys(key for item in items for key in item))
        if self.observe is not None:
            self.observe(store, len(keys))
        results = await load_batch(read, store, max_lag, keys, self.max_keys)
        if len(items) == 1 and len(keys) == len(items[0]):  # one field's distinct keys: its results as they are
            return [results]
        found = dict(zip(keys, results, strict=True))
        return [[found[key] for key in item] for item in items]

    def values(self, store: str, max_lag: int | None = None) -> Loader:
        """Return the loader of a key-value store's values (batched into get_many)."""
        return self._loader(store, max_lag, self._queries.get_many)

    def windows(self, store: str, max_lag: int | None = None) -> Loader:
        """Return the loader of a window store's fetches (batched into fetch_many)."""
        return self._loader(store, max_lag, self._queries.fetch_many)

    def membership(self, store: str, max_lag: int | None = None) -> Loader:
        """Return the loader of a bloom store's lookups (batched into might_contain_many)."""
        return self._loader(store, max_lag, self._queries.might_contain_many)

    def calls(self, field: str, max_lag: int | None = None) -> Loader:
        """Return the loader of an owner-side field's values (batched into call_many; its name is no store's)."""
        return self._loader(field, max_lag, self._queries.call_many, is_store=False)
