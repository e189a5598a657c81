"""Tracing through every hop: W3C Trace Context in and out of every node, OpenTelemetry spans.

Off by default (``IQGRAPH_TRACING``): ``ENABLED`` is False, no ASGI wrapper is installed, and each hook on a hot
path costs one test of that flag. On (``enable``, from the node's settings), with the OpenTelemetry SDK installed
(the ``tracing`` extra), spans go to the process's tracer provider — one made here exporting over OTLP/HTTP in
batches (the exporter's own ``OTEL_EXPORTER_OTLP_*`` settings: default ``http://localhost:4318``), unless the
process has one already (``opentelemetry-instrument``). The spans, named after OpenTelemetry's conventions:

- per HTTP request (``TraceContext``, around each listener): SERVER, continuing the caller's ``traceparent`` (a
  client's, or the peer's that forwarded it); renamed to the GraphQL operation's type once the request is read
  (``operation``), with ``graphql.operation.type``, ``graphql.operation.name`` and — only with
  ``IQGRAPH_TRACING_DOCUMENTS=true``, documents may hold literals — ``graphql.document``. Every response carries
  ``traceresponse`` (W3C Trace Context Level 2), so a client can find the trace of a slow answer;
- per store batch (``app.query.executor``: the reads of one store sent to one replica): ``iqgraph.store``,
  ``iqgraph.node``, ``iqgraph.partitions``, ``iqgraph.reads``, ``iqgraph.replica`` (active or standby);
- per forwarded request (``app.cluster.peers``): CLIENT, ``server.address`` (the peer), the status and bytes
  both ways; its ``traceparent`` goes with it (owner calls and live upstreams too), so the peer's spans are its
  children and a query answered by three nodes is ONE trace;
- per failover retry (``app.query.executor``): a round of reads after the first, with the partitions it retries.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

log = logging.getLogger(__name__)

#: Whether spans are made: set once at start (``enable``); every hook tests it first.
ENABLED = False
#: Whether a request's span carries its document (graphql.document).
DOCUMENTS = False
_tracer: Any = None
_OPERATION = re.compile(r"\b(query|mutation|subscription)\b(?:\s+([_A-Za-z][_0-9A-Za-z]*))?")


def enable(node_id: str, documents: bool = False) -> bool:
    """Turn tracing on for this process; False (logged) when the OpenTelemetry SDK is not installed."""
    global ENABLED, DOCUMENTS, _tracer  # noqa: PLW0603 - one switch for the process, set at start
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("tracing is on but OpenTelemetry is not installed: pip install 'iqgraph[tracing]'")
        return False
    if not isinstance(trace.get_tracer_provider(), TracerProvider):  # none configured by the process
        resource = Resource.create({"service.name": "iqgraph", "service.instance.id": node_id})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("iqgraph")
    ENABLED, DOCUMENTS = True, documents
    return True


def disable() -> None:
    """Turn tracing off (the tests' undo of ``enable``)."""
    global ENABLED  # noqa: PLW0603
    ENABLED = False


def span(name: str, attributes: dict[str, Any], kind: str = "INTERNAL") -> AbstractContextManager[Any]:
    """Return a context manager of a span made current (a no-op when tracing is off)."""
    if not ENABLED:
        return nullcontext()
    from opentelemetry.trace import SpanKind

    return _tracer.start_as_current_span(name, kind=getattr(SpanKind, kind), attributes=attributes)


async def traced(name: str, attributes: dict[str, Any], work: Awaitable[Any]) -> Any:
    """Await work inside a span of its own."""
    with span(name, attributes):
        return await work


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current trace context (traceparent, tracestate) to an outgoing request's headers."""
    if ENABLED:
        from opentelemetry import propagate

        propagate.inject(headers)


def current() -> Any:
    """Return the current span (a non-recording one when tracing is off)."""
    from opentelemetry import trace

    return trace.get_current_span()


def operation(document: str | None, operation_name: str | None) -> None:
    """Name the current request's span after its GraphQL operation (OpenTelemetry's GraphQL conventions)."""
    if not ENABLED or document is None:
        return
    found = None
    for match in _OPERATION.finditer(document):
        if operation_name is None or match.group(2) == operation_name:
            found = match
            break
    kind = found.group(1) if found is not None else "query"  # a document that starts with "{": a query
    name = operation_name or (found.group(2) if found is not None else None)
    live = current()
    live.update_name(kind)
    live.set_attribute("graphql.operation.type", kind)
    if name:
        live.set_attribute("graphql.operation.name", name)
    if DOCUMENTS:
        live.set_attribute("graphql.document", document)


Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class TraceContext:
    """An ASGI wrapper: each HTTP request in a SERVER span continuing its ``traceparent``, and a ``traceresponse``
    header on its answer. Install it only when tracing is on (``ENABLED``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind

        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())}
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        with _tracer.start_as_current_span(
            f"{scope['method']} {scope['path']}", propagate.extract(carrier), SpanKind.SERVER, attributes
        ) as request_span:
            context = request_span.get_span_context()
            header = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}".encode()

            async def answered(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", ()), (b"traceresponse", header)]}
                    request_span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, answered)
