"""Spark's driver JVM from a class-data-sharing archive (`iqgraph.streaming.jvm_archive`): a session built after
the archive maps Spark's classes from it, and no file that is not a whole archive is ever given to a JVM (one cut
short kills the JVM with SIGBUS)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from iqgraph.streaming import jvm_archive
from iqgraph.streaming.jvm_archive import DYNAMIC_ARCHIVE_MAGIC, archive, archive_stem, build, java_options

CHILD = textwrap.dedent(
    """
    import sys
    from iqgraph.streaming.session import build_spark_session
    log = sys.argv[1]
    options = {"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={log}"}
    spark = build_spark_session("local[1]", kafka_connector=False, extra_conf=options)
    spark.range(10).groupBy().count().collect()
    spark.stop()
    """
)


def test_a_session_built_after_the_archive_loads_sparks_classes_from_it(tmp_path: Path) -> None:
    built = build()  # the session fixture built it; this finds it
    assert built is not None and archive() == built and f"-XX:SharedArchiveFile={built}" in java_options()
    log = tmp_path / "classes.txt"
    child = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    spark = [line for line in log.read_text().splitlines() if " org.apache.spark." in line]
    assert any(" org.apache.spark.SparkContext source: shared objects file (top)" in line for line in spark)
    shared = sum(1 for line in spark if "source: shared objects file (top)" in line)
    read = sum(1 for line in spark if "source: file:" in line or "source: jar:" in line)  # from a jar, parsed anew
    assert shared > 20 * read, f"{shared} of Spark's classes mapped from the archive, {read} read from its jars"


def test_only_a_whole_archive_is_given_to_the_jvm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IQGRAPH_JVM_ARCHIVE", str(tmp_path))
    stem = archive_stem()
    assert stem is not None and stem.parent == tmp_path and archive() is None and java_options() == ""
    cut = stem.with_name(f"{stem.name}.100.jsa")
    cut.write_bytes(DYNAMIC_ARCHIVE_MAGIC + bytes(50))  # a dump cut short: the size in its name is not its own
    headless = stem.with_name(f"{stem.name}.64.jsa")
    headless.write_bytes(bytes(64))  # the header (written last) is not there
    assert archive() is None and java_options() == ""
    whole = stem.with_name(f"{stem.name}.54.jsa")
    whole.write_bytes(DYNAMIC_ARCHIVE_MAGIC + bytes(50))
    assert archive() == whole and java_options().startswith(f"-XX:SharedArchiveFile={whole} -Xshare:auto")


def test_switched_off_there_is_no_archive_and_nothing_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IQGRAPH_JVM_ARCHIVE", "off")
    monkeypatch.setattr(jvm_archive, "_dump", lambda *_: pytest.fail("built while switched off"))
    assert archive_stem() is None and archive() is None and java_options() == "" and build() is None
