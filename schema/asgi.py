"""The Strawberry ASGI app of a schema: /graphql over POST and GET, GraphiQL in a browser, subscriptions.

Each request gets a fresh Context (its own DataLoaders) from ``context_getter``. Requests and responses
follow the GraphQL over HTTP spec (``schema.http_spec`` holds its rules and the choices made): the media
type is negotiated from Accept, a request is parsed and checked here rather than by Strawberry, and a
refused one gets its HTTP status and a GraphQL-shaped error (code BAD_REQUEST unless a GraphQL one),
never Strawberry's plain text.

Given ``live``, subscriptions (and any operation) stream over two transports, both Strawberry's:
graphql-transport-ws on a websocket at the same path (ping/pong; at most ``max_subscriptions_per_connection``
operations at once, then LIMIT_EXCEEDED), and GraphQL over SSE (graphql-sse's distinct connections mode: a POST
whose Accept lists ``text/event-stream`` gets ``next`` events, a ``complete`` event, and a ``: ping`` comment
every 15 s). A websocket whose handshake carried no credentials (browsers cannot set its headers) is
authenticated by its ``connection_init`` payload, ``{"Authorization": "Bearer …"}`` or ``{"x-api-key": …}``;
refused: closed with 4403.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from cross_web import AsyncHTTPRequestAdapter, HTTPException, StarletteRequestAdapter
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.websockets import WebSocket, WebSocketDisconnect
from strawberry.asgi import ASGIWebSocketAdapter, GraphQL
from strawberry.exceptions import ConnectionRejectionError, MissingQueryError
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.subscriptions import GRAPHQL_SSE_PROTOCOL, GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_transport_ws.types import SubscribeMessage
from strawberry.types import ExecutionResult
from strawberry.types.graphql import OperationType
from strawberry.types.unset import UNSET, UnsetType

from iqgraph.schema import http_spec, tracing
from iqgraph.schema.access import ANONYMOUS, PRINCIPAL_SCOPE_KEY, Principal, principal_of
from iqgraph.schema.builder import IqGraphSchema
from iqgraph.schema.context import Context, request_context
from iqgraph.schema.errors import (
    GRAPHQL_PARSE_FAILED,
    GRAPHQL_VALIDATION_FAILED,
    UNAUTHENTICATED,
    ApiError,
    limit_exceeded,
)
from iqgraph.schema.graphiql import graphiql_html
from iqgraph.schema.internal import answer_lookups, lookup_fields
from iqgraph.schema.limits import Limits
from iqgraph.schema.persisted import PersistedDocuments
from iqgraph.schema.wire import encode_json

if TYPE_CHECKING:
    import strawberry
    from starlette.types import Message, Receive, Scope, Send

    from iqgraph.schema.compiled import RequestMetrics
    from iqgraph.schema.types import LiveQueries, PeerQueries, StoreQueries

#: The caller of a request nothing authenticated, where authentication is required: it may read no store.
NOBODY = Principal("nobody", frozenset())
#: Authenticate a websocket's connection_init credentials (headers by lower-case name) from a client address:
#: the caller, or None if refused.
ConnectionAuth = Callable[[Mapping[str, str], str | None], Awaitable[Principal | None]]
#: The connection_init payload entries that carry a credential, as the header each stands for.
_INIT_CREDENTIALS = {"authorization": "authorization", "x-api-key": "x-api-key"}


def _sub_response(media_type: str | None) -> Response:
    """Return the response resolvers may add headers to, as Strawberry makes it, with the negotiated media type."""
    sub_response = Response()
    sub_response.status_code = None  # type: ignore[assignment]
    del sub_response.headers["content-length"]
    sub_response.media_type = media_type
    return sub_response


#: Accept values whose media type the lean path remembers (``GraphQLApp._lean_media_type``), at most.
_ACCEPTS_KEPT = 256
_UNSEEN = object()


def _accept_and_content_type(scope: Scope) -> tuple[str | None, str | None]:
    """Return a request's first Accept and Content-Type headers (as Starlette's ``headers.get`` reads them)."""
    accept = content_type = None
    for name, value in scope["headers"]:
        if name == b"accept":
            if accept is None:
                accept = value.decode("latin-1")
        elif name == b"content-type" and content_type is None:
            content_type = value.decode("latin-1")
    return accept, content_type


class _Answer:
    """An HTTP response as ASGI sends it: status, raw headers, one body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


class _ReadBody:
    """A request's receive whose body was read whole: it gives the body (once), then asks the request's receive."""

    __slots__ = ("body", "_receive", "_given")

    def __init__(self, body: bytes, receive: Receive) -> None:
        self.body, self._receive, self._given = body, receive, False

    @classmethod
    async def of(cls, receive: Receive) -> Receive:
        """Return receive with the request's body read (a body in several messages, or none: receive as it is)."""
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            return cls(message.get("body", b""), receive)
        return _Replay(message, receive)

    async def __call__(self) -> Message:
        if self._given:
            return await self._receive()
        self._given = True
        return {"type": "http.request", "body": self.body, "more_body": False}


class _Replay:
    """A request's receive whose first message was taken: it gives it again, then asks the request's receive."""

    __slots__ = ("_first", "_receive")

    def __init__(self, first: Message, receive: Receive) -> None:
        self._first: Message | None = first
        self._receive = receive

    async def __call__(self) -> Message:
        first, self._first = self._first, None
        return first if first is not None else await self._receive()


def init_credentials(payload: Mapping[str, Any] | None) -> dict[str, str]:
    """Return the credentials of a connection_init payload as headers by lower-case name (keys of any case)."""
    found: dict[str, str] = {}
    for name, value in (payload or {}).items():
        header = _INIT_CREDENTIALS.get(str(name).lower())
        if header is not None and isinstance(value, str):
            found[header] = f"{found[header]}, {value}" if header in found else value  # repeated: never valid
    return found


class _TextFrames(ASGIWebSocketAdapter):
    """Send each websocket message in a text frame: graphql-ws (GraphiQL's client) cannot read binary ones."""

    async def send_json(self, message: Mapping[str, object]) -> None:
        try:
            await self.ws.send_text(encode_json(message).decode())
        except WebSocketDisconnect as exc:
            raise WebSocketDisconnected from exc


class _TransportWSHandler(BaseGraphQLTransportWSHandler[Context, None]):
    """graphql-transport-ws; an operation past the connection's limit is refused with a coded error."""

    async def handle_subscribe(self, message: SubscribeMessage) -> None:
        """Start an operation, or refuse it with LIMIT_EXCEEDED when the connection runs as many as it may; one
        naming its document (``schema.persisted``) runs that document, or is refused with its code."""
        limit = self.max_subscriptions_per_connection
        running = len(self.operations)
        if self.connection_acknowledged and limit is not None and running >= limit:
            error = limit_exceeded("operations on one connection", limit, running + 1)
            await self.send_message({"id": message["id"], "type": "error", "payload": [error.formatted]})
            return
        if self.connection_acknowledged and isinstance(self.view, GraphQLApp):
            try:
                payload = self.view.documents.resolve(message["payload"])
            except http_spec.RequestError as exc:
                refused = ApiError(exc.reason, exc.code)
                await self.send_message({"id": message["id"], "type": "error", "payload": [refused.formatted]})
                return
            message = {**message, "payload": payload}  # type: ignore[typeddict-item]
        await super().handle_subscribe(message)

    def forget_id(self, id: str) -> None:  # noqa: A002 - Strawberry's name
        """Forget a finished operation's id; it may be gone already: an operation that completes (its watch ended
        as the node stops) while the connection's cleanup forgets every operation (Strawberry's ``del`` raised
        KeyError there, logged with a traceback)."""
        self.operations.pop(id, None)


class GraphQLApp(GraphQL[Context, None]):
    """Serve schema over HTTP, answering from queries within limits (give build_schema the same Limits).

    Each request's queries are bound to its own reports and its caller: the Principal an ASGI wrapper put
    in the scope (``app.security.gate.AuthGate`` for clients, ``app.security.peer_auth.PeerGate`` for peers); with
    ``require_principal`` a request nothing authenticated may read no store, else it reads as ANONYMOUS.
    With ``local`` (the node's own partitions) this is the internal endpoint: its schema's internal
    fields answer from local partitions only — a forwarded request is never forwarded again, so nodes
    cannot loop. ``live`` is what subscriptions follow; ``connection_auth`` authenticates a websocket by its
    connection_init payload (without it, only by its handshake's headers).
    """

    graphql_transport_ws_handler_class = _TransportWSHandler
    websocket_adapter_class = _TextFrames

    def __init__(
        self,
        schema: strawberry.Schema,
        queries: StoreQueries,
        limits: Limits | None = None,
        *,
        local: PeerQueries | None = None,
        compiled: bool = True,
        require_principal: bool = False,
        live: LiveQueries | None = None,
        connection_auth: ConnectionAuth | None = None,
        documents: PersistedDocuments | None = None,
        **options: Any,
    ) -> None:
        if live is not None:  # what subscriptions follow: over graphql-transport-ws and SSE
            options.setdefault("subscription_protocols", (GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_SSE_PROTOCOL))
        super().__init__(schema, **options)
        self.compiled = compiled  # serve what a compiled plan covers on the lean path
        self._limits = limits or Limits()
        self._queries = queries
        self._local = local
        self._live = live
        self._connection_auth = connection_auth
        self._anonymous = NOBODY if require_principal else ANONYMOUS
        #: documents requests may name by their hash: trusted ones, and APQ's (schema.persisted)
        self.documents = documents or PersistedDocuments()
        self._accepts: dict[str | None, str | None] = {}  # the lean path's media type per Accept value

    def principal(self, request: Any) -> Principal:
        """Return the caller of request, as the ASGI wrappers authenticated it."""
        if request is None or PRINCIPAL_SCOPE_KEY not in request.scope:
            return self._anonymous
        return principal_of(request.scope)

    async def get_context(self, request: Any, response: Any) -> Context:
        """Return the context of one request, bound to its caller."""
        principal = self.principal(request)
        return request_context(self._queries, self._limits, request, response, self._local, principal, self._live)

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """Accept a websocket its handshake authenticated; else authenticate its connection_init payload."""
        scope = context.request.scope if context.request is not None else {}
        if PRINCIPAL_SCOPE_KEY in scope or self._anonymous is ANONYMOUS:
            return UNSET
        credentials = init_credentials(context.connection_params)
        principal = None
        if credentials and self._connection_auth is not None:
            client = scope.get("client")
            principal = await self._connection_auth(credentials, f"{client[0]}:{client[1]}" if client else None)
        if principal is None:
            raise ConnectionRejectionError({"code": UNAUTHENTICATED})
        context.authenticate(principal)
        return UNSET

    def should_render_graphql_ide(self, request: Any) -> bool:
        """Return whether a GET is a browser's ask for GraphiQL: Strawberry's rule (no ``query``, HTML or */*
        accepted), and it names no document either (``documentId``, APQ's ``extensions``), which curl's */* or a
        browser's Accept asks to be answered, not shown an IDE."""
        params = request.query_params
        if params.get("documentId") is not None or params.get("extensions") is not None:
            return False
        return super().should_render_graphql_ide(request)

    def streams(self, headers: Mapping[str, str]) -> bool:
        """Return whether a request asks for an event stream (SSE), and this app serves one."""
        accept = {"accept": headers.get("accept") or ""}  # Strawberry scans the headers it is given for Accept
        return self._get_stream_transport_from_headers(accept) is not None

    async def get_sub_response(self, request: Request | WebSocket) -> Response:
        """Return the response resolvers may add headers to; its media_type is the one Accept chose (or 406)."""
        accept = request.headers.get("accept")
        media_type = http_spec.negotiate(accept)
        if media_type is None and isinstance(request, Request) and not self.streams(request.headers):
            if not self.should_render_graphql_ide(StarletteRequestAdapter(request)):
                raise http_spec.not_acceptable(accept or "")
        return _sub_response(media_type)

    async def parse_http_body(self, request: AsyncHTTPRequestAdapter) -> GraphQLRequestData:
        """Return the GraphQL-over-HTTP request of a GET's query string or a POST's JSON body (SSE: to stream)."""
        if request.method == "GET":
            data = http_spec.graphql_request(self.documents.resolve(http_spec.query_params(request.query_params)))
            tracing.operation(data.query, data.operation_name)
            return data
        http_spec.check_content_type(request.content_type)
        data = http_spec.graphql_request(self.documents.resolve(http_spec.decode_body(await request.get_body())))
        tracing.operation(data.query, data.operation_name)
        if self.streams(request.headers):
            data.protocol = "sse"
        return data

    async def execute_single(
        self,
        request: Request,
        request_adapter: AsyncHTTPRequestAdapter,
        sub_response: Response,
        context: Context,
        root_value: None,
        request_data: GraphQLRequestData,
    ) -> ExecutionResult:
        """Execute one request (GET runs queries only); refuse one that cannot run with the spec's status.

        With ``live``, a subscription POSTed for a JSON answer is refused (406): it streams (SSE, websocket).
        """
        method = request_adapter.method
        get_allows = {OperationType.QUERY} if self.allow_queries_via_get else set()
        allowed = get_allows if method == "GET" else OperationType.from_http(method)
        if self._live is not None:
            allowed = allowed - {OperationType.SUBSCRIPTION}
        try:
            return await self.schema.execute(
                request_data.query,
                root_value=root_value,
                variable_values=request_data.variables,
                context_value=context,
                operation_name=request_data.operation_name,
                allowed_operation_types=allowed,
                operation_extensions=request_data.extensions,
            )
        except InvalidOperationTypeError as exc:
            if exc.operation_type is OperationType.SUBSCRIPTION and method != "GET":
                reason = "a subscription streams: POST it with Accept: text/event-stream, or use a websocket"
                raise http_spec.RequestError(406, reason) from exc
            reason = f"{exc.as_http_error_reason(method)}: use POST"
            raise http_spec.RequestError(405, reason, headers={"allow": "POST"}) from exc
        except CannotGetOperationTypeError as exc:
            raise http_spec.RequestError(422, exc.as_http_error_reason(), GRAPHQL_VALIDATION_FAILED) from exc
        except MissingQueryError as exc:
            raise http_spec.RequestError(400, "Syntax Error: the document is empty", GRAPHQL_PARSE_FAILED) from exc

    async def process_result(self, request: Request, result: ExecutionResult) -> GraphQLHTTPResponse:
        """Return the GraphQL response of result; one that failed before execution has no data entry."""
        response = await super().process_result(request, result)
        if http_spec.is_request_error(result):
            del response["data"]
        return response

    def create_response(
        self, response_data: GraphQLHTTPResponse | list[GraphQLHTTPResponse], sub_response: Response
    ) -> Response:
        """Return the HTTP response of a GraphQL response, with the spec's status and Content-Type."""
        if isinstance(response_data, list):  # never: parse_http_body refuses batches
            return super().create_response(response_data, sub_response)
        media_type = sub_response.media_type or http_spec.GRAPHQL_RESPONSE
        status = sub_response.status_code or http_spec.response_status(response_data, media_type)
        content_type = http_spec.content_type(media_type, status)
        response = Response(self.encode_json(response_data), status, media_type=content_type)
        response.headers.raw.extend(sub_response.headers.raw)
        response.background = sub_response.background
        return response

    async def render_graphql_ide(self, request: Request) -> Response:
        """Return GraphiQL loading its assets from this node (schema.graphiql), never from a CDN."""
        return HTMLResponse(graphiql_html(request.url.path))

    def encode_json(self, data: object) -> bytes:
        """Return the JSON of a response body (``encode_json``)."""
        return encode_json(data)

    async def compiled_response(self, request: Request) -> _Answer | None:
        """Return the response of a request a compiled plan answers; None for the Strawberry path.

        The lean path: the same GraphQL-over-HTTP rules (schema.http_spec), the same context, the same
        execution and the same response making as the Strawberry view, without its per-request machinery.
        A peer's forwarded point reads (``wire.lookups``) are answered by ``schema.internal.answer_lookups``.
        Anything else — GraphiQL, a refused request (its refusal is the Strawberry path's), a document or
        variables no plan covers — gets None, and the Strawberry view serves it.
        """
        schema = self.schema
        method = request.scope["method"]
        if method not in ("GET", "POST"):
            return None
        if not isinstance(schema, IqGraphSchema) or (schema.compiled is None and self._local is None):
            return None
        accept, content_type = _accept_and_content_type(request.scope)
        media_type = self._lean_media_type(accept)
        if media_type is None:
            return None
        try:
            if method == "GET":
                if self.should_render_graphql_ide(StarletteRequestAdapter(request)):
                    return None
                data = http_spec.graphql_request(self.documents.resolve(http_spec.query_params(request.query_params)))
            else:
                http_spec.check_content_type(content_type)
                body = request.receive.body if isinstance(request.receive, _ReadBody) else await request.body()
                data = http_spec.graphql_request(self.documents.resolve(http_spec.decode_body(body)))
        except HTTPException:
            return None
        tracing.operation(data.query, data.operation_name)
        result = self._forwarded_lookups(request, data, schema.request_metrics)
        if result is None:
            if schema.compiled is None:
                return None
            context = await self.get_context(request, None)  # no resolver of a plan sets a header or a status
            result = await schema.execute_compiled(
                data.query, data.variables, context, data.operation_name, data.extensions
            )
        if result is None:
            return None
        return self._lean_response(await self.process_result(request, result), media_type)

    def _lean_media_type(self, accept: str | None) -> str | None:
        """Return the media type the lean path answers a request's Accept with; None when it does not answer it (an
        Accept of nothing served, or one asking for an event stream): what ``get_sub_response`` and ``streams``
        decide, remembered per Accept value (a client sends the same one with every request)."""
        found = self._accepts.get(accept, _UNSEEN)
        if found is _UNSEEN:
            media_type = http_spec.negotiate(accept)
            found = None if media_type is None or self.streams({"accept": accept or ""}) else media_type
            if len(self._accepts) >= _ACCEPTS_KEPT:
                self._accepts.clear()
            self._accepts[accept] = found
        return found  # type: ignore[return-value] # a media type or None

    def _lean_response(self, response_data: GraphQLHTTPResponse, media_type: str) -> _Answer:
        """Return the HTTP response of a GraphQL response on the lean path: what ``create_response`` makes of it with
        the sub-response of a media type (no header of its own, no status), as raw ASGI messages."""
        status = http_spec.response_status(response_data, media_type)
        body = self.encode_json(response_data)
        content_type = http_spec.content_type(media_type, status).encode("latin-1")
        return _Answer(status, [(b"content-length", str(len(body)).encode()), (b"content-type", content_type)], body)

    async def execute_document(
        self, request: Request, query: str, variables: dict[str, Any], extensions: dict[str, Any] | None = None
    ) -> GraphQLHTTPResponse:
        """Return the GraphQL response of a query the node itself wrote for request (``app.http.rest``).

        It runs as a client's query does — the request's caller, its own context and loaders, the compiled plan
        when one covers it — so REST and GraphQL answer in the same words, parse arguments alike and fail with
        the same codes.
        """
        context = await self.get_context(request, _sub_response(http_spec.GRAPHQL_RESPONSE))
        result = None
        if self.compiled and isinstance(self.schema, IqGraphSchema):
            result = await self.schema.execute_compiled(query, variables, context, None, extensions)
        if result is None:
            result = await self.schema.execute(
                query,
                variable_values=variables,
                context_value=context,
                allowed_operation_types={OperationType.QUERY},
                operation_extensions=extensions,
            )
        return await self.process_result(request, result)

    def _forwarded_lookups(
        self, request: Request, data: GraphQLRequestData, metrics: RequestMetrics | None
    ) -> ExecutionResult | None:
        """Return the result of a peer's forwarded point reads (schema.internal's lean path); None otherwise."""
        if self._local is None or data.extensions:
            return None
        fields = lookup_fields(data.query)
        if fields is None or data.operation_name is not None:
            return None
        started = time.perf_counter()
        variables = data.variables or {}
        answered = answer_lookups(self._local, fields, variables, self.principal(request), self._limits)
        if answered is None:
            return None
        if metrics is not None:
            metrics.observe_fields(fields, variables, time.perf_counter() - started, [])
        return ExecutionResult(data=answered, errors=None, extensions={})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection; HTTP requests that are not GraphQL get a JSON error."""
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        response: Response | _Answer | None
        if scope["method"] == "POST":  # its body, read here in one message (the guard's), given again to the view
            receive = await _ReadBody.of(receive)
        request = Request(scope=scope, receive=receive)
        try:
            response = await self.compiled_response(request) if self.compiled else None
            if response is None:
                response = await self.run(request)
        except HTTPException as exc:
            body, headers = http_spec.refusal(exc)
            response = Response(self.encode_json(body), exc.status_code, headers=headers)
        await response(scope, receive, send)
