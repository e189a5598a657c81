"""GroupMembership on the embedded Apache Kafka broker: join, rebalance on join and leave, crash expiry and rejoin
(under the classic and the KIP-848 consumer protocol), co-partitioning, standbys, warm-up replicas; and build_map's
rules (pure)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, ConsumerGroupType, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from iqgraph.app.cluster.group_membership import (
    METADATA_TOPIC_CONFIG,
    GroupMembership,
    GroupMembershipError,
    MemberRecord,
    Replicas,
    build_map,
    metadata_topic_for,
)
from iqgraph.app.cluster.membership import ClusterMap, Member, PartitionOwners
from iqgraph.app.cluster.replicas import ReplicaState
from iqgraph.streaming.apache_kafka import KafkaBroker
from tests.conftest import MakeTopic

PARTITIONS = 6
#: The embedded broker accepts session timeouts from 1 s (group.min.session.timeout.ms, Kafka's default floor: 6 s;
#: group.consumer.min.session.timeout.ms for the consumer protocol, default floor 45 s).
SESSION_MS = 2000
PROTOCOLS = pytest.mark.parametrize("protocol", ["classic", "consumer"])
DEADLINE_S = 20.0
REPO = Path(__file__).resolve().parents[3]

Join = Callable[..., GroupMembership]


@pytest.fixture
def topic(make_topic: MakeTopic) -> str:
    return make_topic(partitions=PARTITIONS, prefix="orders")


@pytest.fixture
def protocol() -> str:
    """The group protocol of the members join() starts; PROTOCOLS runs a test under both."""
    return "classic"


@pytest.fixture
def join(broker: KafkaBroker, topic: str, protocol: str) -> Iterator[Join]:
    """Return join(node_id, standbys=0): a started member of a fresh group over topic; all stop at teardown."""
    app, started = f"app-{uuid.uuid4().hex[:8]}", []

    def make(
        node_id: str, standbys: int = 0, replicas: Replicas | None = None, topics: Mapping[str, int] | None = None
    ) -> GroupMembership:
        member = GroupMembership(
            node_id, url_of(node_id), app, topics or {topic: PARTITIONS}, broker.bootstrap_servers,
            standbys=standbys, session_timeout_ms=SESSION_MS, heartbeat_s=0.5, liveness_s=3.0,
            start_timeout_s=DEADLINE_S, replicas=replicas, group_protocol=protocol,
        )  # fmt: skip
        member.start()
        started.append(member)
        return member

    yield make
    for member in reversed(started):
        member.stop()


def url_of(node_id: str) -> str:
    return f"http://{node_id}.test:8000"


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> float:
    """Wait until condition holds; return the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < deadline_s, f"not within {deadline_s} s: {what}"
        time.sleep(0.02)
    return time.monotonic() - start


def active(cmap: ClusterMap, node_id: str, topic: str) -> set[int]:
    return set(cmap.active_partitions(node_id).get(topic, []))


def split_between(cmap: ClusterMap, topic: str, nodes: list[str]) -> bool:
    """Return whether every node has a share and the shares cover the topic exactly once."""
    shares = [active(cmap, node, topic) for node in nodes]
    covered = sorted(p for share in shares for p in share)
    return all(shares) and covered == list(range(PARTITIONS)) and set(cmap.members) == set(nodes)


def read_metadata(bootstrap: str, app: str) -> dict[str, bytes | None]:
    """Return the latest value per key of app's metadata topic, read from the beginning."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "enable.partition.eof": True})
    consumer.assign([TopicPartition(metadata_topic_for(app), 0, OFFSET_BEGINNING)])
    latest: dict[str, bytes | None] = {}
    try:
        while (message := consumer.poll(5.0)) is not None and message.error() is None:
            latest[message.key().decode()] = message.value()
    finally:
        consumer.close()
    return latest


def group_type(bootstrap: str, group: str) -> ConsumerGroupType:
    """Return the protocol the broker's group coordinator runs group under."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(timeout=10).type


@PROTOCOLS
def test_one_member_gets_every_partition_and_publishes_it(
    join: Join, topic: str, broker: KafkaBroker, protocol: str
) -> None:
    started = time.monotonic()
    node = join("a")
    joined_s = time.monotonic() - started

    cmap = node.current()
    assert cmap.members == {"a": Member("a", url_of("a"))}
    assert cmap.active_partitions("a") == {topic: list(range(PARTITIONS))}
    assert cmap.owners_of(topic, 0) == PartitionOwners("a", ())
    published = read_metadata(broker.bootstrap_servers, node.app_name)["a"]
    assert published is not None
    record = MemberRecord.decode(published)
    assert (record.url, dict(record.active)) == (url_of("a"), {topic: tuple(range(PARTITIONS))})
    assert record.generation == cmap.generation and abs(record.time - time.time()) < 5
    assert group_type(broker.bootstrap_servers, node.app_name) == ConsumerGroupType[protocol.upper()]
    print(f"{protocol}: join of a first member: {joined_s:.2f} s")


@PROTOCOLS
def test_second_member_takes_a_share_and_both_maps_converge(join: Join, topic: str, protocol: str) -> None:
    first = join("a")
    heard: list[ClusterMap] = []
    first.subscribe(heard.append)

    started = time.monotonic()
    second = join("b")
    joined_s = time.monotonic() - started
    wait_for(
        lambda: split_between(first.current(), topic, ["a", "b"]) and first.current() == second.current(),
        "both nodes see a and b sharing the partitions",
    )
    converged_s = time.monotonic() - started

    assert second.refresh() == first.refresh()
    wait_for(lambda: bool(heard) and heard[-1] == first.current(), "a's subscriber heard the converged map")
    print(f"{protocol}: second member: start() {joined_s:.2f} s, maps converged {converged_s:.2f} s after starting b")


def test_each_partition_has_the_other_node_as_standby(join: Join, topic: str) -> None:
    first, second = join("a", standbys=1), join("b", standbys=1)
    wait_for(lambda: split_between(first.current(), topic, ["a", "b"]), "a and b share the partitions")
    wait_for(lambda: second.current() == first.current(), "both nodes have the same map")

    cmap = first.current()
    for partition in range(PARTITIONS):
        owners = cmap.owners_of(topic, partition)
        assert owners.standbys == ({"a": "b", "b": "a"}[owners.active or ""],)
    assert cmap.standby_partitions("a") == cmap.active_partitions("b")


@PROTOCOLS
def test_a_stopping_member_hands_its_partitions_back(join: Join, topic: str, protocol: str) -> None:
    first, second = join("a"), join("b")
    wait_for(lambda: split_between(first.current(), topic, ["a", "b"]), "a and b share the partitions")

    started = time.monotonic()
    second.stop()
    left_s = wait_for(lambda: "b" not in first.current().members, "a's map drops b")
    back_s = wait_for(lambda: active(first.current(), "a", topic) == set(range(PARTITIONS)), "a owns every partition")
    assert set(first.current().members) == {"a"}
    print(
        f"{protocol}: clean leave: b dropped after {left_s:.2f} s, a owns all after {time.monotonic() - started:.2f} s"
    )
    assert back_s < DEADLINE_S


@PROTOCOLS
def test_a_crashed_member_expires_from_the_map_and_a_new_one_takes_a_share(
    join: Join, topic: str, broker: KafkaBroker, protocol: str
) -> None:
    first = join("a")
    child = subprocess.Popen(  # noqa: S603 - our own interpreter running our own module
        [sys.executable, "-c", CRASHING_MEMBER, broker.bootstrap_servers, first.app_name, topic, protocol],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        wait_for(lambda: split_between(first.current(), topic, ["a", "z"]), "a and z share the partitions")
        started = time.monotonic()
    finally:
        child.kill()  # no LeaveGroup, no tombstone: the group's session timeout and our liveness timeout act
        child.wait()
    gone_s = wait_for(lambda: set(first.current().members) == {"a"}, "a's map drops z")
    back_s = wait_for(lambda: active(first.current(), "a", topic) == set(range(PARTITIONS)), "a owns every partition")
    crashed_s = time.monotonic() - started
    join("b")  # the crashed node back, as a new member
    rejoined_s = wait_for(lambda: split_between(first.current(), topic, ["a", "b"]), "a and b share the partitions")
    print(
        f"{protocol}: crash: z dropped after {gone_s:.2f} s, a owns all after {crashed_s:.2f} s ({back_s=:.2f}); "
        f"a new member shares {rejoined_s:.2f} s after its start() returned"
    )


@PROTOCOLS
def test_range_gives_partition_p_of_every_input_topic_to_the_same_member(
    join: Join, topic: str, make_topic: MakeTopic, protocol: str
) -> None:
    other = make_topic(partitions=PARTITIONS, prefix="customers")
    topics = {topic: PARTITIONS, other: PARTITIONS}
    first, _, _ = (join(node, topics=topics) for node in "abc")

    def co_partitioned() -> bool:
        cmap = first.current()
        return split_between(cmap, topic, ["a", "b", "c"]) and all(
            active(cmap, node, topic) == active(cmap, node, other) for node in "abc"
        )

    wait_for(co_partitioned, "a, b and c hold the same partitions of both topics")


def test_the_metadata_topic_is_compacted_for_real_and_a_member_joining_after_reads_the_same_map(
    join: Join, topic: str, broker: KafkaBroker
) -> None:
    first, _ = join("a"), join("b")
    wait_for(lambda: split_between(first.current(), topic, ["a", "b"]), "a and b share the partitions")
    metadata = metadata_topic_for(first.app_name)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    resource = ConfigResource(ResourceType.TOPIC, metadata)
    created = admin.describe_configs([resource])[resource].result(timeout=10)
    assert {name: created[name].value for name in METADATA_TOPIC_CONFIG} == dict(METADATA_TOPIC_CONFIG)
    # the production segment rolls every 10 minutes: roll it at once here, so the cleaner works within the test
    quick = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in {
        "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}.items()]  # fmt: skip
    admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, metadata, incremental_configs=quick)])[
        resource
    ].result(timeout=10)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "probe"})
    try:

        def compacted() -> bool:  # the cleaner removed older heartbeats: fewer records than offsets
            low, high = consumer.get_watermark_offsets(TopicPartition(metadata, 0), 10, cached=False)
            return sum(1 for _ in _offsets(broker.bootstrap_servers, metadata, high)) < high - low

        wait_for(compacted, "the log cleaner compacts the metadata topic", deadline_s=40.0)
    finally:
        consumer.close()
    third = join("c")  # reads the compacted log from the beginning
    wait_for(lambda: split_between(third.current(), topic, ["a", "b", "c"]), "c's map has the three members")
    wait_for(lambda: third.current().members == first.current().members, "c and a agree on the members")
    assert {n: active(third.current(), n, topic) for n in "abc"} == {
        n: active(first.current(), n, topic) for n in "abc"
    }


def _offsets(bootstrap: str, topic: str, end: int) -> Iterator[int]:
    """Yield the offset of every record of partition 0 of topic below end, read from the beginning.

    Stopping at end, not at the partition's end: the members' heartbeats keep appending, and a reader that
    keeps up with them may see no end of partition for long (it counted them all and the check failed).
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    try:
        while (message := consumer.poll(5.0)) is not None and message.error() is None and message.offset() < end:
            yield message.offset()
    finally:
        consumer.close()


CRASHING_MEMBER = """
import sys, time
from iqgraph.app.cluster.group_membership import GroupMembership
bootstrap, app, topic, protocol = sys.argv[1:5]
GroupMembership("z", "http://z.test:8000", app, {topic: 6}, bootstrap, session_timeout_ms=2000,
                heartbeat_s=0.5, liveness_s=3.0, group_protocol=protocol).start()
print("ready", flush=True)
time.sleep(600)
"""


def test_start_names_a_missing_input_topic(broker: KafkaBroker) -> None:
    member = GroupMembership("a", url_of("a"), "app-missing", {"no-such-topic": 3}, broker.bootstrap_servers)
    with pytest.raises(GroupMembershipError, match="'no-such-topic' does not exist"):
        member.start()


def test_start_gives_up_at_its_deadline_with_a_clear_error(broker: KafkaBroker, topic: str) -> None:
    member = GroupMembership(
        "a", url_of("a"), "app-impatient", {topic: PARTITIONS}, broker.bootstrap_servers,
        session_timeout_ms=SESSION_MS, start_timeout_s=0.2,
    )  # fmt: skip
    with pytest.raises(GroupMembershipError, match="got no assignment from consumer group 'app-impatient'"):
        member.start()  # the coordinator needs more than 0.2 s to answer the first join


def test_the_consumer_protocol_names_the_brokers_bounds_when_it_refuses_the_session_timeout(
    broker: KafkaBroker, topic: str
) -> None:
    member = GroupMembership(
        "a", url_of("a"), "app-hasty", {topic: PARTITIONS}, broker.bootstrap_servers, session_timeout_ms=500,
        group_protocol="consumer",
    )  # fmt: skip
    with pytest.raises(GroupMembershipError, match=r"refuses consumer group 'app-hasty' a session timeout of 500 ms"):
        member.start()  # the embedded broker's group.consumer.min.session.timeout.ms is 1000


def test_build_map_prefers_the_highest_generation_and_drops_silent_members() -> None:
    now = 1000.0
    records = {
        "a": MemberRecord("a", "http://a", {"t": (0, 1, 2)}, generation=4, time=now - 1),
        "b": MemberRecord("b", "http://b", {"t": (2, 3)}, generation=5, time=now - 1),
        "c": MemberRecord("c", "http://c", {"t": (4,)}, generation=3, time=now - 60),
    }
    cmap = build_map(records, now=now, liveness_s=6.0, standbys=1)

    assert set(cmap.members) == {"a", "b"} and cmap.generation == 5
    assert cmap.active_partitions("a") == {"t": [0, 1]}
    assert cmap.active_partitions("b") == {"t": [2, 3]}
    assert cmap.owners_of("t", 4) == PartitionOwners(None)
    assert cmap.owners_of("t", 0).standbys == ("b",) and cmap.owners_of("t", 3).standbys == ("a",)
    assert MemberRecord.decode(records["a"].encode()) == records["a"]


def test_a_joiner_is_active_only_once_it_reports_its_partitions_caught_up(join: Join, topic: str) -> None:
    reports: dict[str, Mapping[tuple[str, int], tuple[str, int | None]]] = {
        "a": {(topic, p): ("RUNNING", 0) for p in range(PARTITIONS)},
        "b": {(topic, p): ("RESTORING", 50_000) for p in range(PARTITIONS)},
    }
    first = join("a", replicas=lambda: reports["a"])
    second = join("b", replicas=lambda: reports["b"])

    def warming(cmap: ClusterMap) -> set[int]:  # no standbys asked for: b is a standby only while it warms up
        return {p for p in range(PARTITIONS) if "b" in cmap.owners_of(topic, p).standbys}

    wait_for(lambda: bool(warming(first.current())), "b claims a share and warms it up as a standby")
    wait_for(lambda: second.current() == first.current(), "both nodes have the same map")
    claimed = warming(first.current())
    assert active(first.current(), "a", topic) == set(range(PARTITIONS)), "a stays active while b warms up"

    reports["b"] = {(topic, p): ("RUNNING", 0) for p in claimed}
    handed_s = wait_for(lambda: active(first.current(), "b", topic) == claimed, "b is active once caught up")
    assert active(first.current(), "a", topic) == set(range(PARTITIONS)) - claimed
    assert all(first.current().owners_of(topic, p).standbys == () for p in range(PARTITIONS))
    print(f"warm-up: b active {handed_s:.2f} s after it reported its {sorted(claimed)} caught up")


NOW = 1000.0


def record(
    node: str,
    claims: tuple[int, ...],
    hosted: Mapping[int, tuple[str, int | None]],
    generation: int = 5,
    age: float = 1,
) -> MemberRecord:
    """Return node's record on topic t: its claims, and its hosted copies' (state, lag)."""
    copies = {("t", p): ReplicaState(state, lag) for p, (state, lag) in hosted.items()}
    return MemberRecord(node, f"http://{node}", {"t": claims}, generation, NOW - age, copies)


def owners(records: list[MemberRecord], partition: int, recovery_lag: int = 1_000) -> PartitionOwners:
    cmap = build_map({r.node_id: r for r in records}, now=NOW, liveness_s=6.0, standbys=1, recovery_lag=recovery_lag)
    return cmap.owners_of("t", partition)


def test_a_joiner_not_caught_up_warms_up_as_a_standby_while_the_previous_owner_stays_active() -> None:
    # c joined and claims 2, which b owned before; c's standby-to-be a does not run 2 yet
    a = record("a", (0,), {0: ("RUNNING", 3), 2: ("RESTORING", 900)})
    b = record("b", (1,), {1: ("RUNNING", 0), 0: ("RUNNING", 2), 2: ("RUNNING", 5)})
    c = record("c", (2,), {2: ("RESTORING", 50_000), 1: ("RESTORING", 800)})

    assert owners([a, b, c], 2) == PartitionOwners("b", ("c", "a"))
    assert owners([a, b, c], 0) == PartitionOwners("a", ("b",))  # caught-up claimants keep today's rule
    assert owners([a, b, c], 1) == PartitionOwners("b", ("c",))


def test_a_joiner_running_within_the_recovery_lag_becomes_active() -> None:
    a = record("a", (0,), {0: ("RUNNING", 3), 2: ("RUNNING", 1)})
    b = record("b", (1,), {1: ("RUNNING", 0), 2: ("RUNNING", 0)})

    caught_up = record("c", (2,), {2: ("RUNNING", 1_000)})
    assert owners([a, b, caught_up], 2) == PartitionOwners("c", ("a",))
    assert owners([a, b, caught_up], 2, recovery_lag=999) == PartitionOwners("a", ("c", "b"))  # b's copy stays
    lag_unknown = record("c", (2,), {2: ("RUNNING", None)})
    assert owners([a, b, lag_unknown], 2) == PartitionOwners("a", ("c", "b"))


def test_the_claimants_standby_is_preferred_to_an_outsider_with_less_lag() -> None:
    # a (c's standby) and b (the previous owner) both run 2: a keeps it anyway, so b does not flip in and out
    a = record("a", (0,), {2: ("RUNNING", 40)})
    b = record("b", (1,), {2: ("RUNNING", 5)})
    c = record("c", (2,), {2: ("RESTORING", 50_000)})
    assert owners([a, b, c], 2) == PartitionOwners("a", ("c", "b"))  # b stays a standby while c warms up
    assert owners([a, b, record("c", (2,), {2: ("RUNNING", 20_000)})], 2) == PartitionOwners("a", ("c", "b"))


def test_with_no_copy_caught_up_the_most_advanced_of_the_claims_copies_is_active() -> None:
    a = record("a", (0,), {2: ("RUNNING", 5_000)})  # c's standby, RUNNING beyond the recovery lag
    b = record("b", (1,), {2: ("RESTORING", 10)})  # an outsider: never chosen by this rule
    c = record("c", (2,), {2: ("RESTORING", 50_000)})
    assert owners([a, b, c], 2) == PartitionOwners("a", ("c",))
    restarting = record("a", (0,), {2: ("RESTORING", 300)})  # its pipeline restarts: seconds from RUNNING
    assert owners([restarting, b, record("c", (2,), {})], 2) == PartitionOwners("a", ("c",))
    assert owners([restarting, b, c], 2) == PartitionOwners("a", ("c",))
    assert owners([record("a", (0,), {}), b, c], 2) == PartitionOwners("c", ("a",))
    assert owners([record("c", (2,), {})], 2) == PartitionOwners("c", ())


def test_a_crashed_claimants_partitions_go_at_once_to_the_best_running_copy() -> None:
    c = record("c", (2, 3, 4), {2: ("RUNNING", 0), 3: ("RUNNING", 0), 4: ("RUNNING", 0)}, age=60)  # expired
    a = record("a", (0,), {0: ("RUNNING", 0), 2: ("RUNNING", 7), 3: ("RUNNING", 20_000), 4: ("RESTORING", 0)})
    b = record("b", (1,), {1: ("RUNNING", 0), 2: ("RUNNING", 9), 3: ("RUNNING", 30_000), 4: ("RESTORING", 0)})

    assert owners([a, b, c], 2) == PartitionOwners("a", ("b",))  # caught up everywhere: by id
    assert owners([a, b, c], 3) == PartitionOwners("a", ("b",))  # beyond the recovery lag: still better than none
    assert owners([a, b, c], 4) == PartitionOwners("a", ("b",))  # restoring everywhere: reads wait for it
    assert owners([a, b, c], 5) == PartitionOwners(None)  # nobody hosts it
    cmap = build_map({r.node_id: r for r in (a, b, c)}, now=NOW, liveness_s=6.0, standbys=1)
    assert set(cmap.members) == {"a", "b"} and cmap.hosted_partitions("b") == {"t": [0, 1, 2, 3, 4]}


def test_caught_up_copies_keep_the_active_role_whatever_their_lags_do() -> None:
    # lags move with every record each node publishes: a choice by lag flapped the role between a and b
    c = record("c", (2,), {2: ("RUNNING", 0)}, age=60)  # crashed: nobody claims 2
    warming = record("c", (2,), {2: ("RESTORING", 50_000)})  # back, claiming 2, warming up
    unclaimed, claimed = set(), set()
    for lag_a, lag_b, lag_d in [(7, 9, 3), (9, 7, 8), (0, 900, 1), (900, 0, 0)]:
        a, b = record("a", (0,), {2: ("RUNNING", lag_a)}), record("b", (1,), {2: ("RUNNING", lag_b)})
        assert owners([a, b, c], 2) == PartitionOwners("a", ("b",)), (lag_a, lag_b)
        unclaimed.add(owners([a, b, c], 2))
        d = record("d", (3,), {2: ("RUNNING", lag_d)})  # an outsider holding a caught-up copy too
        claimed.add(owners([a, b, d, warming], 2))
    assert len(unclaimed) == 1 and len(claimed) == 1, (unclaimed, claimed)
    behind = record("b", (1,), {2: ("RUNNING", 1_001)})  # beyond the recovery lag: the caught-up copy wins
    assert owners([record("a", (0,), {2: ("RUNNING", 1_000)}), behind, c], 2).active == "a"
    beyond = record("a", (0,), {2: ("RUNNING", 1_001)})
    assert owners([beyond, record("b", (1,), {2: ("RUNNING", 0)}), c], 2).active == "b"


def test_while_a_claimant_warms_up_every_caught_up_copy_stays_a_standby() -> None:
    # seen under load: c crashed (its record still live), the group gave c's partition 4 to b, which has no
    # copy; c stayed active as b's standby-to-be, and a's caught-up standby copy was dropped from the map:
    # every read of 4 failed (c down, no standby that could answer), and a restored 4 from scratch after
    c = record("c", (4,), {4: ("RUNNING", 3)}, generation=5, age=2)
    a = record("a", (0,), {4: ("RUNNING", 0)}, generation=6)
    b = record("b", (4,), {}, generation=6)
    found = owners([a, b, c], 4)
    assert found.active == "c" and "a" in found.standbys and "b" in found.standbys, found


def test_an_unclaimed_partition_keeps_every_copy_it_has() -> None:
    c = record("c", (2,), {2: ("RUNNING", 0)}, age=60)  # expired
    hosts = [record(n, (), {2: ("RUNNING", 10), 0: ("RUNNING", 0)}) for n in ("a", "b", "d")]
    cmap = build_map({r.node_id: r for r in (c, *hosts)}, now=NOW, liveness_s=6.0, standbys=1)
    assert cmap.owners_of("t", 2) == PartitionOwners("a", ("b", "d"))


def test_build_map_is_deterministic() -> None:
    rng = random.Random(7)
    states = ["RUNNING", "RESTORING", "CREATED"]
    records = [
        record(
            node,
            tuple(p for p in range(8) if p % 3 == i),
            {p: (rng.choice(states), rng.choice([None, 0, 500, 5_000])) for p in range(8) if rng.random() < 0.6},
            generation=4 + i % 2,
            age=rng.choice([1, 2, 60]),
        )
        for i, node in enumerate(["a", "b", "c"])
    ]
    built = [
        build_map({r.node_id: r for r in rng.sample(records, len(records))}, now=NOW, liveness_s=6.0, standbys=1)
        for _ in range(5)
    ]
    assert all(cmap == built[0] for cmap in built)


def test_a_record_carries_its_hosted_copies_and_old_records_still_decode() -> None:
    new = record("a", (0, 1), {0: ("RUNNING", 3), 5: ("RESTORING", None)})
    assert json.loads(new.encode())["hosted"] == {"t": {"0": ["RUNNING", 3], "5": ["RESTORING", None]}}
    assert MemberRecord.decode(new.encode()) == new

    old = b'{"node_id": "a", "url": "http://a", "generation": 3, "time": 999.0, "active": {"t": [0, 1]}}'
    assert MemberRecord.decode(old) == MemberRecord("a", "http://a", {"t": (0, 1)}, 3, 999.0)
    cmap = build_map({"a": MemberRecord.decode(old)}, now=NOW, liveness_s=6.0, standbys=1)
    assert cmap.owners_of("t", 0) == PartitionOwners("a", ())
