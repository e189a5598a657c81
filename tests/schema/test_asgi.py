"""GraphQLApp in-process over ASGI (the uvicorn suite lives in tests/app): contexts, bad requests."""

from __future__ import annotations

from typing import Any

import httpx

from iqgraph.schema import GraphQLApp, Limits
from tests.schema.conftest import Api, DifferentialASGI


def client(api: Api, app: Any = None) -> httpx.AsyncClient:
    """Return an HTTP client of api's GraphQLApp, in-process."""
    app = app or GraphQLApp(api.schema, api.queries, api.limits)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://iqgraph")


async def test_post_and_get_answer_each_request_with_its_own_loaders(shop: Api) -> None:
    async with client(shop) as http:
        for _ in range(2):
            posted = await http.post("/graphql", json={"query": '{ orderCount { get(key: "customer-00") } }'})
            assert posted.status_code == 200 and posted.json()["data"]["orderCount"]["get"] > 0
        got = await http.get("/graphql", params={"query": "{ node { id } }"})
        assert got.json() == {"data": {"node": {"id": "node-0"}}}
    assert [c[0] for c in shop.queries.calls] == ["get_many", "get_many"]


async def test_requests_that_are_not_graphql_get_a_json_error(shop: Api) -> None:
    async with client(shop) as http:
        garbled = await http.post("/graphql", content=b"{not json", headers={"content-type": "application/json"})
        assert garbled.status_code == 400
        assert garbled.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"
        syntax = await http.post("/graphql", json={"query": "{ orderCount {"})
        assert syntax.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_PARSE_FAILED"
        assert "Traceback" not in garbled.text + syntax.text


async def test_limits_apply_over_http(shop: Api) -> None:
    small = Api(shop.app, shop.queries, Limits(max_keys=1))
    async with client(small) as http:
        response = await http.post("/graphql", json={"query": '{ orderCount { getMany(keys: ["a", "b"]) } }'})
    assert response.json()["errors"][0]["extensions"]["code"] == "LIMIT_EXCEEDED"


async def test_the_lean_path_answers_compiled_queries_with_the_views_bytes(shop: Api) -> None:
    differential = DifferentialASGI(shop)
    async with client(shop, differential) as http:
        queries = [
            '{ orderCount { get(key: "customer-00") many: getMany(keys: ["customer-01", "nobody", ""]) } }',
            '{ orderCount(maxLag: -1) { get(key: "customer-00") } }',
            '{ latestOrder { get(key: "customer-00") { orderId amount ts } } itemsSold { mightContain(key: "x") } }',
        ]
        for query in queries:
            for accept in ("application/graphql-response+json", "application/json", "*/*"):
                posted = await http.post("/graphql", json={"query": query}, headers={"accept": accept})
                got = await http.get("/graphql", params={"query": query}, headers={"accept": accept})
                assert posted.status_code == got.status_code and posted.json() == got.json()
        variables = {"query": "query($k: [String!]!) { orderCount { getMany(keys: $k) } }", "variables": {"k": ["a"]}}
        assert (await http.post("/graphql", json=variables)).status_code == 200
        bad = {**variables, "variables": {"k": [1]}}
        spec = {"accept": "application/graphql-response+json"}
        assert (await http.post("/graphql", json=bad, headers=spec)).status_code == 400  # not coerced: the view answers
        assert (await http.post("/graphql", json=bad)).status_code == 200  # a legacy client's: errors in the body
        ide = await http.get("/graphql", headers={"accept": "text/html"})
        assert ide.status_code == 200 and "graphiql" in ide.text.lower()
    assert differential.lean == 3 * 3 * 2 + 1


async def test_the_lean_path_can_be_turned_off(shop: Api) -> None:
    app = GraphQLApp(shop.schema, shop.queries, shop.limits, compiled=False)
    async with client(shop, app) as http:
        assert (await http.post("/graphql", json={"query": "{ node { id } }"})).status_code == 200
