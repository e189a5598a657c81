"""The point-lookup methods of StoreQueries, in terms of one kind-checked batch lookup."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from iqgraph.app.merging import Request
from iqgraph.stores import Key, StoreKind


class PointLookups:
    """get_many, might_contain_many and fetch_many over ``_lookup(store, kind, requests)``."""

    async def _lookup(self, store: str, kind: StoreKind, requests: Sequence[Request]) -> list[Any]:
        raise NotImplementedError

    async def get_many(self, store: str, keys: Sequence[Key]) -> list[Any]:
        """Return the value of each key of a key-value store, in key order (None when absent)."""
        return await self._lookup(store, StoreKind.KEY_VALUE, [(k, None, None) for k in keys])

    async def might_contain_many(self, store: str, keys: Sequence[Key]) -> list[Any]:
        """Return, per key of a bloom store, whether it was probably added."""
        return await self._lookup(store, StoreKind.BLOOM, [(k, None, None) for k in keys])

    async def fetch_many(self, store: str, requests: Sequence[tuple[Key, int, int]]) -> list[Any]:
        """Return, per (key, time_from, time_to), the key's windows with start in that range."""
        return await self._lookup(store, StoreKind.WINDOW, list(requests))
