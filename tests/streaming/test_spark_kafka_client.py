"""The Kafka client on Spark's class path (kafka/spark-kafka-pom.xml's kafka-clients), as Spark's Kafka source uses it.

Spark's source lists each batch's end offsets through a Java `Admin` (``KafkaOffsetReaderAdmin``: ``listOffsets``
with ``OffsetSpec.latest()`` and the read_committed isolation level). With kafka-clients 3.9.2, the connector's own
dependency, a listing that looked a partition's leader up just before that leader died (kill -9, a lost machine)
stayed queued for the dead broker: it was sent only when that broker came back, or failed at the call's deadline
(``default.api.timeout.ms``, 60 s) — a node's ingestion stopped for that long (test_kafka_broker_loss: 56 s after
Kafka itself went on). kafka-clients 4.4.0 sends the partition back to the leader lookup once the broker has left
the cluster's metadata (KAFKA-20673), so the listing answers from the new leader.

The connector was built against 3.9.2: every kafka-clients field and method its classes name must be in the pinned
client (read from the jars' class files, `tests.support.java_classes`), but those `GONE` lists.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from iqgraph.streaming.apache_kafka import KafkaCluster
from iqgraph.streaming.kafka_jars import DEPRECATED_OFFSET_FETCHING, ensure_kafka_jars, spark_kafka_jars
from iqgraph.streaming.session import build_spark_session
from tests.support.java_classes import Reference, declared, named, resolves

CONSUMER_RECORDS = "Lorg/apache/kafka/clients/consumer/ConsumerRecords;"
#: A dead broker is fenced (and leaves the metadata clients get) ~3 s after its last heartbeat, as in the drills.
FAST_FAILOVER = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
#: The listing's own deadline here (Java's default is 60 s): well past what the fence and a new lookup take.
API_TIMEOUT_MS = 30_000
#: What a listing begun at the kill may take: the fence (~3-5 s) and a lookup of the new leader, on a busy machine.
ANSWER_WITHIN_S = 15.0


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=b"v", partition=0)
    assert producer.flush(30) == 0


def _latest(spark: SparkSession, admin: Any, topic: str) -> int:
    """List partition 0's end offset as Spark's source does (read_committed); wait at most the call's deadline."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    kafka = jvm.org.apache.kafka
    partition = kafka.common.TopicPartition(topic, 0)
    specs = jvm.java.util.HashMap()
    specs.put(partition, kafka.clients.admin.OffsetSpec.latest())
    options = kafka.clients.admin.ListOffsetsOptions(kafka.common.IsolationLevel.READ_COMMITTED)
    wait = API_TIMEOUT_MS + 5_000, jvm.java.util.concurrent.TimeUnit.MILLISECONDS
    answers = admin.listOffsets(specs, options).all().get(*wait)
    return int(answers.get(partition).offset())


@pytest.mark.slow  # three broker JVMs beside the session's Spark: ~30 s
def test_an_offset_listing_begun_as_its_leader_dies_answers_from_the_new_leader(spark: SparkSession) -> None:
    ensure_kafka_jars()
    with KafkaCluster(size=3, heap="256m", properties=FAST_FAILOVER) as cluster:
        topic = f"listing-{uuid.uuid4().hex[:8]}"
        cluster.create_topics({topic: 1}, {"min.insync.replicas": "2"})
        _produce(cluster.bootstrap_servers, topic, 100)
        properties = spark._jvm.java.util.Properties()  # type: ignore[attr-defined]
        properties.setProperty("bootstrap.servers", cluster.bootstrap_servers)
        properties.setProperty("default.api.timeout.ms", str(API_TIMEOUT_MS))
        admin = spark._jvm.org.apache.kafka.clients.admin.Admin.create(properties)  # type: ignore[attr-defined]
        try:
            assert _latest(spark, admin, topic) == 100  # the admin client knows the cluster and the leader
            leader = cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions[0].leader
            next(broker for broker in cluster.brokers if broker.node_id == leader).kill()

            began = time.monotonic()
            try:
                end = _latest(spark, admin, topic)  # its metadata still names the dead broker: not yet fenced
            except Py4JJavaError as exc:  # 3.9.2: "Timed out waiting for a node assignment. Call: listOffsets"
                cause = str(exc.java_exception.getCause() or exc.java_exception)
                pytest.fail(f"the listing failed after {time.monotonic() - began:.1f} s: {cause}")
            took = time.monotonic() - began

            # the dead broker stays dead: the answer came from the new leader, true, soon after the fence
            assert end == 100
            assert took < ANSWER_WITHIN_S, f"the listing took {took:.1f} s with broker {leader} dead"
            print(f"\nlisting begun at the leader's kill answered after {took:.1f} s")
        finally:
            admin.close()


#: kafka-clients members the connector names that the pinned client no longer has, and the only classes naming them:
#: Consumer.poll(long) (removed in Kafka 4.0), called by Spark's consumer-based offset listing alone, which
#: kafka_jars.unrunnable_spark_conf refuses (spark.sql.streaming.kafka.useDeprecatedOffsetFetching).
GONE = {
    Reference("method", "org/apache/kafka/clients/consumer/Consumer", "poll", f"(J){CONSUMER_RECORDS}"): {
        "org/apache/spark/sql/kafka010/KafkaOffsetReaderConsumer"
    }
}


def test_every_kafka_clients_member_the_connector_names_is_in_the_pinned_client() -> None:
    jars = spark_kafka_jars()
    client = declared(next(jar for jar in jars if jar.name.startswith("kafka-clients-")))
    users: dict[Reference, set[str]] = {}
    for jar in (jar for jar in jars if jar.name.startswith("spark-")):
        for user, references in named(jar).items():
            for reference in references:
                if reference.owner.startswith("org/apache/kafka/"):
                    users.setdefault(reference, set()).add(user)

    missing = {reference: names for reference, names in users.items() if not resolves(client, reference)}

    assert len(users) > 50  # the admin client, consumers, producers, records, errors the connector uses (86)
    assert missing == {reference: names for reference, names in GONE.items() if reference in missing}, missing
    assert all(users.get(reference, names) == names for reference, names in GONE.items())


def test_a_session_asked_for_the_consumer_based_listing_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"Consumer\.poll\(long\).*remove the setting") as refused:
        build_spark_session("local[1]", extra_conf={DEPRECATED_OFFSET_FETCHING: "True"})  # before any JVM starts
    assert "\n" not in str(refused.value)
