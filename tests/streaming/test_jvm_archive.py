"""Spark's and Kafka's JVMs from class-data-sharing archives (`iqgraph.streaming.jvm_archive`): a session or a
broker started after the archives were built maps its classes from them, and no file that is not a whole archive
is ever given to a JVM (one cut short kills the JVM with SIGBUS)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from iqgraph.streaming import jvm_archive
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.jvm_archive import (
    DYNAMIC_ARCHIVE_MAGIC,
    KAFKA,
    SPARK,
    ArchiveError,
    _build_here,
    archive,
    archive_stem,
    build,
    java_options,
)

CHILD = textwrap.dedent(
    """
    import sys
    from iqgraph.streaming.session import build_spark_session
    options = {"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={sys.argv[1]}"}
    spark = build_spark_session("local[1]", kafka_connector=False, extra_conf=options)
    spark.range(10).groupBy().count().collect()
    spark.stop()
    """
)


def from_archive(log: Path, package: str, main_class: str) -> None:
    """Check that the JVM whose class loading log is log took main_class, and nearly all of package's classes it
    read, from the archive (a generated class, a lambda's, is never in it)."""
    lines = [line for line in log.read_text().splitlines() if f" {package}." in line]
    assert any(f" {main_class} source: shared objects file (top)" in line for line in lines), lines[:3]
    shared = sum(1 for line in lines if "source: shared objects file (top)" in line)
    read = sum(1 for line in lines if "source: file:" in line or "source: jar:" in line)  # from a jar, parsed anew
    assert shared > 20 * read, f"{shared} of {package}'s classes mapped from the archive, {read} read from jars"


def test_a_session_built_after_the_archives_loads_sparks_classes_from_them(tmp_path: Path) -> None:
    built = build()  # the session fixture built them; this finds them
    assert archive(SPARK) in built and f"-XX:SharedArchiveFile={archive(SPARK)}" in java_options(SPARK)
    log = tmp_path / "classes.txt"
    child = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    from_archive(log, "org.apache.spark", "org.apache.spark.SparkContext")


def test_a_broker_started_after_the_archives_loads_kafkas_classes_from_them(tmp_path: Path) -> None:
    assert archive(KAFKA) in build()
    log = tmp_path / "classes.txt"
    with KafkaBroker(jvm_options=[f"-Xlog:class+load=info:file={log}"]) as broker:
        broker.create_topics({"t": 1})
    from_archive(log, "kafka.server", "kafka.server.KafkaRaftServer")


def test_only_a_whole_archive_is_given_to_the_jvm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IQGRAPH_JVM_ARCHIVE", str(tmp_path))
    stem = archive_stem(SPARK)
    assert stem is not None and stem.parent == tmp_path and archive(SPARK) is None and java_options(SPARK) == []
    cut = stem.with_name(f"{stem.name}.100.jsa")
    cut.write_bytes(DYNAMIC_ARCHIVE_MAGIC + bytes(50))  # a dump cut short: the size in its name is not its own
    headless = stem.with_name(f"{stem.name}.64.jsa")
    headless.write_bytes(bytes(64))  # the header (written last) is not there
    assert archive(SPARK) is None and java_options(SPARK) == []
    whole = stem.with_name(f"{stem.name}.54.jsa")
    whole.write_bytes(DYNAMIC_ARCHIVE_MAGIC + bytes(50))
    assert archive(SPARK) == whole and java_options(SPARK)[:2] == [f"-XX:SharedArchiveFile={whole}", "-Xshare:auto"]
    assert archive(KAFKA) is None  # each JVM's own


def test_switched_off_there_is_no_archive_and_nothing_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IQGRAPH_JVM_ARCHIVE", "off")
    monkeypatch.setattr(jvm_archive.subprocess, "run", lambda *_, **__: pytest.fail("a build was started"))
    assert archive_stem(SPARK) is None and archive(KAFKA) is None and java_options(SPARK) == [] and build() == []


def fake_jvm(size: int, cut: bool = False) -> Callable[[list[str]], None]:
    """Return a stand-in for a JVM run that writes an archive of size bytes where its options say (cut: without the
    header a JVM writes last)."""

    def run(options: list[str]) -> None:
        target = next(o.split("=", 1)[1] for o in options if o.startswith("-XX:ArchiveClassesAtExit="))
        Path(target).write_bytes((bytes(4) if cut else DYNAMIC_ARCHIVE_MAGIC) + bytes(size - 4))

    return run


def test_a_build_moves_only_a_whole_archive_into_place_and_forgets_those_of_jars_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IQGRAPH_JVM_ARCHIVE", str(tmp_path))
    stem = archive_stem(SPARK)
    assert stem is not None
    gone = tmp_path / "spark-0123456789abcdef"  # the archive of a virtualenv deleted since
    gone.with_name(f"{gone.name}.8.jsa").write_bytes(DYNAMIC_ARCHIVE_MAGIC + bytes(4))
    gone.with_name(f"{gone.name}.jars").write_text(str(tmp_path / "venv-deleted" / "jars"))
    monkeypatch.setitem(jvm_archive.BUILDERS, SPARK, fake_jvm(64, cut=True))
    with pytest.raises(ArchiveError, match="no whole class archive"):
        _build_here(SPARK)
    assert archive(SPARK) is None and not list(tmp_path.glob("*.partial"))
    monkeypatch.setitem(jvm_archive.BUILDERS, SPARK, fake_jvm(64))
    built = _build_here(SPARK)
    assert built == stem.with_name(f"{stem.name}.64.jsa") == archive(SPARK)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{stem.name}.{end}" for end in ("64.jsa", "jars", "lock")
    )
    assert _build_here(SPARK) == built  # there: not built again
