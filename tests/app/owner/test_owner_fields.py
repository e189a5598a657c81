"""The owner-side field runner on one node's partitions: JSON-able values, views that read only what is local,
workers that a stuck function cannot hold forever; and the routing of keys with two candidate partitions over
three in-process nodes."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from iqgraph.app.owner.runner import OwnerFieldRunner, as_json
from iqgraph.app.query.partitions import LocalPartitions
from iqgraph.schema.errors import ApiError
from iqgraph.schema.wire import Owned
from iqgraph.streaming.definitions import App, key_value_store, sum_
from iqgraph.streaming.owner_fields import OwnerField
from iqgraph.streaming.partitioner import partition_for, placement
from tests.schema.conftest import Hosted, close_hosted, open_hosted
from tests.support.apps import MARKET_TYPES, PARTITIONS, fill_market, market_app, market_orders

RELEASE = threading.Event()
REPO = Path(__file__).resolve().parents[3]


def _stuck(key: str, views: Any) -> float:
    RELEASE.wait(5)
    return 1.0


def _fast(key: str, views: Any) -> float:
    return 2.0


def _orders(key: str, views: Any) -> int:
    return int(views.kv("order_count").get(key) or 0)


def _ratio(key: str, views: Any) -> float:
    return float("inf")


def _by_item(key: str, views: Any) -> float:
    return float(views.kv("spend_per_item").get("widget") or 0.0)


def _app() -> App:
    base = market_app()
    stores = [*base.stores, key_value_store("spend_per_item", "orders", sum_("amount"), key="item")]
    fields = [
        OwnerField("stuck", _stuck, "double", "order_count", timeout_s=0.1),
        OwnerField("by_item", _by_item, "double", "order_count"),
        OwnerField("fast", _fast, "double", "order_count", timeout_s=0.5),
        OwnerField("orders", _orders, "bigint", "order_count"),
        OwnerField("ratio", _ratio, "double", "order_count"),
    ]
    return dataclasses.replace(base, stores=stores, fields=fields)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalPartitions]:
    app = _app()
    hosted: Hosted = open_hosted(tmp_path, app, "orders", "customers", "products")
    fill_market(hosted, market_orders())
    yield LocalPartitions(app, hosted, owner=OwnerFieldRunner)
    close_hosted(hosted)


def _call(key: str) -> tuple[str, tuple[int, ...]]:
    return key, (partition_for(key, PARTITIONS, "string", "murmur2"),)


def test_values_become_json_the_schema_converts() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    struct = StructType(
        [
            StructField("at", TimestampType()),
            StructField("day", DateType()),
            StructField("price", DecimalType(10, 2)),
            StructField("pair", StructType([StructField("n", LongType()), StructField("s", StringType())])),
        ]
    )
    value = {"at": when, "day": when.date(), "price": decimal.Decimal("1.10"), "pair": (1, "a")}
    assert as_json(value, struct) == {
        "at": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "price": "1.10",
        "pair": [1, "a"],
    }
    genre = StructType([StructField("genre", StringType()), StructField("plays", LongType())])
    assert as_json(Row(genre="jazz", plays=3), genre) == {"genre": "jazz", "plays": 3}
    assert as_json({1: "one"}, MapType(LongType(), StringType())) == [[1, "one"]]  # non-string keys: pairs
    with pytest.raises(TypeError, match="returned a object"):
        as_json(object(), DoubleType())


def test_bytes_are_base64_and_only_for_binary() -> None:
    assert as_json(b"\xff\xfe\x00", BinaryType()) == "//4A"  # not UTF-8: still an answer
    assert as_json([bytearray(b"ok")], ArrayType(BinaryType())) == ["b2s="]
    with pytest.raises(TypeError, match="for a binary value: return bytes"):
        as_json("text", BinaryType())
    with pytest.raises(TypeError, match="returned bytes for a string value"):
        as_json(b"text", StringType())


async def test_a_stuck_worker_is_replaced_so_the_next_call_runs_at_once(local: LocalPartitions) -> None:
    RELEASE.clear()
    others = set(threading.enumerate())  # other runners' idle workers (earlier tests) live on as daemons
    runner = OwnerFieldRunner(local, workers=4)
    try:
        started = time.monotonic()
        stuck = await asyncio.wait_for(runner.call("stuck", [_call(f"customer-0{i}") for i in range(1, 5)]), 5)
        assert time.monotonic() - started < 3.0  # (0.1 s and the scheduling of a loaded machine)
        for owned in stuck.value:
            assert owned.found and owned.value.code == "TIMEOUT" and "ran longer than 0.1 s" in owned.value.message
        assert runner.stuck_threads == 4
        started = time.monotonic()
        fast = await asyncio.wait_for(runner.call("fast", [_call("customer-01")]), 5)
        assert fast.value == [Owned(True, 2.0)]
        assert time.monotonic() - started < 0.5  # not queued behind the stuck ones (10 s before): replaced
        workers = [t for t in threading.enumerate() if t.name.startswith("iqgraph-owner-field") and t not in others]
        assert len(workers) == 8 and all(t.daemon for t in workers)  # 4 stuck, 4 taking calls
    finally:
        RELEASE.set()
        runner.close()
    deadline = time.monotonic() + 5
    while runner.stuck_threads and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert runner.stuck_threads == 0  # each stuck thread ended when its function returned


async def test_the_wait_for_a_free_worker_is_bounded_by_the_fields_timeout(local: LocalPartitions) -> None:
    RELEASE.clear()
    runner = OwnerFieldRunner(local, workers=1)
    hog = dataclasses.replace(local.app.fields[0], timeout_s=2.0, name="stuck")
    patient = LocalPartitions(dataclasses.replace(local.app, fields=[hog, *local.app.fields[1:]]), local.partitions)
    runner.local = patient
    try:
        blocking = asyncio.ensure_future(runner.call("stuck", [_call("customer-01")]))
        await asyncio.sleep(0.05)  # the one worker runs the stuck key
        started = time.monotonic()
        waited = await asyncio.wait_for(runner.call("fast", [_call("customer-02")]), 5)
        elapsed = time.monotonic() - started
        [owned] = waited.value
        assert owned.value.code == "TIMEOUT" and "waited 0.5 s for a free worker" in owned.value.message
        assert 0.45 <= elapsed < 2.0  # its own timeout_s, not a fixed queue timeout (10 s)
    finally:
        RELEASE.set()
        await blocking
        runner.close()


async def test_past_the_stuck_threads_cap_calls_answer_timeout_at_once_and_log(
    local: LocalPartitions, caplog: pytest.LogCaptureFixture
) -> None:
    RELEASE.clear()
    runner = OwnerFieldRunner(local, workers=1, max_stuck=2)
    try:
        for key in ("customer-01", "customer-02"):
            await runner.call("stuck", [_call(key)])
        assert runner.stuck_threads == 2
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="iqgraph.app.owner.runner"):
            refused = await runner.call("fast", [_call("customer-03")])
        assert time.monotonic() - started < 0.4  # at once, not after its timeout_s
        [owned] = refused.value
        assert owned.value.code == "TIMEOUT" and "2 worker threads are stuck" in owned.value.message
        assert any("fast" in r.getMessage() and "stuck" in r.getMessage() for r in caplog.records)
    finally:
        RELEASE.set()
    deadline = time.monotonic() + 5
    while runner.stuck_threads and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert (await runner.call("fast", [_call("customer-03")])).value == [Owned(True, 2.0)]  # capacity is back
    runner.close()


async def test_a_batch_answers_within_the_nodes_limit_whatever_its_keys(
    local: LocalPartitions, monkeypatch: pytest.MonkeyPatch
) -> None:
    import iqgraph.app.owner.runner as owner_fields

    monkeypatch.setattr(owner_fields, "OWNER_FIELD_MAX_TIMEOUT_S", 0.5)  # (4 s: the peer timeout less a second)

    def sleepy(key: str, views: Any) -> float:
        time.sleep(0.3)
        return 1.0

    field = OwnerField("sleepy", sleepy, "double", "order_count", timeout_s=0.4)
    runner = OwnerFieldRunner(
        LocalPartitions(dataclasses.replace(local.app, fields=[field]), local.partitions), workers=1
    )
    started = time.monotonic()
    answer = await runner.call("sleepy", [_call(f"customer-0{i}") for i in range(1, 5)])
    elapsed = time.monotonic() - started
    runner.close()
    first, second, *waiting = [o.value for o in answer.value]
    assert first == 1.0
    assert second.code == "TIMEOUT" and "within the 0.5 s a node has for a batch" in second.message
    assert all(w.code == "TIMEOUT" and "free worker" in w.message for w in waiting)
    assert elapsed < 0.6  # a peer answers before the caller's peer timeout


def test_a_stuck_function_does_not_hold_the_process_at_exit(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, dataclasses, threading
        from pathlib import Path
        from iqgraph.app.query.partitions import LocalPartitions
        from iqgraph.app.owner.runner import OwnerFieldRunner
        from iqgraph.streaming.owner_fields import OwnerField
        from iqgraph.streaming.partitioner import partition_for
        from tests.support.apps import PARTITIONS, fill_market, market_app, market_orders
        from tests.schema.conftest import open_hosted

        def hang(key, views):
            threading.Event().wait(60)
        field = OwnerField("hang", hang, "double", "order_count", timeout_s=0.1)
        app = dataclasses.replace(market_app(), fields=[field])
        hosted = open_hosted(Path({str(tmp_path)!r}), app, "orders", "customers", "products")
        fill_market(hosted, market_orders())
        runner = OwnerFieldRunner(LocalPartitions(app, hosted))
        calls = [(k, (partition_for(k, PARTITIONS, "string", "murmur2"),)) for k in ("customer-01", "customer-02")]
        print([o.value.code for o in asyncio.run(runner.call("hang", calls)).value], flush=True)
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['TIMEOUT', 'TIMEOUT']"
    assert time.monotonic() - started < 30  # not the 60 s the function hangs


async def test_the_owner_says_whether_the_routing_store_holds_the_key(local: LocalPartitions) -> None:
    key = "customer-01"
    right = partition_for(key, PARTITIONS, "string", "murmur2")
    wrong = (right + 1) % PARTITIONS
    answer = await local.call("orders", [(key, (right,)), (key, (wrong,)), (key, (right, wrong))])
    assert answer.value == [Owned(True, 5), Owned(False, 0), Owned(True, 5)]


async def test_a_window_view_reads_a_user_aggregation(tmp_path: Path) -> None:
    from iqgraph import Topic, aggregate, count, key_value_store, tumbling, window_store
    from iqgraph.stores import PartitionState, StateDirectory
    from iqgraph.streaming.sink import PartitionBatch, StoreSink
    from iqgraph.streaming.sketches import histogram

    def slow_requests(host: str, views: Any) -> int:
        return sum(w.value[-1]["count"] for w in views.window("latency").fetch(host))

    app = App(
        "a",
        [Topic("t", schema="ms DOUBLE", partitions=1)],
        [
            key_value_store("requests", "t", count()),
            window_store("latency", "t", aggregate(histogram("ms", [10, 100])), tumbling(minutes=1)),
        ],
        fields=[OwnerField("slow_requests", slow_requests, "bigint", "requests")],
    )
    stores = StateDirectory(tmp_path, "a").open("t", 0, app.specs("t"))
    stores.db.set_state(PartitionState.RUNNING)
    batch = PartitionBatch(first_offset=0, last_offset=0)
    batch.partials["requests"].append(("h1", None, 1, 1))
    batch.partials["latency"].append(("h1", 60_000, [0, 0, 1], 1))
    batch.stream_time["latency"] = 60_000
    StoreSink(app, app.topic("t"), {0: stores}).apply({0: batch})
    try:
        answer = await LocalPartitions(app, {"t": {0: stores}}, owner=OwnerFieldRunner).call(
            "slow_requests", [("h1", (0,))]
        )
    finally:
        stores.close()
    assert answer.value == [Owned(True, 1)]


async def test_a_view_of_a_store_keyed_by_a_column_is_refused(
    local: LocalPartitions, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="iqgraph.app.owner.runner"):
        answer = await local.call("by_item", [_call("customer-01")])
    [error] = answer.value
    assert isinstance(error, Owned) and isinstance(error.value, ApiError) and error.value.code == "INTERNAL"
    [record] = caplog.records
    assert "by_item" in record.getMessage() and "customer-01" in record.getMessage()
    assert record.exc_info is not None and "keyed by column 'item'" in str(record.exc_info[1])


async def test_a_partition_not_hosted_fails_its_keys_for_another_replica(local: LocalPartitions) -> None:
    key = "customer-01"
    elsewhere = (partition_for(key, PARTITIONS, "string", "murmur2") + 1) % PARTITIONS
    hosted = {t: {p: s for p, s in ps.items() if p != elsewhere} for t, ps in local.partitions.items()}
    partial = LocalPartitions(local.app, hosted, owner=OwnerFieldRunner)
    answer = await partial.call("stuck", [(key, (elsewhere,))])
    [error] = answer.value
    assert type(error).__name__ == "StoreMigratedError"


# -- three in-process nodes over the same partition databases; peers over ASGI --------------------------------


SECRET = "in-process-cluster"  # noqa: S105 - a test's


class _Router:
    """Route each request to its node's GraphQL app by host: clients' /graphql, peers' internal endpoint."""

    def __init__(self) -> None:
        self.apps: dict[str, Any] = {}
        self.internal: dict[str, Any] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.responses import JSONResponse

        from iqgraph.schema.wire import INTERNAL_PATH

        host = dict(scope["headers"]).get(b"host", b"").decode()
        if scope["path"] == "/healthz":  # a node's peer listener is the same host here
            await JSONResponse({"peerUrl": f"http://{host}"})(scope, receive, send)
            return
        apps = self.internal if scope["path"] == INTERNAL_PATH else self.apps
        await apps[host](scope, receive, send)


def _cluster(app: App, hosted: Hosted, partitioner: str, n: int = 3) -> tuple[list[Any], _Router]:
    from iqgraph.app.catalog import entity_infos
    from iqgraph.app.cluster.membership import Member, StaticMembership
    from iqgraph.app.cluster.peers import PeerClient
    from iqgraph.app.owner.calls import call_many
    from iqgraph.app.owner.runner import owner_field_infos
    from iqgraph.app.query.store_queries import ClusterStoreQueries, RetryPolicy
    from iqgraph.app.security.peer_auth import PeerGate, PeerVerifier
    from iqgraph.schema import GraphQLApp, Limits, build_schema
    from iqgraph.schema.builder import build_internal_schema

    members = [Member(f"node-{i}", f"http://node{i}.test") for i in range(n)]
    router = _Router()
    nodes = []
    for member in members:
        membership = StaticMembership(
            member.id,
            members,
            {t.name: t.partitions for t in app.topics},
            global_topics={t.name: t.partitions for t in app.topics if t.global_table},
        )
        cmap = membership.current()
        mine = {
            t: {p: s for p, s in ps.items() if cmap.owners_of(t, p).active == member.id} for t, ps in hosted.items()
        }
        local = LocalPartitions(app, mine, node_id=member.id, url=member.url, owner=OwnerFieldRunner)
        queries = ClusterStoreQueries(
            app,
            {**MARKET_TYPES, "spend_per_item": DoubleType()},
            local,
            membership,
            PeerClient(member.id, secret=SECRET),
            retry=RetryPolicy(50),
            partitioner=lambda t: partitioner,
            owner_calls=call_many,
        )
        schema = build_schema(
            queries.stores(), Limits(), entities=entity_infos(app), owner_fields=owner_field_infos(app)
        )
        gql = GraphQLApp(schema, queries, Limits())
        internal = GraphQLApp(build_internal_schema(Limits(), owner_field_infos(app)), queries, Limits(), local=local)
        router.apps[member.url.removeprefix("http://")] = gql
        router.internal[member.url.removeprefix("http://")] = PeerGate(internal, PeerVerifier(SECRET, member.id))
        nodes.append((member, queries, gql))
    return nodes, router


async def _post(router: _Router, node: Any, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=router), base_url=node[0].url) as client:
        response = await client.post("/graphql", json={"query": query, "variables": variables})
        return response.json()  # type: ignore[no-any-return]


def _wire(nodes: list[Any], router: _Router) -> None:
    loop = id(asyncio.get_running_loop())
    for _, queries, _ in nodes:
        queries.peers._clients[loop] = httpx.AsyncClient(transport=httpx.ASGITransport(app=router))


def _split_keys() -> list[str]:
    """Return the market's customers whose murmur2 and CRC32 partitions differ (two candidates each)."""
    keys = sorted({o["customer"] for o in market_orders()})
    return [k for k in keys if len(set(placement(k.encode(), PARTITIONS))) == 2]


@pytest.mark.parametrize("n", [1, 3])
async def test_a_key_with_two_candidates_is_answered_by_the_one_holding_it(local: LocalPartitions, n: int) -> None:
    keys = _split_keys()
    assert len(keys) >= 3
    nodes, router = _cluster(local.app, local.partitions, "unknown", n)
    _wire(nodes, router)
    expected = [sum(o["customer"] == k for o in market_orders()) for k in keys]
    result = await _post(router, nodes[0], "query($k: [String!]!) { ordersMany(keys: $k) }", {"k": keys})
    assert result == {"data": {"ordersMany": expected}}
    absent = await _post(router, nodes[0], "query($k: [String!]!) { ordersMany(keys: $k) }", {"k": ["nobody-7"] * 2})
    assert absent == {"data": {"ordersMany": [0, 0]}}  # held nowhere: the value computed with no data


async def test_a_key_held_in_both_candidates_is_a_partitioner_mismatch(local: LocalPartitions) -> None:
    from tests.support.apps import begin_batch

    key = _split_keys()[0]
    where = placement(key.encode(), PARTITIONS)
    other = local.partitions["orders"][where.consistent_random]
    with begin_batch(other) as tx:
        other.kv("order_count").merge(tx, [(key, 1)])
    nodes, router = _cluster(local.app, local.partitions, "unknown")
    _wire(nodes, router)
    result = await _post(router, nodes[0], "query($k: String!) { orders(key: $k) }", {"k": key})
    assert result["data"] == {"orders": None}
    [error] = result["errors"]
    assert error["extensions"]["code"] == "PARTITIONER_MISMATCH"
    assert sorted(error["extensions"]["partitions"]) == sorted(where)


async def test_nan_is_internal_alike_on_the_owner_and_through_a_peer(local: LocalPartitions) -> None:
    nodes, router = _cluster(local.app, local.partitions, "murmur2")
    _wire(nodes, router)
    keys = sorted({o["customer"] for o in market_orders()})
    here = next(k for k in keys if partition_for(k, PARTITIONS, "string", "murmur2") % 3 == 0)
    there = next(k for k in keys if partition_for(k, PARTITIONS, "string", "murmur2") % 3 == 1)
    for key in (here, there):
        result = await _post(router, nodes[0], "query($k: String!) { ratio(key: $k) }", {"k": key})
        assert result["data"] == {"ratio": None}
        assert [e["extensions"]["code"] for e in result["errors"]] == ["INTERNAL"], key
