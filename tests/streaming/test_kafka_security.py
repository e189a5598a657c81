"""Secured clusters for real (issue 42 part 3): the embedded broker with SASL_SSL (SCRAM-SHA-512, PLAIN) and with
mutual TLS, ACLs on; one librdkafka config for every client a node runs; refusals in one line.

The recipes and the ACLs of docs/kafka-security.md are what these tests run: its code blocks are read, the test's
addresses and files put in place of the example ones, and nothing else added.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import shlex
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trustme
from confluent_kafka import Consumer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from cryptography.hazmat.primitives import serialization

from iqgraph.examples.shop import build_app, generate_orders
from iqgraph.streaming.apache_kafka import BrokerSecurity, KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from iqgraph.streaming.kafka_access import KafkaAccessError, app_needs, check_access
from iqgraph.streaming.kafka_client_config import java_consumer_options
from tests.support.nodes import ROOT, NodeProcess, restart_node, start_node, wait_ready
from tests.support.pipeline import START_MS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DOC = ROOT / "docs" / "kafka-security.md"
PASSWORD = "shop-node-Pa55-word"  # noqa: S105 - a test broker's
EXAMPLE_SERVERS = "kafka-1.example.com:9093"
EXAMPLE_DIR = "/etc/iqgraph/"
PARTITIONS = 3
#: SCRAM users: the node, and principals that miss one right each (their ACLs are granted per test).
SCRAM_USERS = {name: PASSWORD for name in ("shop-node", "reader", "no-group", "no-create", "no-txn", "no-restore")}


def doc_blocks(language: str) -> list[str]:
    """Return the code blocks of docs/kafka-security.md written in language, in order."""
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


# --- a test CA, the broker's certificate and the clients' -------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """PEM files of a test CA and of certificates it signed (keys PKCS#8, as the Java client reads them)."""

    home: Path

    @property
    def ca(self) -> Path:
        return self.home / "kafka-ca.pem"

    def cert(self, name: str) -> Path:
        return self.home / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.home / f"{name}.key"


def write_leaf(ca: trustme.CA, home: Path, name: str, file: str | None = None, **validity: Any) -> None:
    """Write a certificate of CN name signed by ca (and its key) as home/<file or name>.pem and .key."""
    identities = ("127.0.0.1", "localhost") if name == "kafka-broker" else (f"{name}.test",)
    leaf = ca.issue_cert(*identities, common_name=name, key_type=trustme.KeyType.RSA, **validity)
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (home / f"{file or name}.key").write_bytes(pkcs8)
    (home / f"{file or name}.pem").write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Make the test CA: the broker's certificate, the node's and others' (one expired, one of another CA)."""
    home = tmp_path_factory.mktemp("pki")
    ca = trustme.CA(key_type=trustme.KeyType.RSA)
    ca.cert_pem.write_to_path(str(home / "kafka-ca.pem"))
    for name in ("kafka-broker", "shop-node", "reader", "no-group", "no-create"):
        write_leaf(ca, home, name)
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    write_leaf(ca, home, "shop-node", "expired", not_before=past, not_after=past + datetime.timedelta(days=1))
    write_leaf(trustme.CA(key_type=trustme.KeyType.RSA), home, "shop-node", "stranger")
    return Pki(home)


def secured_broker(pki: Pki, protocol: str) -> KafkaBroker:
    """Return a broker (not started) whose client listener is protocol, ACLs on."""
    security = BrokerSecurity(
        protocol,
        pki.ca,
        pki.cert("kafka-broker"),
        pki.key("kafka-broker"),
        "kafka-broker",
        scram_users=SCRAM_USERS,
        plain_users={"plain-node": PASSWORD},
    )
    return KafkaBroker(security=security, heap="384m")


def running(pki: Pki, protocol: str) -> Iterator[KafkaBroker]:
    """Run a secured broker with the topic orders and the doc's ACLs for User:shop-node."""
    with secured_broker(pki, protocol) as broker:
        broker.create_topics({"orders": PARTITIONS})
        grant_doc_acls(broker, "User:shop-node")
        yield broker


@pytest.fixture(scope="module")
def scram_broker(pki: Pki) -> Iterator[KafkaBroker]:
    yield from running(pki, "SASL_SSL")


@pytest.fixture(scope="module")
def mtls_broker(pki: Pki) -> Iterator[KafkaBroker]:
    yield from running(pki, "SSL")


def scram(broker: KafkaBroker, pki: Pki, user: str = "shop-node", password: str = PASSWORD) -> dict[str, str]:
    """Return the node's config for a SASL_SSL broker (librdkafka's names), logging in as user."""
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(pki.ca),
    }


def mtls(broker: KafkaBroker, pki: Pki, name: str = "shop-node") -> dict[str, str]:
    """Return the node's config for a mutual-TLS broker, with the certificate pki.cert(name)."""
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(pki.cert(name)),
        "ssl.key.location": str(pki.key(name)),
    }


# --- ACLs: the doc's, and single ones -----------------------------------------------------------------------------

_RESOURCES = {"--topic": ResourceType.TOPIC, "--group": ResourceType.GROUP}
_RESOURCES["--transactional-id"] = ResourceType.TRANSACTIONAL_ID


def doc_acls(principal: str) -> list[AclBinding]:
    """Return the ACLs the doc's kafka-acls lines grant (for principal instead of the doc's)."""
    (block,) = [b for b in doc_blocks("bash") if b.startswith("kafka-acls")]
    bindings = []
    for line in block.splitlines():
        words = shlex.split(line)
        options: dict[str, list[str]] = {}
        for flag, value in zip(words[2::2], words[3::2], strict=True):  # after "kafka-acls --add"
            options.setdefault(flag, []).append(value)
        assert options["--allow-principal"] == ["User:shop-node"]
        (flag,) = [f for f in options if f in _RESOURCES]
        pattern = options.get("--resource-pattern-type", ["literal"])[0].upper()
        for operation in options["--operation"]:
            bindings.append(acl(principal, _RESOURCES[flag], options[flag][0], operation, pattern))
    return bindings


def acl(principal: str, kind: ResourceType, name: str, operation: str, pattern: str = "LITERAL") -> AclBinding:
    """Return an ALLOW binding; operation in kafka-acls' spelling (Read, DescribeConfigs, …)."""
    op = AclOperation[re.sub(r"(?<!^)([A-Z])", r"_\1", operation).upper()]
    return AclBinding(kind, name, ResourcePatternType[pattern], principal, "*", op, AclPermissionType.ALLOW)


def grant(broker: KafkaBroker, bindings: list[AclBinding]) -> None:
    """Create the ACLs with the broker's own (super user) admin."""
    for future in broker.admin().create_acls(bindings).values():
        future.result(10)


def grant_doc_acls(broker: KafkaBroker, principal: str) -> None:
    grant(broker, doc_acls(principal))


# --- one config, every client: confluent-kafka's producer, consumer and admin, Spark's connector ----------------


def produce_consume_describe(config: Mapping[str, str], topic: str, values: list[bytes]) -> list[bytes]:
    """Produce values to partition 0 of topic, describe the topic and read the values back, all with config."""
    assert produce(config["bootstrap.servers"], topic, [(None, v, 0) for v in values], config) == len(values)
    admin = AdminClient(dict(config))  # kept: a future of an admin destroyed meanwhile fails (_DESTROY)
    described = admin.describe_topics(TopicCollection([topic]))[topic].result(15)
    assert [p.id for p in described.partitions] == [0]
    consumer = Consumer({**config, "group.id": f"{topic}-reader", "enable.auto.commit": "false"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        batch = consumer.consume(len(values), timeout=15)
    finally:
        consumer.close()
    assert all(message.error() is None for message in batch)
    return [message.value() or b"" for message in batch]


def read_with_spark(spark: SparkSession, config: Mapping[str, str], topic: str) -> list[bytes]:
    """Return partition 0 of topic as Spark's Kafka connector reads it with config translated."""
    options = {f"kafka.{key}": value for key, value in java_consumer_options(config).items()}
    frame = spark.read.format("kafka").options(**options).option("assign", json.dumps({topic: [0]})).load()
    return [row.value for row in frame.select("value").collect()]


@pytest.mark.parametrize("login", ["SCRAM-SHA-512", "PLAIN", "mTLS"])
def test_one_librdkafka_config_serves_every_client_on_a_secured_broker(
    spark: SparkSession, request: pytest.FixtureRequest, pki: Pki, login: str
) -> None:
    broker: KafkaBroker = request.getfixturevalue("mtls_broker" if login == "mTLS" else "scram_broker")
    if login == "mTLS":
        config = mtls(broker, pki)
    elif login == "PLAIN":
        config = scram(broker, pki, "plain-node") | {"sasl.mechanism": "PLAIN"}
        grant_doc_acls(broker, "User:plain-node")
    else:
        config = scram(broker, pki)
    topic = f"shop-{uuid.uuid4().hex[:10]}"  # under the doc's prefix ACL: the node may write and read it
    broker.create_topics({topic: 1})
    values = [f"{login}-{i}".encode() for i in range(5)]
    assert produce_consume_describe(config, topic, values) == values
    assert read_with_spark(spark, config, topic) == values


def test_the_doc_acls_are_all_a_node_needs(scram_broker: KafkaBroker, mtls_broker: KafkaBroker, pki: Pki) -> None:
    app = build_app("orders", PARTITIONS)
    check_access(scram(scram_broker, pki), app_needs(app, group_id="shop"))
    check_access(mtls(mtls_broker, pki), app_needs(app, group_id="shop"))


# --- refusals: one line, at once -------------------------------------------------------------------------------


def refused(config: Mapping[str, str], group_id: str | None = "shop") -> str:
    """Return the one line check_access raises for config (a shop node), checking that it came at once."""
    started = time.monotonic()
    with pytest.raises(KafkaAccessError) as raised:
        check_access(config, app_needs(build_app("orders", PARTITIONS), group_id=group_id))
    line = str(raised.value)
    assert "\n" not in line
    assert time.monotonic() - started < 10, "a refusal must not wait out a retry loop"
    return line


def test_a_wrong_password_is_one_line_naming_the_login(scram_broker: KafkaBroker, pki: Pki) -> None:
    line = refused(scram(scram_broker, pki, password="wrong"))  # noqa: S106 - a wrong one
    assert line.startswith(f"Kafka at {scram_broker.bootstrap_servers} refused the SCRAM-SHA-512 login of 'shop-node'")
    assert "check sasl.username and sasl.password" in line

    plain = scram(scram_broker, pki, "plain-node", "wrong") | {"sasl.mechanism": "PLAIN"}
    assert "refused the PLAIN login of 'plain-node'" in refused(plain)


def test_an_expired_certificate_is_one_line_saying_renew_it(mtls_broker: KafkaBroker, pki: Pki) -> None:
    line = refused(mtls(mtls_broker, pki, "expired"))
    assert "refused this node's TLS connection" in line and "expired" in line
    assert "renew the certificate in ssl.certificate.location" in line


def test_a_certificate_of_another_ca_is_refused_in_one_line(mtls_broker: KafkaBroker, pki: Pki) -> None:
    assert "refused this node's TLS connection" in refused(mtls(mtls_broker, pki, "stranger"))


@pytest.mark.parametrize("login", ["SCRAM-SHA-512", "mTLS"])
def test_a_missing_read_on_the_input_topic_names_the_grant(
    request: pytest.FixtureRequest, pki: Pki, login: str
) -> None:
    broker: KafkaBroker = request.getfixturevalue("mtls_broker" if login == "mTLS" else "scram_broker")
    grant(broker, [acl("User:reader", ResourceType.TOPIC, "orders", "Describe")])
    config = mtls(broker, pki, "reader") if login == "mTLS" else scram(broker, pki, "reader")
    line = refused(config)
    assert line.startswith("Kafka refused READ on topic 'orders' (input topic)")
    assert "kafka-acls --add --allow-principal User:" in line and "--operation Read --topic orders" in line


def test_a_missing_group_right_names_the_group(scram_broker: KafkaBroker, pki: Pki) -> None:
    rights = [b for b in doc_acls("User:no-group") if b.restype != ResourceType.GROUP]
    grant(scram_broker, rights)
    line = refused(scram(scram_broker, pki, "no-group"))
    assert line.startswith("Kafka refused READ and DESCRIBE on group 'shop' (membership group) to User:no-group")
    check_access(scram(scram_broker, pki, "no-group"), [])  # the login itself is fine


def test_a_changelog_topic_the_node_may_not_create_names_create(scram_broker: KafkaBroker, pki: Pki) -> None:
    rights = [
        b
        for b in doc_acls("User:no-create")
        if not (b.name == "shop-" and b.restype == ResourceType.TOPIC and b.operation == AclOperation.CREATE)
    ]
    grant(scram_broker, rights)
    line = refused(scram(scram_broker, pki, "no-create"))
    assert line.startswith("Kafka refused CREATE on topic 'shop-orders-changelog' (changelog topic)"), line


def test_missing_rights_on_the_changelog_writers_transactional_ids_name_the_prefix(
    scram_broker: KafkaBroker, pki: Pki
) -> None:
    grant(scram_broker, [b for b in doc_acls("User:no-txn") if b.restype != ResourceType.TRANSACTIONAL_ID])
    line = refused(scram(scram_broker, pki, "no-txn"))
    assert line == (
        "Kafka refused WRITE and DESCRIBE on the transactional ids shop-* (changelog writers) to User:no-txn: grant "
        "it: kafka-acls --add --allow-principal User:no-txn --operation Write --operation Describe --transactional-id "
        "shop- --resource-pattern-type prefixed"
    )
    check_access(scram(scram_broker, pki, "no-txn"), app_needs(build_app("orders", PARTITIONS), changelog=False))


def test_each_app_restores_its_changelogs_under_a_group_id_of_its_own(scram_broker: KafkaBroker, pki: Pki) -> None:
    # the doc's ACLs name shop's restore group; without them a static node (no membership group) is refused on it
    grant(scram_broker, [b for b in doc_acls("User:no-restore") if b.restype != ResourceType.GROUP])
    line = refused(scram(scram_broker, pki, "no-restore"), group_id=None)
    assert line.startswith(
        "Kafka refused DESCRIBE on group 'shop-changelog-restore' (changelog restore consumers' group id)"
    ), line
    other = app_needs(dataclasses.replace(build_app("orders", PARTITIONS), name="other"))
    assert [n.name for n in other if n.kind == "group"] == ["other-changelog-restore"]


# --- end to end: the doc's recipes, a node process, produce, ingest, query, restart ------------------------------


def orders(seed: int, n: int) -> list[tuple[str, dict[str, Any]]]:
    events = generate_orders(seed, START_MS)
    return [next(events) for _ in range(n)]


def query_counts(node: NodeProcess, keys: list[str]) -> list[Any]:
    answer = node.post("query($keys: [String!]!) { orderCount { getMany(keys: $keys) } }", {"keys": keys})
    return [] if answer.get("errors") else answer["data"]["orderCount"]["getMany"]


def wait_counts(node: NodeProcess, events: list[tuple[str, dict[str, Any]]], timeout: float = 120) -> None:
    """Wait until the node answers every key's order count as the events make it."""
    truth = Counter(key for key, _ in events)
    keys = sorted(truth)
    deadline = time.monotonic() + timeout
    while (got := query_counts(node, keys)) != [truth[k] for k in keys]:
        assert time.monotonic() < deadline, f"counts not as produced after {timeout} s: {got[:5]}"
        time.sleep(0.5)


def produce_as_admin(broker: KafkaBroker, events: list[tuple[str, dict[str, Any]]]) -> None:
    records = [(k.encode(), orjson.dumps(v), None) for k, v in events]
    config = broker.admin_config()
    produce(config["bootstrap.servers"], "orders", records, {**config, "acks": "all"})


def run_recipe(broker: KafkaBroker, home: Path, flags: list[str], env: dict[str, str]) -> None:
    """Produce, start a node with flags and env, check its answers, kill it, produce more, restart, check again."""
    first = orders(1, 200)
    produce_as_admin(broker, first)
    node = start_node(home, "shop_app", "node-0", free_port("127.0.0.1"), flags, env)
    try:
        wait_ready([node])
        wait_counts(node, first)
        node.kill()
        more = first + orders(2, 200)
        produce_as_admin(broker, more[len(first) :])
        node = restart_node(node)
        wait_ready([node])
        wait_counts(node, more)
    finally:
        node.kill()
    log = node.log.read_text()
    assert "AUTHORIZATION_FAILED" not in log and "Authentication failed" not in log, log[-3000:]


def serve_command(block: str) -> tuple[dict[str, str], list[str]]:
    """Return the exports and the flags after `--app shop_app:app` of a doc block that runs iqgraph serve."""
    env, flags = {}, []
    for line in block.splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            name, value = words[1].split("=", 1)
            env[name] = value
        elif words[:2] == ["iqgraph", "serve"]:
            assert words[2:4] == ["--app", "shop_app:app"]
            flags = words[4:]
    return env, flags


@pytest.mark.slow
def test_the_scram_recipe_runs_a_node_with_group_membership(
    scram_broker: KafkaBroker, pki: Pki, tmp_path: Path
) -> None:
    app_code, shell = doc_blocks("python")[0], doc_blocks("bash")[0]
    app_code = app_code.replace(EXAMPLE_SERVERS, scram_broker.bootstrap_servers).replace(EXAMPLE_DIR, f"{pki.home}/")
    (tmp_path / "shop_app.py").write_text(app_code)
    env, flags = serve_command(shell)
    assert env == {"IQGRAPH_KAFKA_SASL_PASSWORD": "the-password"} and flags == ["--membership", "kafka"]
    run_recipe(scram_broker, tmp_path, flags, {"IQGRAPH_KAFKA_SASL_PASSWORD": PASSWORD})


@pytest.mark.slow
def test_the_mutual_tls_recipe_runs_a_node(mtls_broker: KafkaBroker, pki: Pki, tmp_path: Path) -> None:
    toml = doc_blocks("toml")[0]
    toml = toml.replace(EXAMPLE_SERVERS, mtls_broker.bootstrap_servers).replace(EXAMPLE_DIR, f"{pki.home}/")
    (tmp_path / "node.toml").write_text(toml)
    app_code = re.sub(r"kafka = KafkaSettings\(.*?\n\)\n", "", doc_blocks("python")[0], flags=re.S)
    (tmp_path / "shop_app.py").write_text(app_code.replace(", kafka=kafka)", ")"))  # the cluster's is in node.toml
    _, flags = serve_command(doc_blocks("bash")[1])
    assert flags == ["--config", "node.toml"]
    run_recipe(mtls_broker, tmp_path, ["--config", str(tmp_path / "node.toml")], {})


@pytest.mark.slow
def test_a_node_started_with_a_wrong_password_ends_with_one_line_naming_the_login(
    scram_broker: KafkaBroker, pki: Pki, tmp_path: Path
) -> None:
    app_code = doc_blocks("python")[0]
    app_code = app_code.replace(EXAMPLE_SERVERS, scram_broker.bootstrap_servers).replace(EXAMPLE_DIR, f"{pki.home}/")
    (tmp_path / "shop_app.py").write_text(app_code)
    flags = ["--membership", "kafka"]
    node = start_node(
        tmp_path, "shop_app", "node-0", free_port("127.0.0.1"), flags, {"IQGRAPH_KAFKA_SASL_PASSWORD": "wrong"}
    )
    try:
        code = node.process.wait(60)
    finally:
        node.kill()
    log = node.log.read_text()
    assert code != 0, log[-3000:]
    said = [line for line in log.splitlines() if "refused the SCRAM-SHA-512 login of 'shop-node'" in line]
    assert len(said) == 1, log[-3000:]
    assert "Traceback" not in log and "starting Spark" not in log, log[-3000:]  # refused before the JVM starts
