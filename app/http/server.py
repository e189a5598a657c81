"""The node's ASGI server: /graphql (POST, GET, GraphiQL), /healthz, /readyz, /metrics, the app's /dashboard.

Graceful shutdown: uvicorn stops accepting connections and lets in-flight requests finish; then the node
stops its streaming queries, closes RocksDB and stops Spark.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import secrets
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from iqgraph.app.http.connections import Hygiene, server_config
from iqgraph.app.http.request_guard import RequestGuard
from iqgraph.app.http.rest import rest_routes
from iqgraph.app.live.stream import StreamEndpoint, changes_events, follow_events
from iqgraph.app.live.watch import Live
from iqgraph.app.metrics import scrape
from iqgraph.app.node import Node, NodeStartError
from iqgraph.app.query.merging import finalize
from iqgraph.app.query.routing import store_key_partitions
from iqgraph.app.security.auth import Authenticator
from iqgraph.app.security.gate import AuthGate, init_authenticator
from iqgraph.app.security.peer_auth import PeerGate, PeerVerifier
from iqgraph.app.security.tls import peer_verify, server_options
from iqgraph.app.settings import Settings
from iqgraph.schema import tracing, wire
from iqgraph.schema.access import principal_of
from iqgraph.schema.errors import NOT_FOUND, STORE_NOT_READY, ApiError
from iqgraph.schema.graphiql import graphiql_mount
from iqgraph.schema.persisted import ManifestError, PersistedDocuments, describe, load_manifest
from iqgraph.schema.wire import CHANGES_PATH, FOLLOW_PATH, HEALTH_PATH, INTERNAL_PATH, INTERNAL_PREFIX, READY_PATH
from iqgraph.streaming.kafka_watch import ConnectionNoise

if TYPE_CHECKING:
    from iqgraph.streaming.definitions import App
    from iqgraph.streaming.kafka_watch import KafkaStatus

log = logging.getLogger(__name__)


def build_asgi(
    node: Node,
    graphql: Any,
    internal: Any = None,
    raw_endpoint: bool = False,
    authenticator: Authenticator | None = None,
) -> Any:
    """Return the ASGI app of a started node: graphql at /graphql for clients and, with internal, the peers'
    listener (``peer_asgi``), each request answered by the app of the port it came in on (``Listeners``).

    authenticator: None makes the one the node's settings describe.
    """
    clients = traced(client_asgi(node, graphql, raw_endpoint, authenticator))
    if internal is None:
        return clients
    return Listeners(clients, traced(peer_asgi(node, internal)), node.settings.peer_listen_port)


def traced(app: Any) -> Any:
    """Return app in a span per request continuing its caller's trace, when tracing is on (schema.tracing)."""
    return tracing.TraceContext(app) if tracing.ENABLED else app


def client_asgi(
    node: Node, graphql: Any, raw_endpoint: bool = False, authenticator: Authenticator | None = None
) -> Any:
    """Return the clients' listener: /graphql (POST, GET, GraphiQL, subscriptions), REST, probes, /metrics.

    Clients are authenticated by ``app.security.gate.AuthGate`` (with auth "none", everyone reads everything);
    every request meets the limits of ``app.http.request_guard`` first. It serves no peer endpoint: a request
    to /internal/* is a coded 404 whose body is never read beyond the clients' limit.
    """

    async def healthz(_: Request) -> Response:
        body: dict[str, Any] = {"status": "alive", "node": node.settings.node_id}
        if node.settings.has_peers:  # where peers send sub-requests (app.cluster.peers.PeerClient.peer_url)
            body["peerPort"] = node.settings.peer_listen_port
            if node.settings.advertised_peer_url:
                body["peerUrl"] = node.settings.peer_url
        return JSONResponse(body)

    kafka = functools.partial(kafka_status, node)
    node.metrics.kafka.watch(kafka)  # iqgraph_kafka_* at /metrics

    async def readyz(_: Request) -> Response:
        info = None if node.local is None else node.local.node()
        ready = node.ready(info)
        body = wire.encode_ready(ready, node.state.value, node.settings.node_id, info, kafka())
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(_: Request) -> Response:
        # in a thread: the partition gauges ask Kafka for the end offsets
        return Response(await run_in_threadpool(scrape, node.metrics), media_type=CONTENT_TYPE_LATEST)

    # the paths of queries first: Starlette tries each route's pattern in turn (no two of these overlap)
    routes = [
        Route("/graphql", graphql, methods=["GET", "POST"]),
        WebSocketRoute("/graphql", graphql),  # subscriptions over graphql-transport-ws (schema.asgi)
    ]
    if raw_endpoint:
        routes.append(Route("/raw/{store}/{key}", _raw_lookup(node), methods=["GET"]))
    if node.queries is not None:
        routes += rest_routes(node.queries, graphql)  # GET /stores/{store}/keys/{key}, /top, /count (app.http.rest)
    routes += [
        Route(HEALTH_PATH, healthz, methods=["GET"]),
        Route(READY_PATH, readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        graphiql_mount("/graphql"),  # GraphiQL's assets at /graphql/static (schema.graphiql)
        Route(f"{INTERNAL_PREFIX}{{rest:path}}", _not_for_clients, methods=["GET", "HEAD", "POST", "PUT", "DELETE"]),
    ]
    if node.app.dashboard is not None:  # the app's page (App.dashboard): it reads /graphql like any client
        routes.append(Route("/dashboard", _page(node.app.dashboard), methods=["GET"]))
    if authenticator is None:
        authenticator = Authenticator.from_settings(node.settings)
    clients = AuthGate(Starlette(routes=routes), authenticator, websocket_init_auth=True)  # or by connection_init
    return RequestGuard(clients, node.settings, {}, node.metrics.request_cut)


def kafka_status(node: Node) -> KafkaStatus | None:
    """Return what the node's KafkaWatch learned of Kafka (None before the node watches it)."""
    return None if node.kafka_watch is None else node.kafka_watch.status()


async def _not_for_clients(_: Request) -> Response:
    message = "peers' endpoints are served only on the node's peer listener (--peer-port), not to clients"
    return JSONResponse({"errors": [{"message": message, "extensions": {"code": NOT_FOUND}}]}, status_code=404)


def peer_asgi(node: Node, internal: Any) -> Any:
    """Return the peers' listener: ``/internal/*`` only, nothing else.

    Each request is signed (``app.security.peer_auth``): its signed head (sender, receiver, time, nonce, path,
    the body's hash and size) is verified by ``RequestGuard`` BEFORE its body is read, and the body is then read
    against the declared size and hash (``PeerGate``). Its own limits: a body of up to ``peer_body_bytes`` (a
    batch of many lookups), and its own connection cap (app.http.connections).
    """
    settings = node.settings
    verifier = PeerVerifier(settings.cluster_secret or secrets.token_bytes(32), settings.node_id)  # none: no peer
    limit = peer_body_bytes(settings)
    received = node.metrics.forwarded_received
    live = functools.partial(_live, node)
    routes = [
        Route(INTERNAL_PATH, PeerGate(internal, verifier, received, limit), methods=["POST"]),
        *(
            Route(path, PeerGate(StreamEndpoint(events), verifier, received, limit), methods=["POST"])
            for path, events in ((FOLLOW_PATH, follow_events(live)), (CHANGES_PATH, changes_events(live)))
        ),  # peers' live upstreams (app.live.relay)
    ]
    bodies = {path: limit for path in (INTERNAL_PATH, FOLLOW_PATH, CHANGES_PATH)}
    signed = {path: verifier.admits for path in bodies}  # checked before bodies
    return RequestGuard(Starlette(routes=routes), settings, bodies, node.metrics.request_cut, signed)


class Listeners:
    """The node's ASGI app: a request (or lifespan event) goes to the peers' app when it came in on the peer
    port, to the clients' otherwise."""

    def __init__(self, clients: Any, peers: Any, peer_port: int) -> None:
        self.clients, self.peers, self.peer_port = clients, peers, peer_port

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        server = scope.get("server")
        if server is not None and len(server) > 1 and server[1] == self.peer_port:
            await self.peers(scope, receive, send)
        else:
            await self.clients(scope, receive, send)


def _live(node: Node) -> Live:
    if node.live is None:
        raise ApiError(f"{node.settings.node_id} is not running yet", STORE_NOT_READY, retryAfterMs=1000)
    return node.live


def _page(path: Path) -> Any:
    """Return an endpoint answering with the HTML file at path."""

    async def page(_: Request) -> Response:
        return FileResponse(path, media_type="text/html")

    return page


def peer_body_bytes(settings: Settings) -> int:
    """Return the largest sub-request body a peer may send: up to wire.MAX_LOOKUPS clients' bodies in one."""
    return 16 * settings.max_body_bytes


def _raw_lookup(node: Node) -> Any:
    """Return an endpoint doing a local point lookup as plain JSON (the benchmark's ceiling: no GraphQL, no routing
    beyond the key's partitions, this node's partitions only)."""

    async def lookup(request: Request) -> Response:
        assert node.local is not None and node.topic_watch is not None  # noqa: S101 - started before serving
        store, key = request.path_params["store"], request.path_params["key"]
        if not principal_of(request.scope).may_read(store):
            return JSONResponse({"error": f"not allowed to read store {store!r}"}, status_code=403)
        try:
            definition = node.app.store(store)
        except KeyError:
            return JSONResponse({"error": f"no store {store!r}"}, status_code=404)
        detected = node.topic_watch.partitioner(definition.topic)
        partitions = store_key_partitions(node.app, definition, key, detected)
        [value] = node.local.read_states(store, [((key, None, None), partitions)]).value
        if isinstance(value, Exception):
            return JSONResponse({"error": str(value)}, status_code=503)
        return JSONResponse({"key": key, "value": finalize(definition, value)})

    return lookup


def graphql_app(
    node: Node, authenticator: Authenticator | None = None, documents: PersistedDocuments | None = None
) -> tuple[Any, Any]:
    """Return the Strawberry ASGI apps answering the node's store queries: clients', and peers' (internal).

    authenticator: how a websocket is authenticated by its connection_init payload (None: the settings' one).
    documents: the trusted documents (validated against the schema and compiled here: NodeStartError naming one
    that does not validate) and APQ's cache; None: the settings' (``persisted_documents``).
    """
    from iqgraph.app.catalog import entity_infos
    from iqgraph.app.owner.runner import owner_field_infos
    from iqgraph.schema import GraphQLApp, Limits, build_schema
    from iqgraph.schema.builder import build_internal_schema

    assert node.queries is not None and node.local is not None  # noqa: S101 - started before serving
    settings = node.settings
    limits = Limits(
        max_keys=settings.max_keys,
        max_page_size=settings.max_page_size,
        default_page_size=settings.default_page_size,
        max_aliases=settings.max_aliases,
        max_depth=settings.max_depth,
        max_tokens=settings.max_tokens,
        max_body_bytes=settings.max_body_bytes,
        max_header_bytes=settings.max_header_bytes,
        request_timeout_ms=settings.request_timeout_ms,
    )
    schema = build_schema(
        node.queries.stores(),
        limits,
        entities=entity_infos(node.app),
        owner_fields=owner_field_infos(node.app),
        description=node.app.description,
        metrics=node.metrics.graphql,
        compiled=settings.compiled,
        introspection=settings.introspection,
        subscriptions=True,
        federation=settings.federation,
    )
    authenticator = authenticator or Authenticator.from_settings(settings)
    documents = documents or persisted_documents(settings)
    try:
        schema.trust(documents)  # type: ignore[attr-defined] # build_schema makes an IqGraphSchema
    except ManifestError as exc:
        raise NodeStartError(str(exc)) from None
    public = GraphQLApp(
        schema,
        node.queries,
        limits,
        compiled=settings.compiled,
        require_principal=True,
        live=node.live,
        connection_auth=None if authenticator is None else init_authenticator(authenticator),
        documents=documents,
    )
    internal_schema = build_internal_schema(
        limits, owner_field_infos(node.app), getattr(schema, "request_metrics", None)
    )
    internal = GraphQLApp(internal_schema, node.queries, limits, local=node.local, require_principal=True)
    return public, internal


def persisted_documents(settings: Settings) -> PersistedDocuments:
    """Return the documents requests may name: the settings' trusted manifest (read here: NodeStartError saying
    what to fix) and APQ's cache."""
    if settings.trusted_documents is None:
        return PersistedDocuments()
    try:
        trusted = load_manifest(settings.trusted_documents)
    except ManifestError as exc:
        raise NodeStartError(str(exc)) from None
    return PersistedDocuments(trusted, settings.only_trusted_documents)


def serve(settings: Settings, app: App) -> int:
    """Run a node until interrupted; return the exit code."""
    tls = server_options(settings)  # its files, the CA's and the authenticator's are checked before Spark starts
    peer_verify(settings)
    authenticator = Authenticator.from_settings(settings)
    documents = persisted_documents(settings)  # the manifest is read before Spark starts too
    if settings.tracing:
        tracing.enable(settings.node_id, settings.tracing_documents)
    for handler in logging.getLogger().handlers:  # Kafka away: one line from the node's KafkaWatch, not librdkafka's
        handler.addFilter(ConnectionNoise())  # hundreds (every client's every reconnect)
    listeners = [bind_listener(settings.host, settings.port)]  # before Spark: it takes ports of its own
    try:
        if settings.has_peers:  # peers' sub-requests come on a listener of their own (peer_asgi)
            listeners.append(bind_listener(settings.host, settings.peer_listen_port, "--peer-port"))
        node = Node(settings, app)
        # one write per line: the restore watch and the pipelines' start say things from two threads at once
        progress = lambda message: print(f"iqgraph: {message}\n", end="", flush=True)  # noqa: E731
        node.start(progress=progress, serve_first=True)  # the streaming queries start once Spark has (a thread)
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    node.watch_restore(progress)
    try:
        public, internal = graphql_app(node, authenticator, documents)
        asgi = build_asgi(node, public, internal if settings.has_peers else None, settings.raw_endpoint, authenticator)
        print(f"iqgraph: serving {app.name} at {settings.url}/graphql (GraphiQL in a browser)", flush=True)
        if settings.has_peers:
            print(f"iqgraph: peers' listener at {settings.peer_url} (/internal/* only)", flush=True)
        print(f"iqgraph: {settings.describe_security()}; {describe(documents)}", flush=True)
        hygiene = lambda: Hygiene(  # noqa: E731 - each listener bounds and counts its own connections
            settings.header_timeout_s, settings.keep_alive_timeout_s, settings.max_connections
        )
        peers = {settings.peer_listen_port: hygiene()} if settings.has_peers else {}
        config = server_config(asgi, hygiene(), peers, **tls)  # HTTPS on both (app.security.tls); slow sockets closed
        gc.collect()
        gc.freeze()  # what start-up made lives as long as the node: keep it out of the collector's full passes
        run_until_signalled(NodeServer(config, node), listeners)
    finally:
        for listener in listeners:
            listener.close()
        print("iqgraph: stopping: streaming queries, stores, Spark", flush=True)
        node.stop()
    if node.start_failure is not None:  # the streaming queries could not start: the server stopped for it
        raise node.start_failure
    return 0


class NodeServer(uvicorn.Server):
    """uvicorn's server that, as it shuts down, ends the node's live subscriptions still streaming over HTTP.

    uvicorn asks every connection to shut down: a websocket gets its close (Strawberry cancels its operations:
    clean), but an SSE stream or a peer's upstream is a request in flight that would hold the shutdown until
    uvicorn cancels it (10 s later, with a traceback). Once the websockets are gone (at most WEBSOCKETS_S), the
    rest are ended (``Live.stop``): each stream completes, and the shutdown goes on at once.
    """

    WEBSOCKETS_S = 2.0

    def __init__(self, config: uvicorn.Config, node: Node) -> None:
        super().__init__(config)
        self.node = node

    async def on_tick(self, counter: int) -> bool:
        """Return whether to exit: when asked to, or when the node's streaming queries could not start."""
        return await super().on_tick(counter) or self.node.start_failure is not None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        ending = asyncio.ensure_future(self._end_live_streams())
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()

    async def _end_live_streams(self) -> None:
        await asyncio.sleep(0)  # uvicorn's shutdown has asked each connection to close
        deadline = time.monotonic() + self.WEBSOCKETS_S
        while time.monotonic() < deadline and any(
            "WebSocket" in type(c).__name__ for c in self.server_state.connections
        ):
            await asyncio.sleep(0.05)
        if self.node.live is not None:
            self.node.live.stop()


def bind_listener(host: str, port: int, flag: str = "--port") -> socket.socket:
    """Return a socket bound to host:port for uvicorn to listen on; NodeStartError if the port is taken.

    Bound at once, before the node starts Spark: Spark's driver and its Kafka and Python connections take
    ephemeral ports of their own, and the port chosen for the node must not be one of them by the time
    the server listens (a port free when chosen was seen taken 15 s later). A taken port fails in a second,
    not after Spark started.
    """
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)  # as uvicorn binds host
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise NodeStartError(f"cannot listen on {host}:{port} ({exc.strerror}): choose another {flag}") from None
    return listener


def run_until_signalled(server: uvicorn.Server, listeners: list[socket.socket] | None = None) -> None:
    """Run server until SIGINT or SIGTERM, then return so that the caller can stop the node cleanly.

    uvicorn finishes in-flight requests, then re-raises the signal it caught to the handler that was
    installed before it ran; ours only notes it, so the process goes on to close RocksDB and stop Spark
    instead of dying with the signal.
    """
    previous = {sig: signal.signal(sig, _note_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=listeners)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _note_signal(sig: int, _frame: object) -> None:
    log.info("received signal %d after the server stopped", sig)
