"""A node killed with kill -9 leaves its log as it was (issue 42 part 5): its orphaned Spark JVM, which exits once its
stdin closes, first failed the micro-batch in flight and wrote ~100 lines into the dead node's log (a ~70-line
FOREACH_BATCH_USER_FUNCTION_ERROR … Connection reset stack trace, lost tasks, a rejected executor task). The JVM's
output now goes through pipes the node passes on (``streaming.session``): once the node is dead, nobody reads them."""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from iqgraph.examples.shop import generate_orders
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from tests.conftest import MakeTopic
from tests.support.nodes import start_node, wait_ready, write_app_module
from tests.support.pipeline import START_MS

APPLIED = "{ node { partitions { appliedOffset } } }"


def descendants(pid: int) -> list[int]:
    """Return the ids of every process below pid (its children, theirs, …)."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout.split()
    children = [int(child) for child in found]
    return children + [grandchild for child in children for grandchild in descendants(child)]


def test_the_jvms_output_reaches_our_stderr_while_we_live(
    spark: SparkSession, capfd: pytest.CaptureFixture[str]
) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.System.err.println("a line the JVM writes to its stderr")
    jvm.System.err.flush()
    deadline = time.monotonic() + 10
    seen = ""
    while "a line the JVM writes to its stderr" not in seen:
        assert time.monotonic() < deadline, "the JVM's stderr was not passed on within 10 s"
        time.sleep(0.05)
        seen += capfd.readouterr().err


@pytest.mark.slow
def test_a_node_killed_mid_batches_gets_no_line_from_its_orphaned_spark_jvm(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(2, prefix="kill")
    small_batches = ["--max-records-per-batch", "200"]  # the kill finds a micro-batch in flight
    write_app_module(tmp_path, "killapp", topic, 2, broker.bootstrap_servers)
    node = start_node(tmp_path, "killapp", "node-0", free_port(), small_batches)
    try:
        wait_ready([node])
        below = descendants(node.process.pid)  # Spark's JVM (and its Python workers)
        assert below, "no Spark JVM under the node"
        orders = itertools.islice(generate_orders(3, START_MS), 20_000)
        produce(broker.bootstrap_servers, topic, [(k.encode(), orjson.dumps(v), None) for k, v in orders])
        deadline = time.monotonic() + 60
        while sum(p["appliedOffset"] for p in node.post(APPLIED)["data"]["node"]["partitions"]) < 1_000:
            assert time.monotonic() < deadline, "no micro-batch applied in 60 s"
            time.sleep(0.1)
        node.process.kill()  # mid-batches: 200 records each, ~19,000 to go
        node.process.wait(60)
        logged = node.log.read_bytes()
        killed = time.monotonic()
        while alive := [pid for pid in below if Path(f"/proc/{pid}").exists()]:
            assert time.monotonic() - killed < 30, f"Spark's processes {alive} outlived the node by 30 s"
            time.sleep(0.2)
        print(f"\nSpark's JVM gone {time.monotonic() - killed:.1f} s after the node")
        time.sleep(1)
    finally:
        node.kill()
    after = node.log.read_bytes()[len(logged) :].decode(errors="replace")
    assert after == "", f"{len(after.splitlines())} lines after the kill:\n{after[:3000]}"
    assert node.log.read_bytes().startswith(logged)
