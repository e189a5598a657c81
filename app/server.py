"""The node's ASGI server: /graphql (POST, GET, GraphiQL), /healthz, /readyz, /metrics, run by uvicorn.

Graceful shutdown: uvicorn stops accepting connections and lets in-flight requests finish; then the node
stops its streaming queries, closes RocksDB and stops Spark.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from iqgraph.app.metrics import scrape, tracing_extensions
from iqgraph.app.node import Node
from iqgraph.app.settings import Settings
from iqgraph.schema.asgi import FORWARDED_HEADER
from iqgraph.schema.graphiql import graphiql_mount

if TYPE_CHECKING:
    from iqgraph.streaming.definitions import App

log = logging.getLogger(__name__)


def build_asgi(node: Node, graphql: Any, raw_endpoint: bool = False) -> Starlette:
    """Return the ASGI app of a started node, serving graphql at /graphql."""

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "alive", "node": node.settings.node_id})

    async def readyz(_: Request) -> Response:
        ready = node.ready()
        partitions = [] if node.queries is None else node.queries.node().partitions
        body = {
            "ready": ready,
            "state": node.state.value,
            "partitions": [{"topic": p.topic, "partition": p.partition, "state": p.state} for p in partitions],
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    counted = ForwardCounter(graphql, node.metrics.forwarded_received)

    async def metrics(_: Request) -> Response:
        # in a thread: the partition gauges ask Kafka for the end offsets
        return Response(await run_in_threadpool(scrape, node.metrics), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        graphiql_mount("/graphql"),  # GraphiQL's assets at /graphql/static (schema.graphiql)
        Route("/graphql", counted, methods=["GET", "POST"]),
    ]
    if raw_endpoint:
        routes.append(Route("/raw/{store}/{key}", _raw_lookup(node), methods=["GET"]))
    return Starlette(routes=routes)


class ForwardCounter:
    """ASGI wrapper counting the forwarded sub-requests received, per node the forwarded header names.

    The header is not authenticated yet (any client can send it): ``count`` gets its raw value and must
    bound it (NodeMetrics labels it only when it names a member, else ``unknown``).
    """

    def __init__(self, app: Any, count: Callable[[str], None]) -> None:
        self.app = app
        self.count = count

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Count a forwarded request, then serve it."""
        origin = dict(scope.get("headers") or []).get(FORWARDED_HEADER.encode())
        if origin is not None:
            self.count(origin.decode("latin-1"))
        await self.app(scope, receive, send)


def _raw_lookup(node: Node) -> Any:
    """Return an endpoint doing a point lookup as plain JSON (the benchmark's ceiling)."""

    async def lookup(request: Request) -> Response:
        assert node.queries is not None  # noqa: S101 - started before serving
        store, key = request.path_params["store"], request.path_params["key"]
        [value] = await node.queries.get_many(store, [key])
        if isinstance(value, Exception):
            return JSONResponse({"error": str(value)}, status_code=503)
        return JSONResponse({"key": key, "value": value})

    return lookup


def graphql_app(node: Node) -> Any:
    """Return the Strawberry ASGI app answering the node's store queries."""
    from iqgraph.schema import GraphQLApp, Limits, build_schema

    assert node.queries is not None  # noqa: S101 - started before serving
    settings = node.settings
    limits = Limits(
        max_keys=settings.max_keys, max_page_size=settings.max_page_size, default_page_size=settings.default_page_size
    )
    schema = build_schema(
        node.queries.stores(),
        limits,
        description=node.app.description,
        metrics=node.metrics.graphql,
        extensions=tracing_extensions(settings.tracing),
    )
    cluster = node.cluster or node.queries
    queries_for = node.cluster.bind if node.cluster is not None else None
    return GraphQLApp(schema, cluster, limits, local=node.queries, queries_for=queries_for)


def serve(settings: Settings, app: App) -> int:
    """Run a node until interrupted; return the exit code."""
    node = Node(settings, app)
    progress = lambda message: print(f"iqgraph: {message}", flush=True)  # noqa: E731
    node.start(progress=progress)
    node.watch_restore(progress)
    try:
        asgi = build_asgi(node, graphql_app(node), raw_endpoint=settings.raw_endpoint)
        print(f"iqgraph: serving {app.name} at {settings.url}/graphql (GraphiQL in a browser)", flush=True)
        config = uvicorn.Config(
            asgi, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=10
        )
        gc.collect()
        gc.freeze()  # what start-up made lives as long as the node: keep it out of the collector's full passes
        run_until_signalled(uvicorn.Server(config))
    finally:
        print("iqgraph: stopping: streaming queries, stores, Spark", flush=True)
        node.stop()
    return 0


def run_until_signalled(server: uvicorn.Server) -> None:
    """Run server until SIGINT or SIGTERM, then return so that the caller can stop the node cleanly.

    uvicorn finishes in-flight requests, then re-raises the signal it caught to the handler that was
    installed before it ran; ours only notes it, so the process goes on to close RocksDB and stop Spark
    instead of dying with the signal.
    """
    previous = {sig: signal.signal(sig, _note_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _note_signal(sig: int, _frame: object) -> None:
    log.info("received signal %d after the server stopped", sig)


def print_schema(app: App) -> int:
    """Print the SDL of app's schema (value types need a brief local Spark session)."""
    from iqgraph.app.local_queries import LocalStoreQueries
    from iqgraph.schema import Limits, build_schema
    from iqgraph.streaming.session import build_spark_session
    from iqgraph.streaming.value_types import value_types

    spark = build_spark_session("local[1]", app_name="iqgraph-schema", log_level="ERROR")
    try:
        queries = LocalStoreQueries(app, value_types(app, spark), {})
    finally:
        spark.stop()
    sys.stdout.write(build_schema(queries.stores(), Limits(), description=app.description).as_str() + "\n")
    return 0
