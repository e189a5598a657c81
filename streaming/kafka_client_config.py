"""The Java consumer's settings for a librdkafka config: what Spark's Kafka connector is given as ``kafka.*``.

A node takes one Kafka client config, in librdkafka's names (the ``kafka`` settings table, ``IQGRAPH_KAFKA_*``,
``KafkaSettings.config``): confluent-kafka uses it as it is, and `java_consumer_options` turns it into the
Java client's names for the JVM connector (kafka-clients 4.4.0). Each key is

- passed, where both clients have it with one meaning (`SAME`), or renamed (`RENAMED`);
- translated, for security: ``sasl.username``/``sasl.password`` become a ``sasl.jaas.config`` for PLAIN or
  SCRAM (GSSAPI: a keytab login), ``ssl.ca.*`` a PEM truststore, ``ssl.certificate.*``/``ssl.key.*`` a PEM
  keystore given as text (the Java client wants key and chain in one store, librdkafka takes two files: they are
  read here, on the driver, so executors need not have them), ``ssl.keystore.*`` a PKCS12 keystore;
- dropped, where the connector has no use for it (`DROPPED`): librdkafka's own tuning, producer settings, and
  group and offset settings (the connector assigns partitions and seeks to the stores' offsets itself);
- refused with `ValueError`, otherwise: a key with no Java equivalent here (ssl.cipher.suites takes OpenSSL's
  names, OAUTHBEARER logs in through a Java callback handler, …). There is no way to give the connector Java
  options of one's own; such a cluster is read with librdkafka instead: ``--kafka-source iqkafka``.

SASL and SSL keys count only where ``security.protocol`` uses them, as in librdkafka.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["DROPPED", "RENAMED", "SAME", "jaas_quote", "java_consumer_options"]

#: Keys whose name and meaning are the same in librdkafka and in the Java consumer.
SAME = frozenset(
    {
        "allow.auto.create.topics",
        "bootstrap.servers",
        "check.crcs",
        "client.dns.lookup",
        "client.id",
        "client.rack",
        "enable.metrics.push",
        "fetch.max.bytes",
        "fetch.min.bytes",
        "isolation.level",
        "max.partition.fetch.bytes",
        "metadata.max.age.ms",
        "metadata.recovery.strategy",
        "reconnect.backoff.max.ms",
        "reconnect.backoff.ms",
        "retry.backoff.max.ms",
        "retry.backoff.ms",
        "socket.connection.setup.timeout.ms",
    }
)


def _buffer_bytes(value: str) -> str:
    """Return a socket buffer size: librdkafka's "system default" is 0, Java's -1 (0 would fail every connection)."""
    return "-1" if value.strip() == "0" else value


def _idle_ms(value: str) -> str | None:
    """Return an idle timeout: librdkafka's 0 never closes; Java has no such value, so its default (9 min) stays."""
    return None if value.strip() == "0" else value


#: librdkafka name -> (Java name, value conversion; None drops the key).
RENAMED: Mapping[str, tuple[str, Callable[[str], str | None]]] = {
    "fetch.wait.max.ms": ("fetch.max.wait.ms", str),
    "socket.send.buffer.bytes": ("send.buffer.bytes", _buffer_bytes),
    "socket.receive.buffer.bytes": ("receive.buffer.bytes", _buffer_bytes),
    "connections.max.idle.ms": ("connections.max.idle.ms", _idle_ms),
    "security.protocol": ("security.protocol", str.upper),
}

#: librdkafka aliases -> the name this module reads.
_ALIASES = {
    "metadata.broker.list": "bootstrap.servers",
    "sasl.mechanisms": "sasl.mechanism",
    "fetch.message.max.bytes": "max.partition.fetch.bytes",
}

_LIBRDKAFKA_ONLY = """builtin.features message.max.bytes message.copy.max.bytes receive.message.max.bytes
    max.in.flight.requests.per.connection max.in.flight metadata.recovery.rebootstrap.trigger.ms
    topic.metadata.refresh.interval.ms topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.fast.cnt
    topic.metadata.refresh.sparse topic.metadata.propagation.max.ms topic.blacklist debug socket.timeout.ms
    socket.blocking.max.ms socket.keepalive.enable socket.nagle.disable socket.max.fails broker.address.ttl
    broker.address.family reconnect.backoff.jitter.ms statistics.interval.ms enabled_events log_level log.queue
    log.thread.name enable.random.seed log.connection.close internal.termination.signal api.version.request
    api.version.request.timeout.ms api.version.fallback.ms broker.version.fallback queued.min.messages
    queued.max.messages.kbytes fetch.queue.backoff.ms fetch.error.backoff.ms enable.partition.eof
    offset.store.method offset.store.path offset.store.sync.interval.ms consume.callback.max.messages
    error_cb throttle_cb stats_cb logger"""
_GROUP_AND_OFFSETS = """group.id group.instance.id group.protocol group.protocol.type group.remote.assignor
    partition.assignment.strategy session.timeout.ms heartbeat.interval.ms coordinator.query.interval.ms
    max.poll.interval.ms enable.auto.commit auto.commit.enable auto.commit.interval.ms enable.auto.offset.store
    auto.offset.reset on_commit"""
_PRODUCER_ONLY = """transactional.id transaction.timeout.ms enable.idempotence enable.gapless.guarantee
    queue.buffering.max.messages queue.buffering.max.kbytes queue.buffering.max.ms linger.ms
    queue.buffering.backpressure.threshold message.send.max.retries retries batch.num.messages batch.size
    compression.codec compression.type compression.level delivery.report.only.error sticky.partitioning.linger.ms
    request.required.acks acks request.timeout.ms message.timeout.ms delivery.timeout.ms queuing.strategy
    produce.offset.report partitioner on_delivery"""
#: Keys the connector has no use for: librdkafka's own tuning and callbacks, group and offset management (the
#: connector assigns partitions and seeks), producer settings.
DROPPED = frozenset(" ".join((_LIBRDKAFKA_ONLY, _GROUP_AND_OFFSETS, _PRODUCER_ONLY)).split())

_SASL = frozenset(
    """sasl.mechanism sasl.username sasl.password sasl.kerberos.service.name sasl.kerberos.principal
    sasl.kerberos.keytab sasl.kerberos.min.time.before.relogin sasl.kerberos.kinit.cmd sasl.oauthbearer.config
    enable.sasl.oauthbearer.unsecure.jwt https.ca.location https.ca.pem""".split()
)
_SSL_UNMAPPED = """ssl.cipher.suites ssl.curves.list ssl.sigalgs.list ssl.crl.location ssl.engine.location
    ssl.engine.id""".split()
_SSL = frozenset(
    [
        *_SSL_UNMAPPED,
        *"""ssl.ca.location ssl.ca.pem ssl.certificate.location ssl.certificate.pem ssl.key.location ssl.key.pem
        ssl.key.password ssl.keystore.location ssl.keystore.password enable.ssl.certificate.verification
        ssl.endpoint.identification.algorithm ssl.ca.certificate.stores ssl.providers""".split(),
    ]
)
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_KERBEROS = "com.sun.security.auth.module.Krb5LoginModule"
_PYTHON_SOURCE = "read with librdkafka instead (--kafka-source iqkafka)"


def java_consumer_options(config: Mapping[str, str]) -> dict[str, str]:
    """Return the Java consumer's settings (names without ``kafka.``) equivalent to the librdkafka config.

    Raises:
        ValueError: a key with no Java equivalent here, or security settings that cannot be translated.
    """
    settings = _canonical(config)
    protocol = settings.get("security.protocol", "plaintext").upper()
    options: dict[str, str] = {}
    for key, value in settings.items():
        if key in SAME:
            options[key] = value
        elif key in RENAMED:
            name, convert = RENAMED[key]
            if (converted := convert(value)) is not None:
                options[name] = converted
        elif not (key in DROPPED or key in _SASL or key in _SSL or key.startswith("sasl.oauthbearer.")):
            raise ValueError(
                f"Kafka setting {key!r} has no Java-client equivalent for Spark's Kafka connector: remove it, "
                f"or {_PYTHON_SOURCE}"
            )
    if protocol.startswith("SASL_"):
        options |= _sasl_options(settings)
    if protocol.endswith("SSL"):
        options |= _ssl_options(settings)
    return options


def jaas_quote(value: str) -> str:
    """Return value as a quoted string of a JAAS configuration (``"`` and ``\\`` escaped, line breaks too)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def _canonical(config: Mapping[str, str]) -> dict[str, str]:
    """Return config with values as strings and librdkafka's aliases under one name (refused if they differ)."""
    settings: dict[str, str] = {}
    for key, value in config.items():
        name = _ALIASES.get(key, key)
        if name in settings and settings[name] != str(value):
            raise ValueError(f"Kafka settings {key!r} and {name!r} are the same setting with different values")
        settings[name] = str(value)
    return settings


def _sasl_options(settings: Mapping[str, str]) -> dict[str, str]:
    """Return sasl.mechanism and a sasl.jaas.config logging in as librdkafka would."""
    mechanism = settings.get("sasl.mechanism", "GSSAPI").upper()  # librdkafka's default, and Java's
    if mechanism == "OAUTHBEARER":
        raise ValueError(
            "sasl.mechanism OAUTHBEARER is not translated for Spark's Kafka connector (the Java client takes a "
            f"login callback handler and OAuthBearerLoginModule options): {_PYTHON_SOURCE}"
        )
    if mechanism in _LOGIN_MODULES:
        user, password = settings.get("sasl.username"), settings.get("sasl.password")
        if user is None or password is None:
            raise ValueError(f"sasl.mechanism {mechanism} needs sasl.username and sasl.password")
        login = f"{_LOGIN_MODULES[mechanism]} required username={jaas_quote(user)} password={jaas_quote(password)};"
        return {"sasl.mechanism": mechanism, "sasl.jaas.config": login}
    if mechanism == "GSSAPI":
        return _kerberos_options(settings)
    raise ValueError(f"sasl.mechanism {mechanism!r} is not one of GSSAPI, PLAIN, SCRAM-SHA-256, SCRAM-SHA-512")


def _kerberos_options(settings: Mapping[str, str]) -> dict[str, str]:
    """Return GSSAPI settings logging in from librdkafka's keytab and principal (a JAAS keytab login)."""
    keytab, principal = settings.get("sasl.kerberos.keytab"), settings.get("sasl.kerberos.principal")
    if "sasl.kerberos.kinit.cmd" in settings or keytab is None or principal is None:
        raise ValueError(
            "sasl.mechanism GSSAPI (librdkafka's default) is translated from sasl.kerberos.keytab and "
            f"sasl.kerberos.principal only, without sasl.kerberos.kinit.cmd: give those, or {_PYTHON_SOURCE}"
        )
    login = f"{_KERBEROS} required useKeyTab=true storeKey=true keyTab={jaas_quote(keytab)}"
    options = {"sasl.mechanism": "GSSAPI", "sasl.jaas.config": f"{login} principal={jaas_quote(principal)};"}
    for name in ("sasl.kerberos.service.name", "sasl.kerberos.min.time.before.relogin"):
        if name in settings:
            options[name] = settings[name]
    return options


def _ssl_options(settings: Mapping[str, str]) -> dict[str, str]:
    """Return the truststore, keystore and hostname check of librdkafka's ssl.* settings."""
    unmapped = [key for key in _SSL_UNMAPPED if key in settings]
    if unmapped:
        raise ValueError(f"Kafka settings {unmapped} take OpenSSL's values, not the Java client's: {_PYTHON_SOURCE}")
    options = {**_truststore(settings), **_keystore(settings)}
    verify = settings.get("enable.ssl.certificate.verification", "true").strip().lower()
    check = settings.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    # Java has no "trust any certificate": it still checks the chain (against ssl.ca.*), only not the host name
    off = verify in ("false", "f", "0", "no", "off") or check == "none"
    if off or "ssl.endpoint.identification.algorithm" in settings:
        options["ssl.endpoint.identification.algorithm"] = "" if off else check
    return options


def _truststore(settings: Mapping[str, str]) -> dict[str, str]:
    """Return a PEM truststore of ssl.ca.location (a file) or ssl.ca.pem; none for "probe" (the JVM's own)."""
    _one_of(settings, "ssl.ca.location", "ssl.ca.pem")
    if "ssl.ca.pem" in settings:
        return {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": settings["ssl.ca.pem"]}
    location = settings.get("ssl.ca.location")
    if location is None or location == "probe":
        return {}
    return {"ssl.truststore.type": "PEM", "ssl.truststore.location": location}


def _keystore(settings: Mapping[str, str]) -> dict[str, str]:
    """Return the client's keystore: PEM text of ssl.certificate.* and ssl.key.*, or ssl.keystore.* (PKCS12)."""
    if "ssl.keystore.location" in settings:
        if any(key.startswith(("ssl.certificate.", "ssl.key.")) for key in settings):
            raise ValueError("give the client's key as ssl.keystore.location or ssl.key.*/ssl.certificate.*, not both")
        options = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": settings["ssl.keystore.location"]}
        if "ssl.keystore.password" in settings:
            options["ssl.keystore.password"] = settings["ssl.keystore.password"]
        return options
    chain, key = _pem(settings, "ssl.certificate"), _pem(settings, "ssl.key")
    if chain is None and key is None:
        return {}
    if chain is None or key is None:
        raise ValueError("a client certificate needs both ssl.certificate.location (or .pem) and ssl.key.location")
    if "-----BEGIN PRIVATE KEY-----" not in key and "-----BEGIN ENCRYPTED PRIVATE KEY-----" not in key:
        raise ValueError(
            "the Java client reads PKCS#8 keys only (BEGIN PRIVATE KEY): convert the ssl.key with "
            "`openssl pkcs8 -topk8 -in client.key -out client-pkcs8.key` (add -nocrypt for no passphrase)"
        )
    options = {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": chain, "ssl.keystore.key": key}
    if "ENCRYPTED PRIVATE KEY" in key and "ssl.key.password" in settings:
        options["ssl.key.password"] = settings["ssl.key.password"]
    return options


def _pem(settings: Mapping[str, str], prefix: str) -> str | None:
    """Return the PEM text of <prefix>.pem, or of the file <prefix>.location; None when neither is given."""
    _one_of(settings, f"{prefix}.location", f"{prefix}.pem")
    if f"{prefix}.pem" in settings:
        return settings[f"{prefix}.pem"]
    location = settings.get(f"{prefix}.location")
    if location is None:
        return None
    try:
        return Path(location).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{prefix}.location {location!r} is not a readable PEM file: {exc}") from None


def _one_of(settings: Mapping[str, str], first: str, second: str) -> None:
    """Refuse settings giving both first and second."""
    if first in settings and second in settings:
        raise ValueError(f"give {first} or {second}, not both")
