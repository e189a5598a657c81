"""An OTLP/HTTP trace receiver for the tests: what a collector (Jaeger, the OpenTelemetry collector) gets from nodes
exporting with ``IQGRAPH_TRACING=true``, decoded with OpenTelemetry's own protobuf messages and kept in memory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.servers import serve_in_thread


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: its ids (hex), name, kind, attributes and the node (service.instance.id) that made it."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    attributes: dict[str, Any]
    node: str


@dataclass
class Received:
    """The spans received so far."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """Serve POST /v1/traces on loopback; yield (the endpoint for OTEL_EXPORTER_OTLP_ENDPOINT, what it received)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    received = Received()

    async def traces(request: Request) -> Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.body())
        found = []
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                            {a.key: _value(a.value) for a in span.attributes},
                            str(resource.get("service.instance.id", "")),
                        )
                    )
        with received.lock:
            received.spans.extend(found)
        return Response(b"", media_type="application/x-protobuf")

    with serve_in_thread(Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])) as url:
        yield url, received
