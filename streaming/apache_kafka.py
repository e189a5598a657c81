"""Apache Kafka brokers run as subprocesses on loopback ports, for tests, benchmarks and ``iqgraph dev``.

The broker is Apache Kafka `KAFKA_VERSION` in KRaft mode, one JVM that is both broker and controller
(`KafkaBroker`), or several such JVMs forming one cluster (`KafkaCluster`). Its jars, and Spark's Kafka connector's,
are ``streaming.kafka_jars`` (pinned, fetched with mvn, checked, cached): starting a broker never downloads.
This module keeps the command line of both:

    python -m iqgraph.streaming.apache_kafka fetch     # install time: download and check both sets of jars
    python -m iqgraph.streaming.apache_kafka run       # a broker in the foreground until Ctrl-C
    python -m iqgraph.streaming.apache_kafka lock      # after changing a pom in kafka/: rewrite the locks
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ClusterMetadata,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from iqgraph.streaming.broker import BrokerError, exit_with_parent, free_port, free_ports
from iqgraph.streaming.jvm_archive import KAFKA, java_options
from iqgraph.streaming.kafka_client_config import jaas_quote

# What streaming.runner still imports from here (the jars are streaming.kafka_jars): re-exported until it moves.
from iqgraph.streaming.kafka_jars import (
    FETCH_COMMAND,
    INSTALL_JAVA,
    JAR_SETS,
    KAFKA_VERSION,
    SPARK_KAFKA_VERSION,
    JarsError,
    ensure_kafka_jars,
    java_binary,
    kafka_jars,
)

__all__ = [
    "FETCH_COMMAND",
    "STANDARD_AUTHORIZER",
    "JVM_OPTIONS",
    "KAFKA_VERSION",
    "ONE_MACHINE_PROPERTIES",
    "SPARK_KAFKA_VERSION",
    "BrokerSecurity",
    "JarsError",
    "KafkaBroker",
    "KafkaCluster",
]

log = logging.getLogger(__name__)

_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"  # a Scala object in kafka_2.13 up to 4.4 at least
_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
logger.kafkaconfig.name = kafka.server.KafkaConfig
logger.kafkaconfig.level = warn
logger.appinfo.name = org.apache.kafka.common.utils.AppInfoParser
logger.appinfo.level = warn
"""
#: The file in a kept data_dir that holds the broker's output (its log4j2 console) of every start, one after another.
OUTPUT_FILE: Final = "kafka-output.log"
#: The file in a kept data_dir that holds the client port of its last start: a broker started again without a port
#: takes it again when it is free, so the producers and nodes of the last run find it where they left it.
PORT_FILE: Final = "client-port"
#: JVM options of the broker (and of its storage tool). C1 only (TieredStopAtLevel=1): measured on two busy cores,
#: a start takes ~2/3 of the time and 400k produced records ~60% of the broker CPU of the default C2 tiers; a
#: long benchmark may want C2 back: KafkaBroker(jvm_options=["-XX:TieredStopAtLevel=4"]) (the later option wins).
JVM_OPTIONS: Final = (
    "-Xms64m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
#: Broker settings for one machine; `KafkaBroker(properties=…)` overrides any of them.
ONE_MACHINE_PROPERTIES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # drills and tests detect a dead member in seconds (Kafka's default floor is 6 s; production keeps it)
        "group.min.session.timeout.ms": "1000",
        # the same for KIP-848's consumer protocol (defaults: sessions of 45 s at least, heartbeats every 5 s at least)
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "100",
        "auto.create.topics.enable": "false",
        # keep every record whatever its timestamp: time retention goes by the records' own timestamps, so data with
        # event times older than 7 days (a replay, a backfill, the examples' fixed dates) would be deleted on arrival
        "log.retention.ms": "-1",
        "log.cleaner.enable": "true",
        "log.cleaner.backoff.ms": "1000",  # an idle cleaner looks for dirty logs every second (default 15 s)
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "2",
    }
)


def _last_port(data_dir: Path | None, host: str) -> int | None:
    """Return the client port of the last start on data_dir (`PORT_FILE`) if it is free on host now, else None."""
    try:
        port = int((data_dir / PORT_FILE).read_text()) if data_dir is not None else 0
    except (OSError, ValueError):
        return None
    if not 0 < port < 65536:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker's own listener binds
        try:
            sock.bind((host, port))
        except OSError:
            return None
    return port


def _new_cluster_id() -> str:
    """Return a new KRaft cluster id: a random UUID in URL-safe base64 without padding, as kafka-storage makes.

    Like Kafka's Uuid.randomUuid, never one that starts with "-", which the storage tool would take for an option.
    """
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()).startswith("-"):
        pass
    return cluster_id


def _run_all(commands: Sequence[Sequence[str]], timeout: float) -> None:
    """Run commands side by side and wait for all; raise `BrokerError` with its output if one fails."""
    processes = [
        subprocess.Popen(  # noqa: S603 - java with the checked jars
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=exit_with_parent
        )
        for command in commands
    ]
    deadline = time.monotonic() + timeout
    failures = []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        if process.returncode != 0:
            failures.append(f"exit {process.returncode}:\n{output.decode(errors='replace')[-2000:]}")
    if failures:
        raise BrokerError(f"kafka storage format failed: {failures[0]}")


class _Endpoint:
    """What a broker and a cluster share: an AdminClient and topic creation over `bootstrap_servers`."""

    _admin: AdminClient | None

    @property
    def bootstrap_servers(self) -> str:
        """Return the bootstrap servers string that clients connect to."""
        raise NotImplementedError

    def admin_config(self) -> dict[str, str]:
        """Return the librdkafka config of a client with every right: the admin's (plain `bootstrap_servers`)."""
        return {"bootstrap.servers": self.bootstrap_servers}

    def admin(self) -> AdminClient:
        """Return an AdminClient with `admin_config`, created on first use."""
        if self._admin is None:
            config: dict[str, str | int | float | bool] = {**self.admin_config()}
            self._admin = AdminClient(config, logger=log)
        return self._admin

    def create_topics(
        self, topics: Mapping[str, int], config: Mapping[str, str] | None = None, timeout: float = 10.0
    ) -> None:
        """Create topics named by topics with the given partition counts and topic config; wait for their leaders."""
        deadline = time.monotonic() + timeout
        new = [NewTopic(name, num_partitions=n, config=dict(config or {})) for name, n in topics.items()]
        futures = self.admin().create_topics(new, operation_timeout=timeout, request_timeout=timeout)
        for name, future in futures.items():
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.1))
            except KafkaException as exc:
                raise BrokerError(f"could not create topic {name!r}: {exc}") from exc
        self._wait_for_leaders(set(topics), deadline)

    def _wait_for_leaders(self, names: set[str], deadline: float) -> None:
        """Wait until the metadata shows a leader for every partition of the named topics."""
        while True:
            metadata = self._metadata(deadline)
            if metadata is not None and all(_has_leaders(metadata, name) for name in names):
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"topics {sorted(names)} have partitions without a leader")
            time.sleep(0.05)

    def _metadata(self, deadline: float) -> ClusterMetadata | None:
        """Return the cluster's metadata, or None when no answer came within a second (or by the deadline)."""
        try:
            return self.admin().list_topics(timeout=min(max(deadline - time.monotonic(), 0.1), 1.0))
        except KafkaException:
            return None


def _has_leaders(metadata: ClusterMetadata, name: str) -> bool:
    """Return whether the metadata lists topic name with a leader for each of its partitions."""
    topic = metadata.topics.get(name)
    return (
        topic is not None
        and topic.error is None
        and bool(topic.partitions)
        and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
    )


#: Kafka's ACL authorizer under KRaft.
STANDARD_AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
#: A certificate's principal is its CN (User:CN=x,OU=y,O=z would be the whole distinguished name).
_CN_PRINCIPAL = "RULE:^CN=([^,]+).*$/$1/,DEFAULT"
_INTERNAL = "INTERNAL"


@dataclass(frozen=True)
class BrokerSecurity:
    """A secured broker: its client listener speaks protocol, ACLs are on, and only the broker itself is super.

    protocol "SASL_SSL": clients log in with SCRAM-SHA-512 (scram_users, created once the broker runs) or PLAIN
    (plain_users, in the broker's JAAS config), over TLS. "SSL": mutual TLS, a client's certificate (signed by ca)
    is its login and its CN its principal (User:<CN>). Either way the broker serves its certificate (certificate,
    key: PEM, the key PKCS#8 unencrypted), checks clients' against ca (PEM), and talks to itself (controller,
    inter-broker, `KafkaBroker.admin`) over an internal mutual-TLS listener as the super user User:<principal>,
    its certificate's CN. ACLs: StandardAuthorizer, nothing allowed that no ACL grants (Kafka's default).
    """

    protocol: str
    ca: Path
    certificate: Path
    key: Path
    principal: str
    scram_users: Mapping[str, str] = field(default_factory=dict)
    plain_users: Mapping[str, str] = field(default_factory=dict)
    super_users: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.protocol not in ("SASL_SSL", "SSL"):
            raise ValueError(f"a secured broker's protocol is SASL_SSL or SSL, not {self.protocol!r}")

    def properties(self, host: str, port: int, internal_port: int, controller_port: int) -> dict[str, str]:
        """Return the broker settings of these listeners, ready for server.properties (escaped)."""
        protocol = self.protocol
        supers = [f"User:{self.principal}", *(f"User:{user}" for user in self.super_users)]
        settings = {
            "listeners": f"{protocol}://{host}:{port},{_INTERNAL}://{host}:{internal_port},"
            f"CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"{protocol}://{host}:{port},{_INTERNAL}://{host}:{internal_port}",
            "inter.broker.listener.name": _INTERNAL,
            "listener.security.protocol.map": f"{protocol}:{protocol},{_INTERNAL}:SSL,CONTROLLER:SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": _escaped(self.certificate.read_text(encoding="ascii")),
            "ssl.keystore.key": _escaped(self.key.read_text(encoding="ascii")),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": _escaped(str(self.ca)),
            "ssl.client.auth": "required",
            "ssl.principal.mapping.rules": _CN_PRINCIPAL,
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "super.users": ";".join(supers),
        }
        if protocol == "SASL_SSL":
            listener = "listener.name.sasl_ssl"
            mechanisms = ["SCRAM-SHA-512", *(["PLAIN"] if self.plain_users else [])]
            settings[f"{listener}.ssl.client.auth"] = "none"
            settings[f"{listener}.sasl.enabled.mechanisms"] = ",".join(mechanisms)
            settings[f"{listener}.scram-sha-512.sasl.jaas.config"] = f"{_SCRAM_MODULE} required;"
            if self.plain_users:
                users = " ".join(f"user_{name}={jaas_quote(pw)}" for name, pw in self.plain_users.items())
                settings[f"{listener}.plain.sasl.jaas.config"] = _escaped(f"{_PLAIN_MODULE} required {users};")
        return settings

    def admin_config(self, host: str, internal_port: int) -> dict[str, str]:
        """Return the librdkafka config of the broker's own super-user client (the internal listener)."""
        return {
            "bootstrap.servers": f"{host}:{internal_port}",
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca),
            "ssl.certificate.location": str(self.certificate),
            "ssl.key.location": str(self.key),
        }


def _escaped(value: str) -> str:
    """Return value escaped for a .properties file (read as ISO-8859-1): backslashes, line breaks, non-ASCII."""
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "".join(ch if ord(ch) < 128 else f"\\u{ord(ch):04x}" for ch in escaped)


class KafkaBroker(_Endpoint):
    """An Apache Kafka KRaft broker and controller in one JVM subprocess, listening on loopback ports.

    data_dir None runs on a temporary directory deleted by `stop`; a given data_dir is kept, so a broker started
    again on it has the topics and records it had, its client port when no port is given and that one is free
    (`PORT_FILE`), and its `OUTPUT_FILE` the output of every start. properties override `ONE_MACHINE_PROPERTIES`
    and the listener settings; heap is the JVM's -Xmx and jvm_options come after `JVM_OPTIONS`. node_id,
    controller_port, quorum_voters and cluster_id are how `KafkaCluster` builds its members. security: a secured
    client listener on port (`BrokerSecurity`: SASL_SSL or mutual TLS, ACLs on) instead of PLAINTEXT; `admin` is
    then the broker's own super user, on an internal listener.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 30.0,
        data_dir: Path | None = None,
        properties: Mapping[str, str] | None = None,
        node_id: int = 1,
        controller_port: int | None = None,
        quorum_voters: str | None = None,
        cluster_id: str | None = None,
        heap: str = "512m",
        jvm_options: Sequence[str] = (),
        security: BrokerSecurity | None = None,
    ) -> None:
        self.host = host
        self.port = port or _last_port(data_dir, host) or free_port(host)
        self.controller_port = controller_port or free_ports(1, {self.port}, host)[0]
        self.security = security
        self.internal_port = free_ports(1, {self.port, self.controller_port}, host)[0] if security else None
        self.startup_timeout = startup_timeout
        self.data_dir = data_dir
        self.properties = dict(properties or {})
        self.node_id = node_id
        self.quorum_voters = quorum_voters or f"{node_id}@{host}:{self.controller_port}"
        self.cluster_id = cluster_id
        self.heap = heap
        self.jvm_options = list(jvm_options)
        #: Seconds the last `start` took from launch to ready (None before).
        self.ready_seconds: float | None = None
        self._temp_dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._output_start = 0  # where this start's output begins in _log
        self._admin = None

    @property
    def bootstrap_servers(self) -> str:
        """Return the bootstrap servers string that clients connect to."""
        return f"{self.host}:{self.port}"

    def admin_config(self) -> dict[str, str]:
        """Return the librdkafka config of a client with every right (a secured broker's own super user)."""
        if self.security is None or self.internal_port is None:
            return super().admin_config()
        return self.security.admin_config(self.host, self.internal_port)

    @property
    def directory(self) -> Path:
        """Return the broker's data directory (its config, log4j2 config and log dirs)."""
        if self.data_dir is not None:
            return self.data_dir
        if self._temp_dir is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="iqgraph-kafka-"))
        return self._temp_dir

    @property
    def pid(self) -> int | None:
        """Return the broker JVM's process id from launch to stop (or kill)."""
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        """Return whether the broker JVM is running."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> KafkaBroker:
        """Start the broker and wait until it is registered, unfenced and answering metadata requests."""
        began = time.monotonic()
        self.launch()
        try:
            self.wait_ready(began + self.startup_timeout)
            self._add_scram_users()
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - began
        log.info("Apache Kafka %s ready on %s in %.1f s", KAFKA_VERSION, self.bootstrap_servers, self.ready_seconds)
        return self

    def _add_scram_users(self) -> None:
        """Create (or update) a secured broker's SCRAM-SHA-512 users, which KRaft keeps in its metadata log."""
        if self.security is None or not self.security.scram_users:
            return
        credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(name, credential, password.encode())
            for name, password in self.security.scram_users.items()
        ]
        for name, future in self.admin().alter_user_scram_credentials(upserts).items():
            try:
                future.result(self.startup_timeout)
            except KafkaException as exc:
                raise BrokerError(f"could not create SCRAM user {name!r}: {exc}") from exc

    def launch(self) -> None:
        """Write the config, format the log dir if it is new, and start the JVM without waiting for it."""
        if self._process is not None:
            raise BrokerError("broker already started")
        java, jars = java_binary(), kafka_jars()
        try:
            format_command = self._prepare(java, jars)
            if format_command is not None:
                _run_all([format_command], self.startup_timeout)
            if self.data_dir is not None:
                (self.directory / PORT_FILE).write_text(str(self.port))
            self._log = self._open_output()  # closed in stop()
            command = [java, *self._jvm_options(self.heap), "-cp", str(jars / "*"), _MAIN_CLASS]
            command.append(str(self.directory / "server.properties"))
            # its own session: a terminal's Ctrl-C must not kill the broker before the clients that use it stop
            self._process = subprocess.Popen(  # noqa: S603 - java with the checked jars
                command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=exit_with_parent
            )
        except OSError as exc:
            self.stop()
            raise BrokerError(f"could not start Apache Kafka: {exc}") from exc
        except BaseException:
            self.stop()
            raise

    def _prepare(self, java: str, jars: Path) -> list[str] | None:
        """Write the config files; return the command that formats the log dir for KRaft, None if it is formatted."""
        config = self._write_config()
        if (self.log_dir / "meta.properties").exists():
            return None
        self.cluster_id = self.cluster_id or _new_cluster_id()
        # what `kafka-storage.sh format` runs, with the static quorum of controller.quorum.voters
        command = [java, *self._jvm_options("256m"), "-cp", str(jars / "*"), _STORAGE_TOOL, "format"]
        return [*command, "-t", self.cluster_id, "-c", str(config)]

    @property
    def log_dir(self) -> Path:
        """Return the broker's one log dir, which also holds the KRaft metadata log."""
        return self.directory / "logs"

    def _write_config(self) -> Path:
        """Write server.properties and log4j2.properties into the data directory; return the former's path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "log4j2.properties").write_text(_LOG4J2, encoding="utf-8")
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.quorum_voters,
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            **ONE_MACHINE_PROPERTIES,
            **self._security_properties(),
            **self.properties,
        }
        path = self.directory / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()), encoding="utf-8")
        return path

    def _security_properties(self) -> dict[str, str]:
        """Return a secured broker's listener, TLS, SASL and ACL settings (none for a PLAINTEXT one)."""
        if self.security is None or self.internal_port is None:
            return {}
        return self.security.properties(self.host, self.port, self.internal_port, self.controller_port)

    def _jvm_options(self, heap: str) -> list[str]:
        """Return the JVM options: `JVM_OPTIONS`, the heap, our log4j2 config, crash files in the data dir, extras."""
        options = [*JVM_OPTIONS, f"-Xmx{heap}", f"-XX:ErrorFile={self.directory / 'hs_err_pid%p.log'}"]
        options.append(f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}")
        return [*options, *java_options(KAFKA), *self.jvm_options]  # Kafka's classes from their archive when built

    def wait_ready(self, deadline: float) -> None:
        """Wait until the port accepts connections and the metadata lists this broker (registered and unfenced)."""
        while not self._accepts_connections():
            if time.monotonic() > deadline:
                raise BrokerError(f"no listener on {self.bootstrap_servers} in time{self._log_tail()}")
            time.sleep(0.05)
        while True:
            metadata = self._metadata(deadline)
            if metadata is not None and self.node_id in metadata.brokers:
                return
            self._check_alive()
            if time.monotonic() > deadline:
                raise BrokerError(f"broker {self.node_id} not in the metadata in time{self._log_tail()}")
            time.sleep(0.05)

    def _accepts_connections(self) -> bool:
        """Return whether the broker port accepts TCP connections; raise if the process died."""
        self._check_alive()
        try:
            socket.create_connection((self.host, self.port), timeout=0.2).close()
        except OSError:
            return False
        return True

    def _check_alive(self) -> None:
        """Raise `BrokerError` when the JVM is not running."""
        if self._process is None or self._process.poll() is not None:
            code = None if self._process is None else self._process.returncode
            tail = self._log_tail()
            if "UnsupportedClassVersionError" in tail:
                raise BrokerError(f"Apache Kafka {KAFKA_VERSION} needs Java 17 or newer: {INSTALL_JAVA}")
            raise BrokerError(f"Apache Kafka exited with code {code}{tail}")

    def _open_output(self) -> IO[bytes]:
        """Return the file the JVM's output goes to: a temporary one, or with a kept data_dir its `OUTPUT_FILE`,
        appended to at each start (what a broker logged before a restart stays there to be read after a drill)."""
        if self.data_dir is None:
            self._output_start = 0
            return tempfile.TemporaryFile(prefix="kafka-")
        output = (self.directory / OUTPUT_FILE).open("a+b")
        output.write(f"---- started {datetime.now(UTC).isoformat(timespec='milliseconds')}\n".encode())
        output.flush()
        self._output_start = output.tell()
        return output

    def _log_tail(self, size: int = 3000) -> str:
        """Return the end of the broker's output, for error messages."""
        if self._log is None:
            return ""
        self._log.seek(0, os.SEEK_END)
        self._log.seek(max(self._log.tell() - size, self._output_start))
        return "\nkafka output:\n" + self._log.read().decode(errors="replace")

    def output(self) -> str:
        """Return everything the broker has logged since it started (its log4j2 output)."""
        if self._log is None:
            return ""
        self._log.seek(self._output_start)
        return self._log.read().decode(errors="replace")

    def terminate(self) -> None:
        """Send SIGTERM to the JVM (a controlled shutdown) without waiting for it to exit."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Kill the JVM at once (SIGKILL, like kill -9), keeping the data directory so that `start` resumes it."""
        process, self._process = self._process, None
        self._admin = None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        self._close_log()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the broker: SIGTERM, wait, SIGKILL if it does not exit in time; delete a temporary data dir."""
        self._admin = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("Apache Kafka on %s did not stop in %.0f s: killed", self.bootstrap_servers, timeout)
                process.kill()
                process.wait()
        self._close_log()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def _close_log(self) -> None:
        """Close the broker's output file."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class KafkaCluster(_Endpoint):
    """size KRaft brokers on loopback ports, each also a controller (a quorum of size voters), as one cluster.

    Topics default to replication factor min(size, 3) and min.insync.replicas 2 (1 below three brokers), and so do
    Kafka's internal topics. `brokers` are the members: kill one (`KafkaBroker.kill`) and `start` it again to test
    failover; each keeps its data directory (data_dir/node-<id>; a temporary root deleted by `stop` when None).
    """

    def __init__(
        self,
        *,
        size: int = 3,
        host: str = "127.0.0.1",
        startup_timeout: float = 60.0,
        data_dir: Path | None = None,
        properties: Mapping[str, str] | None = None,
        heap: str = "512m",
        jvm_options: Sequence[str] = (),
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one broker")
        self.startup_timeout = startup_timeout
        self._temp_dir = None if data_dir is not None else Path(tempfile.mkdtemp(prefix="iqgraph-kafka-cluster-"))
        root = data_dir or self._temp_dir
        assert root is not None  # noqa: S101 - one of the two is set
        ports = free_ports(2 * size, host=host)
        voters = ",".join(f"{i + 1}@{host}:{ports[2 * i + 1]}" for i in range(size))
        replicas, min_isr = str(min(size, 3)), str(2 if size >= 3 else 1)
        replicated = {
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
        }
        cluster_id = _new_cluster_id()
        self.brokers = [
            KafkaBroker(
                host=host,
                port=ports[2 * i],
                controller_port=ports[2 * i + 1],
                startup_timeout=startup_timeout,
                data_dir=root / f"node-{i + 1}",
                properties={**replicated, **(properties or {})},
                node_id=i + 1,
                quorum_voters=voters,
                cluster_id=cluster_id,
                heap=heap,
                jvm_options=jvm_options,
            )
            for i in range(size)
        ]
        self.ready_seconds: float | None = None
        self._admin = None

    @property
    def bootstrap_servers(self) -> str:
        """Return the bootstrap servers string of every member."""
        return ",".join(broker.bootstrap_servers for broker in self.brokers)

    def start(self) -> KafkaCluster:
        """Start every member and wait until the metadata lists them all."""
        began = time.monotonic()
        deadline = began + self.startup_timeout
        try:
            java, jars = java_binary(), kafka_jars()
            formats = [command for broker in self.brokers if (command := broker._prepare(java, jars)) is not None]
            _run_all(formats, self.startup_timeout)  # side by side: each is a JVM start
            for broker in self.brokers:  # all JVMs first: a controller quorum needs a majority up to elect a leader
                broker.launch()
            for broker in self.brokers:
                broker.wait_ready(deadline)
            self._wait_for_members(deadline)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - began
        log.info("Apache Kafka cluster of %d ready in %.1f s", len(self.brokers), self.ready_seconds)
        return self

    def _wait_for_members(self, deadline: float) -> None:
        """Wait until the cluster's metadata lists every member as a live broker."""
        ids = {broker.node_id for broker in self.brokers}
        while True:
            metadata = self._metadata(deadline)
            if metadata is not None and ids <= set(metadata.brokers):
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"brokers {sorted(ids)} not all in the metadata in time")
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every member and delete a temporary root; a kept data_dir gets a controlled shutdown.

        Kept: SIGTERM to all, then wait, SIGKILL past timeout (the last members, without a controller quorum, wait
        for one until then). Temporary: SIGKILL at once, there being nothing to keep.
        """
        self._admin = None
        if self._temp_dir is not None:
            for broker in self.brokers:
                broker.kill()
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
            return
        for broker in self.brokers:
            broker.terminate()
        deadline = time.monotonic() + timeout
        for broker in self.brokers:
            broker.stop(max(deadline - time.monotonic(), 0.1))

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _run(args: argparse.Namespace) -> int:
    """Run a broker in the foreground until interrupted."""
    ensure_kafka_jars()
    broker = KafkaBroker(port=args.port, data_dir=args.data_dir)
    with broker:
        print(f"Apache Kafka {KAFKA_VERSION} on {broker.bootstrap_servers}, ready in {broker.ready_seconds:.1f} s")
        with contextlib.suppress(KeyboardInterrupt):
            while broker.running:
                time.sleep(1.0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line: fetch, lock or run."""
    parser = argparse.ArgumentParser(
        prog="python -m iqgraph.streaming.apache_kafka", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="download and check the broker's and Spark's Kafka connector's jars")
    lock = commands.add_parser("lock", help="rewrite the locks in kafka/ from their poms")
    lock.add_argument("only", nargs="?", choices=sorted(JAR_SETS), help="only this set (default: every set)")
    run = commands.add_parser("run", help="run a broker in the foreground until Ctrl-C")
    run.add_argument("--port", type=int, default=None, help="broker port (default: a free one)")
    run.add_argument("--data-dir", type=Path, default=None, help="kept data directory (default: a temporary one)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            for jars in JAR_SETS.values():
                print(f"{jars.label} jars in {jars.ensure()}")
            return 0
        if args.command == "lock":
            for name, jars in JAR_SETS.items():
                if args.only in (None, name):
                    jars.write_lock()
            return 0
        return _run(args)
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
