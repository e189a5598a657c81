"""Persisted documents with the real clients' tools under node (``tests/js``): Apollo Client 4's persisted-queries
link against a node with no manifest (automatic persisted queries), and GraphQL Code Generator's client preset
writing the manifest a node then trusts (``--trusted-documents`` / ``--only-trusted-documents``). Production's
ASGI app (``build_asgi``) on a real uvicorn, over the schema tests' filled shop."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from iqgraph.app.http.server import build_asgi
from iqgraph.app.node import Node
from iqgraph.app.settings import Settings
from iqgraph.schema import GraphQLApp
from iqgraph.schema.persisted import PersistedDocuments, load_manifest, sha256_of
from tests.js import NODE_DIR, require_node
from tests.schema.conftest import Hosted, ShopTruth, api_factory
from tests.support.apps import SHOP_TYPES, shop_app
from tests.support.servers import serve_in_thread

QUERY = "query OrderCount($key: String!) { orderCount { get(key: $key) } }"
SPEC = {"accept": "application/graphql-response+json"}


def _serve(hosted: Hosted, documents: PersistedDocuments) -> Iterator[str]:
    api = api_factory(shop_app(), SHOP_TYPES, hosted)()
    api.schema.trust(documents)  # type: ignore[attr-defined]
    graphql = GraphQLApp(api.schema, api.queries, api.limits, documents=documents)
    with serve_in_thread(build_asgi(Node(Settings(app="shop:app"), shop_app()), graphql), log_level="warning") as url:
        yield f"{url}/graphql"


def _node(script: str, *args: str) -> Any:
    require_node()
    run = subprocess.run(["node", script, *args], cwd=NODE_DIR, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_apollo_clients_persisted_queries_link_sends_the_hash_then_the_document_once_then_the_hash_over_get(
    shop_hosted: Hosted, truth: ShopTruth
) -> None:
    key = min(truth.counts())
    for url in _serve(shop_hosted, PersistedDocuments()):
        found = _node("apollo_apq.mjs", url, key)
    expected = {"orderCount": {"__typename": "OrderCountStore", "get": truth.counts()[key]}}  # Apollo adds __typename
    assert [a["data"] for a in found["answers"]] == [expected, expected], found
    sent = [(r["method"], r["status"], r["body"] is not None and "query" in r["body"]) for r in found["requests"]]
    # 1: the hash alone over GET, not found; 2: POSTed again with the document (kept); 3: the hash alone over GET
    assert sent == [("GET", 400, False), ("POST", 200, True), ("GET", 200, False)], found["requests"]
    registered = found["requests"][1]["body"]  # the document as Apollo prints it, and the hash it sent with it
    assert registered["extensions"]["persistedQuery"]["sha256Hash"] == sha256_of(registered["query"])
    assert sha256_of(registered["query"]) in found["requests"][2]["url"]


def test_graphql_code_generators_manifest_is_trusted_and_only_its_documents_run(
    shop_hosted: Hosted, truth: ShopTruth, tmp_path: Path
) -> None:
    require_node()
    api = api_factory(shop_app(), SHOP_TYPES, shop_hosted)()
    (tmp_path / "schema.graphql").write_text(api.schema.as_str())
    (tmp_path / "documents.graphql").write_text(QUERY.replace("{ orderCount", "{\n  orderCount") + "\n")
    config = {
        "schema": str(tmp_path / "schema.graphql"),
        "documents": [str(tmp_path / "documents.graphql")],
        "generates": {
            f"{tmp_path}/gql/": {
                "preset": "client",
                "presetConfig": {"persistedDocuments": {"hashAlgorithm": "sha256"}},
            }
        },
    }
    (tmp_path / "codegen.json").write_text(json.dumps(config))
    codegen = NODE_DIR / "node_modules" / ".bin" / "graphql-codegen"
    run = subprocess.run(
        [str(codegen), "--config", str(tmp_path / "codegen.json")], cwd=NODE_DIR, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    trusted = load_manifest(tmp_path / "gql" / "persisted-documents.json")  # keys checked against their documents
    [(digest, document)] = trusted.items()
    key = min(truth.counts())
    expected = {"data": {"orderCount": {"get": truth.counts()[key]}}}
    for url in _serve(shop_hosted, PersistedDocuments(trusted, only_trusted=True)):
        by_id = httpx.post(url, json={"documentId": f"sha256:{digest}", "variables": {"key": key}}, headers=SPEC)
        assert by_id.json() == expected
        by_text = httpx.post(url, json={"query": document, "variables": {"key": key}}, headers=SPEC)
        assert by_text.json() == expected
        other = httpx.post(url, json={"query": "{ orderCount { count } }"}, headers=SPEC)  # not in the manifest
        assert other.status_code == 400
        assert other.json()["errors"][0]["extensions"]["code"] == "TRUSTED_DOCUMENT_REQUIRED"
