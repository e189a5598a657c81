"""Three real nodes (uvicorn + Spark + the embedded broker) on loopback: any node answers any query."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from iqgraph.examples.shop import build_app
from iqgraph.streaming.broker import EmbeddedBroker
from iqgraph.streaming.partitioner import partition_for
from tests.app.cluster_nodes import NodeProcess, start_nodes, wait_ready, write_app_module
from tests.conftest import MakeTopic
from tests.streaming.ground_truth import Expected, expected
from tests.streaming.test_pipeline import START_MS, send

PARTITIONS = 6
EVENTS = 3_000
GET_MANY = "query($k: [String!]!) { orderCount { getMany(keys: $k) } }"


@pytest.fixture(scope="module")
def cluster(
    broker: EmbeddedBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[list[NodeProcess], Expected, str]]:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(61, START_MS), EVENTS))
    send(broker, topic, events)
    home = tmp_path_factory.mktemp("cluster")
    write_app_module(home, "clusterapp", topic, PARTITIONS, broker.bootstrap_servers)
    # node-0 lets a standby answer (stale reads allowed); node-1 does not.
    nodes = start_nodes(
        home, "clusterapp", 3, [["--standbys", "1", "--max-lag", "1000000"], ["--standbys", "1"], ["--standbys", "1"]]
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


def test_a_forwarded_request_is_answered_from_local_partitions_only(cluster: Any) -> None:
    nodes, truth, _ = cluster
    key = next(k for k in sorted(truth.kv["order_count"]) if _owner(k) == "node-1")  # not hosted by node-0
    partition = partition_for(key, PARTITIONS, "string", "murmur2")
    lookup = 'query($r: JSON!) { _lookup(store: "order_count", reads: $r) }'
    body = nodes[0].post(lookup, {"r": [[key, None, None, [partition]]]}, **{"x-iqgraph-forwarded": "node-9"})
    [result] = body["data"]["_lookup"]["results"]
    assert result["error"]["extensions"]["code"] == "STORE_MIGRATED", body  # never forwarded again
    plain = nodes[0].post(lookup, {"r": [[key, None, None, [partition]]]})
    assert plain["errors"][0]["extensions"]["code"] == "BAD_REQUEST"  # internal fields answer peers only


def test_when_a_node_dies_standbys_answer_with_lag_or_keys_fail_clearly(cluster: Any) -> None:
    nodes, truth, _ = cluster
    counts = truth.kv["order_count"]
    keys = sorted(counts)
    nodes[2].process.send_signal(signal.SIGKILL)
    nodes[2].process.wait()
    time.sleep(3)  # health checks notice
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
