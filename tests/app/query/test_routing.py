"""The routing core, without a server: every replica state × staleness bound × partitioner."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from iqgraph.app.cluster.membership import ClusterMap, Member, PartitionOwners
from iqgraph.app.cluster.replicas import DOWN, NOT_KNOWN, ReplicaState
from iqgraph.app.query.routing import Refusal, Server, choose, keys_partitions, plan
from iqgraph.schema.errors import ApiError
from iqgraph.stores import InvalidKeyError
from iqgraph.streaming.partitioner import crc32_partition, murmur2_partition

TOPIC = "orders"
RUNNING = ReplicaState("RUNNING", 0)
RESTORING = ReplicaState("RESTORING", 5_000)


def _map(
    active: str | None = "a", standbys: tuple[str, ...] = ("b", "c"), down: frozenset[str] = frozenset()
) -> ClusterMap:
    members = {n: Member(n, f"http://{n}") for n in ("a", "b", "c")}
    return ClusterMap(1, members, {(TOPIC, 0): PartitionOwners(active, standbys)}, down)


def _states(table: Mapping[str, ReplicaState]):  # type: ignore[no-untyped-def]
    return lambda node, topic, partition: table.get(node, NOT_KNOWN)


def test_a_running_active_serves_whatever_the_bound() -> None:
    for bound in (None, 0, 100):
        assert choose(_map(), _states({"a": RUNNING}), TOPIC, 0, bound) == Server("a", "active")


def test_an_active_whose_state_is_not_known_yet_is_tried_first() -> None:
    assert choose(_map(), _states({}), TOPIC, 0, None) == Server("a", "active")


@pytest.mark.parametrize("why", ["down in the map", "failed in this request", "failed a poll"])
def test_a_dead_active_fails_over_to_the_least_lagging_standby_within_the_bound(why: str) -> None:
    states = {"a": RUNNING, "b": ReplicaState("RUNNING", 40), "c": ReplicaState("RUNNING", 3)}
    cmap, excluded = _map(), ()
    if why == "down in the map":
        cmap = _map(down=frozenset({"a"}))
    elif why == "failed in this request":
        excluded = ("a",)
    else:
        states["a"] = ReplicaState(DOWN)
    assert choose(cmap, _states(states), TOPIC, 0, 50, excluded) == Server("c", "standby")
    assert choose(cmap, _states(states), TOPIC, 0, 10, excluded) == Server("c", "standby")


def test_this_node_is_preferred_among_equally_fresh_standbys() -> None:
    states = {"b": ReplicaState("RUNNING", 0), "c": ReplicaState("RUNNING", 0)}
    cmap = _map(down=frozenset({"a"}))
    assert choose(cmap, _states(states), TOPIC, 0, 0, prefer="c") == Server("c", "standby")
    assert choose(cmap, _states(states), TOPIC, 0, 0, prefer="b") == Server("b", "standby")


def test_a_restoring_active_yields_to_a_caught_up_standby() -> None:
    states = {"a": RESTORING, "b": ReplicaState("RUNNING", 0)}
    assert choose(_map(), _states(states), TOPIC, 0, 0) == Server("b", "standby")


def test_a_restoring_active_is_the_last_resort_the_read_waits_for() -> None:
    states = {"a": RESTORING, "b": ReplicaState("RUNNING", 900), "c": ReplicaState("RESTORING", 10)}
    assert choose(_map(), _states(states), TOPIC, 0, 100) == Server("a", "active")
    assert choose(_map(), _states(states), TOPIC, 0, None) == Server("a", "active")


def test_a_stale_standby_beyond_the_bound_is_refused_with_the_best_lag() -> None:
    states = {"b": ReplicaState("RUNNING", 900), "c": ReplicaState("RUNNING", 400)}
    refused = choose(_map(down=frozenset({"a"})), _states(states), TOPIC, 0, 100, ("a",))
    assert isinstance(refused, Refusal)
    assert (refused.code, refused.best_lag, refused.partition) == ("STALE_BEYOND_BOUND", 400, 0)
    assert "maxLag 100" in refused.message


def test_without_a_bound_standbys_never_answer_and_the_refusal_says_how_to_allow_them() -> None:
    states = {"b": RUNNING, "c": RUNNING}
    refused = choose(_map(down=frozenset({"a"})), _states(states), TOPIC, 0, None, ("a",))
    assert isinstance(refused, Refusal) and refused.code == "STORE_NOT_AVAILABLE"
    assert "pass maxLag" in refused.message


def test_a_standby_not_known_yet_is_tried_after_the_known_ones() -> None:
    states = {"b": NOT_KNOWN, "c": ReplicaState("RUNNING", 5)}
    cmap = _map(down=frozenset({"a"}))
    assert choose(cmap, _states(states), TOPIC, 0, 10) == Server("c", "standby")
    assert choose(cmap, _states(states), TOPIC, 0, 1) == Server("b", "standby")


def test_no_replica_at_all() -> None:
    refused = choose(_map(active=None, standbys=()), _states({}), TOPIC, 0, 10)
    assert isinstance(refused, Refusal) and refused.code == "STORE_NOT_AVAILABLE"
    assert "has no active node and no standby" in refused.message
    refused = choose(_map(standbys=()), _states({"a": ReplicaState(DOWN)}), TOPIC, 0, 10, ("a",))
    assert isinstance(refused, Refusal) and "down and no standby" in refused.message


@pytest.mark.parametrize("why", ["down in the map", "failed a poll"])
def test_a_replica_only_believed_down_is_asked_before_a_read_fails(why: str) -> None:
    # a node starved of CPU misses its /readyz poll yet answers: a belief is no proof, a failure in this request is
    believed = _map(down=frozenset({"a", "b"})) if why == "down in the map" else _map()
    polled = {"a": ReplicaState(DOWN), "b": ReplicaState(DOWN), "c": ReplicaState("RUNNING", 900)}
    if why == "down in the map":
        polled = {"c": ReplicaState("RUNNING", 900)}
    assert choose(believed, _states(polled), TOPIC, 0, 10) == Server("a", "active")
    assert choose(believed, _states(polled), TOPIC, 0, 10, ("a",)) == Server("b", "standby")
    assert choose(believed, _states(polled), TOPIC, 0, None, ("a",)).code == "STORE_NOT_AVAILABLE"  # type: ignore[union-attr]
    refused = choose(believed, _states(polled), TOPIC, 0, 10, ("a", "b"))
    assert isinstance(refused, Refusal) and (refused.code, refused.best_lag) == ("STALE_BEYOND_BOUND", 900)
    fresh = {**polled, "c": ReplicaState("RUNNING", 0)}
    assert choose(believed, _states(fresh), TOPIC, 0, 10) == Server("c", "standby")  # a sure replica first


def test_plan_groups_reads_per_serving_node_and_refuses_a_read_as_a_whole() -> None:
    members = {n: Member(n, f"http://{n}") for n in ("a", "b")}
    owners = {
        (TOPIC, 0): PartitionOwners("a", ("b",)),
        (TOPIC, 1): PartitionOwners("b", ("a",)),
        (TOPIC, 2): PartitionOwners("b", ()),
    }
    cmap = ClusterMap(1, members, owners, frozenset({"b"}))
    needs = {0: [0], 1: [1], 2: [0, 1], 3: [2], 4: [0, 2]}
    routed = plan(cmap, _states({"a": RUNNING}), TOPIC, needs, 10, {1: {"b"}, 2: {"b"}})
    assert routed.groups == {
        Server("a", "active"): routed.groups[Server("a", "active")],
        Server("a", "standby"): routed.groups[Server("a", "standby")],
    }
    assert routed.groups[Server("a", "active")].reads == {0: [0], 2: [0]}
    assert routed.groups[Server("a", "standby")].reads == {1: [1], 2: [1]}
    assert set(routed.refused) == {3, 4} and routed.refused[4].partition == 2


def test_plan_honours_per_partition_exclusions() -> None:
    routed = plan(_map(), _states({"a": RUNNING, "b": RUNNING}), TOPIC, {0: [0]}, 5, {0: {"a"}})
    assert list(routed.groups) == [Server("b", "standby")]


def key_partitions(key: object, *args: object) -> tuple[int, ...]:
    """Return keys_partitions of one key; raise its error."""
    (found,) = keys_partitions([key], *args)  # type: ignore[arg-type, list-item]
    if isinstance(found, Exception):
        raise found
    return found


def test_a_batch_routes_each_key_and_reports_each_bad_key_in_place() -> None:
    found = keys_partitions(["k-1", "", 7, "k-2"], "string", "string", TOPIC, 6, True, "murmur2")
    assert found[0] == (murmur2_partition(b"k-1", 6),) and found[3] == (murmur2_partition(b"k-2", 6),)
    assert isinstance(found[1], InvalidKeyError) and isinstance(found[2], InvalidKeyError)


def _key_on_disagreeing_partitions(partitions: int) -> str:
    for i in range(1_000):
        key = f"k-{i}"
        if murmur2_partition(key.encode(), partitions) != crc32_partition(key.encode(), partitions):
            return key
    raise AssertionError("no key found")


@pytest.mark.parametrize(
    ("detected", "expected"),
    [("murmur2", "m"), ("consistent_random", "c"), ("mixed", "mc"), ("unknown", "mc")],
)
def test_keys_route_by_the_detected_partitioner(detected: str, expected: str) -> None:
    key = _key_on_disagreeing_partitions(6)
    where = {"m": murmur2_partition(key.encode(), 6), "c": crc32_partition(key.encode(), 6)}
    found = key_partitions(key, "string", "string", TOPIC, 6, True, detected)
    assert found == tuple(where[c] for c in expected)


def test_a_key_no_partitioner_explains_is_a_partitioner_mismatch_not_a_null() -> None:
    with pytest.raises(ApiError) as refused:
        key_partitions("k-1", "string", "string", TOPIC, 6, True, "unexplained")
    assert refused.value.code == "PARTITIONER_MISMATCH"
    assert (refused.value.extensions or {})["topic"] == TOPIC


def test_a_store_keyed_by_a_column_reads_every_partition() -> None:
    assert key_partitions("widget", "string", "string", TOPIC, 4, False, "unexplained") == (0, 1, 2, 3)


def test_an_empty_or_mistyped_key_is_invalid() -> None:
    with pytest.raises(InvalidKeyError):
        key_partitions("", "string", "string", TOPIC, 6, True, "murmur2")
    with pytest.raises(InvalidKeyError):
        key_partitions("12", "int", "long", TOPIC, 6, True, "murmur2")


def test_a_key_routed_lately_is_not_hashed_again_and_its_partitions_stay_those_of_its_detection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from iqgraph.app.query import routing

    hashed: list[bytes] = []
    real = routing.candidates_many

    def counting(keys: list[bytes], partitions: int, detected: str) -> list[tuple[int, ...] | None]:
        hashed.extend(keys)
        return real(keys, partitions, detected)

    monkeypatch.setattr(routing, "candidates_many", counting)
    monkeypatch.setattr(routing, "_ROUTED", {})
    key = "routed-lately-7"
    first = keys_partitions([key, "other-3"], "string", "string", "t", 6, True, "murmur2")
    again = keys_partitions([key], "string", "string", "t", 6, True, "murmur2")
    assert again == [first[0]] == [(murmur2_partition(key.encode(), 6),)]
    assert hashed == [key.encode(), b"other-3"]  # the second read hashed nothing
    both = keys_partitions([key], "string", "string", "t", 6, True, "unknown")  # a detection of its own
    assert both[0] == tuple(dict.fromkeys((murmur2_partition(key.encode(), 6), crc32_partition(key.encode(), 6))))
    assert hashed[-1] == key.encode() and len(hashed) == 3
    monkeypatch.setattr(routing, "ROUTED_KEYS", 2)  # full: cleared, never past its bound
    keys_partitions(["x-1", "x-2"], "string", "string", "t", 6, True, "murmur2")
    assert len(routing._ROUTED) <= 2
