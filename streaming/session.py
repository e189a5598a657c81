"""Build the SparkSession that iqgraph's streaming queries run in.

Local settings suit a small machine: few shuffle partitions, no UI, no console progress bar, Arrow on, UTC
session time zone, loopback driver address, and Spark's own logging turned down to warnings. Python workers
run the interpreter that builds the session, so the Python Data Source and the sinks import this project.

Spark's own Kafka source (``format("kafka")``, the runner's default) comes from the connector jars fetched at
install time (``python -m iqgraph.streaming.apache_kafka fetch``: ``streaming.kafka_jars.SPARK_KAFKA_JARS``),
given to the session as ``spark.jars`` (after any the caller sets): on a cluster Spark ships them to the
executors. Without them, or with a pyspark of another version than the connector's, building the session
raises `JarsError` in one line saying what to run. ``kafka_connector=False`` builds a session without them.

On a cluster (any master but ``local``), executors import what the driver pickles by reference — a user's
transform that calls a plain function of the user's module needs that module on every executor. ``ship_module``
adds the user's top-level package (zipped) or module file to the session (``SparkContext.addPyFile``) unless
it is installed (site-packages) or is iqgraph itself: those must be installed on the workers.

Spark's JVM writes its output (log4j's lines, its Python workers' stderr) into pipes this process passes on to
its own stdout and stderr (``_start_jvm``), not into the files it was given: when this process is killed (kill -9),
the JVM — which exits once its stdin closes — first fails the micro-batch in flight (its foreachBatch function
is gone) and logged ~100 lines (a ~70-line FOREACH_BATCH_USER_FUNCTION_ERROR … Connection reset stack trace,
lost tasks) into a dead node's log; with nobody reading its pipes, it writes nothing there.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from iqgraph.streaming.jvm_archive import java_options
from iqgraph.streaming.kafka_jars import (
    FETCH_COMMAND,
    SPARK_KAFKA_VERSION,
    JarsError,
    spark_kafka_jars,
    unrunnable_spark_conf,
)

__all__ = ["build_spark_session", "kafka_connector_jars", "ship_module"]
log = logging.getLogger(__name__)

# Warnings and errors to stderr, one line each; silence the start-up notices Spark logs at WARN.
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
# Harmless in our sink: a cached block computed by two coalesced tasks, and cancelling a finished job on stop.
logger.blockmanager.name = org.apache.spark.storage.BlockManager
logger.blockmanager.level = error
logger.dagscheduler.name = org.apache.spark.scheduler.DAGScheduler
logger.dagscheduler.level = error
# A stop can interrupt Hadoop's chmod of a checkpoint file (it forks one, then waits): harmless, the batch is
# applied again from the stores' offsets; its WARN came with a Java stack trace.
logger.shell.name = org.apache.hadoop.util.Shell
logger.shell.level = error
# Kafka away: the node's KafkaWatch says so in one line; the Java client's WARN per reconnect (one a second) and the
# offset reader's retried attempts (with a stack trace) are not said again.
logger.kafkanet.name = org.apache.kafka.clients.NetworkClient
logger.kafkanet.level = error
logger.offsetreader.name = org.apache.spark.sql.kafka010.KafkaOffsetReaderAdmin
logger.offsetreader.level = error
# A query that dies: the node's supervisor says why in one line; Spark's "terminated with error" came with a ~70-line
# Java stack trace wrapping the same Python error (a user function's traceback stays: the executor logs it).
logger.microbatch.name = org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution
logger.microbatch.filter.died.type = RegexFilter
logger.microbatch.filter.died.regex = .*terminated with error.*
logger.microbatch.filter.died.onMatch = DENY
logger.microbatch.filter.died.onMismatch = NEUTRAL
"""


def build_spark_session(
    master: str = "local[*]",
    *,
    shuffle_partitions: int = 4,
    driver_memory: str = "1g",
    app_name: str = "iqgraph",
    log_level: str = "WARN",
    extra_conf: Mapping[str, str] | None = None,
    kafka_connector: bool = True,
) -> SparkSession:
    """Return a SparkSession configured for iqgraph's pipelines (created, or the active one reused).

    kafka_connector: add Spark's Kafka connector jars to spark.jars (raises `JarsError` when they are missing;
    ValueError for settings the connector cannot run with, `unrunnable_spark_conf`).
    """
    conf = session_conf(_base_conf(master, shuffle_partitions, driver_memory), extra_conf or {})
    if kafka_connector:
        if unrunnable := unrunnable_spark_conf(conf):
            raise ValueError(unrunnable)
        given = [jar for jar in conf.get("spark.jars", "").split(",") if jar.strip()]
        conf["spark.jars"] = ",".join([*given, *(str(path) for path in kafka_connector_jars())])
    # SparkContext reads the worker interpreter from the environment only; default it to ours.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else a warning on every start
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    _start_jvm({"spark.master": master, "spark.app.name": app_name, **conf})
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark


def _start_jvm(conf: Mapping[str, str]) -> None:
    """Start Spark's JVM and its SparkContext with conf, the JVM's stdout and stderr passed on by this process.

    Nothing to do when this process already has a JVM (a session built before) or is given one (pyspark's
    ``PYSPARK_GATEWAY_PORT``, as under spark-submit): the builder then uses it.
    """
    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    pipes = [os.pipe(), os.pipe()]  # the JVM's stdout, stderr
    try:
        gateway = launch_gateway(SparkConf().setAll(list(conf.items())), {"stdout": pipes[0][1], "stderr": pipes[1][1]})
    except BaseException:
        for read_end, _ in pipes:
            os.close(read_end)
        raise
    finally:
        for _, write_end in pipes:
            os.close(write_end)  # the JVM holds them: once it exits, the readers see the end
    for (read_end, _), target in zip(pipes, (1, 2), strict=True):  # where it wrote before: our stdout, stderr
        threading.Thread(target=_pass_on, args=(read_end, target), name="spark-jvm-output", daemon=True).start()
    SparkContext(conf=SparkConf().setAll(list(conf.items())), gateway=gateway)  # builder.getOrCreate() takes it up


def _pass_on(read_end: int, target: int) -> None:
    """Copy what the JVM writes to read_end onto target until the JVM closes it."""
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while chunk := source.read(65536):
            left = memoryview(chunk)
            with contextlib.suppress(OSError):  # nowhere to write: drop it, and go on reading (the JVM never blocks)
                while left:
                    left = left[os.write(target, left) :]


def kafka_connector_jars() -> list[Path]:
    """Return the paths of Spark's Kafka connector jars for this pyspark; raise `JarsError` (one line) if unusable."""
    if pyspark.__version__ != SPARK_KAFKA_VERSION:
        raise JarsError(
            f"pyspark {pyspark.__version__} is installed but Spark's Kafka connector is pinned to "
            f"{SPARK_KAFKA_VERSION}: pip install pyspark=={SPARK_KAFKA_VERSION} (then run `{FETCH_COMMAND}`)"
        )
    return spark_kafka_jars()


#: Spark's checkpoint file manager over Hadoop's FileSystem API (pyspark 4.2's package for it).
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def _base_conf(master: str, shuffle_partitions: int, driver_memory: str) -> dict[str, str]:
    """Return the Spark settings every iqgraph session uses."""
    conf = {
        "spark.driver.memory": driver_memory,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.minBatchesToRetain": "10",
        "spark.python.worker.reuse": "true",
        "spark.sql.adaptive.enabled": "false",  # streaming disables it anyway, with a warning per query
        # a store's partials are wide rows: Spark renders every batch's plan (SQL execution events) and warned
        # once, at whatever moment (a stop included), that it cut the text at its default of 25 fields
        "spark.sql.debug.maxToStringFields": "10000",
        # the checkpoint's offset and commit logs written through Hadoop's FileSystem API, not FileContext: on the
        # local file system each micro-batch's two writes took ~50 and ~60 ms with FileContext, ~13 and ~20 ms with
        # this (bench/ingest.py, docs/benchmarks.md). A rename there is atomic, and the checkpoint is one run's
        # (each query starts from a fresh directory: the stores hold the offsets)
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
        # the classes from the archive `jvm_archive` builds, when it is there: ~5 s less per start on two cores
        "spark.driver.extraJavaOptions": " ".join([f"-Dlog4j2.configurationFile={_log4j2_file()}", *java_options()]),
    }
    if master.startswith("local"):
        conf |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    return conf


#: Settings whose value is a list of JVM options: the user's come after iqgraph's (the later of two -D wins).
_JVM_OPTIONS = ("spark.driver.extraJavaOptions",)


def session_conf(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """Return base with the user's extra settings over it; a user's driver JVM options are added to iqgraph's (its
    log4j2 file, which keeps a query's death to one line), not put in their place."""
    conf = {**base, **extra}
    for key in _JVM_OPTIONS:
        if key in base and key in extra:
            conf[key] = f"{base[key]} {extra[key].strip()}".strip()
    return conf


def _log4j2_file() -> Path:
    """Write the log4j2 configuration for the driver JVM and return its path."""
    path = Path(tempfile.gettempdir()) / "iqgraph-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(_LOG4J2)
        partial.replace(path)  # atomic: several nodes may start at once
    return path


def ship_module(spark: SparkSession, module_name: str) -> Path | None:
    """Ship the top-level package (or module) of module_name to the executors; return what was shipped.

    Nothing is shipped for iqgraph itself or for what is installed (site-packages, the standard library).
    """
    top = module_name.split(".")[0]
    spec = importlib.util.find_spec(top)
    if top == "iqgraph" or spec is None or spec.origin in (None, "built-in", "frozen"):
        return None
    locations = list(spec.submodule_search_locations or [])
    source = Path(locations[0] if locations else str(spec.origin)).resolve()
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib", "stdlib")}
    if any(source.is_relative_to(root) for root in installed):
        return None
    shipped = source
    if locations:  # a package: ship it zipped, the package directory at the archive's root
        target = Path(tempfile.mkdtemp(prefix="iqgraph-ship-")) / top
        shipped = Path(shutil.make_archive(str(target), "zip", root_dir=source.parent, base_dir=source.name))
    spark.sparkContext.addPyFile(str(shipped))
    log.info("shipped %s to the executors (module %s)", shipped, module_name)
    return shipped
