"""Trusted documents and Automatic Persisted Queries (``schema.persisted``) over the node's HTTP stack on a real
uvicorn (``build_asgi``): POST, GET, SSE and graphql-transport-ws; a manifest's documents validated and compiled at
start; ``only_trusted`` refusing any other document with a code. The real clients' side (Apollo Client, GraphQL
Code Generator's manifest) is tests/schema/test_persisted_clients.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from iqgraph.app.http.server import build_asgi
from iqgraph.app.node import Node
from iqgraph.app.settings import Settings
from iqgraph.schema import GraphQLApp
from iqgraph.schema.persisted import ManifestError, PersistedDocuments, load_manifest, sha256_of
from tests.support.live_shop import KEYS, WATCH, LiveShop, open_live_shop
from tests.support.servers import serve_in_thread
from tests.support.sse import sse_events
from tests.support.transport_ws import TransportWS, websocket

GET = "query Count($k: String!) { perKey { get(key: $k) } }"
COUNT = "{ perKey { count } }"
SPEC = {"accept": "application/graphql-response+json"}


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveShop]:
    shop = open_live_shop(tmp_path_factory.mktemp("persisted"))
    shop.write([(KEYS[0], "pen", 0), (KEYS[0], "ink", 0), (KEYS[1], "pen", 0)])
    yield shop
    shop.close()


def _serve(shop: LiveShop, documents: PersistedDocuments) -> Iterator[str]:
    shop.schema.trust(documents)
    graphql = GraphQLApp(shop.schema, shop.queries, shop.limits, live=shop.live, documents=documents)
    with serve_in_thread(build_asgi(Node(Settings(app="shop:app"), shop.app), graphql), log_level="warning") as url:
        yield url


@pytest.fixture(scope="module")
def apq(shop: LiveShop) -> Iterator[str]:
    """A node with no manifest: APQ only."""
    yield from _serve(shop, PersistedDocuments())


@pytest.fixture(scope="module")
def locked(shop: LiveShop) -> Iterator[str]:
    """A node that runs its two trusted documents only (the WATCH subscription among them)."""
    yield from _serve(shop, PersistedDocuments({sha256_of(d): d for d in (GET, WATCH)}, only_trusted=True))


def _persisted(document: str) -> dict[str, Any]:
    return {"persistedQuery": {"version": 1, "sha256Hash": sha256_of(document)}}


def _code(response: httpx.Response) -> str:
    return str(response.json()["errors"][0]["extensions"]["code"])


def test_apq_a_hash_the_node_does_not_know_is_not_found_then_registered_with_its_document(
    apq: str, shop: LiveShop
) -> None:
    variables, expected = {"k": KEYS[0]}, {"data": {"perKey": {"get": shop.count(KEYS[0])}}}
    hashed = {"variables": variables, "extensions": _persisted(GET)}
    missing = httpx.post(f"{apq}/graphql", json=hashed, headers=SPEC)
    assert missing.status_code == 400 and _code(missing) == "PERSISTED_QUERY_NOT_FOUND", missing.text
    assert missing.json()["errors"][0]["message"] == "PersistedQueryNotFound"  # what Apollo Client looks for
    assert httpx.post(f"{apq}/graphql", json={**hashed, "query": GET}, headers=SPEC).json() == expected
    assert httpx.post(f"{apq}/graphql", json=hashed, headers=SPEC).json() == expected  # the hash alone now
    params = {"variables": json.dumps(variables), "extensions": json.dumps(_persisted(GET))}
    assert httpx.get(f"{apq}/graphql", params=params, headers=SPEC).json() == expected  # GET too (CDN-cacheable)
    forged = {**hashed, "query": COUNT}  # a document registered under another's hash would answer for it
    refused = httpx.post(f"{apq}/graphql", json=forged, headers=SPEC)
    assert refused.status_code == 400 and _code(refused) == "BAD_REQUEST"


def test_apq_over_sse_and_graphql_transport_ws(apq: str, shop: LiveShop) -> None:
    key = KEYS[1]
    body = {"query": WATCH, "variables": {"keys": [key]}, "extensions": _persisted(WATCH)}
    with httpx.stream("POST", f"{apq}/graphql", json=body, headers={"accept": "text/event-stream"}) as response:
        kind, first = next(sse_events(response.iter_lines()))
    assert kind == "next" and first["data"]["perKeyWatch"]["value"] == shop.count(key)
    with websocket(apq.removeprefix("http://")) as raw:
        ws = TransportWS(raw)
        assert ws.init()["type"] == "connection_ack"
        ws.send(
            {"id": "1", "type": "subscribe", "payload": {"variables": {"keys": [key]}, "extensions": _persisted(WATCH)}}
        )
        message = ws.receive()
        assert message["type"] == "next" and message["payload"]["data"]["perKeyWatch"]["value"] == shop.count(key)
        ws.send({"id": "2", "type": "subscribe", "payload": {"extensions": _persisted("{ nope }")}})
        refused = ws.receive()
        assert refused["type"] == "error" and refused["payload"][0]["extensions"]["code"] == "PERSISTED_QUERY_NOT_FOUND"


def test_only_trusted_documents_run_by_id_by_hash_or_by_their_text(locked: str, shop: LiveShop) -> None:
    expected = {"data": {"perKey": {"get": shop.count(KEYS[0])}}}
    variables = {"k": KEYS[0]}
    for request in (
        {"documentId": f"sha256:{sha256_of(GET)}", "variables": variables},  # the appendix draft's form
        {"documentId": sha256_of(GET), "variables": variables},  # GraphQL Code Generator's client preset sends the hex
        {"extensions": _persisted(GET), "variables": variables},
        {"query": GET, "variables": variables},
    ):
        assert httpx.post(f"{locked}/graphql", json=request, headers=SPEC).json() == expected, request
    params = {"documentId": f"sha256:{sha256_of(GET)}", "variables": json.dumps(variables)}
    assert httpx.get(f"{locked}/graphql", params=params, headers=SPEC).json() == expected
    for request, code in (
        ({"query": COUNT}, "TRUSTED_DOCUMENT_REQUIRED"),
        ({"query": COUNT, "extensions": _persisted(COUNT)}, "TRUSTED_DOCUMENT_REQUIRED"),  # APQ registers nothing
        ({"extensions": _persisted(COUNT)}, "PERSISTED_QUERY_NOT_FOUND"),
        ({"documentId": f"sha256:{sha256_of(COUNT)}"}, "PERSISTED_QUERY_NOT_FOUND"),
    ):
        refused = httpx.post(f"{locked}/graphql", json=request, headers=SPEC)
        assert refused.status_code == 400 and _code(refused) == code and "data" not in refused.json(), request
    with websocket(locked.removeprefix("http://")) as raw:
        ws = TransportWS(raw)
        assert ws.init()["type"] == "connection_ack"
        ws.subscribe("1", 'subscription { perKeyWatch(keys: ["x"]) { key } }', {})
        refused_ws = ws.receive()
        assert refused_ws["type"] == "error"
        assert refused_ws["payload"][0]["extensions"]["code"] == "TRUSTED_DOCUMENT_REQUIRED"
        ws.send(
            {
                "id": "2",
                "type": "subscribe",
                "payload": {"documentId": sha256_of(WATCH), "variables": {"keys": [KEYS[1]]}},
            }
        )
        assert ws.receive()["payload"]["data"]["perKeyWatch"]["value"] == shop.count(KEYS[1])


def test_a_get_naming_a_document_is_answered_whatever_it_accepts_and_only_a_bare_one_gets_graphiql(
    locked: str, shop: LiveShop
) -> None:
    expected = {"data": {"perKey": {"get": shop.count(KEYS[0])}}}
    variables = json.dumps({"k": KEYS[0]})
    for accept in ("*/*", "text/html,application/xhtml+xml,*/*;q=0.8", None):  # curl's, a browser's, none
        headers = {} if accept is None else {"accept": accept}
        for named in ({"documentId": f"sha256:{sha256_of(GET)}"}, {"extensions": json.dumps(_persisted(GET))}):
            answer = httpx.get(f"{locked}/graphql", params={**named, "variables": variables}, headers=headers)
            assert answer.status_code == 200 and answer.json() == expected, (accept, named, answer.text[:200])
    page = httpx.get(f"{locked}/graphql", headers={"accept": "text/html"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_trusted_documents_are_compiled_at_start_and_one_that_does_not_validate_stops_the_start(
    shop: LiveShop,
) -> None:
    compiled = shop.schema.compiled
    assert compiled is not None
    documents = PersistedDocuments({sha256_of(GET): GET})
    shop.schema.trust(documents)
    before = compiled._plans.cache_info()
    assert compiled.plan(GET, None) is not None and compiled.plan(GET, "Count") is not None
    assert compiled._plans.cache_info() == before  # pinned at start: no parse, no validation, no cache lookup
    broken = PersistedDocuments({sha256_of("{ perKey { nope } }"): "{ perKey { nope } }"})
    with pytest.raises(ManifestError, match=f"sha256:{sha256_of('{ perKey { nope } }')} does not validate"):
        shop.schema.trust(broken)


def test_manifests_of_the_clients_tools_load_and_wrong_ones_say_what_to_fix(tmp_path: Path) -> None:
    flat = tmp_path / "persisted-documents.json"  # GraphQL Code Generator's client preset, Relay
    flat.write_text(json.dumps({sha256_of(GET): GET}))
    assert load_manifest(flat) == {sha256_of(GET): GET}
    apollo = tmp_path / "apollo.json"
    operations = [{"id": sha256_of(GET), "body": GET, "name": "Count", "type": "query"}]
    apollo.write_text(json.dumps({"format": "apollo-persisted-query-manifest", "version": 1, "operations": operations}))
    assert load_manifest(apollo) == {sha256_of(GET): GET}
    for content, message in (
        ("{not json", "is not JSON"),
        (json.dumps(["x"]), "a manifest is a JSON object"),
        (json.dumps({"abc": GET}), "is not a SHA-256"),
        (json.dumps({sha256_of(COUNT): GET}), "is not the one that hashes to it"),
    ):
        flat.write_text(content)
        with pytest.raises(ManifestError, match=message):
            load_manifest(flat)
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "missing.json")
