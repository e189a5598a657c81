"""How results of one store combine across partitions (and nodes), and become values.

Reads return *states* (what the stores keep: mergeable); a store not keyed by the record key holds
partial states of one key in several partitions, so states are combined first and finalized last.
This module knows, per store kind, how to combine two results, how to finalize one, and how to order,
combine and locate the items of a scan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from iqgraph.app.query.scatter import Merge
from iqgraph.schema.errors import INTERNAL, ApiError
from iqgraph.schema.types import Scan
from iqgraph.stores import KeyCodec, StoreKind, WindowedValue
from iqgraph.stores.aggregations import Aggregation, merge_state
from iqgraph.stores.codecs import encode_int64
from iqgraph.streaming.definitions import App, StoreDefinition

log = logging.getLogger(__name__)


def aggregation_of(definition: StoreDefinition) -> Aggregation:
    """Return the aggregation a store's states are merged with (a built-in or a user's, as JSON states)."""
    return definition.state_aggregation


def combiner(definition: StoreDefinition) -> Callable[[Any, Any], Any]:
    """Return how two partitions' results for one lookup combine."""
    if definition.kind is StoreKind.BLOOM:
        return lambda a, b: bool(a) or bool(b)
    agg = aggregation_of(definition)
    if definition.kind is StoreKind.WINDOW:
        return lambda a, b: merge_windows(agg, a or [], b or [])
    return lambda a, b: merge_state(agg, a, b)


def finalize(definition: StoreDefinition, result: Any) -> Any:
    """Return the value of one lookup's state (exceptions and missing values pass through)."""
    return finalize_many(definition, [result])[0]


def finalize_many(definition: StoreDefinition, results: list[Any]) -> list[Any]:
    """Return the values of lookups' states, in order (exceptions and missing values pass through)."""
    if definition.kind is StoreKind.BLOOM:
        return results
    agg = aggregation_of(definition)
    if definition.kind is StoreKind.WINDOW:
        return [_finalized(definition, r, lambda r: [final_window(agg, w) for w in r]) for r in results]
    done = agg.finalize
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


def merge_windows(agg: Aggregation, a: Sequence[WindowedValue], b: Sequence[WindowedValue]) -> list[WindowedValue]:
    """Return the windows of a and b, those with the same start combined, in time order."""
    by_start = {w.start: w for w in a}
    for w in b:
        old = by_start.get(w.start)
        by_start[w.start] = (
            w if old is None else WindowedValue(w.key, w.start, w.end, merge_state(agg, old.value, w.value))
        )
    return [by_start[s] for s in sorted(by_start)]


def final_window(agg: Aggregation, window: WindowedValue) -> WindowedValue:
    """Return window with its state finalized into a value."""
    return WindowedValue(window.key, window.start, window.end, agg.finalize(window.value))


def key_codec(app: App, definition: StoreDefinition) -> KeyCodec:
    """Return the key codec of a store."""
    return KeyCodec(definition.resolved_key_type(app.topic(definition.topic)))


def scan_merge(app: App, definition: StoreDefinition, scan: Scan) -> Merge[Any]:
    """Return how the items of a scan's partition pages are ordered, combined and located."""
    if scan.kind == "top":  # (member, value, index key): a member lives in one partition, nothing to combine
        return Merge(sort_key=lambda item: item[2], position_of=lambda item: item[2])
    codec = key_codec(app, definition)
    agg = aggregation_of(definition)
    if scan.kind in ("range", "prefix"):
        return Merge(
            sort_key=lambda item: codec.encode(item[0]),
            position_of=lambda item: codec.encode(item[0]),
            combine=lambda a, b: (a[0], merge_state(agg, a[1], b[1])),
        )

    def window_key(w: WindowedValue) -> bytes:
        return codec.encode_window_key(w.key, w.start)

    def combine(a: WindowedValue, b: WindowedValue) -> WindowedValue:
        return WindowedValue(a.key, a.start, a.end, merge_state(agg, a.value, b.value))

    if scan.kind == "fetch_all":

        def index_key(w: WindowedValue) -> bytes:
            return encode_int64(w.start) + window_key(w)

        return Merge(index_key, index_key, combine)
    return Merge(window_key, window_key, combine)


def finalize_items(definition: StoreDefinition, scan: Scan, items: list[Any]) -> list[Any]:
    """Return a scan's merged state items as values (a ranking's index holds values already)."""
    if scan.kind == "top":
        return items
    agg = aggregation_of(definition)
    if scan.kind in ("range", "prefix"):
        return [(k, agg.finalize(v)) for k, v in items]
    return [final_window(agg, w) for w in items]
