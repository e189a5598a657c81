"""Spark's driver JVM started from a class-data-sharing archive (Java's dynamic AppCDS, JDK 13+).

A node's start loads ~15,000 of Spark's classes: the JVM reads, parses and verifies each, every time. The archive
holds them as they are once loaded, in a file under ``~/.cache/iqgraph/jvm`` (``$IQGRAPH_JVM_ARCHIVE`` for another
directory, ``off`` for none), and every later start maps it: a session and its first job took 8.4-10.2 s with it
against 14.1-17.6 s without, on two cores (docs/benchmarks.md, "Spark's JVM from a class archive").

``python -m iqgraph.streaming.jvm_archive build`` makes it (the test session does first; nodes never do): a child
JVM runs a small batch and streaming job and writes the archive as it exits, into a file of its own that is moved
into place only once complete (its header, written last, read back), so no start maps a partial one.
`java_options` is what a start adds when it is there. The archive's name holds what it depends on (the Java
binary, pyspark's version and jars): another Java or pyspark looks for another file. A JVM that still cannot use
it (another class path, say) starts as it did without: ``-Xshare:auto``, and the JVM's class-sharing warnings off.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyspark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class ArchiveError(RuntimeError):
    """Building the archive failed."""


#: The first 4 bytes of a complete dynamic archive (HotSpot's CDS_DYNAMIC_ARCHIVE_MAGIC, little-endian): the JVM
#: writes its header last, so a file cut short by a killed dump does not start with them.
DYNAMIC_ARCHIVE_MAGIC = (0xF00BABA8).to_bytes(4, "little")
#: The JVM's own lines about class sharing, off: a start that cannot map the archive says so on stdout otherwise.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> Path | None:
    """Return the Java binary pyspark starts ($JAVA_HOME's, else the first on PATH), resolved; None if none."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_stem() -> Path | None:
    """Return the archive's path for this Java and pyspark without its size and suffix (whether built or not);
    None when switched off or there is no Java."""
    setting = os.environ.get("IQGRAPH_JVM_ARCHIVE", "")
    java = _java()
    if setting.lower() == "off" or java is None:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    stat = java.stat()
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    key = "\n".join([str(java), str(stat.st_size), str(stat.st_mtime_ns), pyspark.__version__, str(jars), *names])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "iqgraph" / "jvm"
    return (Path(setting).expanduser() if setting else cache) / f"spark-{pyspark.__version__}-{digest}"


def whole(path: Path, name: Path | None = None) -> bool:
    """Return whether path is a whole dynamic archive: its header (written last) is there, and it has the size its
    name (path's own, or the one given) says: a JVM that maps a file cut short dies of SIGBUS."""
    try:
        size = int((name or path).suffixes[-2][1:])
        with path.open("rb") as file:
            return file.read(4) == DYNAMIC_ARCHIVE_MAGIC and os.fstat(file.fileno()).st_size == size
    except (OSError, ValueError, IndexError):
        return False


def archive() -> Path | None:
    """Return the whole archive for this Java and pyspark, or None."""
    stem = archive_stem()
    if stem is None or not stem.parent.is_dir():
        return None
    return next((path for path in sorted(stem.parent.glob(f"{stem.name}.*.jsa")) if whole(path)), None)


def java_options() -> str:
    """Return the driver JVM options that start it from the archive, or "" when there is none."""
    path = archive()
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {QUIET}" if path is not None else ""


def build(timeout_s: float = 600.0) -> Path | None:
    """Return the archive, built first in a child process (its JVM must exit to write it) unless it is there; None
    when switched off. Raises `ArchiveError` when the child fails."""
    if archive_stem() is None:
        return None
    if found := archive():
        return found
    command = [sys.executable, "-m", "iqgraph.streaming.jvm_archive", "build"]
    child = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603
    if child.returncode != 0:
        raise ArchiveError(f"building Spark's class archive failed: {child.stderr.strip()[-2000:]}")
    return archive()


def _build_here(timeout_s: float = 600.0) -> Path | None:
    """Build the archive in this process unless it is there (one builder at a time); return it (None: off)."""
    stem = archive_stem()
    if stem is None:
        return None
    stem.parent.mkdir(parents=True, exist_ok=True)
    with stem.with_name(f"{stem.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another builder's archive is then there
        return archive() or _dump(stem, timeout_s)


def _dump(stem: Path, timeout_s: float) -> Path:
    """Run a small batch and streaming job in a JVM that archives its classes at its exit, wait for the exit, and
    move the archive into place, named by its size, when complete."""
    from pyspark import SparkContext

    from iqgraph.streaming.session import build_spark_session

    partial = stem.with_name(f"{stem.name}.{os.getpid()}.partial")
    began = time.monotonic()
    options = f"-XX:ArchiveClassesAtExit={partial} {QUIET}"
    spark = build_spark_session("local[2]", shuffle_partitions=2, extra_conf={"spark.driver.extraJavaOptions": options})
    try:
        _run_jobs(spark)
    finally:
        spark.stop()
        process = getattr(SparkContext._gateway, "proc", None)
        if process is not None and process.stdin is not None:
            process.stdin.close()  # the JVM exits once its stdin closes, writing the archive first
            process.wait(timeout=max(1.0, timeout_s - (time.monotonic() - began)))
    path = stem.with_name(f"{stem.name}.{partial.stat().st_size if partial.exists() else 0}.jsa")
    if not partial.exists() or not whole(partial, path):
        partial.unlink(missing_ok=True)
        raise ArchiveError(f"the JVM wrote no complete class archive at {partial}")
    os.replace(partial, path)
    return path


def _run_jobs(spark: SparkSession) -> None:
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


def main(argv: list[str]) -> int:
    """``build``: build the archive unless it is there; print where it is."""
    if argv != ["build"]:
        print("usage: python -m iqgraph.streaming.jvm_archive build", file=sys.stderr)
        return 2
    began = time.monotonic()
    path = _build_here()
    if path is None:
        print("no class archive: IQGRAPH_JVM_ARCHIVE=off, or no Java found")
    else:
        print(f"Spark's class archive: {path} ({path.stat().st_size / 1e6:.0f} MB, {time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
