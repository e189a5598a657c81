"""The Kafka drill (issue 42 part 2): brokers restarted, killed and all gone under three nodes, no answer lost.

A 3-broker Apache Kafka cluster (`KafkaCluster(size=3)`: replication factor 3, min.insync.replicas 2 for the input
topic and the changelog topics), three `iqgraph serve` nodes of the shop with one standby per partition, an
idempotent acks=all producer at 40 orders/s and a reader asking each node for every key's order count all along.
Then: a rolling restart of the three brokers (SIGTERM, start, wait until every replica is in sync, next), a kill -9
of the broker leading the controller quorum (started again 5 s later), and the whole cluster stopped for 30 s and
started again; each step begins once every node applied what was acknowledged before it (its orders are counted in
its own figures). Checked:
- every answer of the run came without an error, none was null, and none counted more than had been handed to the
  producer for its key (and the topic holds twice) nor less than was acknowledged before the nodes started (a
  standby or the last known state answers while Kafka is away; its staleness in ``extensions.staleness``);
- produce -> queryable (from the hand-over of an order to the first answer that counts it) stays <= 10 s at p99
  through the rolling restart, or, on a machine too busy for that with every broker up, within 3 s of the p99 the
  same run measured with every broker up (the baseline): the roll is a pause, not a stall. Speed itself is the
  benchmark's (`bench/kafka_drill.py` prints both p99s side by side);
- after each return (each broker of the roll, the killed controller, the whole cluster) every node applied an order
  acknowledged after it;
- the input topic holds every order where the brokers acknowledged it, at consecutive offsets (an order held twice
  is the idempotent producer's retry after an epoch bump, librdkafka#4953: a record the nodes apply like any
  other), and, with the nodes stopped, every copy on every node's disk (actives and standbys, every store) equals
  the ground truth of what the input topic holds, read back from Kafka.
It prints the figures docs/benchmarks.md records (`bench/kafka_drill.py` prints the same, outside pytest).

Run: ``flock /tmp/iqgraph-spark.lock .venv/bin/python -m pytest -q -s -p no:cacheprovider -m slow
tests/e2e/test_kafka_drill.py`` (~5 minutes on two cores).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from iqgraph.stores import PartitionState
from iqgraph.stores.state_dir import StateDirectory
from iqgraph.streaming.partitioner import partition_for
from tests.support.kafka_drill import PARTITIONS, Drill, errors_by_kind, figures, percentile, run_drill, wrong
from tests.support.pipeline import assert_equal_to_ground_truth
from tests.support.readback import read_back

pytestmark = pytest.mark.slow

FRESH_P99_S = 10.0  # the target for produce -> queryable at p99 through the roll
#: What the roll may add to the baseline's p99 (every broker up, the same run) when that alone leaves no room under
#: FRESH_P99_S: on the shared two cores the baseline p99 ranged 3.5-6.4 s one evening and 9.0-13.2 s the next.
ROLL_ADDS_S = 3.0


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drill]:
    yield from run_drill(tmp_path_factory.mktemp("kafka-drill"))


def test_every_query_answered_through_broker_restarts_kills_and_a_cluster_outage(drill: Drill) -> None:
    print("\n" + figures(drill))
    answers = drill.reader.answers
    failed = [(a.node, a.errors[:2]) for a in answers if a.errors or "data" not in a.body]
    assert not failed, f"{len(failed)} of {len(answers)} answers failed: {errors_by_kind(answers)}, e.g. {failed[:3]}"
    bad = wrong(drill)
    assert not bad, f"{len(bad)} wrong values, e.g. {bad[:5]}"
    during_outage = [a for a in answers if drill.down[0] <= a.sent and a.received <= drill.down[1]]
    assert during_outage, "no answer came while the whole cluster was down"


def test_freshness_through_the_roll_stays_within_ten_seconds_or_near_the_baseline(drill: Drill) -> None:
    roll, baseline = drill.freshness(*drill.roll), drill.freshness(*drill.baseline)
    assert roll, "no order handed over during the roll was asked for"
    assert baseline, "no order handed over with every broker up was asked for"
    roll_p99, baseline_p99 = percentile(roll, 99), percentile(baseline, 99)
    assert roll_p99 <= max(FRESH_P99_S, baseline_p99 + ROLL_ADDS_S), (
        f"roll p99 {roll_p99:.2f} s, baseline p99 {baseline_p99:.2f} s; "
        f"slowest {[round(s, 2) for s in sorted(roll)[-5:]]}"
    )


def test_every_node_progresses_after_each_return(drill: Drill) -> None:
    # run_drill waited for it (AFTER_S at most); here: each of the five returns, every node
    assert [r.what.split(" (")[0] for r in drill.returns][:3] == [f"broker {b} restarted" for b in (1, 2, 3)]
    assert len(drill.returns) == 5
    assert all(len(r.progress) == len(drill.nodes) for r in drill.returns), drill.returns


def test_topics_are_replicated_three_times_with_two_in_sync(drill: Drill) -> None:
    assert drill.topics and all(found == (3, "2") for found in drill.topics.values()), drill.topics


def test_kafka_holds_every_order_acknowledged_where_it_was_acknowledged(drill: Drill) -> None:
    assert len(drill.ingest.acked) == drill.ingest.produced and not drill.ingest.failed
    misplaced = drill.misplaced()  # an order acknowledged without an offset: anywhere in its partition
    assert not misplaced, f"{len(misplaced)} acknowledged orders not where Kafka said, e.g. {misplaced[:3]}"
    for p, records in drill.held.items():
        offsets = [offset for offset, _, _ in records]
        assert offsets == list(range(len(offsets))), f"partition {p}: records missing between offsets"
    # an order held twice is the producer's retry after an epoch bump (librdkafka#4953): the nodes count it twice,
    # and the figures say how many there were (drill.doubled)


def test_every_copy_on_disk_equals_the_ground_truth_of_what_the_input_topic_holds(drill: Drill) -> None:
    events = drill.held_events()
    copies = 0
    for node in drill.nodes:
        directory = StateDirectory(drill.home / f"state-{node.id}", drill.app.name)
        held = [p for topic, p in directory.partitions_on_disk() if topic == drill.topic]
        assert len(held) == 2 * PARTITIONS // len(drill.nodes), (node.id, held)
        partitions = [directory.open(drill.topic, p, drill.app.specs(drill.topic)) for p in held]
        try:
            for stores in partitions:
                stores.db.set_state(PartitionState.RUNNING)
            actual: Any = read_back(drill.app, partitions)
            mine = [(k, v) for k, v in events if partition_for(k, PARTITIONS, "string", "murmur2") in held]
            assert_equal_to_ground_truth(drill.app, actual, mine)
            copies += len(partitions)
        finally:
            for stores in partitions:
                stores.close()
    assert copies == 2 * PARTITIONS
