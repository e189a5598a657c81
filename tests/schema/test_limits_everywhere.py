"""Limits everywhere (issue 11, part 5): the document limits (tokens, aliases, depth) at and over their bound on
the compiled (lean) path and the Strawberry path alike (DifferentialASGI: same status, Content-Type and
body), documents that would cost without bound (fragment fan-out, long chains, JSON nested too deeply), the
caches of documents bounded in characters, and the bytes limits of the node's guard in front of GraphQLApp.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from iqgraph.app.http.request_guard import RequestGuard
from iqgraph.schema import GraphQLApp, Limits
from iqgraph.schema.limits import CACHED_CHARS, CACHED_DOCUMENT_CHARS, DocumentCache
from tests.schema.conftest import Api, DifferentialASGI, MakeApi

QUERY = "{ node { id } }"  # 6 tokens as the parser counts them (EOF too), depth 1
DEEP = "{ orderCount { all(first: 1) { edges { node { key } } } } }"  # depth 4 (strawberry counts selection sets)
RELATED = "{ orderCount { all(first: 2) { edges { node { customer { key favorite { name } } } } } } }"  # depth 6


def client(api: Api, guard: Limits | None = None) -> httpx.AsyncClient:
    """Return an in-process client of api's two apps (lean/compiled and Strawberry's), failing if they differ.

    guard: limits of an app.request_guard in front, as the node serves them.
    """
    app = DifferentialASGI(api)
    transport = httpx.ASGITransport(app=app if guard is None else RequestGuard(app, guard))
    return httpx.AsyncClient(transport=transport, base_url="http://iqgraph", headers=SPEC_CLIENT)


#: What a client of the spec sends (a legacy client's request errors are 200: tests/schema/test_http_spec.py).
SPEC_CLIENT = {"accept": "application/graphql-response+json"}


def code(response: httpx.Response) -> str:
    """Return the code of a response's first error."""
    return str(response.json()["errors"][0]["extensions"]["code"])


def aliases(n: int) -> str:
    return "{ " + " ".join(f"a{i}: node {{ id }}" for i in range(n)) + " }"


@pytest.mark.parametrize(
    ("limits", "query", "status", "error"),
    [
        (Limits(max_aliases=3), aliases(3), 200, None),
        (Limits(max_aliases=3), aliases(4), 400, "LIMIT_EXCEEDED"),
        (Limits(max_depth=4), DEEP, 200, None),
        (Limits(max_depth=3), DEEP, 400, "LIMIT_EXCEEDED"),
        (Limits(max_tokens=6), QUERY, 200, None),
        (Limits(max_tokens=5), QUERY, 400, "GRAPHQL_PARSE_FAILED"),
    ],
)
async def test_document_limits_on_both_paths(
    make_shop: MakeApi, limits: Limits, query: str, status: int, error: str | None
) -> None:
    api = make_shop(limits)
    async with client(api) as http:
        for response in (
            await http.post("/graphql", json={"query": query}),
            await http.get("/graphql", params={"query": query}),
        ):
            assert response.status_code == status, response.text
            if error is None:
                assert "errors" not in response.json()
            else:
                assert "data" not in response.json() and code(response) == error
    planned = api.schema.compiled.plan(query, None)  # type: ignore[attr-defined]
    assert (planned is not None) == (error is None)  # over a limit: no plan, Strawberry refuses it


@pytest.mark.parametrize(("max_depth", "status"), [(6, 200), (5, 400)])
async def test_relations_nest_within_the_depth_limit(make_market: MakeApi, max_depth: int, status: int) -> None:
    async with client(make_market(Limits(max_depth=max_depth))) as http:
        response = await http.post("/graphql", json={"query": RELATED})
    assert response.status_code == status, response.text


async def test_a_limit_over_is_one_error_naming_it(make_shop: MakeApi) -> None:
    wide = "{ " + " ".join(f"x{i}: orderCount {{ all(first: 1) {{ edges {{ node {{ key }} }} }} }}" for i in range(5))
    async with client(make_shop(Limits(max_depth=3, max_aliases=4))) as http:
        body = (await http.post("/graphql", json={"query": wide + " }"})).json()
    assert [e["extensions"] for e in body["errors"]] == [
        {"code": "LIMIT_EXCEEDED", "limit": 4, "requested": 5},
        {"code": "LIMIT_EXCEEDED", "limit": 3, "requested": 4},
    ]
    assert body["errors"][1]["message"] == "query depth (nested selections): 4 requested, at most 3 allowed"


async def test_fragments_count_where_they_are_spread_and_cost_once(shop: Api) -> None:
    """Ten fragments each spreading the next ten times: 10^9 aliases counted in no time, refused."""
    fragments = " ".join(
        f"fragment F{i} on Query {{ {' '.join(f'...F{i + 1}' for _ in range(10))} }}" for i in range(9)
    )
    query = "{ ...F0 } " + fragments + " fragment F9 on Query { a: node { id } }"
    started = time.monotonic()
    async with client(shop) as http:
        response = await http.post("/graphql", json={"query": query})
    assert time.monotonic() - started < 2
    assert response.status_code == 400 and response.json()["errors"][0]["extensions"]["requested"] == 10**9


async def test_a_fragment_chain_deeper_than_the_parser_allows_is_refused(shop: Api) -> None:
    chain = " ".join(f"fragment F{i} on Query {{ ...F{i + 1} }}" for i in range(1_500))
    query = "{ ...F0 } " + chain + " fragment F1500 on Query { node { id } }"
    async with client(shop) as http:
        response = await http.post("/graphql", json={"query": query})
    assert response.status_code == 400 and code(response) == "GRAPHQL_VALIDATION_FAILED", response.text


@pytest.mark.parametrize("levels", [10_000, 300])
async def test_a_document_nested_too_deeply_does_not_parse(shop: Api, levels: int) -> None:
    nested = "{" + "orderCount { " * levels + "count" + " }" * levels + "}"
    async with client(shop) as http:
        response = await http.post("/graphql", json={"query": nested})
    assert response.status_code == 400 and code(response) == "GRAPHQL_PARSE_FAILED"


async def test_json_nested_too_deeply_is_a_bad_request(shop: Api) -> None:
    body = b'{"query": "{ node { id } }", "variables": {"k": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    async with client(shop) as http:
        posted = await http.post("/graphql", content=body, headers={"content-type": "application/json"})
        got = await http.get("/graphql", params={"query": QUERY, "variables": "[" * 3_000 + "]" * 3_000})
    assert posted.status_code == 400 and code(posted) == "BAD_REQUEST"
    assert got.status_code == 422 and code(got) == "BAD_REQUEST"


async def test_long_documents_are_not_cached(make_shop: MakeApi) -> None:
    """Each document valid and within every limit, but long: its syntax tree would cost ~150 bytes a character."""
    api = make_shop()
    compiled = api.schema.compiled  # type: ignore[attr-defined]
    padding = "#" + "x" * CACHED_DOCUMENT_CHARS + "\n"
    async with client(api) as http:
        for i in range(3):
            query = f"{padding}{{ node {{ id }} orderCount {{ count{' ' * i} }} }}"
            assert (await http.post("/graphql", json={"query": query})).status_code == 200
            assert compiled.plan(query, None) is None  # it ran on graphql-core
    extensions = [make() for make in api.reference.extensions]  # type: ignore[operator]
    kept = [e.cached_parse_document.cache_info() for e in extensions if hasattr(e, "cached_parse_document")]
    assert kept and all(info.chars < CACHED_DOCUMENT_CHARS for info in kept)


def test_a_document_cache_is_bounded_in_characters() -> None:
    cache: DocumentCache[int] = DocumentCache(entries=1_000, chars=1_000, max_chars=300)
    for i in range(100):
        cache.get(i, 250, lambda i=i: i)  # type: ignore[misc]
    assert cache.get(99, 250, lambda: -1) == 99 and 0 not in cache
    assert cache.cache_info().entries == 4 and cache.cache_info().chars == 1_000
    assert cache.get("long", 301, lambda: 7) == 7 and "long" not in cache
    assert CACHED_CHARS >= 8 * CACHED_DOCUMENT_CHARS  # a long document does not empty the cache


# -- bytes limits of the guard in front of GraphQLApp ---------------------------------------------------------


async def test_body_limit_at_and_over(shop: Api) -> None:
    body = orjson.dumps({"query": QUERY})
    json_headers = {"content-type": "application/json"}
    async with client(shop, Limits(max_body_bytes=len(body))) as http:
        assert (await http.post("/graphql", content=body, headers=json_headers)).status_code == 200
    async with client(shop, Limits(max_body_bytes=len(body) - 1)) as http:
        refused = await http.post("/graphql", content=body, headers=json_headers)
        assert refused.status_code == 413 and code(refused) == "LIMIT_EXCEEDED"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused once the bytes pass the limit
            yield body[:10]
            yield body[10:]

        streamed = await http.post("/graphql", content=chunks(), headers=json_headers)
        assert streamed.status_code == 413 and code(streamed) == "LIMIT_EXCEEDED"


async def test_header_limit_at_and_over(shop: Api) -> None:
    async with client(shop, Limits(max_header_bytes=1_000)) as http:
        sent = await http.get("/graphql", params={"query": QUERY}, headers={"x-pad": "x" * 500})
        refused = await http.get("/graphql", params={"query": QUERY}, headers={"x-pad": "x" * 1_000})
    assert sent.status_code == 200
    assert refused.status_code == 431 and code(refused) == "LIMIT_EXCEEDED"


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
    app = RequestGuard(GraphQLApp(shop.schema, shop.queries, shop.limits), shop.limits)  # as the node serves it
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://iqgraph", headers=SPEC_CLIENT
    ) as http:

        async def bad() -> list[tuple[int, str]]:
            answers = [
                await http.get("/graphql", params={"query": QUERY}, headers={"x-huge": "x" * (1 << 20)}),
                await http.post("/graphql", content=fifty_megabytes(), headers={"content-type": "application/json"}),
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
        (400, "GRAPHQL_PARSE_FAILED"),  # nested too deeply
        (400, "GRAPHQL_PARSE_FAILED"),  # 10,000 aliases are more tokens than a document may have
    ]
    assert sent < 8 << 20  # the body was not read whole (the limit is 4 MiB)
    assert all(s == 200 for statuses in answered for s in statuses)
    assert time.monotonic() - started < 30
