"""Tracing (``schema.tracing``) in-process, spans kept in memory: a request continues its caller's W3C trace, its span
is named after the GraphQL operation, its answer names the trace (``traceresponse``); off, nothing is wrapped and
no header is sent. Three real nodes sharing ONE trace: tests/e2e/test_cluster.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from iqgraph.schema import tracing
from tests.schema.conftest import Hosted
from tests.support.served import served_app

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def exporter() -> Any:
    """The process's tracer provider: spans kept in memory (set once: OpenTelemetry refuses a second)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(provider)
    else:  # another module set one: add ours to it
        trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(memory))  # type: ignore[attr-defined]
    return memory


@pytest.fixture
def traced(exporter: Any) -> Iterator[Any]:
    assert tracing.enable("node-t", documents=True)
    exporter.clear()
    try:
        yield exporter
    finally:
        tracing.disable()


async def test_a_request_continues_its_callers_trace_is_named_after_its_operation_and_names_its_trace(
    shop_hosted: Hosted, traced: Any
) -> None:
    transport = httpx.ASGITransport(app=served_app(shop_hosted))
    query = 'query Spend { orderCount { get(key: "customer-01") } }'
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT}-01", "accept": "application/graphql-response+json"}
    async with httpx.AsyncClient(transport=transport, base_url="http://iqgraph") as http:
        response = await http.post("/graphql", json={"query": query}, headers=headers)
    assert response.status_code == 200
    version, trace_id, span_id, flags = response.headers["traceresponse"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    [request] = [s for s in traced.get_finished_spans() if s.kind.name == "SERVER"]
    assert request.name == "query" and f"{request.context.span_id:016x}" == span_id
    assert f"{request.parent.span_id:016x}" == PARENT and f"{request.context.trace_id:032x}" == TRACE_ID
    assert request.attributes["graphql.operation.type"] == "query"
    assert request.attributes["graphql.operation.name"] == "Spend"
    assert request.attributes["graphql.document"] == query
    assert request.attributes["http.response.status_code"] == 200


async def test_off_nothing_is_wrapped_and_no_trace_is_named(shop_hosted: Hosted, exporter: Any) -> None:
    assert not tracing.ENABLED
    exporter.clear()
    transport = httpx.ASGITransport(app=served_app(shop_hosted))
    async with httpx.AsyncClient(transport=transport, base_url="http://iqgraph") as http:
        response = await http.post("/graphql", json={"query": "{ node { id } }"})
    assert response.status_code == 200 and "traceresponse" not in response.headers
    assert exporter.get_finished_spans() == ()


def test_the_operation_is_found_by_its_name_or_its_first_keyword() -> None:
    cases = {
        ("{ node { id } }", None): ("query", None),
        ("query A { node { id } } subscription B { x }", "B"): ("subscription", "B"),
        ("# a comment\nmutation M { x }", None): ("mutation", "M"),
    }
    from opentelemetry import trace

    assert tracing.enable("node-t")
    try:
        tracer = trace.get_tracer("test")
        for (document, name), (kind, found) in cases.items():
            with tracer.start_as_current_span("request") as span:
                tracing.operation(document, name)
                assert span.name == kind and span.attributes.get("graphql.operation.name") == found
                assert "graphql.document" not in span.attributes  # only when asked
    finally:
        tracing.disable()
