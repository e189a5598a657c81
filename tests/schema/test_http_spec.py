"""GraphQLApp against the GraphQL over HTTP spec (draft of August 2026), one test per rule, in-process over ASGI.

Each docstring quotes the spec's sentence; schema.http_spec says which choices the server makes where
the spec leaves one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.schema.conftest import Api, DifferentialASGI

GRAPHQL_RESPONSE = "application/graphql-response+json; charset=utf-8"
JSON = "application/json; charset=utf-8"
QUERY = "{ node { id } }"
FIELD_ERROR = "{ orderCount { all(first: 5000) { pageInfo { hasNextPage } } } }"

#: Requests the server refuses before execution: (method, request arguments, status).
REFUSED: list[tuple[str, dict[str, Any], int]] = [
    ("POST", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
    ("POST", {"json": ["not", "an", "object"]}, 422),
    ("POST", {"json": {"query": "{ orderCount {"}}, 400),
    ("POST", {"json": {"query": "{ nope }"}}, 400),
    ("POST", {"content": QUERY.encode(), "headers": {"content-type": "application/graphql"}}, 415),
    ("PUT", {"json": {"query": QUERY}}, 405),
    ("GET", {"params": {"query": "mutation { x }"}}, 405),
    ("GET", {"params": {"query": QUERY}, "headers": {"accept": "text/plain"}}, 406),
]


@pytest.fixture
async def http(shop: Api) -> AsyncIterator[httpx.AsyncClient]:
    """Return an HTTP client of the shop's GraphQLApp, in-process, asking for graphql-response+json.

    Every request goes to the lean path (compiled plans) and to Strawberry's view alone: the responses
    must be the same bytes (DifferentialASGI)."""
    app = DifferentialASGI(shop)
    headers = {"accept": "application/graphql-response+json"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://iqgraph", headers=headers
    ) as c:
        yield c


async def post(http: httpx.AsyncClient, body: Any, **headers: str) -> httpx.Response:
    """POST body as JSON to /graphql."""
    return await http.post("/graphql", json=body, headers=headers)


def assert_refused(response: httpx.Response, status: int, code: str = "BAD_REQUEST") -> None:
    """Assert response is a request error: status, a GraphQL body with no data entry, the error's code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == GRAPHQL_RESPONSE
    body = response.json()
    assert "data" not in body and body["errors"][0]["extensions"]["code"] == code, body


# Media types and Accept


async def test_server_supports_graphql_response_json(http: httpx.AsyncClient) -> None:
    """A server MUST support responses using the `application/graphql-response+json` media type."""
    response = await post(http, {"query": QUERY})
    assert response.headers["content-type"] == GRAPHQL_RESPONSE
    assert response.json() == {"data": {"node": {"id": "node-0"}}}


async def test_no_accept_header_or_only_a_wildcard_gets_application_json(http: httpx.AsyncClient) -> None:
    """If a client does not supply the `Accept` header then the server may respond with ... any content type it chooses.
    graphql-http's audit: SHOULD assume application/json when accept is missing (80D8), and use it for */* (47DE)."""  # noqa: E501
    request = http.build_request("POST", "/graphql", json={"query": QUERY})
    del request.headers["accept"]
    assert (await http.send(request)).headers["content-type"] == JSON
    for accept in ("*/*", "application/*"):
        anything = await post(http, {"query": QUERY}, accept=accept)
        assert anything.status_code == 200 and anything.headers["content-type"] == JSON


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        ("application/graphql-response+json, application/json;q=0.9", GRAPHQL_RESPONSE),
        ("application/graphql-response+json;q=0.5, application/json", JSON),
        ("application/json;q=0.9, application/graphql-response+json", GRAPHQL_RESPONSE),
        ("application/json, */*", JSON),
        ("application/*;q=0.2, application/json;q=0.1", GRAPHQL_RESPONSE),
        ("text/html, application/json;q=0.8, */*;q=0.1", JSON),
    ],
)
async def test_highest_priority_supported_media_type_is_used(
    http: httpx.AsyncClient, accept: str, content_type: str
) -> None:
    """The server MUST respect the given `Accept` header and attempt to encode the response in the highest priority media type listed that is supported by the server."""  # noqa: E501
    response = await post(http, {"query": QUERY}, accept=accept)
    assert response.status_code == 200 and response.headers["content-type"] == content_type


async def test_legacy_client_gets_application_json_on_2xx(http: httpx.AsyncClient) -> None:
    """Any response that produces a `2xx` status code should replace the `Content-Type` header with `Content-Type: application/json`."""  # noqa: E501
    ok = await post(http, {"query": QUERY}, accept="application/json")
    assert ok.status_code == 200 and ok.headers["content-type"] == JSON
    partial = await post(http, {"query": FIELD_ERROR}, accept="application/json")
    assert partial.status_code == 200 and partial.headers["content-type"] == JSON
    assert partial.json()["errors"][0]["extensions"]["code"] == "LIMIT_EXCEEDED"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"query": "{ orderCount {"}, "GRAPHQL_PARSE_FAILED"),
        ({"query": "{ nope }"}, "GRAPHQL_VALIDATION_FAILED"),
        ({"query": "query($k: String!) { orderCount { get(key: $k) } }", "variables": {"k": 5}},
         "GRAPHQL_VALIDATION_FAILED"),
    ],
)  # fmt: skip
async def test_legacy_client_gets_200_with_the_request_errors_in_the_body(
    http: httpx.AsyncClient, body: dict[str, Any], code: str
) -> None:
    """graphql-http's audit: SHOULD use 200 on document parsing (572B), validation (FDE2) and variable coercion
    (7B9B) failure when accepting application/json — a legacy client may not read a 4xx body as GraphQL."""
    response = await post(http, body, accept="application/json")
    assert response.status_code == 200 and response.headers["content-type"] == JSON, response.text
    answer = response.json()
    assert "data" not in answer and answer["errors"][0]["extensions"]["code"] == code


@pytest.mark.parametrize("accept", ["text/plain", "application/xml, application/graphql-response+json;q=0", "nonsense"])
async def test_accept_without_a_supported_type_is_406(http: httpx.AsyncClient, accept: str) -> None:
    """If the `Accept` header is present but does not indicate support for any of the server's supported media types or `application/json`, the server SHOULD respond with `406 Not Acceptable`."""  # noqa: E501
    assert_refused(await post(http, {"query": QUERY}, accept=accept), 406)


async def test_browser_asking_for_html_still_gets_graphiql(http: httpx.AsyncClient) -> None:
    """Server URLs which enable GraphQL requests MAY also be used for other purposes."""
    response = await http.get("/graphql", headers={"accept": "text/html"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")


# Status codes of executed requests


async def test_data_without_errors_is_200(http: httpx.AsyncClient) -> None:
    """If the _GraphQL response_ contains the {data} entry and does not contain the {errors} entry, then the server SHOULD reply with a `200` status code."""  # noqa: E501
    assert (await post(http, {"query": QUERY})).status_code == 200


async def test_field_errors_are_294_partial_success(http: httpx.AsyncClient) -> None:
    """If the _GraphQL response_ contains both the {data} entry (even if it is {null}) and the {errors} entry, then the server SHOULD reply with a `294` status code."""  # noqa: E501
    response = await post(http, {"query": FIELD_ERROR})
    assert response.status_code == 294 and response.headers["content-type"] == GRAPHQL_RESPONSE
    body = response.json()
    assert body["data"] == {"orderCount": {"all": None}}
    assert body["errors"][0]["path"] == ["orderCount", "all"]


# Status codes of request errors (nothing executed: no data entry)


async def test_document_that_does_not_parse_is_400(http: httpx.AsyncClient) -> None:
    """If the GraphQL document in the request cannot be parsed, status code `400` SHOULD be used."""
    assert_refused(await post(http, {"query": "{ orderCount {"}), 400, "GRAPHQL_PARSE_FAILED")
    assert_refused(await http.get("/graphql", params={"query": ""}), 400, "GRAPHQL_PARSE_FAILED")


async def test_document_that_fails_validation_is_400(http: httpx.AsyncClient) -> None:
    """The August 2026 draft: "If the request does not pass GraphQL validation, status code `422` SHOULD be used";
    graphql-http's audit (74FF, 86EE) and the spec's earlier text: 400 (schema.http_spec says why)."""
    assert_refused(await post(http, {"query": "{ nope }"}), 400, "GRAPHQL_VALIDATION_FAILED")
    assert_refused(await post(http, {"query": "mutation { x }"}), 400, "GRAPHQL_VALIDATION_FAILED")


async def test_operation_that_cannot_be_determined_is_422(http: httpx.AsyncClient) -> None:
    """If the operation to execute cannot be unambiguously determined, status code `422` SHOULD be used."""
    response = await post(http, {"query": "query A { node { id } }", "operationName": "B"})
    assert_refused(response, 422, "GRAPHQL_VALIDATION_FAILED")


@pytest.mark.parametrize("variables", [{}, {"k": 5}])
async def test_variables_that_cannot_be_coerced_are_400(http: httpx.AsyncClient, variables: dict[str, Any]) -> None:
    """graphql-http's audit 86EE: SHOULD use a status code of 400 on variable coercion failure when accepting
    application/graphql-response+json (the August 2026 draft says 422)."""
    body = {"query": "query($k: String!) { orderCount { get(key: $k) } }", "variables": variables}
    assert_refused(await post(http, body), 400, "GRAPHQL_VALIDATION_FAILED")


# Methods


@pytest.mark.parametrize(
    "params",
    [
        {"query": "mutation { x }"},
        {"query": "subscription { x }"},
        {"query": "query Q { node { id } } mutation M { x }", "operationName": "M"},
    ],
)
async def test_mutation_over_get_is_405_allow_post(http: httpx.AsyncClient, params: dict[str, str]) -> None:
    """If the values of {query} and {operationName} indicate that a mutation operation is to be executed, the server MUST respond with an appropriate `4xx` status code and halt execution; status code `405` (Method Not Allowed) is RECOMMENDED."""  # noqa: E501
    response = await http.get("/graphql", params=params)
    assert_refused(response, 405)
    assert response.headers["allow"] == "POST"


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
async def test_unsupported_method_is_405_with_allow(http: httpx.AsyncClient, method: str) -> None:
    """If the request uses an unsupported HTTP method, status code `405` SHOULD be used."""
    response = await http.request(method, "/graphql", json={"query": QUERY})
    assert_refused(response, 405)
    assert response.headers["allow"] == "GET, POST"


async def test_get_request_parameters_are_in_the_query_string(http: httpx.AsyncClient) -> None:
    """For HTTP GET requests, the _GraphQL-over-HTTP request_ parameters MUST be provided in the query component of the request URL."""  # noqa: E501
    params = {"query": "query Q($k: String!) { orderCount { get(key: $k) } }", "variables": '{"k": "nobody"}'}
    response = await http.get("/graphql", params={**params, "operationName": "Q", "extensions": "{}"})
    assert response.status_code == 200 and response.json() == {"data": {"orderCount": {"get": None}}}


async def test_empty_get_parameters_are_absent(http: httpx.AsyncClient) -> None:
    """Specifying the empty string for optional request parameters is equivalent to not specifying them at all."""
    response = await http.get(
        "/graphql", params={"query": QUERY, "operationName": "", "variables": "", "extensions": ""}
    )
    assert response.status_code == 200, response.text


# Request bodies


async def test_body_that_is_not_json_is_400(http: httpx.AsyncClient) -> None:
    """If the JSON body of the request could not be parsed, status code `400` SHOULD be used."""
    for body in (b"{not json", b'{"query":', b"NONSENSE", b"\xff\xfe"):
        response = await http.post("/graphql", content=body, headers={"content-type": "application/json"})
        assert_refused(response, 400)


@pytest.mark.parametrize(
    "body",
    [
        "a string",
        ["a", "batch"],
        {"qeury": QUERY},
        {"query": None},
        {"query": 5},
        {"query": QUERY, "variables": [7]},
        {"query": QUERY, "variables": '{"k": 1}'},
        {"query": QUERY, "operationName": 5},
        {"query": QUERY, "extensions": "x"},
    ],
)
async def test_post_that_is_not_a_well_formed_request_is_422(http: httpx.AsyncClient, body: Any) -> None:
    """If the request is not a well-formed _GraphQL-over-HTTP request_, status code `422` SHOULD be used."""
    assert_refused(await post(http, body), 422)


@pytest.mark.parametrize("params", [{"variables": "{not json"}, {"variables": "[1]"}, {"extensions": "5"}, {}])
async def test_get_that_is_not_a_well_formed_request_is_422(http: httpx.AsyncClient, params: dict[str, str]) -> None:
    """Each of the {variables} and {extensions} parameters, if present and not the empty string, MUST be encoded as a JSON string."""  # noqa: E501
    query = {"query": QUERY} if params else {}
    assert_refused(await http.get("/graphql", params={**query, **params}), 422)


async def test_null_optional_parameters_are_absent(http: httpx.AsyncClient) -> None:
    """Specifying `null` for optional request parameters is equivalent to not specifying them at all."""
    response = await post(http, {"query": QUERY, "operationName": None, "variables": None, "extensions": None})
    assert response.status_code == 200, response.text


async def test_unknown_request_properties_are_ignored(http: httpx.AsyncClient) -> None:
    """Servers receiving a request with additional properties MUST ignore properties they do not understand."""
    assert (await post(http, {"query": QUERY, "clientLibrary": "abc", "future": {"x": 1}})).status_code == 200


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "application/json;charset=UTF-8"]
)
async def test_json_in_utf8_is_supported(http: httpx.AsyncClient, content_type: str) -> None:
    """A server MUST support POST requests encoded with the `application/json` media type ... encoded with UTF-8."""
    body = '{"query": "{ orderCount { get(key: \\"café\\") } }"}'.encode()
    response = await http.post("/graphql", content=body, headers={"content-type": content_type})
    assert response.status_code == 200 and response.json() == {"data": {"orderCount": {"get": None}}}


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/graphql",
        "application/x-www-form-urlencoded",
        "application/graphql-response+json",
        "application/json; charset=latin-1",
    ],
)
async def test_unsupported_content_type_is_415(http: httpx.AsyncClient, content_type: str) -> None:
    """If the `Content-Type` of the request is not supported, status code `415` SHOULD be used."""
    response = await http.post(
        "/graphql", content=b'{"query": "{ node { id } }"}', headers={"content-type": content_type}
    )
    assert_refused(response, 415)


async def test_post_without_content_type_is_rejected(http: httpx.AsyncClient) -> None:
    """If the client does not supply a `Content-Type` header with a POST request, the server SHOULD reject the request using the appropriate `4xx` status code."""  # noqa: E501
    assert_refused(await http.post("/graphql", content=b'{"query": "{ node { id } }"}'), 415)


# Every response


@pytest.mark.parametrize(("method", "kwargs", "status"), REFUSED)
async def test_responses_indicate_media_type_and_encoding(
    http: httpx.AsyncClient, method: str, kwargs: dict[str, Any], status: int
) -> None:
    """A server MUST indicate the media type of the response with a `Content-Type` header, and SHOULD indicate the encoding."""  # noqa: E501
    response = await http.request(method, "/graphql", **kwargs)
    assert response.status_code == status and response.headers["content-type"] == GRAPHQL_RESPONSE


@pytest.mark.parametrize(("method", "kwargs", "status"), REFUSED[:2])
async def test_a_body_that_is_no_graphql_request_is_refused_alike_for_a_legacy_client(
    http: httpx.AsyncClient, method: str, kwargs: dict[str, Any], status: int
) -> None:
    # docs/querying.md: the 200-with-errors of an application/json client is for GraphQL requests only
    headers = {"accept": "*/*"} | kwargs.get("headers", {})
    response = await http.request(method, "/graphql", **(kwargs | {"headers": headers}))
    assert response.status_code == status and response.headers["content-type"] == GRAPHQL_RESPONSE
    assert response.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"


@pytest.mark.parametrize(("method", "kwargs", "status"), REFUSED)
async def test_refusals_are_graphql_responses(
    http: httpx.AsyncClient, method: str, kwargs: dict[str, Any], status: int
) -> None:
    """The body of the server's response MUST follow the requirements for a _GraphQL response_."""
    response = await http.request(method, "/graphql", **kwargs)
    body = response.json()
    assert set(body) == {"errors"} and isinstance(body["errors"][0]["message"], str), body
    assert body["errors"][0]["extensions"]["code"]
    assert "Traceback" not in response.text


@pytest.mark.parametrize(
    "body",
    [
        b'{"query": "{ a }", "variables": {"n": 1180591620717411303424}}',  # past 64 bits: orjson refuses it
        b'{"query": "{ a }", "variables": {"x": NaN, "y": -Infinity}}',  # not JSON, but Python's json reads it
        b'{"query": "\\ud800"}',  # a lone surrogate
        b'{"query": "{ a }", "variables": {"k": "caf\xc3\xa9"}, "extensions": {}}',
    ],
)
def test_a_body_is_read_to_the_values_pythons_json_reads(body: bytes) -> None:
    import json
    import math

    from iqgraph.schema.http_spec import decode_body

    expected, found = json.loads(body.decode("utf-8")), decode_body(body)
    assert repr(found) == repr(expected) or (math.isnan(found["variables"]["x"]) and found["variables"]["y"] < 0)


@pytest.mark.parametrize("body", [b"{", b"\xff{}", b"\xef\xbb\xbf{}", b"[" * 100_000])
def test_a_body_that_is_not_json_is_a_400(body: bytes) -> None:
    from iqgraph.schema.http_spec import RequestError, decode_body

    with pytest.raises(RequestError) as raised:
        decode_body(body)
    assert raised.value.status_code == 400


async def test_a_body_in_several_messages_is_read_whole_on_both_paths(http: httpx.AsyncClient) -> None:
    """The view reads a body given in one message once (schema.asgi._ReadBody); one in several is read as it comes."""

    async def chunks() -> AsyncIterator[bytes]:
        for part in (b'{"query": "{ orderCount ', b'{ get(key: \\"alice\\") } }"', b"}"):
            yield part

    split = await http.post("/graphql", content=chunks(), headers={"content-type": "application/json"})
    whole = await post(http, {"query": '{ orderCount { get(key: "alice") } }'})
    assert split.status_code == whole.status_code == 200 and split.json() == whole.json()
    assert "errors" not in whole.json()
