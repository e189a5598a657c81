"""The pinned jars every node needs: Apache Kafka's (the broker) and Spark's Kafka connector, fetched, checked, cached.

The broker's jars come from Maven Central: ``kafka/pom.xml`` beside this module names them, ``mvn`` resolves and
downloads them (checking Maven's checksums) and `ensure_kafka_jars` then checks each against ``kafka/jars.lock``
(name, size, sha256) before it keeps them under `kafka_home`, so a second install finds them there and downloads
nothing. Starting a broker (``streaming.apache_kafka.KafkaBroker``) never downloads: without the jars (or without
Java) it raises a `JarsError` or ``BrokerError`` saying what to run.

Spark's own Kafka source (``spark-sql-kafka-0-10`` of pyspark's exact version, `SPARK_KAFKA_VERSION`) is fetched
the same way (`JarSet`): ``kafka/spark-kafka-pom.xml`` names it, excluding what pyspark already ships in its jars/,
``kafka/spark-kafka-jars.lock`` pins the rest (the connector, its token provider, kafka-clients, commons-pool2),
`ensure_spark_kafka_jars` keeps them under ~/.cache/iqgraph/spark-kafka-<version> (or $IQGRAPH_SPARK_KAFKA_HOME)
and `spark_kafka_jars` lists them for the node's session (``spark.jars``: ``streaming.session``).

The command line stays ``python -m iqgraph.streaming.apache_kafka fetch|lock`` (`FETCH_COMMAND`), beside ``run``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.resources
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from iqgraph.streaming.broker import BrokerError

__all__ = [
    "BROKER_JARS",
    "FETCH_COMMAND",
    "HOME_ENV",
    "INSTALL_JAVA",
    "JAR_SETS",
    "KAFKA_VERSION",
    "SPARK_KAFKA_HOME_ENV",
    "SPARK_KAFKA_JARS",
    "SPARK_KAFKA_VERSION",
    "DEPRECATED_OFFSET_FETCHING",
    "JarSet",
    "JarsError",
    "LockedJar",
    "ensure_kafka_jars",
    "ensure_spark_kafka_jars",
    "java_binary",
    "kafka_home",
    "kafka_jars",
    "lock_jars",
    "locked_jars",
    "spark_kafka_jars",
    "unrunnable_spark_conf",
]

#: The Apache Kafka release that kafka/pom.xml and kafka/jars.lock pin.
KAFKA_VERSION: Final = "4.4.0"
#: Environment variable naming the directory that holds (or is to hold) the jars; default `kafka_home()`.
HOME_ENV: Final = "IQGRAPH_KAFKA_HOME"
#: Spark's Kafka connector (spark-sql-kafka-0-10_2.13) that kafka/spark-kafka-pom.xml pins: pyspark's exact version.
SPARK_KAFKA_VERSION: Final = "4.2.0"
#: Environment variable naming the directory of the connector's jars; default ~/.cache/iqgraph/spark-kafka-<version>.
SPARK_KAFKA_HOME_ENV: Final = "IQGRAPH_SPARK_KAFKA_HOME"
#: What a one-line error about missing jars tells the user to run (the command line lives in apache_kafka).
FETCH_COMMAND: Final = "python -m iqgraph.streaming.apache_kafka fetch"

_LIBS = "libs"
_MARKER = "jars.lock"  # a copy of the package's lock, written last: the jars beside it were checked against it
#: What to do when there is no Java 17+ (the end of a one-line error).
INSTALL_JAVA: Final = "install a Java 17+ runtime (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"


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


def locked_jars() -> list[LockedJar]:
    """Return the jars that jars.lock pins, in its order."""
    return BROKER_JARS.locked()


def kafka_home() -> Path:
    """Return the directory of this Kafka release's jars: $IQGRAPH_KAFKA_HOME, else one in the user's cache."""
    return BROKER_JARS.home()


def kafka_jars() -> Path:
    """Return the directory of the installed jars; raise `BrokerError` (one line) when they are missing."""
    return BROKER_JARS.libs()


def spark_kafka_jars() -> list[Path]:
    """Return the paths of Spark's Kafka connector jars; raise `JarsError` (one line) when they are missing."""
    return SPARK_KAFKA_JARS.paths()


#: Spark's switch back to its Kafka source's consumer-based offset listing, which the pinned kafka-clients 4.4.0 cannot
#: run (it calls Consumer.poll(long), gone since Kafka 4.0; spark-kafka-pom.xml says why 4.4.0).
DEPRECATED_OFFSET_FETCHING: Final = "spark.sql.streaming.kafka.useDeprecatedOffsetFetching"


def unrunnable_spark_conf(conf: Mapping[str, object]) -> str | None:
    """Return, in one line, why Spark's Kafka connector cannot run with these Spark settings; None when it can."""
    if str(conf.get(DEPRECATED_OFFSET_FETCHING, "")).strip().lower() != "true":
        return None
    return (
        f"--spark-conf {DEPRECATED_OFFSET_FETCHING}=true cannot run: Spark's consumer-based offset listing calls "
        "Consumer.poll(long), which the Kafka client iqgraph gives the connector (kafka-clients 4.4.0: its admin "
        "listing finds a dead leader's successor) no longer has; remove the setting"
    )


def java_binary() -> str:
    """Return the java executable ($JAVA_HOME/bin/java, else java on PATH); raise `BrokerError` if there is none."""
    if java_home := os.environ.get("JAVA_HOME"):
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise BrokerError(f"Apache Kafka {KAFKA_VERSION} needs Java 17 or newer and there is no java: {INSTALL_JAVA}")
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
