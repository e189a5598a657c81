"""Routing uses the producers' partitioner: checked against librdkafka producing into the real broker."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import BATCHING
from iqgraph.streaming.partitioner import (
    EVIDENCE_COUNTERS,
    PartitionerEvidence,
    Placement,
    candidate_partitions,
    crc32_partition,
    detect,
    evidence_from_counters,
    evidence_of,
    explained,
    murmur2,
    murmur2_partition,
    partition_for,
    placement,
    resolve,
)
from tests.conftest import MakeTopic

PARTITIONS = 7


def test_murmur2_matches_kafkas_java_test_vectors() -> None:
    def signed(value: int) -> int:
        return value - (1 << 32) if value >= 1 << 31 else value

    assert signed(murmur2(b"21")) == -973932308
    assert signed(murmur2(b"foobar")) == -790332482
    assert signed(murmur2(b"a-little-bit-long-string")) == -985981536
    assert signed(murmur2(b"")) == 275646681


@pytest.mark.parametrize(
    ("librdkafka", "ours"), [("murmur2_random", "murmur2"), ("consistent_random", "consistent_random")]
)
def test_partition_for_agrees_with_librdkafka(
    broker: KafkaBroker, make_topic: MakeTopic, librdkafka: str, ours: str
) -> None:
    topic = make_topic(PARTITIONS, prefix="route")
    producer = Producer({**BATCHING, "bootstrap.servers": broker.bootstrap_servers, "partitioner": librdkafka})
    landed: dict[str, int] = {}

    def delivered(error: object, message: object) -> None:
        assert error is None
        landed[message.key().decode()] = message.partition()  # type: ignore[attr-defined]

    keys = [f"customer-{i:04d}" for i in range(300)] + ["ü-ñ-漢字", "a" * 100]
    if librdkafka == "murmur2_random":
        keys.append("")  # consistent_random partitions empty keys at random, like null ones
    for key in keys:
        producer.produce(topic, key=key.encode(), value=b"{}", on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert set(landed) == set(keys)
    for key, partition in landed.items():
        assert partition_for(key, PARTITIONS, "string", ours) == partition, key  # type: ignore[arg-type]


def _key_where(agree: bool, partitions: int = PARTITIONS) -> bytes:
    """Return the first customer key on which murmur2 and CRC32 agree (or disagree)."""
    return next(
        key
        for key in (f"customer-{i:04d}".encode() for i in range(1000))
        if (murmur2_partition(key, partitions) == crc32_partition(key, partitions)) is agree
    )


def test_auto_routes_as_murmur2_until_routing_detects() -> None:
    key = _key_where(agree=False).decode()
    assert partition_for(key, PARTITIONS, "string", "auto") == partition_for(key, PARTITIONS, "string", "murmur2")


def test_evidence_adds_field_by_field() -> None:
    total = PartitionerEvidence(1, 2, 3, 4) + PartitionerEvidence(10, 20, 30, 40)
    assert total == PartitionerEvidence(murmur2=11, consistent_random=22, both=33, neither=44)
    assert sum([PartitionerEvidence(murmur2=1)] * 3, PartitionerEvidence()) == PartitionerEvidence(murmur2=3)


def test_evidence_counters_have_fixed_names_and_read_back() -> None:
    assert dict(EVIDENCE_COUNTERS) == {
        "murmur2": "partitioner:murmur2",
        "consistent_random": "partitioner:consistent_random",
        "both": "partitioner:both",
        "neither": "partitioner:neither",
    }
    kept = {"partitioner:murmur2": 5, "partitioner:both": 2, "misrouted:x": 9}
    assert evidence_from_counters(lambda name: kept.get(name, 0)) == PartitionerEvidence(murmur2=5, both=2)


def test_evidence_of_sorts_keys_by_the_hashes_that_explain_their_partition() -> None:
    placements = [Placement(3, 1), Placement(3, 3), Placement(1, 3), Placement(1, 3), Placement(0, 1)]
    assert evidence_of(placements, 3) == PartitionerEvidence(murmur2=1, consistent_random=2, both=1, neither=1)
    assert evidence_of([], 3) == PartitionerEvidence()


def test_explained_by_the_configured_partitioner_or_under_auto_by_either() -> None:
    where = Placement(murmur2=2, consistent_random=5)
    assert explained(where, 2, "murmur2") and not explained(where, 2, "consistent_random")
    assert explained(where, 5, "consistent_random") and not explained(where, 5, "murmur2")
    assert explained(where, 2, "auto") and explained(where, 5, "auto") and not explained(where, 0, "auto")


@pytest.mark.parametrize(
    ("evidence", "verdict"),
    [
        (PartitionerEvidence(), "unknown"),
        (PartitionerEvidence(both=40), "unknown"),
        (PartitionerEvidence(murmur2=170, both=30), "murmur2"),
        (PartitionerEvidence(consistent_random=170, both=30), "consistent_random"),
        (PartitionerEvidence(murmur2=80, consistent_random=90, both=30), "mixed"),
        (PartitionerEvidence(murmur2=1, consistent_random=1), "mixed"),
        (PartitionerEvidence(murmur2=170, both=30, neither=1), "unexplained"),
        (PartitionerEvidence(murmur2=80, consistent_random=90, neither=2), "unexplained"),
        (PartitionerEvidence(neither=5), "unexplained"),
    ],
)
def test_detect(evidence: PartitionerEvidence, verdict: str) -> None:
    assert detect(evidence) == verdict


def test_an_explicit_partitioner_wins_over_the_evidence() -> None:
    crc = PartitionerEvidence(consistent_random=100)
    assert resolve("murmur2", crc) == "murmur2"
    assert resolve("consistent_random", PartitionerEvidence(neither=3)) == "consistent_random"
    assert resolve("auto", crc) == "consistent_random"
    assert resolve("auto", PartitionerEvidence()) == "unknown"


def test_candidate_partitions_when_the_hashes_disagree() -> None:
    key = _key_where(agree=False)
    where = placement(key, PARTITIONS)
    assert where == Placement(murmur2_partition(key, PARTITIONS), crc32_partition(key, PARTITIONS))
    assert candidate_partitions(key, PARTITIONS, "murmur2") == (where.murmur2,)
    assert candidate_partitions(key, PARTITIONS, "consistent_random") == (where.consistent_random,)
    assert candidate_partitions(key, PARTITIONS, "mixed") == (where.murmur2, where.consistent_random)
    assert candidate_partitions(key, PARTITIONS, "unknown") == (where.murmur2, where.consistent_random)
    assert candidate_partitions(key, PARTITIONS, "unexplained") is None


def test_candidate_partitions_when_the_hashes_agree() -> None:
    key = _key_where(agree=True)
    only = (murmur2_partition(key, PARTITIONS),)
    for detected in ("murmur2", "consistent_random", "mixed", "unknown"):
        assert candidate_partitions(key, PARTITIONS, detected) == only, detected
    assert candidate_partitions(key, PARTITIONS, "unexplained") is None


def test_candidate_partitions_refuses_auto_and_other_names() -> None:
    for name in ("auto", "random", ""):
        with pytest.raises(ValueError, match="not a partitioner or a detection"):
            candidate_partitions(b"k", PARTITIONS, name)


def test_the_batch_hash_equals_the_scalar_hash_for_every_length_and_detection() -> None:
    import random

    from iqgraph.streaming.partitioner import candidates_many, murmur2, murmur2_many

    rng = random.Random(11)
    keys = [rng.randbytes(rng.choice([0, 1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 33])) for _ in range(4_000)]
    keys += [f"customer-{i:04d}".encode() for i in range(500)] + ["kéy-ü".encode()] * 20
    assert murmur2_many(keys) == [murmur2(k) for k in keys]
    for detected in ("murmur2", "consistent_random", "mixed", "unknown", "unexplained"):
        assert candidates_many(keys, 7, detected) == [candidate_partitions(k, 7, detected) for k in keys], detected
    with pytest.raises(ValueError, match="not a partitioner"):
        candidates_many(keys, 7, "auto")
