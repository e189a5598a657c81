"""Read every store of a running node back into the shape of ground_truth.Expected."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from iqgraph.stores import PartitionStores, StoreKind
from iqgraph.streaming.definitions import App
from tests.support.ground_truth import Expected

FAR_PAST, FAR_FUTURE = -(1 << 62), 1 << 62


def _pages(fetch: Any) -> list[Any]:
    items, after = [], None
    while True:
        page = fetch(after)
        items.extend(page.items)
        if page.next_cursor is None:
            return items
        after = page.next_cursor


def _merged(store: Any, part: Any, value: Any) -> Any:
    """Return two partitions' values of one key of a store keyed by a column (counts and sums add up)."""
    assert store.key and store.aggregate.kind in ("count", "sum"), store
    return part + value


def read_back(app: App, partitions: Iterable[PartitionStores]) -> Expected:
    """Return what the given partition databases hold, store by store."""
    out = Expected()
    for stores in partitions:
        for store in app.stores:
            if store.kind is StoreKind.KEY_VALUE:
                kv = stores.kv(store.name)
                out.kv[store.name].update(_pages(lambda after, kv=kv: kv.all(limit=500, after=after)))
            elif store.kind is StoreKind.WINDOW:
                window = stores.window(store.name)
                found = _pages(lambda after, w=window: w.fetch_all(FAR_PAST, FAR_FUTURE, limit=500, after=after))
                table = out.windows[store.name]
                for w in found:  # a store keyed by a column holds a part of a key's value in each partition
                    part = table.get((w.key, w.start))
                    table[(w.key, w.start)] = w.value if part is None else _merged(store, part, w.value)
                out.late[store.name] += window.late_records()
    return out
