"""The one replica executor, without a server: the failover rules every read, owner call and watch goes through."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pytest

from iqgraph.app.cluster.membership import ClusterMap, Member, PartitionOwners
from iqgraph.app.cluster.peers import PeerError, PeerUnavailableError
from iqgraph.app.cluster.replicas import NOT_KNOWN, ReplicaState
from iqgraph.app.query import routing
from iqgraph.app.query.executor import Failover, RetryPolicy, execute
from iqgraph.schema.errors import ApiError
from iqgraph.schema.types import Answer

TOPIC = "orders"
FAST = RetryPolicy(deadline_ms=200, first_backoff_ms=5, max_backoff_ms=20)


class Cluster:
    """Replicas over a fixed map (a active, b and c standbys of partitions 0 and 1), recording marks."""

    node_id = "a"

    def __init__(self, states: Mapping[str, ReplicaState] | None = None, standbys: tuple[str, ...] = ("b",)) -> None:
        members = {n: Member(n, f"http://{n}") for n in ("a", "b", "c")}
        owners = {(TOPIC, p): PartitionOwners("a", standbys) for p in (0, 1)}
        self.cmap = ClusterMap(1, members, owners)
        self.states = dict(states or {})
        self.down: list[str] = []
        self.refreshed = 0

    def _state(self, node: str, topic: str, partition: int) -> ReplicaState:
        return self.states.get(node, NOT_KNOWN)

    def choose(
        self, topic: str, partition: int, bound: int | None, excluded: Collection[str]
    ) -> routing.Server | routing.Refusal:
        return routing.choose(self.cmap, self._state, topic, partition, bound, excluded, self.node_id)

    def plan(
        self, topic: str, needs: Mapping[int, Sequence[int]], bound: int | None, excluded: Mapping[int, Collection[str]]
    ) -> routing.Plan:
        return routing.plan(self.cmap, self._state, topic, needs, bound, excluded, self.node_id)

    def mark_down(self, node: str) -> None:
        self.down.append(node)

    def refresh(self) -> None:
        self.refreshed += 1


def _accept(server: routing.Server, group: routing.Group, answer: Answer[dict[int, Any]]) -> dict[int, Any]:
    return dict(answer.value)


def _run(cluster: Cluster, answers: Mapping[str, Any], bound: int | None = None) -> tuple[dict[int, Any], list[str]]:
    """Read partition 0 (item 0) and 1 (item 1); each node answers answers[node] (an exception raises)."""
    asked: list[str] = []

    async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
        asked.append(server.node)
        found = answers[server.node]
        if isinstance(found, BaseException):
            raise found
        return Answer({i: f"{server.node}:{found}" for i in group.reads}, {}, {})

    failover = Failover(cluster, TOPIC, bound, FAST)
    return asyncio.run(execute(failover, {0: [0], 1: [1]}, ask, _accept, None)), asked


def test_an_unreachable_active_is_marked_down_and_a_standby_within_the_bound_answers() -> None:
    cluster = Cluster({"b": ReplicaState("RUNNING", 0)})
    found, asked = _run(cluster, {"a": PeerUnavailableError("gone"), "b": "v"}, bound=10)
    assert found == {0: "b:v", 1: "b:v"} and asked == ["a", "b"]
    assert "a" in cluster.down


def test_without_a_bound_the_refusal_says_why_with_the_bound_and_best_lag() -> None:
    cluster = Cluster({"b": ReplicaState("RUNNING", 50)})
    found, _ = _run(cluster, {"a": PeerUnavailableError("gone"), "b": "v"}, bound=5)
    error = found[0]
    assert isinstance(error, ApiError) and error.code == "STALE_BEYOND_BOUND"
    assert error.extensions == {
        "code": "STALE_BEYOND_BOUND",
        "partition": 0,
        "retryAfterMs": 1000,
        "bestLag": 50,
        "maxLag": 5,
    }


def test_a_partition_that_is_not_ready_is_waited_for_until_the_deadline() -> None:
    not_ready = PeerError("restoring", "STORE_NOT_READY", {"retryAfterMs": 100})
    found, asked = _run(Cluster(standbys=()), {"a": not_ready})
    assert {e.code for e in found.values()} == {"STORE_NOT_READY"}
    assert len(asked) > 2  # asked again after each backoff, not excluded for the request


def test_an_error_that_cannot_fail_over_ends_the_item_at_once() -> None:
    forbidden = PeerError("no", "FORBIDDEN", {})
    found, asked = _run(Cluster({"b": ReplicaState("RUNNING", 0)}), {"a": forbidden, "b": "v"}, bound=10)
    assert {e.code for e in found.values()} == {"FORBIDDEN"} and asked == ["a"]


def test_a_moved_partition_refreshes_the_map() -> None:
    cluster = Cluster({"b": ReplicaState("RUNNING", 0)})
    moved = PeerError("moved", "STORE_MIGRATED", {})
    found, _ = _run(cluster, {"a": moved, "b": "v"}, bound=10)
    assert found == {0: "b:v", 1: "b:v"} and cluster.refreshed >= 1


def test_a_watch_waits_out_a_refusal_until_the_deadline_then_ends_with_the_same_extensions_as_a_read() -> None:
    cluster = Cluster({"a": ReplicaState("DOWN"), "b": ReplicaState("RUNNING", 50)})
    clock = [0.0]
    watch = Failover(cluster, TOPIC, 5, FAST, patient=True, clock=lambda: clock[0])
    assert watch.choose(0) == routing.Server("a", "active")  # only believed down: asked before refusing
    assert watch.failed("a", [0], PeerUnavailableError("gone")) is None
    refusal = watch.choose(0)
    assert isinstance(refusal, routing.Refusal)
    assert watch.refused(refusal) is None  # patient: retried until the deadline
    clock[0] = 1.0
    error = watch.refused(refusal)
    read = Failover(cluster, TOPIC, 5, FAST).refused(refusal)
    assert error is not None and read is not None and error.extensions == read.extensions
    assert error.extensions["bestLag"] == 50 and error.extensions["maxLag"] == 5


@pytest.mark.parametrize("code", ["NODE_UNAVAILABLE", "STORE_NOT_READY", "STORE_MIGRATED", "STALE_BEYOND_BOUND"])
def test_a_watch_and_a_read_fail_over_on_the_same_codes(code: str) -> None:
    failover = Failover(Cluster(), TOPIC, None, FAST)
    assert failover.failed("a", [0], PeerError("x", code, {})) is None
    assert failover.failed("a", [0], PeerError("x", "FORBIDDEN", {})) is not None


def test_a_read_this_node_serves_whole_is_one_ask_without_a_plan_and_a_failed_one_goes_on_to_the_rounds() -> None:
    class Counting(Cluster):
        plans = 0

        def plan(self, *args: Any) -> routing.Plan:
            self.plans += 1
            return super().plan(*args)

    served = Counting({"a": ReplicaState("RUNNING", 0)})
    found, asked = _run(served, {"a": "v"})
    assert found == {0: "a:v", 1: "a:v"} and asked == ["a"] and served.plans == 0  # both items in one ask

    failing = Counting({"a": ReplicaState("RUNNING", 0), "b": ReplicaState("RUNNING", 0)})
    found, asked = _run(failing, {"a": PeerUnavailableError("gone"), "b": "v"}, bound=10)
    assert found == {0: "b:v", 1: "b:v"} and asked == ["a", "b"]  # a is asked once, its failure counts
    assert set(failing.down) == {"a"} and failing.plans == 1  # then one plan, without a
