"""A REST path for curl and reverse proxies: a store's key, top or count over plain HTTP, answered by GraphQL.

Each REST request is a GraphQL query the node writes for it (``GraphQLApp.execute_document``) and runs as a
client's would: the same caller, routing, failover and staleness bound (``?maxLag=N``), the same argument
parsing and the same rendering — field names camelCase as in the schema, times ISO 8601 (``DateTime``), a
``Decimal`` a string — and the same error codes. What the routes answer:

- ``GET /stores/{store}/keys/{key}``:
  key-value store: 200 ``{"store", "key", "value"}``, **404** ``NOT_FOUND`` when the store has no such key;
  window store: 200 ``{"store", "key", "windows": [{"key", "start", "end", "value"}, …]}`` for window starts in
  ``?from=…&to=…`` (inclusive; ISO 8601 or epoch ms, as GraphQL's ``DateTime``; default all), 404 when the
  key has no window there; bloom store: 200 ``{"store", "key", "mightContain": true|false}``;
  a ranking: 400 (it keeps no value per key: read its top).
- ``GET /stores/{store}/top?group=…&first=…&after=…`` (a ranking): 200 ``{"store", "group", "top": [{"rank",
  "member", "value", "cursor"}, …]}``.
- ``GET /stores/{store}/count``: 200 ``{"store", "count"}`` — the ``count`` field of the store's type (a bloom
  store: ``{"store", "approximateCount"}``, its filters' estimate).
- ``GET /stores/{store}/keys/{key}/metadata``: KeyQueryMetadata with URLs: partition(s), active and standby
  nodes and where they are reached — a proxy can route by key without reimplementing the partitioner.

A value holds every stored column, nested ones too, and nothing computed. A relation named like its column
(``Relation("customer", "Customer", column="customer")``: its field takes the column's place in GraphQL) is
rendered as the key the column stores, ``"customer": "customer-0001"``, as if no relation were declared: the
document reads it as ``customer { key }``, which reads no store (a null column is null; a value the entity's
key type cannot take is the relation's INVALID_KEY, as in GraphQL). The other fields with arguments are left
out, each computed from what the value already holds: a relation named apart from its column (``product`` of
column ``item``: ``item`` is there), a relation of the entries (it follows the entry's ``key`` or ``member``),
and the entity's own fields beyond a relation. Owner-side fields are root fields: no store's value has one.

A standby's answer has ``extensions.staleness``; ``?positions=true`` adds ``extensions.positions`` (the applied
offsets read). An error is ``{"errors": [{"message", "extensions": {"code", …}}]}`` with the status of its
code (``schema.errors.CODES``), and a ``Retry-After`` header when the code says when to retry.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from graphql import GraphQLField, GraphQLObjectType, GraphQLSchema, get_named_type, is_leaf_type
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from iqgraph.app.query.store_queries import ClusterStoreQueries
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
from iqgraph.schema.naming import camel_case
from iqgraph.stores import Key, StoreError, UnknownStoreError

if TYPE_CHECKING:
    from iqgraph.schema.asgi import GraphQLApp
    from iqgraph.schema.types import StoreInfo

log = logging.getLogger(__name__)


class KeyRead(NamedTuple):
    """A field of a store's type that GET /stores/{store}/keys/{key} reads: the name of its answer in the body, the
    query parameters passed as its arguments, and the answers that say the key is absent (404): a value that is
    falsy (0, an empty list) is a value, a bloom filter's False an answer."""

    field: str
    body: str
    params: tuple[str, ...] = ()
    absent: tuple[object, ...] = (None,)


#: What the key route reads: the first of these fields the store's GraphQL type has (the type says what its kind
#: answers; a ranking has none of them). A new kind of store with a point read adds its field here.
_KEY_READS = (
    KeyRead("get", "value"),
    KeyRead("fetch", "windows", ("from", "to"), absent=(None, [])),  # no window in [from, to]: as no key
    KeyRead("mightContain", "mightContain", absent=()),
)
#: The count route reads the first of these its type has (a bloom filter keeps no keys: its estimate only).
_COUNT_FIELDS = ("count", "approximateCount")
_NUMBERS = frozenset({"Int", "Long"})  # argument types whose query parameter must be a whole number


def rest_routes(queries: ClusterStoreQueries, graphql: GraphQLApp) -> list[Route]:
    """Return the REST routes: GraphQL queries (graphql, the node's public app) written for each request."""
    schema = graphql.schema._schema  # type: ignore[attr-defined] # noqa: SLF001 - graphql-core's schema: the types to select
    documents = Documents(schema, queries.stores())

    async def value(request: Request) -> Response:
        async def answer() -> Response:
            store, key = _store_key(queries, request)
            fields = documents.fields(store)
            read = next((r for r in _KEY_READS if r.field in fields), None)
            if read is None:
                raise invalid_argument(
                    "store",
                    f"{store!r} is a ranking: it keeps no value per key; read its top at /stores/{store}/top"
                    "?group=…&first=…",
                )
            found, extensions = await _run(graphql, documents, request, store, read.field, {"key": key}, read.params)
            if found in read.absent:
                return _not_found(store, key, extensions)
            return _found({"store": store, "key": key, read.body: found}, extensions)

        return await _answered(answer)

    async def top(request: Request) -> Response:
        async def answer() -> Response:
            store = _store(queries, request)
            if "top" not in documents.fields(store):
                raise invalid_argument("store", f"{store!r} is not a ranking: read a key at /stores/{store}/keys/…")
            found, extensions = await _run(graphql, documents, request, store, "top", {}, ("group", "first", "after"))
            return _found({"store": store, "group": request.query_params.get("group"), "top": found}, extensions)

        return await _answered(answer)

    async def count(request: Request) -> Response:
        async def answer() -> Response:
            store = _store(queries, request)
            fields = documents.fields(store)
            field = next(f for f in _COUNT_FIELDS if f in fields)
            found, extensions = await _run(graphql, documents, request, store, field, {}, ())
            return _found({"store": store, field: found}, extensions)

        return await _answered(answer)

    async def metadata(request: Request) -> Response:
        async def answer() -> Response:
            store, key = _store_key(queries, request)
            found = queries.key_metadata(store, key)
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

        return await _answered(answer)

    return [
        Route("/stores/{store}/keys/{key}/metadata", metadata, methods=["GET"]),
        Route("/stores/{store}/keys/{key}", value, methods=["GET"]),
        Route("/stores/{store}/top", top, methods=["GET"]),
        Route("/stores/{store}/count", count, methods=["GET"]),
    ]


class Documents:
    """The GraphQL documents of REST requests: one per (store, field, arguments given), made once.

    A document selects every field of what the store's field returns (objects, lists of objects, recursively), so
    a value comes whole, rendered as GraphQL renders it; a relation in its column's place is read as its ``key``.
    """

    def __init__(self, schema: GraphQLSchema, stores: Iterable[StoreInfo]) -> None:
        self.schema = schema
        #: per store, the fields of its value that are relations in their column's place
        self.columns = {
            s.name: frozenset(camel_case(r.field) for r in s.relations if r.replaces_column) for s in stores
        }

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one per node, for its life
    def fields(self, store: str) -> frozenset[str]:
        """Return the fields of store's GraphQL type: what its kind answers (``get``, ``fetch``, ``top``, …)."""
        return frozenset(self._store_type(store).fields)

    def _store_type(self, store: str) -> GraphQLObjectType:
        query = self.schema.query_type
        root = camel_case(store)
        assert query is not None and root in query.fields  # noqa: S101 - a store of the node's schema
        store_type = get_named_type(query.fields[root].type)
        assert isinstance(store_type, GraphQLObjectType)  # noqa: S101
        return store_type

    @functools.lru_cache(maxsize=1_024)  # noqa: B019 - one per node, for its life
    def document(self, store: str, field: str, arguments: tuple[str, ...]) -> Document:
        """Return the query reading field of store's root field with arguments (their variables named alike)."""
        root = camel_case(store)
        read = self._store_type(store).fields[field]
        types = {a: str(read.args[a].type) for a in arguments if a in read.args}
        variables = ["$maxLag: Long", *(f"${a}: {t}" for a, t in types.items())]
        args = f"({', '.join(f'{a}: ${a}' for a in types)})" if types else ""
        selection, keyed = _selection(read, self.columns.get(store, frozenset()))
        text = f"query Rest({', '.join(variables)}) {{ {root}(maxLag: $maxLag) {{ {field}{args}{selection} }} }}"
        return Document(text, {a: t.rstrip("!") for a, t in types.items()}, keyed)


class Document(NamedTuple):
    """A REST request's GraphQL query, the named type of each argument it passes, and where it reads keys.

    keyed: the path (field names; lists passed through) of each relation read as ``{ key }`` for its column.
    """

    text: str
    types: dict[str, str]
    keyed: tuple[tuple[str, ...], ...] = ()

    def rendered(self, found: Any) -> Any:
        """Return found, the field's data, with each keyed relation replaced by its key: the column as stored."""
        for path in self.keyed:
            found = _as_key(found, path)
        return found


def _selection(
    field: GraphQLField, columns: frozenset[str], seen: frozenset[str] = frozenset()
) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """Return the selection of every field of what field returns that the store holds ("" for a scalar or enum),
    and the paths of the relations it reads as ``{ key }``.

    columns: the relations in their column's place (their field named like it), read as ``{ key }``. The other
    fields with arguments are left out: they read another store or compute from what the value holds.
    """
    named = get_named_type(field.type)
    if is_leaf_type(named):
        return "", ()
    assert isinstance(named, GraphQLObjectType) and named.name not in seen  # noqa: S101 - values are trees
    chosen: list[str] = []
    keyed: list[tuple[str, ...]] = []
    for name, sub in named.fields.items():
        if not sub.args:
            inner, paths = _selection(sub, columns, seen | {named.name})
            chosen.append(name + inner)
            keyed += [(name, *path) for path in paths]
        elif name in columns:
            chosen.append(f"{name} {{ key }}")
            keyed.append((name,))
    return " { " + " ".join(chosen) + " }", tuple(keyed)


def _as_key(found: Any, path: tuple[str, ...]) -> Any:
    """Return found with the entity at path (through lists) replaced by its key; a null stays null."""
    if isinstance(found, list):
        return [_as_key(item, path) for item in found]
    if found is None:
        return None
    if not path:
        return found["key"]
    return {**found, path[0]: _as_key(found[path[0]], path[1:])}


async def _run(
    graphql: GraphQLApp,
    documents: Documents,
    request: Request,
    store: str,
    field: str,
    variables: dict[str, Any],
    params: tuple[str, ...],
) -> tuple[Any, dict[str, Any]]:
    """Return what field of store answers to request's GraphQL query, and the response's extensions.

    params: the query parameters passed as the field's arguments (a whole number where the argument is one).
    Raises the first error of the response.
    """
    given = {p: request.query_params[p] for p in params if request.query_params.get(p, "") != ""}
    document = documents.document(store, field, tuple(sorted({*variables, *given})))
    values = {**variables, **{p: _param(p, raw, document.types.get(p)) for p, raw in given.items()}}
    values["maxLag"] = _param("maxLag", request.query_params.get("maxLag", ""), "Long")  # 0: only the caught-up
    extensions = {"positions": True} if request.query_params.get("positions") == "true" else None
    response = await graphql.execute_document(request, document.text, values, extensions)
    errors: list[Any] = list(response.get("errors") or [])
    if errors:
        raise _Failed(errors[0], dict(response.get("extensions") or {}))
    data: dict[str, Any] = dict(response.get("data") or {})
    return document.rendered(data[camel_case(store)][field]), dict(response.get("extensions") or {})


def _param(name: str, raw: str, declared: str | None) -> Any:
    """Return a query parameter as its argument's variable takes it: a whole number for a Long or Int argument,
    epoch ms for a DateTime one given in digits (else the string: ISO 8601, parsed by GraphQL's DateTime)."""
    if raw == "":
        return None
    if declared in _NUMBERS or (declared == "DateTime" and raw.lstrip("-").isdigit()):
        try:
            return int(raw)
        except ValueError:
            raise invalid_argument(name, f"must be a whole number, got {raw!r}") from None
    return raw


class _Failed(Exception):
    """The GraphQL response of a REST request had an error: its first, and the response's extensions."""

    def __init__(self, error: dict[str, Any], extensions: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error
        self.extensions = extensions


def _store(queries: ClusterStoreQueries, request: Request) -> str:
    store = request.path_params["store"]
    if not any(s.name == store for s in queries.stores()):
        known = ", ".join(s.name for s in queries.stores())
        raise UnknownStoreError(f"no store named {store!r} (stores: {known})")
    return store


def _store_key(queries: ClusterStoreQueries, request: Request) -> tuple[str, Key]:
    store = _store(queries, request)
    info = next(s for s in queries.stores() if s.name == store)
    return store, key_kind(info.key_type).parse(request.path_params["key"])


def _found(body: dict[str, Any], extensions: dict[str, Any]) -> Response:
    if extensions:
        body["extensions"] = extensions
    return JSONResponse(body)


def _not_found(store: str, key: Key, extensions: dict[str, Any]) -> Response:
    error = {"message": f"store {store} has no key {key!r}", "extensions": {"code": NOT_FOUND}}
    body: dict[str, Any] = {"errors": [error]}
    if extensions:
        body["extensions"] = extensions
    return JSONResponse(body, status_code=404)


async def _answered(answer: Any) -> Response:
    """Return answer()'s response; any failure as a coded JSON error with its code's status."""
    try:
        return await answer()
    except _Failed as failed:
        return _error_response(failed.error, failed.extensions)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a coded JSON error
        found = api_error(exc) if isinstance(exc, StoreError) else exc
        if not isinstance(found, ApiError):
            log.error("unexpected error on the REST path", exc_info=exc)
            found = ApiError(INTERNAL_MESSAGE, INTERNAL)
        return _error_response({"message": found.message, "extensions": dict(found.extensions or {})}, {})


def _error_response(error: dict[str, Any], extensions: dict[str, Any]) -> Response:
    coded = error.get("extensions") or {}
    status = properties(str(coded.get("code"))).http_status
    headers = {}
    retry_ms = coded.get("retryAfterMs")
    if isinstance(retry_ms, int):
        headers["retry-after"] = str(max(1, math.ceil(retry_ms / 1000)))
    body: dict[str, Any] = {"errors": [error]}
    if extensions:
        body["extensions"] = extensions
    return JSONResponse(body, status, headers=headers)
