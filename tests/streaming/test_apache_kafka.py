"""Apache Kafka as the embedded broker: jars, start and readiness, batched and transactional produce, restarts."""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource

from iqgraph.streaming.apache_kafka import OUTPUT_FILE, KafkaBroker, KafkaCluster
from iqgraph.streaming.broker import BrokerError
from iqgraph.streaming.kafka_jars import HOME_ENV, KAFKA_VERSION, ensure_kafka_jars, locked_jars

#: The issue's target for the embedded broker's start (launch to ready), cold or warm.
START_DEADLINE = 10.0
#: Broker settings that let a test see the log cleaner work within seconds.
FAST_CLEANER = {"log.cleaner.backoff.ms": "100", "log.retention.check.interval.ms": "500"}


@pytest.fixture(scope="module")
def kafka() -> Iterator[KafkaBroker]:
    """Run one Apache Kafka broker for this module's tests (downloading the jars first if needed)."""
    ensure_kafka_jars()
    with KafkaBroker(properties=FAST_CLEANER) as running:
        yield running


def new_topic(broker: KafkaBroker | KafkaCluster, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
    """Create a uniquely named topic on broker and return its name."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    broker.create_topics({name: partitions}, config)
    return name


def produce_batched(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes, int]], **config: Any
) -> dict[str, Any]:
    """Produce (key, value, partition) records with ordinary batching, wait until all are acknowledged.

    Return the producer's last librdkafka statistics, taken after the flush.
    """
    stats: list[dict[str, Any]] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 65536,
            "statistics.interval.ms": 100,
            "stats_cb": lambda text: stats.append(json.loads(text)),
            **config,
        }
    )
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error)

    for key, value, partition in records:
        producer.produce(topic, value, key, partition=partition, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30.0) == 0, "undelivered records after 30 s"
    assert not errors, errors[:3]
    flushed = len(stats)
    deadline = time.monotonic() + 10
    while len(stats) == flushed:
        assert time.monotonic() < deadline, "no producer statistics in 10 s"
        producer.poll(0.05)
    return stats[-1]


def read_partition(
    bootstrap: str, topic: str, partition: int, count: int | None = None, isolation: str = "read_uncommitted"
) -> list[tuple[int, bytes | None, bytes | None]]:
    """Return (offset, key, value) of a partition's records from the earliest: count of them, or up to its end."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "tests", "enable.auto.commit": False, "isolation.level": isolation}
    )
    tp = TopicPartition(topic, partition)
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        consumer.assign([TopicPartition(topic, partition, low)])
        records: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 30
        while (len(records) < count) if count is not None else (consumer.position([tp])[0].offset < high):
            assert time.monotonic() < deadline, f"read {len(records)} records of {topic}[{partition}] in 30 s"
            for message in consumer.consume(500, timeout=1.0):
                error, offset, key, value = message.error(), message.offset(), message.key(), message.value()
                assert error is None or error.code() == KafkaError._PARTITION_EOF, error
                if error is None and offset is not None:
                    records.append((offset, key, value))
        return records
    finally:
        consumer.close()


def watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """Return the low and high watermark the broker reports for a partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        return int(low), int(high)
    finally:
        consumer.close()


def test_broker_is_ready_within_the_deadline(kafka: KafkaBroker) -> None:
    cluster = kafka.admin().describe_cluster(request_timeout=10).result(timeout=10)

    assert kafka.ready_seconds is not None and kafka.ready_seconds < START_DEADLINE
    assert [node.id for node in cluster.nodes] == [kafka.node_id]
    assert cluster.controller is not None


def test_batched_produce_reports_the_right_high_watermark(kafka: KafkaBroker) -> None:
    topic = new_topic(kafka, 2)
    records = [(f"k{i}".encode(), f"v{i}".encode(), i % 2) for i in range(4000)]

    stats = produce_batched(kafka.bootstrap_servers, topic, records, acks="all")

    produce_requests = sum(broker["req"].get("Produce", 0) for broker in stats["brokers"].values())
    assert produce_requests < 4000 / 20, f"{produce_requests} produce requests for 4000 records: not batched"
    assert watermarks(kafka.bootstrap_servers, topic, 0) == (0, 2000)
    got = read_partition(kafka.bootstrap_servers, topic, 1)
    assert got == [(i // 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(1, 4000, 2)]


def test_transactional_producer_commits_and_aborts(kafka: KafkaBroker) -> None:
    topic = new_topic(kafka)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(10)
    for outcome, count in (("commit", 10), ("abort", 5), ("commit", 3)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, f"{outcome}-{i}".encode(), partition=0)
        producer.flush(10)  # on the broker before the abort (abort_transaction drops records not yet sent)
        if outcome == "commit":
            producer.commit_transaction(10)
        else:
            producer.abort_transaction(10)

    committed = read_partition(kafka.bootstrap_servers, topic, 0, isolation="read_committed")

    assert [value for _, _, value in committed] == [f"commit-{i}".encode() for i in (*range(10), *range(3))]
    assert watermarks(kafka.bootstrap_servers, topic, 0) == (0, 18 + 3)  # 18 records and 3 control markers


def test_create_topics_with_config(kafka: KafkaBroker) -> None:
    topic = new_topic(kafka, 3, {"cleanup.policy": "compact", "segment.ms": "60000"})

    metadata = kafka.admin().list_topics(topic, timeout=10)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = kafka.admin().describe_configs([resource])[resource].result(timeout=10)

    assert len(metadata.topics[topic].partitions) == 3
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.ms"].value == "60000"
    with pytest.raises(BrokerError, match="already exists"):
        kafka.create_topics({topic: 3})


def test_auto_create_is_off(kafka: KafkaBroker) -> None:
    name = f"never-created-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "message.timeout.ms": 500})
    errors: list[KafkaError | None] = []
    producer.produce(name, b"x", on_delivery=lambda error, _m: errors.append(error))
    producer.flush(10)

    assert len(errors) == 1 and errors[0] is not None
    assert name not in kafka.admin().list_topics(timeout=10).topics


def test_log_cleaner_compacts_a_topic(kafka: KafkaBroker) -> None:
    config = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}
    topic = new_topic(kafka, 1, config)
    produce_batched(kafka.bootstrap_servers, topic, [(b"k", f"v{i}".encode(), 0) for i in range(50)])
    deadline = time.monotonic() + 30
    while True:  # segment.ms rolls the active segment on the next append; keep appending until the cleaner ran
        time.sleep(0.2)
        produce_batched(kafka.bootstrap_servers, topic, [(b"other", b"x", 0)])
        values = [value for key, _, value in _keyed(read_partition(kafka.bootstrap_servers, topic, 0)) if key == b"k"]
        if values == [b"v49"]:
            break
        assert time.monotonic() < deadline, f"not compacted in 30 s: {len(values)} values of k left"


def _keyed(records: list[tuple[int, bytes | None, bytes | None]]) -> list[tuple[bytes | None, int, bytes | None]]:
    """Return records as (key, offset, value)."""
    return [(key, offset, value) for offset, key, value in records]


def test_restart_on_the_same_data_dir_keeps_topics_and_records(tmp_path: Path) -> None:
    ensure_kafka_jars()
    records = [(f"k{i}".encode(), f"v{i}".encode(), 0) for i in range(100)]
    with KafkaBroker(data_dir=tmp_path) as first:
        topic = new_topic(first, 1, {"cleanup.policy": "compact"})
        produce_batched(first.bootstrap_servers, topic, records)

    with KafkaBroker(data_dir=tmp_path) as second:  # the same log dir, and its client port again (it is free)
        got = read_partition(second.bootstrap_servers, topic, 0)
        assert second.ready_seconds is not None and second.ready_seconds < START_DEADLINE
        this_start = second.output()

    assert second.port == first.port
    taken = socket.create_server(("127.0.0.1", first.port))  # the last port busy: another one, and it starts
    try:
        third = KafkaBroker(data_dir=tmp_path)
        assert third.port != first.port
    finally:
        taken.close()
    assert got == [(i, key, value) for i, (key, value, _) in enumerate(records)]
    assert (tmp_path / "logs" / "meta.properties").is_file()
    # both starts' output stays in the data dir (read after a drill); output() is this start's only
    kept = (tmp_path / OUTPUT_FILE).read_text()
    assert kept.count("---- started ") == 2 and kept.count("Kafka Server started") == 2, kept[-2000:]
    second_start = kept[kept.rindex("---- started ") :].split("\n", 1)[1]
    assert "Kafka Server started" in this_start and second_start.startswith(this_start)


def test_temporary_data_dir_is_deleted_on_stop() -> None:
    ensure_kafka_jars()
    broker = KafkaBroker()
    broker.launch()  # formatted and started, not waited for
    directory = broker.directory
    assert (directory / "logs" / "meta.properties").is_file()
    assert broker.running

    broker.stop()

    assert not directory.exists()
    assert not broker.running and broker.pid is None


def test_missing_jars_say_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "empty"))

    with pytest.raises(BrokerError) as raised:
        KafkaBroker().start()

    message = str(raised.value)
    assert "\n" not in message
    assert f"Apache Kafka {KAFKA_VERSION} jars are not installed" in message
    assert "python -m iqgraph.streaming.apache_kafka fetch" in message


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_kafka_jars()
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "")

    with pytest.raises(BrokerError) as raised:
        KafkaBroker().start()

    assert "\n" not in str(raised.value)
    assert "Java 17" in str(raised.value)


def test_installed_jars_need_no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_kafka_jars()
    monkeypatch.setenv("PATH", "")  # no mvn: a second install must not need it
    said: list[str] = []

    libs = ensure_kafka_jars(progress=said.append)

    assert said == []
    assert sorted(path.name for path in libs.glob("*.jar")) == sorted(jar.name for jar in locked_jars())


# mvn at the edge: copies the jars an earlier fetch checked into -DoutputDirectory, saying what it "downloaded"
# as mvn does, one of its own plugins included
FAKE_MVN = """#!{python}
import shutil, sys
from pathlib import Path
target = Path(next(a for a in sys.argv if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
url = "https://repo.maven.apache.org/maven2/org/x/1.0"
print(f"Downloaded from central: {{url}}/maven-dependency-plugin-3.8.jar (180 kB at 1.2 MB/s)")
for jar in Path({libs!r}).glob("*.jar"):
    shutil.copy(jar, target / jar.name)
    print(f"Downloaded from central: {{url}}/{{jar.name}} ({{jar.stat().st_size / 1e3:.1f}} kB at 9.0 MB/s)")
"""


def test_a_fetch_names_the_large_jars_and_sums_the_small_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libs = ensure_kafka_jars()
    (tmp_path / "bin").mkdir()
    mvn = tmp_path / "bin" / "mvn"
    mvn.write_text(FAKE_MVN.format(python=sys.executable, libs=str(libs)))
    mvn.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    said: list[str] = []

    ensure_kafka_jars(progress=said.append)

    large = sorted(jar.name for jar in locked_jars() if jar.size >= 1e6)
    small = [jar for jar in locked_jars() if jar.size < 1e6]
    assert said[0].startswith(f"Apache Kafka {KAFKA_VERSION}: {len(locked_jars())} jars, ")
    assert sorted(line.split()[1] for line in said[1:-3]) == large
    assert said[-3].startswith(f"  and {len(small)} smaller jars (")
    assert said[-2] == "  and 1 jars of Maven's dependency plugin (180 kB), once per machine"
    assert said[-1].startswith(f"Apache Kafka {KAFKA_VERSION}: {len(locked_jars())} jars fetched and checked (sha256)")


@pytest.mark.slow  # three JVMs on two cores: ~25 s
def test_three_broker_cluster_survives_a_killed_broker() -> None:
    ensure_kafka_jars()
    fast_failover = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
    with KafkaCluster(size=3, heap="256m", properties=fast_failover) as cluster:
        topic = new_topic(cluster, 1)
        first = [(f"k{i}".encode(), f"a{i}".encode(), 0) for i in range(200)]
        produce_batched(cluster.bootstrap_servers, topic, first, acks="all")
        leader = cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        victim = next(broker for broker in cluster.brokers if broker.node_id == leader)

        victim.kill()
        second = [(f"k{i}".encode(), f"b{i}".encode(), 0) for i in range(200)]
        produce_batched(cluster.bootstrap_servers, topic, second, acks="all")  # min.insync.replicas 2 of 3 alive
        got = read_partition(cluster.bootstrap_servers, topic, 0)
        victim.start()

        assert [value for _, _, value in got] == [value for _, value, _ in first + second]
        assert cluster.ready_seconds is not None
        _wait_for_isr(cluster, topic, 3)


def _wait_for_isr(cluster: KafkaCluster, topic: str, size: int, timeout: float = 30.0) -> None:
    """Wait until partition 0 of topic has size in-sync replicas."""
    deadline = time.monotonic() + timeout
    while len(cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions[0].isrs) < size:
        assert time.monotonic() < deadline, f"{topic} has not {size} in-sync replicas after {timeout} s"
        time.sleep(0.2)
