"""Start-up times: the embedded Apache Kafka broker, a node on an empty topic, and `iqgraph schema`.

    python -m bench.startup [--runs 3]

Each figure is measured `runs` times in one run, side by side, and printed as min / median / max:
- broker: `KafkaBroker` start until it is registered and unfenced (`ready_seconds`: readiness checked, not slept);
- node on an empty topic: `iqgraph serve` (local[1], the shop example) started until /readyz answers 200, and the
  node's own "ready X s after start" line (from its log: where the time went when slow);
- `iqgraph schema --app iqgraph.examples.shop:app`: wall time of the whole command (a new interpreter each run);
- the node and the broker again with the JVMs' class archives switched off (``IQGRAPH_JVM_ARCHIVE=off``) and on,
  alternating, with the ratio of the medians (the archives built first, as `make test` does:
  `iqgraph.streaming.jvm_archive`).
Goals (the Real Kafka issue): broker ≤ 10 s, node ready on an empty topic ≤ 10 s, schema ≤ 3 s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port
from iqgraph.streaming.jvm_archive import build
from iqgraph.streaming.kafka_jars import ensure_kafka_jars
from tests.support.nodes import start_node, write_app_module

PARTITIONS = 6
READY_LINE = re.compile(r"ready (\d+(?:\.\d+)?) s after start")


def broker_start(archives: str = "on") -> float:
    """Return the seconds one embedded broker took to be ready (archives: "off" starts it without its class
    archive)."""
    if archives == "off":
        os.environ["IQGRAPH_JVM_ARCHIVE"] = "off"
    try:
        broker = KafkaBroker().start()
    finally:
        os.environ.pop("IQGRAPH_JVM_ARCHIVE", None)
    try:
        assert broker.ready_seconds is not None
        return broker.ready_seconds
    finally:
        broker.stop()


def node_ready(broker: KafkaBroker, home: Path, run: int, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Return (seconds until /readyz 200 seen from outside, the node's own ready figure) on a new empty topic; env:
    more environment for the node."""
    topic = f"startup-{run}-{int(time.time())}"
    broker.create_topics({topic: PARTITIONS})
    module = f"startupapp{run}"
    write_app_module(home, module, topic, PARTITIONS, broker.bootstrap_servers)
    began = time.monotonic()
    node = start_node(home, module, f"node-{run}", free_port(), env=env)
    try:
        deadline = began + 180
        while True:
            assert node.process.poll() is None, node.log.read_text()[-2000:]
            assert time.monotonic() < deadline, "not ready in 180 s"
            try:
                if httpx.get(f"{node.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        outside = time.monotonic() - began
        said_by = time.monotonic() + 10  # the restore watcher says it at its next look (every 2 s) after ready
        while not (found := READY_LINE.search(node.log.read_text())) and time.monotonic() < said_by:
            time.sleep(0.1)
        return outside, float(found.group(1)) if found else float("nan")
    finally:
        node.kill()


def schema_wall() -> float:
    """Return the wall seconds of `iqgraph schema --app iqgraph.examples.shop:app`."""
    began = time.monotonic()
    subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "iqgraph.app.cli", "schema", "--app", "iqgraph.examples.shop:app"],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - began


def spread(values: list[float]) -> str:
    """Return min / median / max of values."""
    return f"{min(values):6.2f} {statistics.median(values):6.2f} {max(values):6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    ensure_kafka_jars()
    brokers = [broker_start() for _ in range(args.runs)]
    schemas = [schema_wall() for _ in range(args.runs)]
    outside, inside = [], []
    archived: dict[str, list[float]] = {"off": [], "on": []}
    brokers_archived: dict[str, list[float]] = {"off": [], "on": []}
    build()
    for _ in range(args.runs):
        for setting in ("off", "on"):
            brokers_archived[setting].append(broker_start(setting))
    with tempfile.TemporaryDirectory(prefix="iqgraph-startup-") as home, KafkaBroker() as broker:
        for run in range(args.runs):
            seen, said = node_ready(broker, Path(home), run)
            outside.append(seen)
            inside.append(said)
        for run in range(args.runs):
            for setting in ("off", "on"):
                env = {"IQGRAPH_JVM_ARCHIVE": "off"} if setting == "off" else {}
                archived[setting].append(node_ready(broker, Path(home), 100 + 2 * run + (setting == "on"), env)[0])
    print(f"{'seconds (min median max)':44} {'min':>6} {'median':>6} {'max':>6}")
    print(f"{'embedded broker: start to ready':44} {spread(brokers)}")
    print(f"{'node on an empty topic: start to /readyz 200':44} {spread(outside)}")
    print(f"{'node on an empty topic: its ready line':44} {spread(inside)}")
    print(f"{'iqgraph schema (shop), whole command':44} {spread(schemas)}")
    for what, figures in (("node to /readyz 200", archived), ("broker to ready", brokers_archived)):
        for setting, seconds in figures.items():
            print(f"{f'{what}, class archives {setting}':44} {spread(seconds)}")
        ratio = statistics.median(figures["on"]) / statistics.median(figures["off"])
        print(f"{f'{what}: archives on / off (medians)':44} {ratio:6.2f}")


if __name__ == "__main__":
    main()
