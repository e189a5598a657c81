"""TopicWatch: the partitioner a node routes by is detected from its partitions' counters, and kept fresh."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from iqgraph.app.cluster.topic_watch import TopicWatch
from iqgraph.app.query.partitions import LocalPartitions
from iqgraph.schema.errors import ApiError, api_error
from iqgraph.stores import PartitionState, PartitionStores, RepartitionedError, StateDirectory, StoreKind, StoreSpec
from iqgraph.streaming.definitions import App, Topic, count, key_value_store
from iqgraph.streaming.kafka_offsets import KafkaOffsets
from iqgraph.streaming.partitioner import EVIDENCE_COUNTERS

if TYPE_CHECKING:
    from iqgraph.streaming.apache_kafka import KafkaBroker

TOPIC = "orders"
SPECS = (StoreSpec("counts", StoreKind.KEY_VALUE, "string"),)


@pytest.fixture
def hosted(tmp_path: Path) -> Iterator[dict[str, dict[int, PartitionStores]]]:
    state = StateDirectory(tmp_path / "state", "watch-app")
    partitions = {TOPIC: {p: state.open(TOPIC, p, SPECS) for p in range(2)}}
    yield partitions
    for stores in partitions[TOPIC].values():
        stores.close()


def _apply_evidence(stores: PartitionStores, offset: int, **fields: int) -> None:
    tx = stores.db.begin(offset, offset + 1)
    assert tx is not None
    for name, amount in fields.items():
        tx.increment(EVIDENCE_COUNTERS[name], amount)
    tx.commit()


def _no_end_offsets(topic: str, partitions: list[int]) -> Mapping[int, int]:
    return {}


def test_a_detection_still_unknown_is_made_again_on_the_spot_not_one_interval_later(
    hosted: dict[str, dict[int, PartitionStores]],
) -> None:
    # an interval far longer than the test: only an on-the-spot detection can see the records
    watch = TopicWatch(hosted, _no_end_offsets, "auto", interval_s=3600)
    watch.start()
    try:
        assert watch.partitioner(TOPIC) == "unknown"
        _apply_evidence(hosted[TOPIC][0], 0, consistent_random=3, both=1)
        assert watch.partitioner(TOPIC) == "consistent_random"
        # once detected, the detection stays until the next refresh round (no per-read counter reads)
        _apply_evidence(hosted[TOPIC][1], 0, murmur2=2)
        assert watch.partitioner(TOPIC) == "consistent_random"
        watch.refresh()
        assert watch.partitioner(TOPIC) == "mixed"
    finally:
        watch.stop()


def test_an_explicit_partitioner_wins_over_the_evidence(hosted: dict[str, dict[int, PartitionStores]]) -> None:
    _apply_evidence(hosted[TOPIC][0], 0, consistent_random=3)
    watch = TopicWatch(hosted, _no_end_offsets, "murmur2", interval_s=3600)
    assert watch.partitioner(TOPIC) == "murmur2"


def test_a_failed_refresh_round_does_not_end_the_watch(hosted: dict[str, dict[int, PartitionStores]]) -> None:
    rounds: list[int] = []

    def end_offsets(topic: str, partitions: list[int]) -> Mapping[int, int]:
        rounds.append(len(rounds))
        return {p: len(rounds) for p in partitions}

    watch = TopicWatch(hosted, end_offsets, "auto", interval_s=0.01)
    broken = {"calls": 0}
    original = watch._detect

    def detect_failing_thrice(topic: str) -> str:
        broken["calls"] += 1
        if broken["calls"] <= 3:
            raise RuntimeError("a round that fails outside the guarded calls")
        return original(topic)

    watch._detect = detect_failing_thrice  # type: ignore[method-assign]
    watch._thread.start()  # without start()'s first synchronous round, which would raise here
    try:
        deadline = 200
        while len(rounds) < 6 and deadline:
            deadline -= 1
            watch._stop.wait(0.02)
        assert len(rounds) >= 6, "the watch thread stopped after a failed round"
        assert watch.end_offset(TOPIC, 0) is not None
    finally:
        watch.stop()


def test_partitions_added_while_the_node_runs_turn_every_hosted_partition_repartitioned_with_what_to_do(
    tmp_path: Path, broker: KafkaBroker, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(2)
    app = App(
        name="grow",
        topics=[Topic(topic, schema="amount INT", partitions=2)],
        stores=[key_value_store("per_key", topic, count())],
    )
    state = StateDirectory(tmp_path / "state", app.name)
    hosted = {topic: {p: state.open(topic, p, app.specs(topic)) for p in range(2)}}
    offsets = KafkaOffsets({"bootstrap.servers": broker.bootstrap_servers}, topic)
    for stores in hosted[topic].values():
        stores.db.topic_partitions(2)  # recorded when the runner opens them
        stores.db.set_state(PartitionState.RUNNING)
    local = LocalPartitions(app, hosted)
    watch = TopicWatch(
        hosted, offsets.latest, "murmur2", interval_s=0.1, partition_count=lambda t: len(offsets.partitions())
    )
    watch.start()
    try:
        time.sleep(0.3)
        assert all(s.db.state is PartitionState.RUNNING for s in hosted[topic].values()), "unchanged: still serving"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=30)
        deadline = time.monotonic() + 10
        while not all(s.db.state is PartitionState.REPARTITIONED for s in hosted[topic].values()):
            assert time.monotonic() < deadline, "the growth was not seen within 10 s"
            time.sleep(0.05)
        (failed,) = local.read_states("per_key", [(("k", None, None), (0,))]).value
        error = api_error(failed)
        assert isinstance(error, ApiError) and error.code == "TOPIC_REPARTITIONED"
        assert error.extensions == {"code": "TOPIC_REPARTITIONED", "topic": topic, "builtFor": 2, "found": 3}
        assert "produce the records into a new topic" in error.message
        assert {p.state for p in local.node().partitions} == {"REPARTITIONED"}  # /readyz: not ready
        assert watch.repartitioned == {topic: (2, 3)}
    finally:
        watch.stop()
        for stores in hosted[topic].values():
            stores.close()
    # restarted with the count edited to the new one, the stores built for the old count refuse to open
    again = state.open(topic, 0, app.specs(topic))
    try:
        with pytest.raises(RepartitionedError, match="built for 2"):
            again.db.topic_partitions(3)
    finally:
        again.close()
