"""Three real nodes (uvicorn + Spark + the embedded broker) on loopback: any node answers any query.

The cluster requires authentication (JWT HS256 and API keys, docs/security.md): the tests' client sends a
token that may read every store; the security tests check who gets what, on the node asked and on owners.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import orjson
import pytest

from iqgraph.app.security.peer_auth import PeerSigner
from iqgraph.examples.shop import build_app
from iqgraph.schema import wire
from iqgraph.schema.access import Principal
from iqgraph.schema.wire import INTERNAL_PATH
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.partitioner import partition_for
from tests.conftest import MakeTopic
from tests.support.ground_truth import Expected, expected
from tests.support.nodes import CLUSTER_SECRET, NodeProcess, start_nodes, wait_ready, write_app_module
from tests.support.otlp import Received, ReceivedSpan, otlp_receiver
from tests.support.pipeline import START_MS, send

PARTITIONS = 6
EVENTS = 3_000
GET_MANY = "query($k: [String!]!) { orderCount { getMany(keys: $k) } }"
JWT_SECRET = "a-test-secret-of-at-least-32-bytes!!"  # noqa: S105 - a test cluster's
ISSUER, AUDIENCE = "https://issuer.test", "iqgraph-test"
API_KEY = "dashboard-key-0123456789"


def token(scope: str, **claims: Any) -> str:
    """Return an HS256 token of the test issuer for the test audience, valid for a minute."""
    now = int(time.time())
    payload = {"sub": "tester", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 60, "scope": scope}
    return jwt.encode({**payload, **claims}, JWT_SECRET, algorithm="HS256")


def bearer(scope: str, **claims: Any) -> dict[str, str]:
    """Return the Authorization header of a token with scope."""
    return {"authorization": f"Bearer {token(scope, **claims)}"}


@pytest.fixture(scope="module")
def otlp() -> Iterator[tuple[str, Received]]:
    """The collector the cluster's nodes export their spans to (they trace: IQGRAPH_TRACING=true)."""
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def cluster(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory, otlp: tuple[str, Received]
) -> Iterator[tuple[list[NodeProcess], Expected, str]]:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(61, START_MS), EVENTS))
    send(broker, topic, events)
    home = tmp_path_factory.mktemp("cluster")
    write_app_module(home, "clusterapp", topic, PARTITIONS, broker.bootstrap_servers)
    keys = home / "api-keys.toml"
    digest = hashlib.sha256(API_KEY.encode()).hexdigest()
    keys.write_text(f'[keys.dashboard]\nsha256 = "{digest}"\nscopes = ["read:order_count"]\n')
    env = {
        "IQGRAPH_AUTH": "jwt,api-key",
        "IQGRAPH_JWT_SECRET": JWT_SECRET,
        "IQGRAPH_JWT_ISSUER": ISSUER,
        "IQGRAPH_JWT_AUDIENCE": AUDIENCE,
        "IQGRAPH_API_KEYS": str(keys),
        "IQGRAPH_RAW_ENDPOINT": "true",  # the benchmark's plain endpoint: authorized as every other
        # every test here runs with tracing on (schema.tracing): spans to the test's collector, sent every 100 ms
        "IQGRAPH_TRACING": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp[0],
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    # node-0 lets a standby answer (stale reads allowed); node-1 does not.
    nodes = start_nodes(
        home,
        "clusterapp",
        3,
        [["--standbys", "1", "--max-lag", "1000000"], ["--standbys", "1"], ["--standbys", "1"]],
        env,
        {"authorization": f"Bearer {token('read:*', exp=int(time.time()) + 3600)}"},
    )
    try:
        wait_ready(nodes)
        yield nodes, expected(app, events), topic
    finally:
        for node in nodes:
            node.kill()


def _owner(key: str) -> str:
    return f"node-{partition_for(key, PARTITIONS, 'string', 'murmur2') % 3}"


def test_any_key_on_any_node_returns_its_owners_value(cluster: Any) -> None:
    nodes, truth, _ = cluster
    counts = truth.kv["order_count"]
    keys = sorted(counts)
    assert {_owner(k) for k in keys} == {"node-0", "node-1", "node-2"}
    for node in nodes:
        body = node.post(GET_MANY, {"k": keys})
        assert body["data"]["orderCount"]["getMany"] == [counts[k] for k in keys], node.id
    meta = nodes[0].post(
        '{ keyMetadata(store: "order_count", key: "customer-0001") { partition activeNode standbyNodes } }'
    )
    found = meta["data"]["keyMetadata"]
    assert found["activeNode"] == f"node-{found['partition'] % 3}"
    assert found["standbyNodes"] == [f"node-{(found['partition'] + 1) % 3}"]


def test_a_query_answered_by_three_nodes_is_one_trace_with_the_peers_spans_as_children(
    cluster: Any, otlp: tuple[str, Received]
) -> None:
    nodes, truth, _ = cluster
    counts = truth.kv["order_count"]
    keys = [next(k for k in sorted(counts) if _owner(k) == owner) for owner in ("node-0", "node-1", "node-2")]
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = {"traceparent": f"00-{trace_id}-{parent}-01"}  # the client's own trace
    body = nodes[0].post(GET_MANY, {"k": keys}, **traceparent)
    assert body == {"data": {"orderCount": {"getMany": [counts[k] for k in keys]}}}
    response = httpx.post(
        f"{nodes[0].url}/graphql", json={"query": GET_MANY, "variables": {"k": keys}},
        headers={**nodes[0].headers, **traceparent}, timeout=30,
    )  # fmt: skip
    assert response.headers["traceresponse"].split("-")[1] == trace_id  # the answer names its trace
    deadline = time.monotonic() + 30
    while {s.node for s in otlp[1].of_trace(trace_id) if s.kind == "SERVER"} != {"node-0", "node-1", "node-2"}:
        assert time.monotonic() < deadline, otlp[1].of_trace(trace_id)
        time.sleep(0.1)
    time.sleep(0.5)  # the rest of the batch
    spans = otlp[1].of_trace(trace_id)
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if s.parent_id == parent]
    assert [(r.node, r.kind, r.name) for r in roots] == [("node-0", "SERVER", "query")] * 2  # one per request
    assert roots[0].attributes["graphql.operation.type"] == "query"

    def root_of(span: ReceivedSpan) -> ReceivedSpan:
        while span.parent_id != parent:
            span = by_id[span.parent_id]  # KeyError: a span whose parent is not in the trace
        return span

    assert all(root_of(s) in roots for s in spans)  # ONE trace: every span hangs from a request of the client's
    for peer in ("node-1", "node-2"):
        served = [s for s in spans if s.node == peer and s.kind == "SERVER"]
        assert len(served) == 2, served  # one sub-request per peer per query
        for span in served:
            forwarded = by_id[span.parent_id]
            assert (forwarded.node, forwarded.kind, forwarded.name) == ("node-0", "CLIENT", "forwarded request")
            assert forwarded.attributes["server.address"] == peer
            assert forwarded.attributes["http.response.status_code"] == 200
            assert forwarded.attributes["http.response.body.size"] > 0
    batches = [s for s in spans if s.name == "store batch" and s.node == "node-0"]
    assert {(s.attributes["iqgraph.store"], s.attributes["iqgraph.node"]) for s in batches} == {
        ("order_count", "node-0"),
        ("order_count", "node-1"),
        ("order_count", "node-2"),
    }


def test_cluster_metadata_shows_every_node_and_where_partitions_live(cluster: Any) -> None:
    nodes, _, topic = cluster
    data = nodes[1].post(
        "{ nodes { id state partitions { partition role state lag } } "
        "stores { name placement { partition activeNode standbyNodes } } }"
    )["data"]
    assert [n["id"] for n in data["nodes"]] == ["node-0", "node-1", "node-2"]
    for i, node in enumerate(data["nodes"]):
        assert node["state"] == "RUNNING"
        roles = {(p["partition"], p["role"]) for p in node["partitions"]}
        assert roles == {(p, "active") for p in range(PARTITIONS) if p % 3 == i} | {
            (p, "standby") for p in range(PARTITIONS) if (p + 1) % 3 == i
        }
        assert all(p["state"] == "RUNNING" and p["lag"] >= 0 for p in node["partitions"])
    placement = next(s for s in data["stores"] if s["name"] == "order_count")["placement"]
    assert placement == [
        {"partition": p, "activeNode": f"node-{p % 3}", "standbyNodes": [f"node-{(p + 1) % 3}"]}
        for p in range(PARTITIONS)
    ]


def test_a_thousand_keys_make_one_forwarded_request_per_peer(cluster: Any) -> None:
    nodes, truth, _ = cluster
    keys = sorted(truth.kv["order_count"]) + [f"nobody-{i}" for i in range(1000)]
    keys = keys[:1000]
    before = [n.metrics().value("iqgraph_forwarded_received_total", peer="node-0") for n in nodes]
    body = nodes[0].post(GET_MANY, {"k": keys})
    assert "errors" not in body
    after = [n.metrics().value("iqgraph_forwarded_received_total", peer="node-0") for n in nodes]
    assert [a - b for a, b in zip(after, before, strict=True)] == [0, 1, 1]


def test_scans_across_nodes_equal_the_union_without_gaps_or_duplicates(cluster: Any) -> None:
    nodes, truth, _ = cluster
    for node in nodes:
        seen, after = [], None
        while True:
            page = node.post(
                "query($a: String) { totalQuantity { all(first: 23, after: $a) { edges { node { key value } } "
                "pageInfo { hasNextPage endCursor } } } }",
                {"a": after},
            )["data"]["totalQuantity"]["all"]
            seen += [(e["node"]["key"], e["node"]["value"]) for e in page["edges"]]
            if not page["pageInfo"]["hasNextPage"]:
                break
            after = page["pageInfo"]["endCursor"]
        assert seen == sorted(truth.kv["total_quantity"].items()), node.id
    items = nodes[1].post('{ itemsSold { mightContainMany(keys: ["widget", "never-sold"]) } }')
    assert items["data"]["itemsSold"]["mightContainMany"] == [True, False]


def _internal(node: NodeProcess, body: bytes, headers: dict[str, str]) -> httpx.Response:
    """Post to the node's peer listener (its /healthz says where)."""
    return httpx.post(f"{node.peer_url}{INTERNAL_PATH}", content=body, headers=headers, timeout=30)


def _signed(body: bytes, caller: Principal, secret: str = CLUSTER_SECRET, to: str = "node-1") -> dict[str, str]:
    signed = PeerSigner("node-2", secret).headers(INTERNAL_PATH, body, caller, to)
    return {"content-type": "application/json", **signed}


def test_a_forwarded_request_is_answered_from_local_partitions_only(cluster: Any) -> None:
    nodes, truth, _ = cluster
    key = next(k for k in sorted(truth.kv["order_count"]) if _owner(k) == "node-1")  # not hosted by node-0
    partition = partition_for(key, PARTITIONS, "string", "murmur2")
    body = orjson.dumps(
        {"query": wire.LOOKUP, "variables": {"store": "order_count", "reads": [[key, None, None, [partition]]]}}
    )
    answer = _internal(nodes[0], body, _signed(body, Principal("tester", None), to="node-0")).json()
    [result] = answer["data"]["_lookup"]["results"]
    assert result["error"]["extensions"]["code"] == "STORE_MIGRATED", answer  # never forwarded again


def test_only_signed_sub_requests_of_peers_reach_the_internal_endpoint(cluster: Any) -> None:
    nodes, truth, _ = cluster
    key = next(k for k in sorted(truth.kv["order_count"]) if _owner(k) == "node-1")
    partition = partition_for(key, PARTITIONS, "string", "murmur2")
    body = orjson.dumps(
        {"query": wire.LOOKUP, "variables": {"store": "order_count", "reads": [[key, None, None, [partition]]]}}
    )
    everyone = Principal("tester", None)
    headers = _signed(body, everyone)
    # the clients' listener serves no peer endpoint, even to a signed request: peers have a listener of their own
    on_client_port = httpx.post(f"{nodes[1].url}{INTERNAL_PATH}", content=body, headers=headers, timeout=30)
    assert on_client_port.status_code == 404, on_client_port.text
    assert on_client_port.json()["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert nodes[1].peer_url != nodes[1].url
    answered = _internal(nodes[1], body, headers)
    [result] = answered.json()["data"]["_lookup"]["results"]
    assert answered.status_code == 200 and result == truth.kv["order_count"][key]  # a count's state is the count
    refused = {
        "replayed": _internal(nodes[1], body, headers),
        # captured on its way to node-1, sent to the others within its window (node-0 holds its partitions' standbys)
        "replayed to node-0": _internal(nodes[0], body, headers),
        "replayed to node-2": _internal(nodes[2], body, headers),
        "wrong secret": _internal(nodes[1], body, _signed(body, everyone, "another-secret")),
        "altered body": _internal(nodes[1], body.replace(b"order_count", b"total_spend"), headers),
        "marker only": _internal(nodes[1], body, {"content-type": "application/json", "x-iqgraph-node": "node-2"}),
        "old": _internal(
            nodes[1],
            body,
            {
                **headers,
                **PeerSigner("node-2", CLUSTER_SECRET).headers(
                    INTERNAL_PATH, body, everyone, "node-1", now=time.time() - 120
                ),
            },
        ),  # fmt: skip
    }
    for why, response in refused.items():
        assert response.status_code == 401, why
        assert response.json() == {
            "errors": [{"message": "peer authentication required", "extensions": {"code": "UNAUTHENTICATED"}}]
        }, why
    # the public endpoint ignores the marker: the internal fields are not there, and the public SDL has none
    marked = nodes[1].post(wire.LOOKUP, {"store": "order_count", "reads": []}, **{"x-iqgraph-node": "node-2"})
    assert marked["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED" and "data" not in marked
    names = nodes[1].post("{ __schema { queryType { fields { name } } } }")["data"]["__schema"]["queryType"]
    assert not [f["name"] for f in names["fields"] if f["name"].startswith("_")]


def test_a_client_without_valid_credentials_gets_401_and_nothing_else(cluster: Any) -> None:
    nodes, truth, _ = cluster
    keys = sorted(truth.kv["order_count"])[:3]
    payload = {"query": GET_MANY, "variables": {"k": keys}}
    expired = token("read:*", exp=int(time.time()) - 3600, iat=int(time.time()) - 7200)
    wrong = jwt.encode({"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60, "scope": "read:*"},
                       "another-secret-of-at-least-32-bytes!", algorithm="HS256")  # fmt: skip
    for headers in ({}, {"authorization": "Bearer not-a-token"}, {"authorization": f"Bearer {expired}"},
                    {"authorization": f"Bearer {wrong}"}, {"authorization": f"Bearer {token('read:*', iss='https://evil')}"},
                    {"authorization": f"Bearer {token('read:*', aud='other')}"}, {"x-api-key": "wrong"}):  # fmt: skip
        response = httpx.post(f"{nodes[0].url}/graphql", json=payload, headers=headers, timeout=30)
        assert response.status_code == 401, headers
        assert response.json() == {"errors": [{"message": "authentication required: send a valid bearer token or "
                                               "API key", "extensions": {"code": "UNAUTHENTICATED"}}]}  # fmt: skip
    by_key = httpx.post(f"{nodes[0].url}/graphql", json=payload, headers={"x-api-key": API_KEY}, timeout=30).json()
    assert by_key["data"]["orderCount"]["getMany"] == [truth.kv["order_count"][k] for k in keys]


def test_a_caller_reads_only_its_stores_and_every_owner_checks(cluster: Any) -> None:
    nodes, truth, _ = cluster
    keys = sorted(truth.kv["order_count"])
    assert {_owner(k) for k in keys} == {"node-0", "node-1", "node-2"}
    both = "query($k: [String!]!) { orderCount { getMany(keys: $k) } totalSpend { getMany(keys: $k) } }"
    for node in nodes:
        body = node.post(both, {"k": keys}, **bearer("read:order_count"))
        assert body["data"]["orderCount"]["getMany"] == [truth.kv["order_count"][k] for k in keys], node.id
        assert body["data"]["totalSpend"] == {"getMany": None}  # that field only, one error
        [error] = body["errors"]
        assert error["extensions"] == {"code": "FORBIDDEN", "store": "total_spend"}
        assert error["path"] == ["totalSpend", "getMany"]
    # the API key's scopes too; and the owner enforces the caller a peer carries, whatever the peer asks
    dashboard = httpx.post(f"{nodes[2].url}/graphql", json={"query": both, "variables": {"k": keys}},
                           headers={"x-api-key": API_KEY}, timeout=30).json()  # fmt: skip
    assert [e["extensions"]["code"] for e in dashboard["errors"]] == ["FORBIDDEN"]
    key = next(k for k in keys if _owner(k) == "node-1")
    partition = partition_for(key, PARTITIONS, "string", "murmur2")
    body = orjson.dumps(
        {"query": wire.LOOKUP, "variables": {"store": "total_spend", "reads": [[key, None, None, [partition]]]}}
    )
    refused = _internal(nodes[1], body, _signed(body, Principal("tester", frozenset({"order_count"})))).json()
    assert refused["data"]["_lookup"] is None and refused["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    # REST too: 401 without credentials, 403 for a store the caller may not read
    rest = f"{nodes[0].url}/stores/total_spend/keys/{key}"
    assert httpx.get(rest, timeout=30).status_code == 401
    forbidden = httpx.get(rest, headers=bearer("read:order_count"), timeout=30)
    assert forbidden.status_code == 403 and forbidden.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    assert httpx.get(rest, headers=bearer("read:total_spend"), timeout=30).json()["value"] == pytest.approx(
        truth.kv["total_spend"][key]
    )
    raw = f"{nodes[0].url}/raw/total_spend/{key}"
    assert httpx.get(raw, timeout=30).status_code == 401
    assert httpx.get(raw, headers=bearer("read:order_count"), timeout=30).status_code == 403
    assert httpx.get(f"{nodes[0].url}/raw/nope/{key}", headers=bearer("read:*"), timeout=30).status_code == 404


def _wait_noticed_down(nodes: list[NodeProcess], logged: list[int], down: str, timeout: float = 30) -> None:
    """Wait until each node's health checks noticed the peer down: it logged "peers down: ..." naming it (in
    what it logged after `logged` bytes)."""
    deadline = time.monotonic() + timeout
    while True:
        said = [node.log.read_bytes()[at:].decode(errors="replace") for node, at in zip(nodes, logged, strict=True)]
        if all(down in _logged_down(text) for text in said):
            return
        assert time.monotonic() < deadline, f"health checks did not notice {down} down in {timeout} s: {said}"
        time.sleep(0.1)


def _logged_down(text: str) -> set[str]:
    """Return every peer a node's log text named in a "peers down: a, b" line."""
    lines = [line.split("peers down: ", 1)[1] for line in text.splitlines() if "peers down: " in line]
    return {name.strip() for line in lines for name in line.split(",")}


def test_when_a_node_dies_standbys_answer_with_lag_or_keys_fail_clearly(cluster: Any) -> None:
    nodes, truth, _ = cluster
    counts = truth.kv["order_count"]
    keys = sorted(counts)
    logged = [len(node.log.read_bytes()) for node in nodes[:2]]
    nodes[2].process.send_signal(signal.SIGKILL)
    nodes[2].process.wait(timeout=60)
    _wait_noticed_down(nodes[:2], logged, "node-2")
    stale = nodes[0].post(GET_MANY, {"k": keys})
    assert stale["data"]["orderCount"]["getMany"] == [counts[k] for k in keys]
    lags = stale["extensions"]["staleness"]
    assert {entry["node"] for entry in lags} == {"node-0"} and all(entry["lag"] == 0 for entry in lags)
    strict = nodes[1].post(GET_MANY, {"k": keys})
    values = strict["data"]["orderCount"]["getMany"]
    for key, value in zip(keys, values, strict=True):
        if _owner(key) == "node-2":
            assert value is None
        else:
            assert value == counts[key]
    codes = {e["extensions"]["code"] for e in strict["errors"]}
    assert codes == {"STORE_NOT_AVAILABLE"}

    partial = nodes[1].post("{ orderCount { all(first: 1000) { edges { node { key } } } } }")
    seen = [e["node"]["key"] for e in partial["data"]["orderCount"]["all"]["edges"]]
    assert seen == sorted(k for k in keys if _owner(k) != "node-2")
    [error] = partial["errors"]
    assert error["extensions"]["code"] == "PARTIAL_RESULT"
    assert error["extensions"]["missingPartitions"] == [p for p in range(PARTITIONS) if p % 3 == 2]
