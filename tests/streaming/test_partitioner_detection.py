"""The sink detects the producers' partitioner per topic: evidence counted in each partition database.

Real producers (librdkafka's default, murmur2_random, consistent_random, a mix of the first two, and
explicit partitions) write into the real broker; a real Spark query runs the sink over them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from iqgraph.stores import PartitionStores, StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import BATCHING
from iqgraph.streaming.definitions import (
    App,
    KafkaSettings,
    Partitioner,
    Topic,
    bloom_store,
    count,
    key_value_store,
    tumbling,
    window_store,
)
from iqgraph.streaming.partitioner import (
    PartitionerEvidence,
    candidate_partitions,
    crc32_partition,
    detect,
    evidence_from_counters,
    murmur2_partition,
)
from iqgraph.streaming.runner import RunnerSettings, StreamRunner
from iqgraph.streaming.sink import PartitionBatch, StoreSink
from tests.conftest import MakeTopic

PARTITIONS = 6
KEYS = [f"customer-{i:04d}" for i in range(200)]
SCHEMA = "amount DOUBLE"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

#: How each topic's records are produced, per half of the keys: a librdkafka partitioner, None for
#: confluent-kafka's default (consistent_random), "explicit" for a partition neither hash picks.
PRODUCERS: Mapping[str, tuple[str | None, str | None]] = {
    "default": (None, None),
    "murmur2_random": ("murmur2_random", "murmur2_random"),
    "consistent_random": ("consistent_random", "consistent_random"),
    "mixed": (None, "murmur2_random"),
    "explicit": (None, "explicit"),
}


def _hashes(key: str) -> tuple[int, int]:
    return murmur2_partition(key.encode(), PARTITIONS), crc32_partition(key.encode(), PARTITIONS)


def _neither(key: str) -> int:
    return next(p for p in range(PARTITIONS) if p not in _hashes(key))


def _produce(broker: KafkaBroker, topic: str, how: tuple[str | None, str | None]) -> dict[str, int]:
    """Produce one record per key, half the keys each way; return the partition each key landed on."""
    landed: dict[str, int] = {}

    def delivered(error: object, message: Any) -> None:
        assert error is None
        landed[message.key().decode()] = message.partition()

    half = len(KEYS) // 2
    for keys, setting in ((KEYS[:half], how[0]), (KEYS[half:], how[1])):
        config = {"partitioner": setting} if setting not in (None, "explicit") else {}
        producer = Producer({**BATCHING, **config, "bootstrap.servers": broker.bootstrap_servers})
        for key in keys:
            extra = {"partition": _neither(key)} if setting == "explicit" else {}
            value = orjson.dumps({"amount": 1.0})
            producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered, **extra)
            producer.poll(0)
        assert producer.flush(30) == 0
    assert set(landed) == set(KEYS)
    return landed


def _expected(landed: Mapping[str, int]) -> PartitionerEvidence:
    """Return the evidence of keys (one record each) from where they landed."""
    total = PartitionerEvidence()
    for key, partition in landed.items():
        by_murmur2, by_crc32 = (p == partition for p in _hashes(key))
        kind = "both" if by_murmur2 and by_crc32 else "murmur2" if by_murmur2 else "consistent_random"
        total += PartitionerEvidence(**{kind if by_murmur2 or by_crc32 else "neither": 1})
    return total


def _evidence(partitions: Mapping[int, PartitionStores]) -> PartitionerEvidence:
    found = (evidence_from_counters(stores.db.counter) for stores in partitions.values())
    return sum(found, PartitionerEvidence())


@pytest.fixture(scope="module")
def detected(
    broker: KafkaBroker, spark: Any, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[StreamRunner, dict[str, tuple[str, dict[str, int]]]]]:
    """Run one app over a topic per way of producing; yield the runner and, per way, (topic, landed)."""
    topics = {how: make_topic(PARTITIONS, prefix=f"part-{how.replace('_', '-')}") for how in PRODUCERS}
    landed = {how: (topic, _produce(broker, topic, PRODUCERS[how])) for how, topic in topics.items()}
    app = App(
        "detect",
        [Topic(topic, schema=SCHEMA, partitions=PARTITIONS) for topic in topics.values()],
        [key_value_store(f"count_{how}", topic, count()) for how, topic in topics.items()],
    )
    assert app.kafka.partitioner == "auto"
    state = StateDirectory(Path(tmp_path_factory.mktemp("detect")) / "state", "detect")
    runner = StreamRunner(app, spark, state, RunnerSettings(broker.bootstrap_servers, max_records_per_batch=120))
    runner.start({topic: range(PARTITIONS) for topic in topics.values()})
    try:
        runner.wait_until_caught_up(timeout=300)
        yield runner, landed
    finally:
        runner.stop()


@pytest.mark.parametrize(
    ("how", "verdict"),
    [
        ("default", "consistent_random"),
        ("murmur2_random", "murmur2"),
        ("consistent_random", "consistent_random"),
        ("mixed", "mixed"),
        ("explicit", "unexplained"),
    ],
)
def test_the_sink_detects_how_the_producers_partitioned(detected: Any, how: str, verdict: str) -> None:
    runner, landed = detected
    topic, where = landed[how]
    partitions = runner.partitions[topic]
    evidence = _evidence(partitions)
    assert evidence == _expected(where)
    assert sum(vars(evidence).values()) == len(KEYS)
    assert detect(evidence) == verdict
    # The hashes agree on about one key in six: the rest decide.
    assert evidence.both < len(KEYS) // 3
    for key, partition in where.items():
        candidates = candidate_partitions(key.encode(), PARTITIONS, verdict)
        assert candidates is None if verdict == "unexplained" else partition in candidates, key


@pytest.mark.parametrize(("how", "misrouted"), [("mixed", 0), ("default", 0), ("explicit", len(KEYS) // 2)])
def test_under_auto_only_keys_neither_hash_explains_are_misrouted(detected: Any, how: str, misrouted: int) -> None:
    runner, landed = detected
    topic, _ = landed[how]
    partitions = runner.partitions[topic]
    assert sum(s.db.counter(f"misrouted:count_{how}") for s in partitions.values()) == misrouted
    assert sum(len(s.kv(f"count_{how}").all(limit=500).items) for s in partitions.values()) == len(KEYS)


# The sink's merge alone, on real RocksDB: which keys count, and misrouted against the setting.


def _find(want: Callable[[int, int], bool]) -> str:
    """Return a key whose (murmur2, CRC32) partitions satisfy want."""
    return next(key for key in (f"key-{i}" for i in range(10_000)) if want(*_hashes(key)))


@pytest.fixture
def partition_two(tmp_path: Path) -> Iterator[Callable[[Partitioner], tuple[StoreSink, PartitionStores]]]:
    opened: list[PartitionStores] = []

    def make(partitioner: Partitioner) -> tuple[StoreSink, PartitionStores]:
        topic = Topic("orders", schema="amount DOUBLE, item STRING", partitions=PARTITIONS)
        app = App(
            "shop",
            [topic],
            [
                key_value_store("per_key", "orders", count()),
                window_store("per_minute", "orders", count(), tumbling(minutes=1)),
                bloom_store("items", "orders", key="item"),
            ],
            KafkaSettings(partitioner=partitioner),
        )
        stores = StateDirectory(tmp_path / partitioner, "shop").open("orders", 2, app.specs("orders"))
        opened.append(stores)
        return StoreSink(app, topic, {2: stores}), stores

    yield make
    for stores in opened:
        stores.close()


#: Keys arriving on partition 2: explained by murmur2 only, CRC32 only, both, neither.
ON_TWO = {
    "murmur2": _find(lambda m, c: m == 2 and c != 2),
    "consistent_random": _find(lambda m, c: c == 2 and m != 2),
    "both": _find(lambda m, c: m == c == 2),
    "neither": _find(lambda m, c: 2 not in (m, c)),
}


def _batch() -> PartitionBatch:
    batch = PartitionBatch(first_offset=0, last_offset=19)
    records = {"murmur2": 3, "consistent_random": 5, "both": 2, "neither": 7}
    batch.partials["per_key"] = [(ON_TWO[k], None, n, n) for k, n in records.items()]
    # the same keys again in two windows each: still one key each
    batch.partials["per_minute"] = [(ON_TWO[k], START_MS + w * 60_000, 1, 1) for k in ON_TWO for w in (0, 1)]
    # a store keyed by a column: its keys are not the record keys and say nothing about the partitioner
    batch.partials["items"] = [(f"item-{i}", None, None, 1) for i in range(20)]
    batch.stream_time["per_minute"] = START_MS + 60_000
    return batch


@pytest.mark.parametrize(
    ("partitioner", "per_key", "per_minute"),
    [("auto", 7, 2), ("murmur2", 5 + 7, 2 + 2), ("consistent_random", 3 + 7, 2 + 2)],
)
def test_merge_counts_distinct_record_keys_and_misrouted_against_the_setting(
    partition_two: Any, partitioner: Partitioner, per_key: int, per_minute: int
) -> None:
    sink, stores = partition_two(partitioner)
    sink.apply({2: _batch()})
    assert evidence_from_counters(stores.db.counter) == PartitionerEvidence(1, 1, 1, 1)
    misrouted = {name: stores.db.counter(f"misrouted:{name}") for name in ("per_key", "per_minute", "items")}
    assert misrouted == {"per_key": per_key, "per_minute": per_minute, "items": 0}


def test_evidence_adds_up_over_batches(partition_two: Any) -> None:
    sink, stores = partition_two("auto")
    sink.apply({2: _batch()})
    again = _batch()
    again.first_offset, again.last_offset = 20, 39
    sink.apply({2: again})
    assert evidence_from_counters(stores.db.counter) == PartitionerEvidence(2, 2, 2, 2)
