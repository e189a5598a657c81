"""A REST path for curl and reverse proxies: one key of one store over plain HTTP, through the routing core.

``GET /stores/{store}/keys/{key}`` answers through the same StoreQueries as the GraphQL fields — any node,
forwarded to the replica that serves the key, same-request failover, the same staleness bound
(``?maxLag=N``, default the node's ``--max-lag``) — and the same error codes:

- key-value store: 200 ``{"store", "key", "value"}``; **404** ``NOT_FOUND`` when the store has no such key;
- window store: 200 ``{"store", "key", "windows": [{"start", "end", "value"}, …]}`` for window starts in
  ``?from=…&to=…`` (epoch ms, inclusive; default all); 404 when the key has no window there;
- bloom store: 200 ``{"store", "key", "mightContain": true|false}``.

Values are the stored JSON (what GraphQL types field by field). A standby's answer has ``extensions.staleness``;
``?positions=true`` adds ``extensions.positions`` (the applied offsets read). An error is
``{"errors": [{"message", "extensions": {"code", …}}]}`` with the status of its code (``schema.errors.CODES``), and a
``Retry-After`` header when the code says when to retry.

``GET /stores/{store}/keys/{key}/metadata`` is KeyQueryMetadata with URLs: partition(s), active and standby
nodes and where they are reached — a proxy can route by key without reimplementing the partitioner.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from iqgraph.app.query.store_queries import ClusterStoreQueries
from iqgraph.schema.access import principal_of
from iqgraph.schema.errors import (
    INTERNAL,
    INTERNAL_MESSAGE,
    NOT_FOUND,
    ApiError,
    api_error,
    invalid_argument,
    properties,
)
from iqgraph.schema.keys import key_kind
from iqgraph.schema.reports import Reports
from iqgraph.stores import Key, StoreError, StoreKind, UnknownStoreError, WindowedValue

log = logging.getLogger(__name__)


def rest_routes(queries: ClusterStoreQueries) -> list[Route]:
    """Return the REST routes answered by the node's StoreQueries."""

    async def value(request: Request) -> Response:
        try:
            return await _value(queries, request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a coded JSON error
            return _error(exc)

    async def metadata(request: Request) -> Response:
        try:
            store, key = _store_key(queries, request)
            found = queries.key_metadata(store, key)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a coded JSON error
            return _error(exc)
        body = {
            "store": store,
            "key": key,
            "partition": found.partition,
            "partitions": list(found.partitions),
            "activeNode": found.active_node,
            "activeUrl": queries.url_of(found.active_node),
            "standbyNodes": list(found.standby_nodes),
            "standbyUrls": [queries.url_of(n) for n in found.standby_nodes],
            "note": found.note,
        }
        return JSONResponse(body)

    return [
        Route("/stores/{store}/keys/{key}/metadata", metadata, methods=["GET"]),
        Route("/stores/{store}/keys/{key}", value, methods=["GET"]),
    ]


def _store_key(queries: ClusterStoreQueries, request: Request) -> tuple[str, Key]:
    store = request.path_params["store"]
    info = next((s for s in queries.stores() if s.name == store), None)
    if info is None:
        known = ", ".join(s.name for s in queries.stores())
        raise UnknownStoreError(f"no store named {store!r} (stores: {known})")
    return store, key_kind(info.key_type).parse(request.path_params["key"])


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid_argument(name, f"must be a whole number, got {raw!r}") from None
    if name == "maxLag" and value < 0:
        raise invalid_argument(name, f"must be a number of records >= 0, got {value}")
    return value


async def _value(queries: ClusterStoreQueries, request: Request) -> Response:
    store, key = _store_key(queries, request)
    max_lag = _int_param(request, "maxLag", None)
    reports = Reports(want_positions=request.query_params.get("positions") == "true")
    bound = queries.bind(reports, principal_of(request.scope))
    kind = StoreKind(next(s.kind for s in queries.stores() if s.name == store))
    body: dict[str, Any] = {"store": store, "key": key}
    if kind is StoreKind.RANKING:
        raise invalid_argument(
            "store",
            f"{store!r} is a ranking: it keeps no value per key; read its top with GraphQL (top(group:, first:))",
        )
    if kind is StoreKind.KEY_VALUE:
        [found] = await bound.get_many(store, [key], max_lag)
        found = _raise_if_error(found)
        if found is None:
            return _not_found(store, key, reports)
        body["value"] = found
    elif kind is StoreKind.WINDOW:
        lo = _int_param(request, "from", -(1 << 62))
        hi = _int_param(request, "to", 1 << 62)
        [found] = await bound.fetch_many(store, [(key, lo, hi)], max_lag)  # type: ignore[list-item]
        found = _raise_if_error(found)
        if not found:
            return _not_found(store, key, reports)
        body["windows"] = [_window(w) for w in found]
    else:
        [found] = await bound.might_contain_many(store, [key], max_lag)
        body["mightContain"] = bool(_raise_if_error(found))
    extensions = reports.extensions()
    if extensions:
        body["extensions"] = extensions
    return JSONResponse(body)


def _window(w: WindowedValue) -> dict[str, Any]:
    return {"start": w.start, "end": w.end, "value": w.value}


def _raise_if_error(found: Any) -> Any:
    if isinstance(found, Exception):
        raise found
    return found


def _not_found(store: str, key: Key, reports: Reports) -> Response:
    error = {"message": f"store {store} has no key {key!r}", "extensions": {"code": NOT_FOUND}}
    body: dict[str, Any] = {"errors": [error]}
    extensions = reports.extensions()
    if extensions:
        body["extensions"] = extensions
    return JSONResponse(body, status_code=404)


def _error(exc: Exception) -> Response:
    found = api_error(exc) if isinstance(exc, StoreError) else exc
    if not isinstance(found, ApiError):
        log.error("unexpected error on the REST path", exc_info=exc)
        found = ApiError(INTERNAL_MESSAGE, INTERNAL)
    extensions = dict(found.extensions or {})
    status = properties(str(extensions.get("code"))).http_status
    headers = {}
    retry_ms = extensions.get("retryAfterMs")
    if isinstance(retry_ms, int):
        headers["retry-after"] = str(max(1, math.ceil(retry_ms / 1000)))
    return JSONResponse({"errors": [{"message": found.message, "extensions": extensions}]}, status, headers=headers)
