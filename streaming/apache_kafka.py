"""Apache Kafka on this machine: the pinned release's jars, and brokers run as subprocesses on loopback ports.

The broker is Apache Kafka `KAFKA_VERSION` in KRaft mode, one JVM that is both broker and controller
(`KafkaBroker`), or several such JVMs forming one cluster (`KafkaCluster`). Its jars come from Maven Central:
``kafka/pom.xml`` beside this module names them, ``mvn`` resolves and downloads them (checking Maven's checksums)
and `ensure_kafka_jars` then checks each against ``kafka/jars.lock`` (name, size, sha256) before it keeps them
under `kafka_home`, so a second install finds them there and downloads nothing. Starting a broker never
downloads: without the jars (or without Java) it raises `BrokerError` saying what to run.

Spark's own Kafka source (``spark-sql-kafka-0-10`` of pyspark's exact version, `SPARK_KAFKA_VERSION`) is fetched
the same way (`JarSet`): ``kafka/spark-kafka-pom.xml`` names it, excluding what pyspark already ships in its jars/,
``kafka/spark-kafka-jars.lock`` pins the rest (the connector, its token provider, kafka-clients, commons-pool2),
`ensure_spark_kafka_jars` keeps them under ~/.cache/iqgraph/spark-kafka-<version> (or $IQGRAPH_SPARK_KAFKA_HOME)
and `spark_kafka_jars` lists them for the node's session (``spark.jars``: ``streaming.session``).

    python -m iqgraph.streaming.apache_kafka fetch     # install time: download and check both sets of jars
    python -m iqgraph.streaming.apache_kafka run       # a broker in the foreground until Ctrl-C
    python -m iqgraph.streaming.apache_kafka lock      # after changing a pom in kafka/: rewrite the locks
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import importlib.resources
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from iqgraph.streaming.broker import BrokerError, exit_with_parent, free_port, free_ports

__all__ = [
    "BROKER_JARS",
    "HOME_ENV",
    "JAR_SETS",
    "JVM_OPTIONS",
    "KAFKA_VERSION",
    "ONE_MACHINE_PROPERTIES",
    "SPARK_KAFKA_HOME_ENV",
    "SPARK_KAFKA_JARS",
    "SPARK_KAFKA_VERSION",
    "JarSet",
    "JarsError",
    "KafkaBroker",
    "KafkaCluster",
    "LockedJar",
    "ensure_kafka_jars",
    "ensure_spark_kafka_jars",
    "java_binary",
    "kafka_home",
    "kafka_jars",
    "locked_jars",
    "lock_jars",
    "spark_kafka_jars",
]

log = logging.getLogger(__name__)

#: The Apache Kafka release that kafka/pom.xml and kafka/jars.lock pin.
KAFKA_VERSION: Final = "4.4.0"
#: Environment variable naming the directory that holds (or is to hold) the jars; default `kafka_home()`.
HOME_ENV: Final = "IQGRAPH_KAFKA_HOME"
#: Spark's Kafka connector (spark-sql-kafka-0-10_2.13) that kafka/spark-kafka-pom.xml pins: pyspark's exact version.
SPARK_KAFKA_VERSION: Final = "4.2.0"
#: Environment variable naming the directory of the connector's jars; default ~/.cache/iqgraph/spark-kafka-<version>.
SPARK_KAFKA_HOME_ENV: Final = "IQGRAPH_SPARK_KAFKA_HOME"
FETCH_COMMAND: Final = "python -m iqgraph.streaming.apache_kafka fetch"

_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"  # a Scala object in kafka_2.13 up to 4.4 at least
_LIBS = "libs"
_MARKER = "jars.lock"  # a copy of the package's lock, written last: the jars beside it were checked against it
_INSTALL_JAVA = "install a Java 17+ runtime (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
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


@dataclass(frozen=True)
class LockedJar:
    """A jar the broker needs: its file name, size in bytes and sha256, as jars.lock pins them."""

    name: str
    size: int
    sha256: str


def _package_file(name: str) -> Path:
    """Return the path of a file shipped in this package's kafka/ folder."""
    return Path(str(importlib.resources.files("iqgraph.streaming").joinpath("kafka", name)))


class JarsError(BrokerError):
    """A set of jars is not installed, or could not be fetched or checked (one line saying what to run)."""


@dataclass(frozen=True)
class JarSet:
    """Jars that a pom in kafka/ names and a lock beside it pins (name, size, sha256), cached under a directory.

    `ensure` downloads them with mvn (checking Maven's checksums), checks each against the lock and keeps them
    under `home`/libs with a copy of the lock written last, so a second install finds them and downloads nothing.
    """

    label: str  # what people read: "Apache Kafka 4.4.0"
    pom: str  # file names in kafka/
    lock: str
    cache_name: str  # the directory under ~/.cache/iqgraph
    home_env: str  # the environment variable that overrides that directory

    def home(self) -> Path:
        """Return the directory of the jars: $<home_env>, else one in the user's cache."""
        if override := os.environ.get(self.home_env):
            return Path(override).expanduser()
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return cache / "iqgraph" / self.cache_name

    def lock_text(self) -> str:
        """Return the text of the package's lock."""
        return _package_file(self.lock).read_text(encoding="utf-8")

    def locked(self) -> list[LockedJar]:
        """Return the jars that the lock pins, in its order."""
        jars = []
        for line in self.lock_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, size, sha256 = line.split()
                jars.append(LockedJar(name, int(size), sha256))
        return jars

    def installed(self, home: Path | None = None) -> bool:
        """Return whether home (default `home()`) holds every locked jar, checked against the current lock."""
        home = self.home() if home is None else home
        marker = home / _MARKER
        if not marker.is_file() or marker.read_text(encoding="utf-8") != self.lock_text():
            return False
        libs = home / _LIBS
        return all(
            (libs / jar.name).is_file() and (libs / jar.name).stat().st_size == jar.size for jar in self.locked()
        )

    def libs(self) -> Path:
        """Return the directory of the installed jars; raise `JarsError` (one line) when they are missing."""
        home = self.home()
        if not self.installed(home):
            raise JarsError(f"{self.label} jars are not installed in {home}: run `{FETCH_COMMAND}`")
        return home / _LIBS

    def paths(self) -> list[Path]:
        """Return the installed jars' paths in the lock's order; raise `JarsError` (one line) when they are missing."""
        libs = self.libs()
        return [libs / jar.name for jar in self.locked()]

    def ensure(self, progress: Callable[[str], object] = print) -> Path:
        """Return the directory of the jars, downloading and checking them first when they are missing."""
        home = self.home()
        if self.installed(home):
            return home / _LIBS
        home.mkdir(parents=True, exist_ok=True)
        with _exclusive(home / ".lock"):
            if not self.installed(home):  # another process may have installed them while this one waited
                self._install(home, progress)
        return home / _LIBS

    def _install(self, home: Path, progress: Callable[[str], object]) -> None:
        """Download the locked jars with mvn into home, check them and make them the installed set."""
        jars = self.locked()
        total = sum(jar.size for jar in jars)
        progress(f"{self.label}: {len(jars)} jars, {_size(total)}, from Maven Central (mvn) into {home}")
        began = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=home))
        try:
            self._copy_dependencies(staging, progress, {jar.name for jar in jars})
            self._verify(staging, jars)
            shutil.rmtree(home / _LIBS, ignore_errors=True)
            staging.chmod(0o755)  # mkdtemp made it private; the jars are public
            staging.rename(home / _LIBS)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        (home / _MARKER).write_text(self.lock_text(), encoding="utf-8")
        progress(f"{self.label}: {len(jars)} jars fetched and checked (sha256) in {time.monotonic() - began:.1f} s")

    def _copy_dependencies(
        self, target: Path, progress: Callable[[str], object], expected: set[str] | None = None
    ) -> None:
        """Run mvn on the package's pom to copy its runtime jars into target, reporting the downloads.

        A jar of 1 MB or more gets a line as it arrives, the smaller ones one line together; downloads of jars not
        in expected (mvn's own plugins, on its first run) are summed in one line.
        """
        mvn = shutil.which("mvn")
        if mvn is None:
            raise JarsError(f"fetching {self.label} needs Maven: apt-get install maven")
        tooling: list[float] = []  # mvn's own plugins, downloaded on its first run on a machine
        small: list[float] = []
        with tempfile.TemporaryDirectory(prefix="iqgraph-pom-") as workdir:
            pom = Path(workdir) / "pom.xml"  # mvn may write beside the pom: never into the installed package
            shutil.copyfile(_package_file(self.pom), pom)
            command = [mvn, "-B", "-C", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime"]
            command.append(f"-DoutputDirectory={target}")
            output: list[str] = []
            with subprocess.Popen(  # noqa: S603 - mvn from PATH, fixed arguments
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir
            ) as process:
                assert process.stdout is not None  # noqa: S101 - stdout=PIPE
                for line in process.stdout:
                    output.append(line)
                    if match := _DOWNLOADED.search(line):
                        name, size = match.group(1), float(match.group(2)) * _UNITS[match.group(3)]
                        if expected is not None and name not in expected:
                            tooling.append(size)
                        elif size < _NAMED_FROM_BYTES:
                            small.append(size)
                        else:
                            progress(f"  downloaded {name} ({_size(size)})")
            if process.returncode != 0:
                tail = "".join(output[-25:])
                raise JarsError(f"mvn could not fetch {self.label} (exit {process.returncode}):\n{tail}")
        if small:
            progress(f"  and {len(small)} smaller jars ({_size(sum(small))})")
        if tooling:
            plugin = f"{len(tooling)} jars of Maven's dependency plugin ({_size(sum(tooling))})"
            progress(f"  and {plugin}, once per machine")

    def _verify(self, directory: Path, jars: Sequence[LockedJar]) -> None:
        """Check that directory holds exactly the locked jars, each with its locked size and sha256."""
        found = {path.name for path in directory.glob("*.jar")}
        expected = {jar.name for jar in jars}
        if found != expected:
            raise JarsError(
                f"mvn resolved other jars than {self.lock}: missing {sorted(expected - found)}, "
                f"extra {sorted(found - expected)}"
            )
        for jar in jars:
            path = directory / jar.name
            digest = _sha256(path)
            if path.stat().st_size != jar.size or digest != jar.sha256:
                raise JarsError(f"{jar.name} does not match {self.lock}: sha256 {digest}, expected {jar.sha256}")

    def write_lock(self, progress: Callable[[str], object] = print) -> Path:
        """Resolve the pom with mvn and rewrite the lock from the jars it copies; return the lock's path."""
        lock = _package_file(self.lock)
        with tempfile.TemporaryDirectory(prefix="iqgraph-lock-") as directory:
            self._copy_dependencies(Path(directory), progress)
            paths = sorted(Path(directory).glob("*.jar"), key=lambda path: path.name.lower())
            lines = [f"{path.name} {path.stat().st_size} {_sha256(path)}" for path in paths]
        total = sum(int(line.split()[1]) for line in lines)
        header = [
            f"# {self.label}: the runtime jars of {self.pom} as mvn resolved them from Maven Central,",
            f"# {len(lines)} jars, {total} bytes. Written by `python -m iqgraph.streaming.apache_kafka lock`.",
            "# file size-in-bytes sha256",
        ]
        lock.write_text("\n".join([*header, *lines]) + "\n", encoding="utf-8")
        progress(f"wrote {lock}: {len(lines)} jars, {_size(total)}")
        return lock


#: The broker's jars (kafka/pom.xml, kafka/jars.lock).
BROKER_JARS: Final = JarSet(f"Apache Kafka {KAFKA_VERSION}", "pom.xml", "jars.lock", f"kafka-{KAFKA_VERSION}", HOME_ENV)
#: Spark's Kafka connector (spark-sql-kafka-0-10 of pyspark's exact Spark version) and what it needs beyond the jars
#: pyspark ships (kafka/spark-kafka-pom.xml excludes those): given to the node's session as spark.jars.
SPARK_KAFKA_JARS: Final = JarSet(
    f"Spark's Kafka connector {SPARK_KAFKA_VERSION}",
    "spark-kafka-pom.xml",
    "spark-kafka-jars.lock",
    f"spark-kafka-{SPARK_KAFKA_VERSION}",
    SPARK_KAFKA_HOME_ENV,
)
#: Every jar set that `fetch` installs and `lock` rewrites, by the name the command line gives it.
JAR_SETS: Final[Mapping[str, JarSet]] = MappingProxyType({"kafka": BROKER_JARS, "spark-kafka": SPARK_KAFKA_JARS})


def _lock_text() -> str:
    """Return the text of the package's jars.lock."""
    return BROKER_JARS.lock_text()


def locked_jars() -> list[LockedJar]:
    """Return the jars that jars.lock pins, in its order."""
    return BROKER_JARS.locked()


def kafka_home() -> Path:
    """Return the directory of this Kafka release's jars: $IQGRAPH_KAFKA_HOME, else one in the user's cache."""
    return BROKER_JARS.home()


def _installed(home: Path) -> bool:
    """Return whether home holds every locked jar, checked against the current lock."""
    return BROKER_JARS.installed(home)


def kafka_jars() -> Path:
    """Return the directory of the installed jars; raise `BrokerError` (one line) when they are missing."""
    return BROKER_JARS.libs()


def spark_kafka_jars() -> list[Path]:
    """Return the paths of Spark's Kafka connector jars; raise `JarsError` (one line) when they are missing."""
    return SPARK_KAFKA_JARS.paths()


def java_binary() -> str:
    """Return the java executable ($JAVA_HOME/bin/java, else java on PATH); raise `BrokerError` if there is none."""
    if java_home := os.environ.get("JAVA_HOME"):
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise BrokerError(f"Apache Kafka {KAFKA_VERSION} needs Java 17 or newer and there is no java: {_INSTALL_JAVA}")
    return found


def _size(size: float) -> str:
    """Return a byte count for people: kB below a megabyte, else MB."""
    return f"{size / 1e3:.0f} kB" if size < 1e6 else f"{size / 1e6:.1f} MB"


def ensure_kafka_jars(progress: Callable[[str], object] = print) -> Path:
    """Return the directory of the broker's jars, downloading and checking them first when they are missing."""
    return BROKER_JARS.ensure(progress)


def ensure_spark_kafka_jars(progress: Callable[[str], object] = print) -> list[Path]:
    """Return the paths of Spark's Kafka connector jars, downloading and checking them first when missing."""
    SPARK_KAFKA_JARS.ensure(progress)
    return SPARK_KAFKA_JARS.paths()


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on path (created if missing) for the block: one install at a time."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_DOWNLOADED = re.compile(r"Downloaded from \S+: \S+/([^/\s]+\.jar) \(([\d.]+) (B|kB|MB|GB)\b")
_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
_NAMED_FROM_BYTES = 1e6  # a downloaded jar this large gets its own line; the smaller ones share one


def _sha256(path: Path) -> str:
    """Return the hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def lock_jars(progress: Callable[[str], object] = print) -> Path:
    """Resolve kafka/pom.xml with mvn and rewrite kafka/jars.lock from the jars it copies; return the lock's path."""
    return BROKER_JARS.write_lock(progress)


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

    def admin(self) -> AdminClient:
        """Return an AdminClient on `bootstrap_servers`, created on first use."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap_servers}, logger=log)
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


class KafkaBroker(_Endpoint):
    """An Apache Kafka KRaft broker and controller in one JVM subprocess, listening on loopback ports.

    data_dir None runs on a temporary directory deleted by `stop`; a given data_dir is kept, so a broker started
    again on it has the topics and records it had. properties override `ONE_MACHINE_PROPERTIES` and the listener
    settings; heap is the JVM's -Xmx and jvm_options come after `JVM_OPTIONS`. node_id, controller_port,
    quorum_voters and cluster_id are how `KafkaCluster` builds its members.
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
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.controller_port = controller_port or free_ports(1, {self.port}, host)[0]
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
        self._admin = None

    @property
    def bootstrap_servers(self) -> str:
        """Return the bootstrap servers string that clients connect to."""
        return f"{self.host}:{self.port}"

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
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - began
        log.info("Apache Kafka %s ready on %s in %.1f s", KAFKA_VERSION, self.bootstrap_servers, self.ready_seconds)
        return self

    def launch(self) -> None:
        """Write the config, format the log dir if it is new, and start the JVM without waiting for it."""
        if self._process is not None:
            raise BrokerError("broker already started")
        java, jars = java_binary(), kafka_jars()
        try:
            format_command = self._prepare(java, jars)
            if format_command is not None:
                _run_all([format_command], self.startup_timeout)
            self._log = tempfile.TemporaryFile(prefix="kafka-")  # closed in stop()
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
            **self.properties,
        }
        path = self.directory / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()), encoding="utf-8")
        return path

    def _jvm_options(self, heap: str) -> list[str]:
        """Return the JVM options: `JVM_OPTIONS`, the heap, our log4j2 config, crash files in the data dir, extras."""
        options = [*JVM_OPTIONS, f"-Xmx{heap}", f"-XX:ErrorFile={self.directory / 'hs_err_pid%p.log'}"]
        options.append(f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}")
        return [*options, *self.jvm_options]

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
                raise BrokerError(f"Apache Kafka {KAFKA_VERSION} needs Java 17 or newer: {_INSTALL_JAVA}")
            raise BrokerError(f"Apache Kafka exited with code {code}{tail}")

    def _log_tail(self, size: int = 3000) -> str:
        """Return the end of the broker's output, for error messages."""
        if self._log is None:
            return ""
        self._log.seek(0, os.SEEK_END)
        self._log.seek(max(self._log.tell() - size, 0))
        return "\nkafka output:\n" + self._log.read().decode(errors="replace")

    def output(self) -> str:
        """Return everything the broker has logged since it started (its log4j2 output)."""
        if self._log is None:
            return ""
        self._log.seek(0)
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
