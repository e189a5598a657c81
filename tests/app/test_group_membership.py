"""GroupMembership on the embedded Tansu broker: join, rebalance on join and leave, standbys, crash expiry."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from iqgraph.app.group_membership import (
    GroupMembership,
    GroupMembershipError,
    MemberRecord,
    build_map,
    metadata_topic_for,
)
from iqgraph.app.membership import ClusterMap, Member, PartitionOwners
from iqgraph.streaming.broker import EmbeddedBroker
from tests.conftest import MakeTopic

PARTITIONS = 6
#: Tansu finishes a join or rebalance in about half the session timeout; real Kafka refuses less than 6 s by default.
SESSION_MS = 2000
DEADLINE_S = 20.0
REPO = Path(__file__).resolve().parents[2]

Join = Callable[..., GroupMembership]


@pytest.fixture
def topic(make_topic: MakeTopic) -> str:
    return make_topic(partitions=PARTITIONS, prefix="orders")


@pytest.fixture
def join(broker: EmbeddedBroker, topic: str) -> Iterator[Join]:
    """Return join(node_id, standbys=0): a started member of a fresh group over topic; all stop at teardown."""
    app, started = f"app-{uuid.uuid4().hex[:8]}", []

    def make(node_id: str, standbys: int = 0) -> GroupMembership:
        member = GroupMembership(
            node_id, url_of(node_id), app, {topic: PARTITIONS}, broker.bootstrap_servers, standbys=standbys,
            session_timeout_ms=SESSION_MS, heartbeat_s=0.5, liveness_s=3.0, start_timeout_s=DEADLINE_S,
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


def test_one_member_gets_every_partition_and_publishes_it(join: Join, topic: str, broker: EmbeddedBroker) -> None:
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
    print(f"join of a first member: {joined_s:.2f} s")


def test_second_member_takes_a_share_and_both_maps_converge(join: Join, topic: str) -> None:
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
    print(f"second member: start() {joined_s:.2f} s, both maps converged {converged_s:.2f} s after starting b")


def test_each_partition_has_the_other_node_as_standby(join: Join, topic: str) -> None:
    first, second = join("a", standbys=1), join("b", standbys=1)
    wait_for(lambda: split_between(first.current(), topic, ["a", "b"]), "a and b share the partitions")
    wait_for(lambda: second.current() == first.current(), "both nodes have the same map")

    cmap = first.current()
    for partition in range(PARTITIONS):
        owners = cmap.owners_of(topic, partition)
        assert owners.standbys == ({"a": "b", "b": "a"}[owners.active or ""],)
    assert cmap.standby_partitions("a") == cmap.active_partitions("b")


def test_a_stopping_member_hands_its_partitions_back(join: Join, topic: str) -> None:
    first, second = join("a"), join("b")
    wait_for(lambda: split_between(first.current(), topic, ["a", "b"]), "a and b share the partitions")

    started = time.monotonic()
    second.stop()
    left_s = wait_for(lambda: "b" not in first.current().members, "a's map drops b")
    back_s = wait_for(lambda: active(first.current(), "a", topic) == set(range(PARTITIONS)), "a owns every partition")
    assert set(first.current().members) == {"a"}
    print(f"clean leave: b dropped after {left_s:.2f} s, a owns all after {time.monotonic() - started:.2f} s")
    assert back_s < DEADLINE_S


def test_a_crashed_member_expires_from_the_map(join: Join, topic: str, broker: EmbeddedBroker) -> None:
    first = join("a")
    child = subprocess.Popen(  # noqa: S603 - our own interpreter running our own module
        [sys.executable, "-c", CRASHING_MEMBER, broker.bootstrap_servers, first.app_name, topic],
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
    print(f"crash: z dropped after {gone_s:.2f} s, a owns all after {time.monotonic() - started:.2f} s ({back_s=:.2f})")


CRASHING_MEMBER = """
import sys, time
from iqgraph.app.group_membership import GroupMembership
bootstrap, app, topic = sys.argv[1:4]
GroupMembership("z", "http://z.test:8000", app, {topic: 6}, bootstrap, session_timeout_ms=2000,
                heartbeat_s=0.5, liveness_s=3.0).start()
print("ready", flush=True)
time.sleep(600)
"""


def test_start_names_a_missing_input_topic(broker: EmbeddedBroker) -> None:
    member = GroupMembership("a", url_of("a"), "app-missing", {"no-such-topic": 3}, broker.bootstrap_servers)
    with pytest.raises(GroupMembershipError, match="'no-such-topic' does not exist"):
        member.start()


def test_start_gives_up_at_its_deadline_with_a_clear_error(broker: EmbeddedBroker, topic: str) -> None:
    member = GroupMembership(
        "a", url_of("a"), "app-impatient", {topic: PARTITIONS}, broker.bootstrap_servers,
        session_timeout_ms=SESSION_MS, start_timeout_s=0.2,
    )  # fmt: skip
    with pytest.raises(GroupMembershipError, match="got no assignment from consumer group 'app-impatient'"):
        member.start()  # Tansu needs about a second to answer the first join


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
