"""Spark's driver JVM and the embedded Kafka broker's started from class-data-sharing archives (Java's dynamic
AppCDS, JDK 13+).

A node's start loads ~15,000 of Spark's classes, a broker's ~5,000 of Kafka's: the JVM reads, parses and verifies
each, every time. An archive holds them as they are once loaded, in a file under ``~/.cache/iqgraph/jvm``
(``$IQGRAPH_JVM_ARCHIVE`` for another directory, ``off`` for none), and every later start maps it. Measured on two
cores (docs/benchmarks.md, "Spark's and Kafka's JVMs from class archives"): a node to /readyz 200 16.1 -> 11.2 s
(medians), a broker to ready 4.1-4.4 -> 2.2-2.3 s.

``python -m iqgraph.streaming.jvm_archive build`` makes both (the test session does first; nodes and brokers
never do): a JVM runs a small job (Spark: a batch and a streaming query; Kafka: a broker that takes idempotent
writes and a group's reads) and writes the archive as it exits, into a file of its own that is moved into place
only once whole (its header, written last, read back, and its size), so no start maps a partial one: a JVM that
maps a file cut short dies of SIGBUS. `java_options` is what a start adds when it is there. The archive's name
holds what it depends on (the Java binary, the class path's jars) and its size: another Java or another jar looks
for another file. A JVM that still cannot use it starts as it did without: ``-Xshare:auto``, and the JVM's
class-sharing warnings off.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from iqgraph.streaming.broker import BrokerError
from iqgraph.streaming.kafka_jars import java_binary, kafka_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The first 4 bytes of a complete dynamic archive (HotSpot's CDS_DYNAMIC_ARCHIVE_MAGIC, little-endian): the JVM
#: writes its header last, so a file cut short by a killed dump does not start with them.
DYNAMIC_ARCHIVE_MAGIC = (0xF00BABA8).to_bytes(4, "little")
#: The JVM's own lines about class sharing, off: a start that cannot map the archive says so on stdout otherwise.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
#: The JVMs archived: Spark's driver, the embedded Kafka broker (and its storage tool).
SPARK, KAFKA = "spark", "kafka"


class ArchiveError(RuntimeError):
    """Building an archive failed."""


def _jars(kind: str) -> Path:
    """Return the directory of the jars on the class path of kind's JVM."""
    if kind == SPARK:
        import pyspark  # not at the top: a broker's start needs no pyspark

        return Path(pyspark.__file__).parent / "jars"
    return kafka_jars()


def archive_stem(kind: str) -> Path | None:
    """Return the path of kind's archive for this Java and these jars without its size and suffix (whether built or
    not); None when switched off, or when there is no Java or no jars."""
    setting = os.environ.get("IQGRAPH_JVM_ARCHIVE", "")
    if setting.lower() == "off":
        return None
    try:
        java, jars = Path(java_binary()).resolve(), _jars(kind)
    except BrokerError:
        return None
    stat = java.stat()
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    key = "\n".join([str(java), str(stat.st_size), str(stat.st_mtime_ns), str(jars.resolve()), *names])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "iqgraph" / "jvm"
    return (Path(setting).expanduser() if setting else cache) / f"{kind}-{digest}"


def whole(path: Path, name: Path | None = None) -> bool:
    """Return whether path is a whole dynamic archive: its header (written last) is there, and it has the size its
    name (path's own, or the one given) says."""
    try:
        size = int((name or path).suffixes[-2][1:])
        with path.open("rb") as file:
            return file.read(4) == DYNAMIC_ARCHIVE_MAGIC and os.fstat(file.fileno()).st_size == size
    except (OSError, ValueError, IndexError):
        return False


def archive(kind: str) -> Path | None:
    """Return kind's whole archive for this Java and these jars, or None."""
    stem = archive_stem(kind)
    if stem is None or not stem.parent.is_dir():
        return None
    return next((path for path in sorted(stem.parent.glob(f"{stem.name}.*.jsa")) if whole(path)), None)


def java_options(kind: str = SPARK) -> list[str]:
    """Return the JVM options that start kind's JVM from its archive, or [] when there is none."""
    path = archive(kind)
    return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", *QUIET] if path is not None else []


def build(timeout_s: float = 900.0) -> list[Path]:
    """Return the archives, built first in a child process (a JVM writes its archive as it exits) unless they are
    there; none when switched off. Raises `ArchiveError` when the child fails."""
    kinds = [kind for kind in (SPARK, KAFKA) if archive_stem(kind) is not None]
    if any(archive(kind) is None for kind in kinds):
        command = [sys.executable, "-m", "iqgraph.streaming.jvm_archive", "build"]
        child = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603
        if child.returncode != 0:
            raise ArchiveError(f"building the JVMs' class archives failed: {child.stderr.strip()[-2000:]}")
    return [path for kind in kinds if (path := archive(kind)) is not None]


def _build_here(kind: str) -> Path | None:
    """Build kind's archive in this process unless it is there (one builder at a time); return it (None: off)."""
    stem = archive_stem(kind)
    if stem is None:
        return None
    stem.parent.mkdir(parents=True, exist_ok=True)
    with stem.with_name(f"{stem.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another builder's archive is then there
        if found := archive(kind):
            return found
        partial = stem.with_name(f"{stem.name}.{os.getpid()}.partial")
        try:
            BUILDERS[kind]([f"-XX:ArchiveClassesAtExit={partial}", *QUIET])
            path = stem.with_name(f"{stem.name}.{partial.stat().st_size if partial.exists() else 0}.jsa")
            if not whole(partial, path):
                raise ArchiveError(f"the JVM wrote no whole class archive at {partial}")
            os.replace(partial, path)
            stem.with_name(f"{stem.name}.jars").write_text(str(_jars(kind).resolve()))
            _forget_gone(stem.parent, kind)
            return path
        finally:
            partial.unlink(missing_ok=True)


def _forget_gone(directory: Path, kind: str) -> None:
    """Delete kind's archives whose jars are gone: each virtualenv has its own pyspark, so its own Spark archive
    (~180 MB), useless once it is deleted."""
    for record in directory.glob(f"{kind}-*.jars"):
        if not Path(record.read_text().strip()).is_dir():
            for path in directory.glob(f"{record.stem}.*"):
                path.unlink(missing_ok=True)


def _run_spark(options: list[str]) -> None:
    """Run a small batch and streaming job in a Spark JVM given options, and wait until that JVM has exited."""
    from pyspark import SparkContext

    from iqgraph.streaming.session import build_spark_session

    extra = {"spark.driver.extraJavaOptions": " ".join(options)}
    spark = build_spark_session("local[2]", shuffle_partitions=2, extra_conf=extra)
    try:
        _spark_jobs(spark)
    finally:
        spark.stop()
        process = getattr(SparkContext._gateway, "proc", None)
        if process is not None and process.stdin is not None:
            process.stdin.close()  # the JVM exits once its stdin closes, writing the archive first
            process.wait(timeout=300)


def _spark_jobs(spark: SparkSession) -> None:
    """Run what a node's start runs, in small: a batch aggregation, Arrow in a Python task, a streaming query with
    a Python foreachBatch over a file source."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    frame = spark.range(10_000).selectExpr("CAST(id % 7 AS STRING) AS key", "id AS value")
    frame.groupBy("key").agg(F.sum("value"), F.count("*")).collect()
    frame.mapInArrow(lambda batches: batches, frame.schema).count()
    with tempfile.TemporaryDirectory(prefix="iqgraph-jvm-archive-") as scratch:
        frame.write.parquet(f"{scratch}/in")

        def batch(part: DataFrame, _epoch: int) -> None:
            part.groupBy("key").agg(F.max("value")).toArrow()

        query = (
            spark.readStream.schema(frame.schema)
            .parquet(f"{scratch}/in")
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", f"{scratch}/checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()


def _run_kafka(options: list[str]) -> None:
    """Run a broker given options through idempotent and transactional writes and a group's reads, then stop it
    (a controlled shutdown: its JVM exits, writing the archive first)."""
    from confluent_kafka import Consumer, Producer

    from iqgraph.streaming.apache_kafka import KafkaBroker

    broker = KafkaBroker(jvm_options=options, startup_timeout=120).start()
    try:
        broker.create_topics({"archive": 2})
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "archive"})
        producer.init_transactions(60)
        producer.begin_transaction()
        for i in range(1000):
            producer.produce("archive", key=str(i).encode(), value=b"x")
        producer.commit_transaction(60)
        group = {"bootstrap.servers": broker.bootstrap_servers, "group.id": "archive", "auto.offset.reset": "earliest"}
        consumer = Consumer(group)
        consumer.subscribe(["archive"])
        read, deadline = 0, time.monotonic() + 60
        while read < 1000 and time.monotonic() < deadline:
            message = consumer.poll(1)
            read += message is not None and message.error() is None
        consumer.commit(asynchronous=False)
        consumer.close()
    finally:
        broker.stop(timeout=120)  # the archive is written between the shutdown and the exit


BUILDERS: dict[str, Callable[[list[str]], None]] = {SPARK: _run_spark, KAFKA: _run_kafka}


def main(argv: list[str]) -> int:
    """``build``: build the archives unless they are there; print where they are."""
    if argv != ["build"]:
        print("usage: python -m iqgraph.streaming.jvm_archive build", file=sys.stderr)
        return 2
    for kind in (SPARK, KAFKA):
        began = time.monotonic()
        path = _build_here(kind)
        if path is None:
            print(f"no class archive of {kind}'s JVM: IQGRAPH_JVM_ARCHIVE=off, or no Java or jars found")
        else:
            took = time.monotonic() - began
            print(f"{kind}'s class archive: {path} ({path.stat().st_size / 1e6:.0f} MB, {took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
