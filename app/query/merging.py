"""How results of one store combine across partitions (and nodes), and become values.

Reads return *states* (what the stores keep: mergeable); a store not keyed by the record key holds
partial states of one key in several partitions, so states are combined first and finalized last.
The kind of store says how two results of a point read combine and how one is finalized (its class:
``stores.kinds.store_class``); a scan says how its items are ordered, combined and finalized (``stores.scans``).
This module asks them, with the store's aggregation, and keeps a user's finalize that raises to its key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from iqgraph.app.query.scatter import Merge
from iqgraph.schema.errors import INTERNAL, ApiError
from iqgraph.schema.types import Scan
from iqgraph.stores import KeyCodec, store_class
from iqgraph.stores.aggregations import Aggregation
from iqgraph.stores.window import final_window, merge_windows
from iqgraph.streaming.definitions import App, StoreDefinition

__all__ = [
    "aggregation_of",
    "combiner",
    "final_window",
    "finalize",
    "finalize_items",
    "finalize_many",
    "key_codec",
    "merge_windows",
    "scan_merge",
]

log = logging.getLogger(__name__)


def aggregation_of(definition: StoreDefinition) -> Aggregation:
    """Return the aggregation a store's states are merged with (a built-in or a user's, as JSON states)."""
    return definition.state_aggregation


def combiner(definition: StoreDefinition) -> Callable[[Any, Any], Any]:
    """Return how two partitions' results for one lookup combine."""
    return store_class(definition.kind).combiner(aggregation_of(definition))


def finalize(definition: StoreDefinition, result: Any) -> Any:
    """Return the value of one lookup's state (exceptions and missing values pass through)."""
    return finalize_many(definition, [result])[0]


def finalize_many(definition: StoreDefinition, results: list[Any]) -> list[Any]:
    """Return the values of lookups' states, in order (exceptions and missing values pass through)."""
    done = store_class(definition.kind).finalizer(aggregation_of(definition))
    if done is None:
        return results
    try:
        return [r if r is None or isinstance(r, Exception) else done(r) for r in results]
    except Exception:  # a user's finalize failed for some key: find which, each answers for itself
        return [_finalized(definition, r, done) for r in results]


def _finalized(definition: StoreDefinition, result: Any, done: Callable[[Any], Any]) -> Any:
    """Return done(result), or an INTERNAL error in its place if the store's finalize raised (logged)."""
    if result is None or isinstance(result, Exception):
        return result
    try:
        return done(result)
    except Exception:  # the user's finalize: the key answers INTERNAL, the request goes on
        log.exception("store %s: a state could not be finalized into a value", definition.name)
        return ApiError(f"store {definition.name!r} could not compute this value (see the server log)", INTERNAL)


def key_codec(app: App, definition: StoreDefinition) -> KeyCodec:
    """Return the key codec of a store."""
    return KeyCodec(definition.resolved_key_type(app.topic(definition.topic)))


def scan_merge(app: App, definition: StoreDefinition, scan: Scan) -> Merge[Any]:
    """Return how the items of a scan's partition pages are ordered, combined and located."""
    order = scan.order(key_codec(app, definition))
    return Merge(sort_key=order, position_of=order, combine=scan.combiner(aggregation_of(definition)))


def finalize_items(definition: StoreDefinition, scan: Scan, items: list[Any]) -> list[Any]:
    """Return a scan's merged state items as values (a ranking's index holds values already)."""
    return scan.finalized(aggregation_of(definition), items)
