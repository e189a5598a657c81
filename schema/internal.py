"""Internal root fields that peers call with a forwarded sub-request: states in compact JSON.

A node that routes keys (or scans) to a peer sends ONE GraphQL request per peer, marked as forwarded,
asking for ``_lookup`` / ``_scan`` / ``_count`` over the partitions it routes there. The peer answers
from its own partitions only (never forwards again) with mergeable states as JSON — no per-field
resolution — so the caller can combine results of several nodes before finalizing them. A failed
lookup is ``{"error": {"message": …, "extensions": {"code": …}}}`` in its place. These fields start
with ``_``: they are for peers, not for clients.
"""

from __future__ import annotations

import logging
from typing import Any

import strawberry
from strawberry.scalars import JSON

from iqgraph.schema.dynamic import Arg, Field, resolved_field, resolver_with
from iqgraph.schema.errors import INTERNAL, ApiError, api_error, store_errors
from iqgraph.schema.resolving import context
from iqgraph.schema.scalars import Long
from iqgraph.schema.types import PeerQueries, Scan
from iqgraph.stores import WindowedValue

log = logging.getLogger(__name__)
INTERNAL_FIELDS = ("_lookup", "_scan", "_count")


def encode_state(value: Any) -> Any:
    """Return a lookup result as JSON: the state, windows as [key, start, end, state], or an error."""
    if isinstance(value, Exception):
        error = api_error(value)
        if isinstance(error, ApiError):
            return {"error": {"message": error.message, "extensions": error.extensions}}
        log.error("unexpected error in a forwarded lookup", exc_info=value)
        return {"error": {"message": "internal error on the peer", "extensions": {"code": INTERNAL}}}
    if isinstance(value, list) and value and isinstance(value[0], WindowedValue):
        return [encode_item(w) for w in value]
    return value


def encode_item(item: Any) -> Any:
    """Return one scan item as JSON: [key, state] or [key, start, end, state]."""
    if isinstance(item, WindowedValue):
        return [item.key, item.start, item.end, item.value]
    key, state = item
    return [key, state]


def _local(info: strawberry.Info) -> PeerQueries:
    local = context(info).local
    if local is None:
        raise ApiError("this server does not answer forwarded sub-requests", "BAD_REQUEST")
    return local


def internal_fields() -> list[Field]:
    """Return the root fields _lookup, _scan and _count."""

    async def lookup(
        root: Any,
        info: strawberry.Info,
        store: str,
        requests: JSON,
        partitions: list[int] | None = None,
        with_lag: bool = False,
    ) -> JSON:
        local = _local(info)
        with store_errors():
            found = await local.lookup_states(store, [tuple(r) for r in requests], partitions)  # type: ignore[attr-defined]
        answer: dict[str, Any] = {"results": [encode_state(r) for r in found]}
        if with_lag:
            answer["lag"] = {str(p.partition): p.lag for p in local.node().partitions}
        return answer  # type: ignore[return-value]

    async def scan(
        root: Any,
        info: strawberry.Info,
        store: str,
        scan: JSON,
        positions: JSON,
        first: int,
        partitions: list[int] | None = None,
    ) -> JSON:
        with store_errors():
            pages = await _local(info).scan_pages(store, Scan(**scan), positions, first, partitions)  # type: ignore[arg-type]
        return {
            p: {"items": [encode_item(i) for i in page.items], "next": page.next_cursor} for p, page in pages.items()
        }  # type: ignore[return-value]

    async def count(root: Any, info: strawberry.Info, store: str, partitions: list[int] | None = None) -> Long:
        with store_errors():
            return Long(await _local(info).count_states(store, partitions))

    store = Arg("store", "store", str, "The store's name.")
    parts = Arg("partitions", "partitions", list[int] | None, "The partitions to read (all when null).")
    return [
        resolved_field(
            "_lookup",
            resolver_with(
                lookup,
                [
                    store,
                    Arg("requests", "requests", JSON, "[[key, from, to], …]"),
                    parts,
                    Arg("with_lag", "withLag", bool, "Report each partition's lag."),
                ],
                JSON,
            ),
            "Internal (peers): states of point lookups from the given partitions.",
        ),
        resolved_field(
            "_scan",
            resolver_with(
                scan,
                [
                    store,
                    Arg("scan", "scan", JSON, "{kind, args}"),
                    Arg("positions", "positions", JSON, "Per partition: a cursor, or null if done."),
                    Arg("first", "first", int, "Items per partition at most."),
                    parts,
                ],
                JSON,
            ),
            "Internal (peers): one page of states per given partition.",
        ),
        resolved_field(
            "_count", resolver_with(count, [store, parts], Long), "Internal (peers): approximate keys in partitions."
        ),
    ]
