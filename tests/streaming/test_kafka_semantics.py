"""Kafka semantics on a real Apache Kafka broker: transactions (aborted records never applied, committed ones
exactly once, a log that ends in a control marker reaches RUNNING) and a compacted table topic whose last
tombstone the log cleaner purged (RUNNING, with the right table). Both sources: Spark's own Kafka connector (the
default) and the iqkafka Python Data Source.

Also, without a broker: Spark's offset log as the sink reads it (`OffsetLog`), the sink's offset-only WriteBatch
for a partition whose batch brought no record, and the one-line errors when the connector cannot be used.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry, generate_latest

from iqgraph.app.metrics import partition_metrics
from iqgraph.app.query.partitions import LocalPartitions
from iqgraph.schema.errors import ApiError, api_error
from iqgraph.stores import OffsetGapError, PartitionState, PartitionStores, StateDirectory
from iqgraph.streaming import session as session_module
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import JAVA_PARTITIONER
from iqgraph.streaming.definitions import App, Topic, count, key_value_store, sum_, table_store
from iqgraph.streaming.kafka_jars import (
    SPARK_KAFKA_HOME_ENV,
    SPARK_KAFKA_JARS,
    SPARK_KAFKA_VERSION,
    JarsError,
    ensure_kafka_jars,
)
from iqgraph.streaming.offset_log import BatchOffsets, OffsetLog
from iqgraph.streaming.partitioner import partition_for
from iqgraph.streaming.runner import RunnerSettings, StreamRunner, source_options
from iqgraph.streaming.sink import PartitionBatch, StoreSink
from tests.support.topic_records import records_of

SOURCES = ("kafka", "iqkafka")
#: Broker settings under which the log cleaner runs within a second of a segment becoming cleanable.
FAST_CLEANER = {"log.cleaner.backoff.ms": "100", "log.retention.check.interval.ms": "500"}
#: A table topic compacted at once: tiny segments (segment.bytes: Kafka 4's minimum, 1 MiB; segment.ms rolls on
#: the next append), any dirt is enough, tombstones and transaction markers purged 100 ms after a first cleaning.
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "segment.bytes": str(1 << 20),
    "min.cleanable.dirty.ratio": "0.001",
    "delete.retention.ms": "100",
    "min.compaction.lag.ms": "0",
}
CAUGHT_UP_S = 180.0  # a runner's deadline to apply everything (the first query of a session starts Spark's Kafka)
PARTITIONS = 2
KEYS = [f"k{i}" for i in range(8)]


@pytest.fixture(scope="module")
def kafka() -> Iterator[KafkaBroker]:
    """Run one Apache Kafka broker for this module, its log cleaner quick."""
    ensure_kafka_jars()
    with KafkaBroker(properties=FAST_CLEANER) as running:
        yield running


def new_topic(kafka: KafkaBroker, partitions: int, config: Mapping[str, str] | None = None) -> str:
    """Create a uniquely named topic and return its name."""
    name = f"sem-{uuid.uuid4().hex[:12]}"
    kafka.create_topics({name: partitions}, config)
    return name


def orders_app(topic: str) -> App:
    """Return an app counting and summing the orders of a 2-partition topic per key."""
    return App(
        name="orders",
        topics=[Topic(topic, schema="amount INT", partitions=PARTITIONS)],
        stores=[key_value_store("per_key", topic, count()), key_value_store("amount", topic, sum_("amount"))],
    )


def table_app(topic: str) -> App:
    """Return an app reading a 1-partition topic as a table of customers."""
    return App(
        name="crm",
        topics=[Topic(topic, schema="name STRING", partitions=1, table=True)],
        stores=[table_store("customers", topic)],
    )


class Transactions:
    """A transactional producer (Kafka's Java partitioner) that runs whole transactions, committed or aborted."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        config = {**JAVA_PARTITIONER, "bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"}
        self.producer = Producer(config)
        self.producer.init_transactions(30)

    def run(self, records: Sequence[tuple[str, bytes | None]], *, commit: bool, before_end: float = 0.0) -> None:
        """Produce records (key, value) in one transaction, then commit or abort it (after before_end seconds)."""
        errors: list[KafkaError] = []
        self.producer.begin_transaction()
        for key, value in records:
            self.producer.produce(
                self.topic, value, key.encode(), on_delivery=lambda e, _m: errors.append(e) if e else None
            )
        assert self.producer.flush(30) == 0, "records not on the broker after 30 s"  # an abort drops unsent records
        assert not errors, errors[:3]
        time.sleep(before_end)
        if commit:
            self.producer.commit_transaction(30)
        else:
            self.producer.abort_transaction(30)


def order(amount: int) -> bytes:
    return orjson.dumps({"amount": amount})


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Return each partition's high watermark (its end offset, control markers included)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sem"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[1] for p in range(partitions)
        }
    finally:
        consumer.close()


def start_runner(app: App, spark: Any, state: Path, bootstrap: str, source: str) -> StreamRunner:
    """Start a runner over every partition of the app's topic and wait until it has applied everything."""
    topic = app.topics[0]
    settings = RunnerSettings(bootstrap, max_records_per_batch=50, source=source)  # several batches per run
    runner = StreamRunner(app, spark, StateDirectory(state, app.name), settings)
    runner.start({topic.name: range(topic.partitions)})
    try:
        runner.wait_until_caught_up(timeout=CAUGHT_UP_S)
    except BaseException:
        runner.stop()
        raise
    return runner


def assert_running_at_the_end(runner: StreamRunner, topic: str, ends: Mapping[int, int]) -> None:
    """Assert every partition is RUNNING with its next offset at the partition's end (markers included)."""
    for partition, stores in runner.partitions[topic].items():
        assert stores.db.state is PartitionState.RUNNING, partition
        assert stores.db.next_offset() == ends[partition], partition


def kv(runner: StreamRunner, topic: str, store: str) -> dict[Any, Any]:
    """Return every entry of a key-value store over the runner's partitions."""
    found: dict[Any, Any] = {}
    for stores in runner.partitions[topic].values():
        found.update(stores.kv(store).all(limit=10_000).items)
    return found


# -- transactions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_transactions_aborted_never_committed_once_and_a_log_ending_in_a_marker_is_running(
    kafka: KafkaBroker, spark: Any, tmp_path: Path, source: str
) -> None:
    topic = new_topic(kafka, PARTITIONS)
    app = orders_app(topic)
    placed = {partition_for(key, PARTITIONS, "string", "murmur2") for key in KEYS}
    assert placed == set(range(PARTITIONS)), "the keys must reach every partition"
    tx = Transactions(kafka.bootstrap_servers, topic)
    tx.run([(key, order(1)) for key in KEYS for _ in range(3)], commit=True)
    tx.run([(key, order(100)) for key in KEYS] + [(f"ghost-{key}", order(100)) for key in KEYS], commit=False)
    tx.run([(key, order(2)) for key in KEYS], commit=True)  # every partition's log now ends in a COMMIT marker
    ends = high_watermarks(kafka.bootstrap_servers, topic, PARTITIONS)
    for partition in range(PARTITIONS):
        last_record = records_of(kafka.bootstrap_servers, topic, partition)[-1][0]
        assert ends[partition] == last_record + 2, "the log must end in one control marker"

    runner = start_runner(app, spark, tmp_path / "state", kafka.bootstrap_servers, source)
    try:
        assert_running_at_the_end(runner, topic, ends)
        assert kv(runner, topic, "per_key") == dict.fromkeys(KEYS, 4)
        assert kv(runner, topic, "amount") == dict.fromkeys(KEYS, 5)
        # while it runs: an aborted transaction (the logs now end in an ABORT marker), then a committed one
        tx.run([(key, order(1000)) for key in KEYS], commit=False)
        ends = high_watermarks(kafka.bootstrap_servers, topic, PARTITIONS)
        runner.wait_until_caught_up(timeout=CAUGHT_UP_S)
        assert_running_at_the_end(runner, topic, ends)
        assert kv(runner, topic, "per_key") == dict.fromkeys(KEYS, 4)
        tx.run([(key, order(3)) for key in KEYS], commit=True)
        ends = high_watermarks(kafka.bootstrap_servers, topic, PARTITIONS)
        runner.wait_until_caught_up(timeout=CAUGHT_UP_S)
        assert_running_at_the_end(runner, topic, ends)
        assert kv(runner, topic, "per_key") == dict.fromkeys(KEYS, 5)
        assert kv(runner, topic, "amount") == dict.fromkeys(KEYS, 8)
    finally:
        runner.stop()
    # a restart from the stores' offsets applies nothing twice
    again = start_runner(app, spark, tmp_path / "state", kafka.bootstrap_servers, source)
    try:
        assert_running_at_the_end(again, topic, ends)
        assert kv(again, topic, "per_key") == dict.fromkeys(KEYS, 5)
        assert kv(again, topic, "amount") == dict.fromkeys(KEYS, 8)
    finally:
        again.stop()


# -- a compacted table topic -----------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_a_compacted_table_whose_last_tombstone_was_purged_is_running_with_the_right_table(
    kafka: KafkaBroker, spark: Any, tmp_path: Path, source: str
) -> None:
    topic = new_topic(kafka, 1, COMPACTED)
    app = table_app(topic)
    bootstrap = kafka.bootstrap_servers
    changes: list[tuple[str, bytes | None]] = [(f"c{i}", orjson.dumps({"name": f"v{i}"})) for i in range(6)]
    changes += [("c1", orjson.dumps({"name": "v1b"})), ("c0", None), ("c2", None)]
    tx = Transactions(bootstrap, topic)
    tx.run(changes[:-1], commit=True)
    start_runner(app, spark, tmp_path / "before", bootstrap, source).stop()  # a node that stops before the delete
    # the last record of the log is a tombstone; its transaction's marker, written past segment.ms, rolls the
    # segment, so the tombstone becomes cleanable
    tx.run(changes[-1:], commit=True, before_end=0.3)
    tombstone = records_of(bootstrap, topic, 0)[-1][0]
    expected = {"c1": {"name": "v1b"}, "c3": {"name": "v3"}, "c4": {"name": "v4"}, "c5": {"name": "v5"}}
    purge_tombstone(tx, bootstrap, topic, tombstone)
    records = records_of(bootstrap, topic, 0)
    end = high_watermarks(bootstrap, topic, 1)[0]
    assert records[-1][0] < tombstone < end, "the tail of the log must be a purged tombstone and markers"
    assert {key for _, key, _ in records} == {b"c1", b"c3", b"c4", b"c5"}, "compacted"

    for state in ("state", "before"):  # a new node; the node restarted after the cleaner purged a delete it missed
        runner = start_runner(app, spark, tmp_path / state, bootstrap, source)
        try:
            assert_running_at_the_end(runner, topic, {0: end})
            assert kv(runner, topic, "customers") == expected, state
            assert runner.partitions[topic][0].kv("customers").count() == len(expected)
        finally:
            runner.stop()


def purge_tombstone(tx: Transactions, bootstrap: str, topic: str, tombstone: int, timeout: float = 60.0) -> None:
    """Wait until the log cleaner has removed the record at offset tombstone.

    A tombstone is removed by a cleaning after its delete horizon (set by the cleaning that first kept it), and
    the cleaner cleans only dirty logs: each round adds dirt that no reader sees (an aborted transaction, its
    abort marker rolling the segment) and waits for the cleaner.
    """
    deadline = time.monotonic() + timeout
    while any(offset >= tombstone for offset, _, _ in records_of(bootstrap, topic, 0)):
        assert time.monotonic() < deadline, f"the log cleaner did not purge offset {tombstone} in {timeout:.0f} s"
        tx.run([("dirt", orjson.dumps({"name": "aborted"}))], commit=False, before_end=0.2)
        time.sleep(0.5)


# -- the sink and the offset log, without Spark ----------------------------------------------------------


def test_the_offset_log_is_read_in_every_form_spark_writes(tmp_path: Path) -> None:
    log_dir = tmp_path / "offsets"
    log_dir.mkdir()
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{"spark.sql.shuffle.partitions":"2"}}'
    (log_dir / "0").write_text(f'v1\n{meta}\n{{"orders":{{"1":17,"0":4}}}}')  # Spark's Kafka source
    (log_dir / "1").write_text(f'v1\n{meta}\n{{"0": 9, "1": 20}}')  # iqkafka
    (log_dir / "2").write_text(f'v2\n{meta}\n0:{{"orders":{{"0":12,"1":20}}}}')  # named sources (Spark 4.1+)
    (log_dir / "3").write_text(f"v1\n{meta}\n-")  # no offset: cannot say
    (log_dir / "4").write_text("v9\n{}\n{}")

    offsets = OffsetLog(log_dir, "orders", starting={0: 0, 1: 3})

    assert offsets.batch(0) == BatchOffsets({0: 0, 1: 3}, {0: 4, 1: 17})
    assert offsets.batch(1) == BatchOffsets({0: 4, 1: 17}, {0: 9, 1: 20})
    assert offsets.batch(2) == BatchOffsets({0: 9, 1: 20}, {0: 12, 1: 20})
    assert offsets.batch(3) is None
    assert offsets.batch(4) is None
    assert offsets.batch(5) is None  # no file
    assert OffsetLog(log_dir, "orders").batch(0) == BatchOffsets(None, {0: 4, 1: 17})


@pytest.fixture
def table_stores(tmp_path: Path) -> Iterator[tuple[App, PartitionStores]]:
    app = table_app("crm-topic")
    stores = StateDirectory(tmp_path / "state", app.name).open("crm-topic", 0, app.specs("crm-topic"))
    stores.db.set_state(PartitionState.RESTORING)
    yield app, stores
    stores.close()


def _rows(first: int, last: int) -> PartitionBatch:
    """Return a batch slice of records first..last with no partials (what counts here is the offsets)."""
    return PartitionBatch(first_offset=first, last_offset=last)


def test_the_sink_moves_offsets_to_where_the_source_read(table_stores: tuple[App, PartitionStores]) -> None:
    app, stores = table_stores
    committed: list[tuple[int, int]] = []
    sink = StoreSink(app, app.topic("crm-topic"), {0: stores}, on_commit=lambda p, o: committed.append((p, o)))

    sink.apply({0: _rows(0, 4)}, BatchOffsets({0: 0}, {0: 7}))  # records 0..4, then two offsets without one
    assert stores.db.next_offset() == 7
    sink.apply({}, BatchOffsets({0: 7}, {0: 9}))  # a batch that read only a control marker and a purged record
    assert stores.db.next_offset() == 9
    sink.apply({0: _rows(5, 6)}, BatchOffsets({0: 5}, {0: 9}))  # a replay: skipped
    sink.apply({}, BatchOffsets({0: 7}, {0: 9}))
    assert stores.db.next_offset() == 9
    sink.apply({0: _rows(9, 10)}, None)  # without the log: past the last record
    assert stores.db.next_offset() == 11
    assert committed == [(0, 7), (0, 9), (0, 11)]
    with pytest.raises(OffsetGapError, match="offsets 11..12 were never read"):
        sink.apply({0: _rows(13, 13)}, BatchOffsets({0: 13}, {0: 14}))
    assert stores.db.next_offset() == 11
    sink.apply({0: _rows(11, 12)}, BatchOffsets({0: 11}, {0: 12}))  # a log that contradicts the records: ignored
    assert stores.db.next_offset() == 13


# -- the connector's options and errors ------------------------------------------------------------------


def test_spark_kafka_source_is_the_default_and_reads_committed_records_only() -> None:
    options = source_options(RunnerSettings("b:9092"), "orders", [0, 2], {0: 5, 2: 0})

    assert options["kafka.isolation.level"] == "read_committed"
    assert options["assign"] == '{"orders": [0, 2]}'
    assert options["startingOffsets"] == '{"orders": {"0": 5, "2": 0}}'
    assert options["failOnDataLoss"] == "true"
    assert "isolation.level" not in str(source_options(RunnerSettings("b:9092", source="iqkafka"), "o", [0], {0: 0}))


def test_the_session_gets_the_connector_jars(spark: Any) -> None:
    jars = spark.sparkContext.getConf().get("spark.jars").split(",")

    assert [Path(jar).name for jar in jars[-len(SPARK_KAFKA_JARS.locked()) :]] == [
        jar.name for jar in SPARK_KAFKA_JARS.locked()
    ]
    assert {jar.name for jar in SPARK_KAFKA_JARS.locked()} >= {
        f"spark-sql-kafka-0-10_2.13-{SPARK_KAFKA_VERSION}.jar",
        f"spark-token-provider-kafka-0-10_2.13-{SPARK_KAFKA_VERSION}.jar",
    }


def test_the_checkpoint_logs_are_written_through_hadoops_file_system_api(spark: Any) -> None:
    from iqgraph.streaming.session import CHECKPOINT_FILE_MANAGER

    # FileContext's writes cost ~50-60 ms each per micro-batch on the local file system (docs/benchmarks.md)
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == CHECKPOINT_FILE_MANAGER
    assert spark._jvm.java.lang.Class.forName(CHECKPOINT_FILE_MANAGER).getName() == CHECKPOINT_FILE_MANAGER


def test_missing_connector_jars_say_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SPARK_KAFKA_HOME_ENV, str(tmp_path / "empty"))

    with pytest.raises(JarsError) as raised:
        session_module.build_spark_session("local[1]")

    message = str(raised.value)
    assert "\n" not in message
    assert f"Spark's Kafka connector {SPARK_KAFKA_VERSION} jars are not installed" in message
    assert "python -m iqgraph.streaming.apache_kafka fetch" in message


def test_another_pyspark_version_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module.pyspark, "__version__", "9.9.9")

    with pytest.raises(JarsError, match=f"pyspark 9.9.9 .* pip install pyspark=={SPARK_KAFKA_VERSION}"):
        session_module.build_spark_session("local[1]")


def test_the_connector_jars_exclude_what_pyspark_ships() -> None:
    import pyspark

    shipped = {path.name for path in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    locked = {jar.name for jar in SPARK_KAFKA_JARS.locked()}

    assert not locked & shipped
    assert not any(name.startswith(("spark-sql-kafka", "kafka-clients", "commons-pool2")) for name in shipped)


def test_a_session_without_the_connector_says_what_to_run() -> None:
    class Reader:  # what load() raises in a session without spark-sql-kafka-0-10 (Spark 4.2)
        def load(self) -> None:
            raise RuntimeError(
                "[_LEGACY_ERROR_TEMP_1140] Failed to find data source: kafka. Please deploy the application as per "
                "the deployment section of Structured Streaming + Kafka Integration Guide."
            )

    runner = object.__new__(StreamRunner)  # no session needed to map the error
    runner.settings = RunnerSettings("b:9092")

    with pytest.raises(JarsError) as raised:
        runner._load(Reader())  # type: ignore[arg-type]

    assert "\n" not in str(raised.value)
    assert "python -m iqgraph.streaming.apache_kafka fetch" in str(raised.value)


# -- retention deleting records a node has not applied ---------------------------------------------------


def delete_records(bootstrap: str, topic: str, partition: int, before: int) -> None:
    """Delete partition's records below offset before, as retention does (Kafka's DeleteRecords)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result(timeout=30)


def sums(records: Sequence[tuple[int, bytes | None, bytes | None]]) -> dict[str, int]:
    """Return the amount per key of records (offset, key, value)."""
    found: dict[str, int] = {}
    for _, key, value in records:
        assert key is not None and value is not None
        found[key.decode()] = found.get(key.decode(), 0) + orjson.loads(value)["amount"]
    return found


def test_records_deleted_before_they_were_applied_are_data_lost_with_the_range_then_rebuilt_on_request(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    topic = new_topic(kafka, PARTITIONS)
    app = orders_app(topic)
    bootstrap, state = kafka.bootstrap_servers, tmp_path / "state"
    produce_batched(bootstrap, topic, [(key, order(1)) for key in KEYS for _ in range(5)])
    start_runner(app, spark, state, bootstrap, "kafka").stop()
    applied = high_watermarks(bootstrap, topic, PARTITIONS)
    produce_batched(bootstrap, topic, [(key, order(10)) for key in KEYS for _ in range(5)])
    cut = applied[0] + 7  # while the node was away, retention deleted partition 0's records below cut
    delete_records(bootstrap, topic, 0, cut)
    produce_batched(bootstrap, topic, [(key, order(100)) for key in KEYS])
    ends = high_watermarks(bootstrap, topic, PARTITIONS)
    held = {p: records_of(bootstrap, topic, p) for p in range(PARTITIONS)}
    assert held[0][0][0] == cut and held[1][0][0] == 0

    runner = StreamRunner(app, spark, StateDirectory(state, app.name), RunnerSettings(bootstrap, source="kafka"))
    runner.start({topic: range(PARTITIONS)})
    try:
        lost, kept = runner.partitions[topic][0], runner.partitions[topic][1]
        assert lost.db.state is PartitionState.DATA_LOST and lost.db.lost == (applied[0], cut)
        wait_until(lambda: kept.db.state is PartitionState.RUNNING and kept.db.next_offset() == ends[1])
        assert dict(kept.kv("amount").all(limit=10_000).items) == sums(held[1])
        assert lost.db.next_offset() == applied[0], "nothing applied past the gap"
        # a read of the lost partition: a coded error naming the partition, the range and what to do
        local = LocalPartitions(app, runner.partitions)
        key = next(k for k in KEYS if partition_for(k, PARTITIONS, "string", "murmur2") == 0)
        (failed,) = local.read_states("amount", [((key, None, None), [0])]).value
        error = api_error(failed)
        assert isinstance(error, ApiError) and error.code == "DATA_LOST"
        assert error.extensions == {
            "code": "DATA_LOST",
            "topic": topic,
            "partition": 0,
            "lostFrom": applied[0],
            "lostTo": cut,
        }
        assert f"records {applied[0]}..{cut - 1}" in error.message and "--rebuild-lost-partitions" in error.message
        # the metric names the partition and the lost range
        text = scrape_partitions(local)
        assert (
            f'iqgraph_partition_lost_offsets{{end_offset="{cut}",first_offset="{applied[0]}",partition="0",'
            f'topic="{topic}"}} {float(cut - applied[0])}'
        ) in text
        assert 'iqgraph_partitions{role="active",state="DATA_LOST"} 1.0' in text
    finally:
        runner.stop()

    # the documented recovery: rebuild the partition from the earliest offset Kafka holds
    settings = RunnerSettings(bootstrap, source="kafka", rebuild_lost=True)
    rebuilt = StreamRunner(app, spark, StateDirectory(state, app.name), settings)
    rebuilt.start({topic: range(PARTITIONS)})
    try:
        rebuilt.wait_until_caught_up(timeout=CAUGHT_UP_S)
        assert_running_at_the_end(rebuilt, topic, ends)
        assert kv(rebuilt, topic, "amount") == sums(held[0] + held[1])
        assert rebuilt.partitions[topic][0].db.lost == (applied[0], cut), "the metric still tells what was lost"
    finally:
        rebuilt.stop()

    # a new node on the same topic reads from the earliest offset Kafka holds: nothing it had, nothing lost
    fresh = start_runner(app, spark, tmp_path / "fresh", bootstrap, "kafka")
    try:
        assert_running_at_the_end(fresh, topic, ends)
        assert kv(fresh, topic, "amount") == sums(held[0] + held[1])
        assert all(stores.db.lost is None for stores in fresh.partitions[topic].values())
    finally:
        fresh.stop()


def produce_batched(bootstrap: str, topic: str, records: Sequence[tuple[str, bytes]]) -> None:
    """Produce records (key, value) with Kafka's Java partitioner, batched, and wait for every ack."""
    producer = Producer({**JAVA_PARTITIONER, "bootstrap.servers": bootstrap, "linger.ms": 5})
    for key, value in records:
        producer.produce(topic, value, key.encode())
    assert producer.flush(30) == 0


def wait_until(condition: Callable[[], bool], timeout: float = CAUGHT_UP_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s"
        time.sleep(0.2)


def scrape_partitions(local: LocalPartitions) -> str:
    """Return the partition metrics of local's node in the Prometheus text format."""
    registry = CollectorRegistry()

    class Partitions:
        def collect(self) -> Iterator[Any]:
            yield from partition_metrics(local.node())

    registry.register(Partitions())
    return generate_latest(registry).decode()
