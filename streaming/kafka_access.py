"""Check, before a node starts anything, that Kafka lets it in and grants every right it needs.

A secured cluster that refuses a login (a wrong password, an expired or untrusted certificate) or a right (an ACL
that is missing) would otherwise show as clients retrying forever, or as a streaming query dying and restarting.
`check_access` asks once, with the node's own client config (librdkafka's names, as every client of the node uses
it), and raises `KafkaAccessError` with one line: what was refused and what to grant.

What a node needs (ACLs, for the principal the config logs in as):

- each input topic: READ and DESCRIBE (a dead-letter topic: WRITE and DESCRIBE);
- each changelog topic ``<app>-<topic>-changelog`` (``streaming.changelog``): READ, WRITE and DESCRIBE, and CREATE
  while it does not exist (the node creates it); its writers' transactional ids ``<app>-`` (a prefix): WRITE and
  DESCRIBE, checked with a transactional id of that prefix that no writer uses (``<app>-iqgraph-access-check``:
  a producer initialises it, which fences nobody and writes nothing);
- the group id of the changelog restore consumers, ``<app>-changelog-restore``: DESCRIBE (they only assign, but
  librdkafka looks a group's coordinator up);
- with Kafka-group membership: the group (the app's name) READ and DESCRIBE (READ is checked once the group exists:
  Kafka tells a group's rights only then), and the ``<app>.iq-metadata`` topic READ, WRITE and DESCRIBE (CREATE
  while it does not exist), and DESCRIBE on the metadata reader's group id ``<app>.iq-metadata-reader``.

Rights are read from Kafka's own answer (KIP-430: a topic's or group's authorized operations), creation is asked
with ``validate_only``: nothing is created, joined or written (but the transactional-id probe's one id, which
Kafka's transaction state keeps). A Kafka that does not answer at all is not refused
access: the caller's own checks say it is unreachable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic
from cryptography import x509

from iqgraph.stores import UserError
from iqgraph.streaming.changelog import changelog_topic, restore_group

if TYPE_CHECKING:
    from iqgraph.streaming.definitions import App

__all__ = ["KafkaAccessError", "Need", "app_needs", "check_access", "needs", "principal_of"]

log = logging.getLogger(__name__)
#: librdkafka's lines of the transactional-id probe: a refusal is its FATAL error, which the one line says instead
_PROBE_LOG = logging.getLogger(f"{__name__}.transactions")
_PROBE_LOG.setLevel(logging.CRITICAL + 1)

#: librdkafka errors that mean the broker refused the login itself (SASL) or the TLS handshake.
_LOGIN_REFUSED = {KafkaError._AUTHENTICATION, KafkaError._SSL}
_DENIED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}
_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
}
_METADATA_SUFFIX = ".iq-metadata"
_ACCESS_CHECK_ID = "iqgraph-access-check"  # after the transactional-id prefix: the id no changelog writer uses
_READ_DESCRIBE = (AclOperation.READ, AclOperation.DESCRIBE)
_READ_WRITE_DESCRIBE = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)


class KafkaAccessError(UserError, RuntimeError):
    """Kafka refused this node's login or a right it needs; the one-line message says what and what to grant."""


@dataclass(frozen=True)
class Need:
    """The rights a node needs on one topic, group or transactional-id prefix, and whether it creates the topic when
    it is missing."""

    kind: str  # "topic", "group" or "transactional-id" (a prefix)
    name: str
    operations: tuple[AclOperation, ...]
    creates: bool = False  # a topic the node creates itself (changelog, membership metadata)
    why: str = ""  # what the node does with it, for the message


def needs(
    topics: Iterable[str],
    *,
    changelogs: Iterable[str] = (),
    dead_letter_topic: str | None = None,
    group_id: str | None = None,
    transactional_ids: str | None = None,
    restore_group_id: str | None = None,
) -> list[Need]:
    """Return what a node needs: its input topics, changelog topics (and their writers' transactional ids, the
    prefix transactional_ids, and their restore consumers' group id restore_group_id), dead-letter topic and
    membership group."""
    wanted = [Need("topic", name, _READ_DESCRIBE, why="input topic") for name in topics]
    changelogs = list(changelogs)
    wanted += [Need("topic", name, _READ_WRITE_DESCRIBE, creates=True, why="changelog topic") for name in changelogs]
    if dead_letter_topic is not None:
        wanted.append(Need("topic", dead_letter_topic, (AclOperation.WRITE, AclOperation.DESCRIBE), why="dead letters"))
    if group_id is not None:
        wanted.append(Need("group", group_id, _READ_DESCRIBE, why="membership group"))
        metadata = f"{group_id}{_METADATA_SUFFIX}"
        wanted.append(Need("topic", metadata, _READ_WRITE_DESCRIBE, creates=True, why="membership metadata topic"))
        reader = f"{metadata}-reader"  # assign-only, but librdkafka looks its coordinator up: DESCRIBE
        wanted.append(Need("group", reader, (AclOperation.DESCRIBE,), why="membership metadata reader's group id"))
    if changelogs:
        if restore_group_id is not None:
            why = "changelog restore consumers' group id"
            wanted.append(Need("group", restore_group_id, (AclOperation.DESCRIBE,), why=why))
        if transactional_ids is not None:
            writers = (AclOperation.WRITE, AclOperation.DESCRIBE)
            wanted.append(Need("transactional-id", transactional_ids, writers, why="changelog writers"))
    return wanted


def app_needs(app: App, *, changelog: bool = True, group_id: str | None = None) -> list[Need]:
    """Return what a node of app needs: changelog: it keeps changelogs; group_id: Kafka-group membership's group."""
    return needs(
        [topic.name for topic in app.topics],
        changelogs=[changelog_topic(app.name, t.name) for t in app.topics if not t.global_table] if changelog else [],
        dead_letter_topic=app.kafka.dead_letter_topic,
        group_id=group_id,
        transactional_ids=f"{app.name}-",  # streaming.changelog: <app>-<topic>-changelog-<partition>
        restore_group_id=restore_group(app.name),
    )


def check_access(config: Mapping[str, str], wanted: Sequence[Need], timeout: float = 10.0) -> None:
    """Raise `KafkaAccessError` (one line) if Kafka refuses config's login or one of the wanted rights.

    config: the node's librdkafka client config (bootstrap.servers included). Returns quietly when every right
    is granted, and also when Kafka does not answer within timeout (that is not a refusal: the caller says so).
    """
    refusals: list[KafkaError] = []
    client: dict[str, Any] = {**config, "error_cb": refusals.append}
    admin = AdminClient(client, logger=log)
    if not _logged_in(admin, config, refusals, time.monotonic() + timeout):
        return
    topics = [need for need in wanted if need.kind == "topic"]
    found = _describe_topics(admin, config, topics, timeout)
    for need in topics:
        _check_topic(admin, config, need, found, timeout)
    for need in wanted:
        if need.kind == "group":
            _check_group(admin, config, need, timeout)
        elif need.kind == "transactional-id":
            _check_transactional_ids(config, need, timeout)


def principal_of(config: Mapping[str, str]) -> str:
    """Return the principal config logs in as, as an ACL names it (or how to find it, for a certificate)."""
    protocol = config.get("security.protocol", "plaintext").upper()
    if protocol.startswith("SASL_") and "sasl.username" in config:
        return f"User:{config['sasl.username']}"
    if protocol == "SSL" and any(key.startswith(("ssl.certificate.", "ssl.keystore.")) for key in config):
        return "User:<the CN of this node's certificate (ssl.certificate.location), or the broker's mapping of it>"
    return "User:ANONYMOUS"


def _logged_in(admin: AdminClient, config: Mapping[str, str], refusals: list[KafkaError], deadline: float) -> bool:
    """Return whether a metadata request got through; raise if the login or the TLS handshake was refused."""
    while True:
        try:
            admin.list_topics(timeout=0.5)
            return True
        except KafkaException:
            admin.poll(0)  # serves error_cb: the refusals librdkafka saw while it tried
        for error in refusals:
            if error.code() in _LOGIN_REFUSED or "SSL" in error.str() or "certificate" in error.str():
                raise KafkaAccessError(_login_line(config, error)) from None
        if time.monotonic() > deadline:
            return False


def _login_line(config: Mapping[str, str], error: KafkaError) -> str:
    """Return the one line of a refused login: which, why (librdkafka's reason, its suffix cut) and what to fix."""
    servers = config.get("bootstrap.servers", "?")
    reason = error.str().split(" (after ")[0]
    if error.code() == KafkaError._AUTHENTICATION and "sasl.username" in config:
        mechanism = config.get("sasl.mechanism", config.get("sasl.mechanisms", "GSSAPI")).upper()
        user = config["sasl.username"]
        create = f"--add-config '{mechanism}=[password=…]'" if mechanism.startswith("SCRAM") else ""
        fix = "check sasl.username and sasl.password" + (
            f", or create the user: kafka-configs --alter {create} --entity-type users --entity-name {user}"
            if create
            else ""
        )
        return f"Kafka at {servers} refused the {mechanism} login of {user!r}: {reason}; {fix}"
    if (expired := _expired_at(config)) is not None:
        fix = f"this node's certificate expired at {expired}: renew the certificate in ssl.certificate.location"
    elif "expired" in reason:
        fix = "renew the certificate in ssl.certificate.location (signed by a CA the brokers trust)"
    elif "verify failed" in reason or "unknown ca" in reason.lower():
        fix = "check ssl.ca.location (the CA that signed the brokers' certificates) and the node's certificate's CA"
    else:
        fix = "check the node's ssl.* settings against the brokers' listener (ssl.client.auth, CA, certificate, key)"
    return f"Kafka at {servers} refused this node's TLS connection: {reason}; {fix}"


def _expired_at(config: Mapping[str, str]) -> str | None:
    """Return when the node's client certificate (ssl.certificate.location / .pem) expired; None if it has not."""
    if "ssl.certificate.pem" in config:
        pem = config["ssl.certificate.pem"].encode()
    elif "ssl.certificate.location" in config:
        try:
            pem = Path(config["ssl.certificate.location"]).read_bytes()
        except OSError:
            return None
    else:
        return None
    try:
        not_after = x509.load_pem_x509_certificate(pem).not_valid_after_utc
    except ValueError:
        return None
    return not_after.strftime("%Y-%m-%d %H:%M:%S UTC") if not_after < datetime.now(UTC) else None


def _describe_topics(
    admin: AdminClient, config: Mapping[str, str], topics: Sequence[Need], timeout: float
) -> dict[str, list[AclOperation] | None]:
    """Return the authorized operations of each existing topic (a topic Kafka says does not exist is left out)."""
    if not topics:
        return {}
    futures = admin.describe_topics(
        TopicCollection([need.name for need in topics]), include_authorized_operations=True, request_timeout=timeout
    )
    found: dict[str, list[AclOperation] | None] = {}
    for need in topics:
        try:
            found[need.name] = list(futures[need.name].result(timeout).authorized_operations or [])
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                found[need.name] = None  # not even DESCRIBE
            elif error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaAccessError(f"cannot describe topic {need.name!r}: {error.str()}") from None
    return found


def _check_topic(
    admin: AdminClient,
    config: Mapping[str, str],
    need: Need,
    found: dict[str, list[AclOperation] | None],
    timeout: float,
) -> None:
    """Raise if the topic's rights are missing, or if it is missing and may not be created (validate_only)."""
    if need.name not in found:  # Kafka says it does not exist (so DESCRIBE is granted)
        if need.creates:
            _check_create(admin, config, need, timeout)
        return  # a missing input topic: the node's topic check names it
    granted = found[need.name]
    if granted is None:  # not even DESCRIBE: Kafka does not say whether it exists
        operations = (*need.operations, AclOperation.CREATE) if need.creates else need.operations
        raise KafkaAccessError(_grant_line(config, need, operations, "topic"))
    missing = [op for op in need.operations if op not in granted]
    if missing:
        raise KafkaAccessError(_grant_line(config, need, missing, "topic"))


def _check_create(admin: AdminClient, config: Mapping[str, str], need: Need, timeout: float) -> None:
    """Raise if Kafka would refuse to create the topic (asked with validate_only: nothing is created)."""
    new = NewTopic(need.name, num_partitions=1)
    future = admin.create_topics([new], validate_only=True, request_timeout=timeout)[need.name]
    try:
        future.result(timeout)
    except KafkaException as exc:
        if exc.args[0].code() in _DENIED:
            raise KafkaAccessError(_grant_line(config, need, [AclOperation.CREATE], "topic")) from None


def _check_group(admin: AdminClient, config: Mapping[str, str], need: Need, timeout: float) -> None:
    """Raise if the consumer group's rights (READ to join, DESCRIBE) are not all granted."""
    deadline = time.monotonic() + timeout
    while True:
        future = admin.describe_consumer_groups(
            [need.name], include_authorized_operations=True, request_timeout=timeout
        )
        try:
            granted = list(future[need.name].result(timeout).authorized_operations or [])
            break
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return  # DESCRIBE is granted (else Kafka says so first); READ cannot be told before the group exists
            if code in _DENIED:
                granted = []
                break
            if code not in _COORDINATOR_MOVING or time.monotonic() > deadline:
                raise KafkaAccessError(
                    f"cannot describe consumer group {need.name!r}: {exc.args[0].name()} {exc.args[0].str()}"
                ) from None
            time.sleep(0.2)  # a new cluster's group coordinator is still loading
    missing = [op for op in need.operations if op not in granted]
    if missing:
        raise KafkaAccessError(_grant_line(config, need, missing, "group"))


def _check_transactional_ids(config: Mapping[str, str], need: Need, timeout: float) -> None:
    """Raise if Kafka refuses the transactional ids of need's prefix: a producer initialises the one id of it that
    no changelog writer uses (nothing is fenced, nothing written). A Kafka that does not answer is no refusal."""
    producer = Producer({**config, "transactional.id": f"{need.name}{_ACCESS_CHECK_ID}"}, logger=_PROBE_LOG)
    try:  # nothing to flush: a refused producer is fatal (a flush raises again), a granted one sent nothing
        producer.init_transactions(timeout)
    except KafkaException as exc:
        code = exc.args[0].code()
        if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise KafkaAccessError(_grant_line(config, need, need.operations, "transactional-id")) from None
        if code in _DENIED:
            raise KafkaAccessError(f"Kafka refused the changelog writers' transactions: {exc.args[0].str()}") from None


def _grant_line(config: Mapping[str, str], need: Need, missing: Iterable[AclOperation], flag: str) -> str:
    """Return the one line of a missing right: what, for whom, and the kafka-acls command that grants it."""
    names = [op.name for op in missing]
    principal = principal_of(config)
    operations = " ".join(f"--operation {name.title().replace('_', '')}" for name in names)
    command = f"kafka-acls --add --allow-principal {principal} {operations} --{flag} {need.name}"
    what = f"{need.kind} {need.name!r}"
    if need.kind == "transactional-id":  # a prefix: every changelog writer's id starts with it
        command += " --resource-pattern-type prefixed"
        what = f"the transactional ids {need.name}*"
    return f"Kafka refused {' and '.join(names)} on {what} ({need.why}) to {principal}: grant it: {command}"
