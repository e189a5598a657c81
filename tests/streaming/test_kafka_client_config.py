"""librdkafka settings turned into the Java consumer's for Spark's Kafka connector; a SASL broker read by both."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port
from iqgraph.streaming.kafka_client_config import DROPPED, RENAMED, SAME, jaas_quote, java_consumer_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
#: A password that needs JAAS quoting (a quote, a backslash) and UTF-8.
PASSWORD = 'pa"ss\\wörd'  # noqa: S105 - a test broker's
KEY = "-----BEGIN PRIVATE KEY-----\nMIIBVQ==\n-----END PRIVATE KEY-----\n"
CHAIN = "-----BEGIN CERTIFICATE-----\nMIIBIj==\n-----END CERTIFICATE-----\n"


def sasl(mechanism: str, **more: str) -> dict[str, str]:
    """Return a librdkafka config logging in as alice over SASL_PLAINTEXT."""
    base = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism}
    return base | {"sasl.username": "alice", "sasl.password": PASSWORD} | more


def test_plain_login_is_a_jaas_config_with_quotes_and_backslashes_escaped() -> None:
    options = java_consumer_options({"bootstrap.servers": "b:9092", **sasl("PLAIN")})
    assert options == {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": f'{PLAIN_MODULE} required username="alice" password="pa\\"ss\\\\wörd";',
    }
    assert jaas_quote("a\nb\r") == '"a\\nb\\r"'  # a line break would end the JAAS string


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_logins_use_the_scram_module_and_the_plural_alias(mechanism: str) -> None:
    config = {"security.protocol": "sasl_ssl", "sasl.mechanisms": mechanism, "sasl.username": "u", "sasl.password": "p"}
    options = java_consumer_options(config)
    assert options["security.protocol"] == "SASL_SSL" and options["sasl.mechanism"] == mechanism
    assert options["sasl.jaas.config"] == f'{SCRAM_MODULE} required username="u" password="p";'


def test_oauthbearer_and_an_unknown_mechanism_are_refused_naming_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"OAUTHBEARER .*--kafka-source iqkafka"):
        java_consumer_options(sasl("OAUTHBEARER", **{"sasl.oauthbearer.method": "oidc"}))
    with pytest.raises(ValueError, match="not one of GSSAPI, PLAIN"):
        java_consumer_options(sasl("DIGEST-MD5"))
    with pytest.raises(ValueError, match="needs sasl.username and sasl.password"):
        java_consumer_options({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"})


def test_kerberos_logs_in_from_the_keytab_and_principal() -> None:
    kerberos = {"security.protocol": "SASL_PLAINTEXT", "sasl.kerberos.service.name": "kafka"}
    options = java_consumer_options(
        kerberos | {"sasl.kerberos.keytab": "/k/c.keytab", "sasl.kerberos.principal": "c@EXAMPLE.COM"}
    )
    assert options["sasl.mechanism"] == "GSSAPI" and options["sasl.kerberos.service.name"] == "kafka"
    assert options["sasl.jaas.config"] == (
        'com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true storeKey=true keyTab="/k/c.keytab" '
        'principal="c@EXAMPLE.COM";'
    )
    with pytest.raises(ValueError, match="GSSAPI .*sasl.kerberos.keytab"):
        java_consumer_options(kerberos)  # GSSAPI is librdkafka's default mechanism


def test_the_ca_becomes_a_pem_truststore_and_disabled_checks_skip_the_host_name() -> None:
    ssl = {"security.protocol": "SSL", "ssl.ca.location": "/etc/kafka/ca.pem"}
    assert java_consumer_options(ssl) == {
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/kafka/ca.pem",
    }
    inline = java_consumer_options({"security.protocol": "SSL", "ssl.ca.pem": CHAIN})
    assert inline["ssl.truststore.certificates"] == CHAIN
    probe = {"security.protocol": "SSL", "ssl.ca.location": "probe"}  # librdkafka's "the system's CAs"
    assert java_consumer_options(probe) == {"security.protocol": "SSL"}
    for setting, check in (
        ({"enable.ssl.certificate.verification": "false"}, ""),
        ({"ssl.endpoint.identification.algorithm": "none"}, ""),
        ({"ssl.endpoint.identification.algorithm": "https"}, "https"),
    ):
        assert java_consumer_options(ssl | setting)["ssl.endpoint.identification.algorithm"] == check


def test_a_client_certificate_becomes_a_pem_keystore_read_from_its_files(tmp_path: Path) -> None:
    (tmp_path / "client.key").write_text(KEY)
    (tmp_path / "client.pem").write_text(CHAIN)
    files = {"ssl.key.location": str(tmp_path / "client.key"), "ssl.certificate.location": str(tmp_path / "client.pem")}
    options = java_consumer_options({"security.protocol": "SSL", **files, "ssl.key.password": "unused"})
    assert options == {
        "security.protocol": "SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": CHAIN,
        "ssl.keystore.key": KEY,  # not encrypted: a key password would make Java try to decrypt it
    }
    encrypted = KEY.replace("PRIVATE", "ENCRYPTED PRIVATE")
    inline = {"ssl.key.pem": encrypted, "ssl.certificate.pem": CHAIN, "ssl.key.password": "s"}
    assert java_consumer_options({"security.protocol": "SSL", **inline})["ssl.key.password"] == "s"
    pkcs12 = {"ssl.keystore.location": "/c.p12", "ssl.keystore.password": "s"}
    assert java_consumer_options({"security.protocol": "SSL", **pkcs12}) == {
        "security.protocol": "SSL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": "/c.p12",
        "ssl.keystore.password": "s",
    }


def test_keys_the_java_client_cannot_read_are_refused(tmp_path: Path) -> None:
    (tmp_path / "rsa.key").write_text(KEY.replace("PRIVATE", "RSA PRIVATE"))
    pkcs1 = {"ssl.key.location": str(tmp_path / "rsa.key"), "ssl.certificate.pem": CHAIN}
    with pytest.raises(ValueError, match="PKCS#8 .*openssl pkcs8 -topk8"):
        java_consumer_options({"security.protocol": "SSL", **pkcs1})
    with pytest.raises(ValueError, match="not a readable PEM file"):
        java_consumer_options({"security.protocol": "SSL", "ssl.key.location": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="needs both"):
        java_consumer_options({"security.protocol": "SSL", "ssl.key.pem": KEY})
    with pytest.raises(ValueError, match="not both"):
        java_consumer_options({"security.protocol": "SSL", "ssl.ca.location": "/a", "ssl.ca.pem": CHAIN})


def test_same_names_pass_renamed_ones_are_renamed_and_the_rest_is_dropped() -> None:
    config = {
        "client.id": "node-1",
        "fetch.min.bytes": "1",
        "metadata.broker.list": "b:9092",
        "fetch.message.max.bytes": "2097152",
        "fetch.wait.max.ms": "100",
        "socket.send.buffer.bytes": "0",
        "socket.receive.buffer.bytes": "65536",
        "connections.max.idle.ms": "0",
        **dict.fromkeys(["statistics.interval.ms", "linger.ms", "queue.buffering.max.ms", "debug"], "1"),
        **dict.fromkeys(["socket.keepalive.enable", "enable.auto.commit"], "true"),
        "group.id": "g",
        "auto.offset.reset": "earliest",
        "sasl.username": "only-with-sasl",
        "ssl.cipher.suites": "only-with-ssl",
    }
    assert java_consumer_options(config) == {
        "client.id": "node-1",
        "fetch.min.bytes": "1",
        "bootstrap.servers": "b:9092",
        "max.partition.fetch.bytes": "2097152",
        "fetch.max.wait.ms": "100",
        "send.buffer.bytes": "-1",
        "receive.buffer.bytes": "65536",
    }


def test_a_key_without_a_java_equivalent_is_refused_in_one_line() -> None:
    for config, key in (
        ({"plugin.library.paths": "monitoring-interceptor"}, "plugin.library.paths"),
        ({"sasl.jaas.config": "x"}, "sasl.jaas.config"),  # Java's name: librdkafka (and so the config) has no such key
        ({"security.protocol": "SSL", "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384"}, "ssl.cipher.suites"),
    ):
        with pytest.raises(ValueError, match=key) as error:
            java_consumer_options(config)
        assert "\n" not in str(error.value) and "--kafka-source iqkafka" in str(error.value)
    with pytest.raises(ValueError, match="same setting with different values"):
        java_consumer_options({"sasl.mechanisms": "PLAIN", "sasl.mechanism": "SCRAM-SHA-256"})


def test_every_librdkafka_name_in_the_tables_is_one_confluent_kafka_knows() -> None:
    python_callbacks = {"error_cb", "throttle_cb", "stats_cb", "logger", "on_delivery", "on_commit"}
    unknown = []
    for name in sorted({*SAME, *RENAMED, *DROPPED} - python_callbacks):
        try:
            Producer({name: "\x01"})  # a value most settings refuse: only the name's error matters
        except (KafkaException, TypeError) as exc:  # TypeError: confluent-kafka's own check of a value's type
            unknown += [name] if "No such configuration property" in str(exc) else []
    assert unknown == []


# --- a broker with a SASL_PLAINTEXT listener: confluent-kafka and Spark's connector read it with one config ---


def properties_text(value: str) -> str:
    """Return value escaped for a Java .properties file (read as ISO-8859-1, with backslash escapes)."""
    return "".join(ch if ord(ch) < 128 else f"\\u{ord(ch):04x}" for ch in value.replace("\\", "\\\\"))


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[tuple[KafkaBroker, str]]:
    """Run a broker with a SASL_PLAINTEXT listener (alice's PLAIN and SCRAM-SHA-256 logins) beside its PLAINTEXT one.

    Yield the broker (its admin uses the PLAINTEXT listener) and the SASL listener's address.
    """
    host, ports = "127.0.0.1", set[int]()
    while len(ports) < 3:
        ports.add(free_port(host))
    plaintext, controller, secured = sorted(ports)
    users = f"{PLAIN_MODULE} required user_alice={jaas_quote(PASSWORD)};"
    listener = "listener.name.sasl_plaintext"
    properties = {
        "listeners": f"PLAINTEXT://{host}:{plaintext},CONTROLLER://{host}:{controller},SASL_PLAINTEXT://{host}:{secured}",
        "advertised.listeners": f"PLAINTEXT://{host}:{plaintext},SASL_PLAINTEXT://{host}:{secured}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        f"{listener}.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        f"{listener}.plain.sasl.jaas.config": properties_text(users),
        f"{listener}.scram-sha-256.sasl.jaas.config": f"{SCRAM_MODULE} required;",
    }
    with KafkaBroker(port=plaintext, controller_port=controller, properties=properties) as broker:
        credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
        upsert = UserScramCredentialUpsertion("alice", credential, PASSWORD.encode())
        for future in broker.admin().alter_user_scram_credentials([upsert]).values():
            future.result(10)
        yield broker, f"{host}:{secured}"


def produce_and_consume(config: Mapping[str, str], topic: str, values: list[bytes]) -> list[bytes]:
    """Produce values to partition 0 of topic with confluent-kafka, then read them back with its consumer."""
    producer = Producer(dict(config))
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(10) == 0
    consumer = Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": "false"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(read) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            read.append(message.value() or b"")
    consumer.close()
    return read


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_one_sasl_config_reads_the_topic_with_confluent_kafka_and_spark(
    spark: SparkSession, sasl_broker: tuple[KafkaBroker, str], mechanism: str
) -> None:
    broker, address = sasl_broker
    topic = f"sasl-{uuid.uuid4().hex[:12]}"
    broker.create_topics({topic: 1})
    config = {"bootstrap.servers": address, "linger.ms": "5", **sasl(mechanism)}  # linger.ms: producers' only
    values = [f"{mechanism}-{i}".encode() for i in range(5)]
    assert produce_and_consume(config, topic, values) == values
    options = {f"kafka.{key}": value for key, value in java_consumer_options(config).items()}
    frame = spark.read.format("kafka").options(**options).option("assign", json.dumps({topic: [0]})).load()
    assert [row.value for row in frame.select("value").collect()] == values


def test_every_name_the_mapping_writes_is_a_consumer_config_of_the_connectors_client(
    spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "client.key").write_text(KEY)
    tls = {"ssl.key.location": str(tmp_path / "client.key"), "ssl.certificate.pem": CHAIN, "ssl.ca.location": "/ca"}
    configs = [
        {**dict.fromkeys([*SAME, *RENAMED], "1"), **sasl("SCRAM-SHA-512"), "security.protocol": "SASL_SSL", **tls},
        {"security.protocol": "SSL", "ssl.keystore.location": "/c.p12", "ssl.keystore.password": "s"},
        {"security.protocol": "SASL_PLAINTEXT", "sasl.kerberos.keytab": "/k", "sasl.kerberos.principal": "p"},
    ]
    written = {name for config in configs for name in java_consumer_options(config)}
    assert spark._jvm is not None
    java_names = set(spark._jvm.org.apache.kafka.clients.consumer.ConsumerConfig.configNames())
    assert written <= java_names, written - java_names
