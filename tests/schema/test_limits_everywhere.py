"""Limits everywhere (issue 11, part 5): every limit at and over its bound, on the compiled (lean) path and the
Strawberry path alike (DifferentialASGI: same status, Content-Type and body), the internal fields bound by the
public limits, unknown internal arguments BAD_REQUEST, and bad input refused while other queries still answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from iqgraph.schema import GraphQLApp, Limits
from iqgraph.schema.asgi import FORWARDED_HEADER, CancelOnDisconnect
from iqgraph.schema.wire import SCAN, lookup_variables, lookups
from tests.schema.apps import shop_partition
from tests.schema.conftest import Api, DifferentialASGI, MakeApi

QUERY = "{ node { id } }"  # 6 tokens as the parser counts them (EOF too), depth 2
DEEP = "{ orderCount { all(first: 1) { edges { node { key } } } } }"  # depth 4 (strawberry counts selection sets)


def client(api: Api, **headers: str) -> httpx.AsyncClient:
    """Return an in-process client of api's two apps (lean/compiled and Strawberry's), failing if they differ."""
    transport = httpx.ASGITransport(app=DifferentialASGI(api))
    return httpx.AsyncClient(transport=transport, base_url="http://iqgraph", headers=headers)


def code(response: httpx.Response) -> str:
    """Return the code of a response's first error."""
    return str(response.json()["errors"][0]["extensions"]["code"])


def aliases(n: int) -> str:
    return "{ " + " ".join(f"a{i}: node {{ id }}" for i in range(n)) + " }"


@pytest.mark.parametrize(
    ("limits", "query", "status", "error"),
    [
        (Limits(max_aliases=3), aliases(3), 200, None),
        (Limits(max_aliases=3), aliases(4), 422, "LIMIT_EXCEEDED"),
        (Limits(max_depth=4), DEEP, 200, None),
        (Limits(max_depth=3), DEEP, 422, "LIMIT_EXCEEDED"),
        (Limits(max_tokens=6), QUERY, 200, None),
        (Limits(max_tokens=5), QUERY, 400, "GRAPHQL_PARSE_FAILED"),
    ],
)
async def test_document_limits_on_both_paths(
    make_shop: MakeApi, limits: Limits, query: str, status: int, error: str | None
) -> None:
    async with client(make_shop(limits)) as http:
        for response in (
            await http.post("/graphql", json={"query": query}),
            await http.get("/graphql", params={"query": query}),
        ):
            assert response.status_code == status, response.text
            if error is None:
                assert "errors" not in response.json()
            else:
                assert "data" not in response.json() and code(response) == error


async def test_depth_over_the_limit_is_one_error(make_shop: MakeApi) -> None:
    wide = (
        "{ "
        + " ".join(f"x{i}: orderCount {{ all(first: 1) {{ edges {{ node {{ key }} }} }} }}" for i in range(5))
        + " }"
    )
    async with client(make_shop(Limits(max_depth=3))) as http:
        body = (await http.post("/graphql", json={"query": wide})).json()
    assert len(body["errors"]) == 1 and body["errors"][0]["extensions"] == {"code": "LIMIT_EXCEEDED", "limit": 3}


async def test_body_limit_at_and_over(make_shop: MakeApi) -> None:
    body = orjson.dumps({"query": QUERY})
    async with client(make_shop(Limits(max_body_bytes=len(body)))) as http:
        assert (
            await http.post("/graphql", content=body, headers={"content-type": "application/json"})
        ).status_code == 200
    async with client(make_shop(Limits(max_body_bytes=len(body) - 1))) as http:
        refused = await http.post("/graphql", content=body, headers={"content-type": "application/json"})
        assert refused.status_code == 413 and code(refused) == "LIMIT_EXCEEDED"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused once the bytes pass the limit
            yield body[:10]
            yield body[10:]

        streamed = await http.post("/graphql", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413 and code(streamed) == "LIMIT_EXCEEDED"


async def test_header_limit_at_and_over(make_shop: MakeApi) -> None:
    async with client(make_shop(Limits(max_header_bytes=400))) as http:
        assert (await http.get("/graphql", params={"query": QUERY})).status_code == 200
        refused = await http.get("/graphql", params={"query": QUERY}, headers={"x-big": "x" * 400})
        assert refused.status_code == 431 and code(refused) == "LIMIT_EXCEEDED"


async def test_deadline_refuses_a_request_too_slow(make_shop: MakeApi) -> None:
    api = make_shop(Limits(request_timeout_ms=50))

    async def slow() -> AsyncIterator[bytes]:
        yield b'{"query": '
        await asyncio.sleep(2)
        yield b'"{ node { id } }"}'

    app = GraphQLApp(api.schema, api.queries, api.limits)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://iqgraph") as http:
        started = time.monotonic()
        response = await http.post("/graphql", content=slow(), headers={"content-type": "application/json"})
    assert response.status_code == 504 and code(response) == "TIMEOUT"
    assert time.monotonic() - started < 1.5


async def test_a_request_whose_client_went_away_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def never_answers(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]
    gone = asyncio.Event()

    async def receive() -> Any:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    task = asyncio.ensure_future(CancelOnDisconnect(never_answers)({"type": "http"}, receive, send))
    await asyncio.sleep(0.05)
    assert not task.done()
    gone.set()
    await asyncio.wait_for(task, 2)
    assert cancelled.is_set() and sent == []


# -- the internal fields, bound by the public limits --------------------------------------------------------

FORWARDED = {"accept": "application/graphql-response+json", FORWARDED_HEADER: "node-1"}
SMALL = Limits(max_keys=2, max_page_size=2, default_page_size=2, max_aliases=1)  # max_forwarded_reads: 4


def forwarded(api: Api, lean: bool) -> httpx.AsyncClient:
    app = GraphQLApp(
        api.schema if lean else api.reference, api.queries, api.limits, local=api.queries.local, compiled=lean
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://iqgraph", headers=FORWARDED)


def reads(n: int) -> list[Any]:
    return [[f"customer-{i:02}", None, None, [shop_partition(f"customer-{i:02}")]] for i in range(n)]


@pytest.mark.parametrize("lean", [True, False])
async def test_lookup_reads_bound(make_shop: MakeApi, lean: bool) -> None:
    api = make_shop(SMALL)
    assert SMALL.max_forwarded_reads == 4
    async with forwarded(api, lean) as http:
        for n, expected in ((4, None), (5, "LIMIT_EXCEEDED")):
            variables, _ = lookup_variables([("order_count", reads(n))])
            body = (await http.post("/graphql", json={"query": lookups(1), "variables": variables})).json()
            assert (body.get("errors") or [{"extensions": {"code": None}}])[0]["extensions"]["code"] == expected


async def test_lookup_lean_and_graphql_core_answer_alike(make_shop: MakeApi) -> None:
    api = make_shop(SMALL)
    variables, _ = lookup_variables([("order_count", reads(5))])
    payload = {"query": lookups(1), "variables": variables}
    async with forwarded(api, True) as lean, forwarded(api, False) as reference:
        a, b = await lean.post("/graphql", json=payload), await reference.post("/graphql", json=payload)
    assert (a.status_code, a.content) == (b.status_code, b.content)


def scan_variables(scan: Any, first: int = 2) -> dict[str, Any]:
    return {"store": "order_count", "scan": scan, "positions": {}, "first": first, "partitions": [0]}


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        (scan_variables({"kind": "range", "args": {}}, 2), None),
        (scan_variables({"kind": "range", "args": {}}, 3), "LIMIT_EXCEEDED"),
        (scan_variables({"kind": "range", "args": {}}, 100_000), "LIMIT_EXCEEDED"),
        (scan_variables({"kind": "nonsense", "args": {}}), "BAD_REQUEST"),
        (scan_variables({"kind": "top", "args": {}}), "BAD_REQUEST"),  # a key-value store has no ranking scan
        (scan_variables({"kind": "range", "args": {"bogus": 1}}), "BAD_REQUEST"),
        (scan_variables({"kind": "range", "args": {"from_key": 7}}), "BAD_REQUEST"),  # String keys
        (scan_variables({"kind": "prefix", "args": {}}), "BAD_REQUEST"),
        (scan_variables("not a scan"), "BAD_REQUEST"),
        ({**scan_variables({"kind": "range"}), "positions": {"0": 5}}, "BAD_REQUEST"),
    ],
)
async def test_scan_arguments(make_shop: MakeApi, variables: dict[str, Any], expected: str | None) -> None:
    async with forwarded(make_shop(SMALL), False) as http:
        body = (await http.post("/graphql", json={"query": SCAN, "variables": variables})).json()
    found = (body.get("errors") or [{"extensions": {"code": None}}])[0]["extensions"]["code"]
    assert found == expected, body


async def test_lookup_reads_that_do_not_decode_are_bad_request(shop: Api) -> None:
    variables, _ = lookup_variables([("order_count", [["customer-01", None, None]])])
    async with forwarded(shop, True) as http:
        body = (await http.post("/graphql", json={"query": lookups(1), "variables": variables})).json()
    assert body["errors"][0]["extensions"]["code"] == "BAD_REQUEST"


# -- bad input while other queries run -----------------------------------------------------------------------


async def test_bad_input_is_refused_while_queries_answer(shop: Api) -> None:
    """Huge headers, a 50 MB body, a 10,000-level document, 10,000 aliases: coded, bounded; the rest answers."""
    sent = 0

    async def fifty_megabytes() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"query": "'
        for _ in range(50 * 16):
            sent += 64 << 10
            yield b"x" * (64 << 10)
        yield b'"}'

    nested = "{" + "orderCount { " * 10_000 + "count" + " }" * 10_000 + "}"
    json_headers = {"content-type": "application/json"}
    app = CancelOnDisconnect(GraphQLApp(shop.schema, shop.queries, shop.limits))  # as the server serves it
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://iqgraph") as http:

        async def bad() -> list[tuple[int, str]]:
            answers = [
                await http.get("/graphql", params={"query": QUERY}, headers={"x-huge": "x" * (1 << 20)}),
                await http.post("/graphql", content=fifty_megabytes(), headers=json_headers),
                await http.post("/graphql", json={"query": nested}),
                await http.post("/graphql", json={"query": aliases(10_000)}),
            ]
            return [(r.status_code, code(r)) for r in answers]

        async def good() -> list[int]:
            statuses = []
            for _ in range(20):
                statuses.append((await http.post("/graphql", json={"query": QUERY})).status_code)
                await asyncio.sleep(0)
            return statuses

        started = time.monotonic()
        refused, *answered = await asyncio.gather(bad(), good(), good())
    assert refused == [
        (431, "LIMIT_EXCEEDED"),
        (413, "LIMIT_EXCEEDED"),
        (400, "GRAPHQL_PARSE_FAILED"),
        (400, "GRAPHQL_PARSE_FAILED"),  # 10,000 aliases are more tokens than a document may have
    ]
    assert sent < 8 << 20  # the body was not read whole (the limit is 4 MiB)
    assert all(s == 200 for statuses in answered for s in statuses)
    assert time.monotonic() - started < 30
    async with client(shop) as http:  # the node keeps serving
        assert (await http.post("/graphql", json={"query": QUERY})).status_code == 200
