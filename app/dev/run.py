"""``iqgraph dev``: any app on an embedded Apache Kafka broker, fed, served by 1 or N nodes, with GraphiQL.

One line per step: start the broker, create the app's topics, feed them (the app's generator, a JSON-lines
file, or nothing — then the exact ``iqgraph produce`` line to use), start the nodes, print their GraphiQL
URLs, an example query and an example subscription built from the served schema, and the app's dashboard
URL. Ctrl-C (or ``--duration``) stops the feed, then the nodes, then the broker: the broker and the node
processes run in process groups of their own, so the terminal's Ctrl-C reaches only this process, which
stops them in that order. ``iqgraph demo`` is ``iqgraph dev`` with the shop example.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from confluent_kafka import KafkaException

from iqgraph.app.cluster.topics import create_topics
from iqgraph.app.dev.data_file import BadLine, read_records
from iqgraph.app.dev.example_query import (
    INTROSPECTION,
    example_query,
    example_subscription,
    sample_keys,
    schema_from_introspection,
)
from iqgraph.app.dev.producer import produce_events, produce_records, producer_config
from iqgraph.app.dev.readiness import NodeStart, read_readiness
from iqgraph.app.loading import load_app
from iqgraph.app.settings import SettingsError, load_settings
from iqgraph.stores import UserError
from iqgraph.streaming.apache_kafka import KAFKA_VERSION, KafkaBroker
from iqgraph.streaming.broker import exit_with_parent, free_ports
from iqgraph.streaming.definitions import App

DEMO_APP = "iqgraph.examples.shop:app"
HISTORY = 3_000  # generated events produced before the nodes start, so that the first queries find data
SAMPLES = 200  # records of a data file looked at for the example query's keys
GENERATED_SAMPLES = 5_000  # generated events looked at (a generator may start with a table's rows)
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DevOptions:
    """What ``iqgraph dev`` runs."""

    app: str
    nodes: int = 1
    data: Path | None = None
    rate: float = 200.0
    port: int = 8000
    state_dir: Path | None = None
    duration: float = 0.0
    prefix: str = "iqgraph dev"


class DevError(UserError, RuntimeError):
    """The dev run cannot go on; the message says why and where to look."""


def run_dev(options: DevOptions) -> int:
    """Run the app until Ctrl-C or the duration; return the exit code."""
    app = load_app(options.app)
    if options.nodes < 1:
        raise DevError("--nodes must be at least 1")
    if options.data is not None and not options.data.is_file():
        raise DevError(f"--data {options.data}: no such file")
    run = DevRun(app, options, _state_dir(options.state_dir))

    def interrupt(_sig: int, _frame: object) -> None:
        run.interrupted.set()  # kept even if the KeyboardInterrupt below is lost (raised inside a finalizer)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a closed terminal or a kill stops as Ctrl-C does
        signal.signal(sig, interrupt)
    try:
        run.start()
        run.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # stopping must finish: no orphan node or broker
            signal.signal(sig, signal.SIG_IGN)
        run.stop()
    return 0


def _state_dir(given: Path | None) -> Path:
    """Return the run's directory: given (created if missing, refused if an earlier run's stores are in it)."""
    if given is None:
        return Path(tempfile.mkdtemp(prefix="iqgraph-dev-"))
    try:
        given.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DevError(f"--state-dir {given}: {exc.strerror}") from None
    return given  # an earlier run's broker data and stores are kept: a restart goes on where it stopped


class DevRun:
    """The broker, the feed and the node processes of one dev run, started and stopped in order."""

    def __init__(self, app: App, options: DevOptions, root: Path) -> None:
        self.app = app
        self.options = options
        self.root = root
        self.broker = KafkaBroker(data_dir=root / "kafka")  # kept: a restarted run keeps its topics and records
        self.nodes: list[NodeProcess] = []
        self.feed: threading.Thread | None = None
        self.stop_feed = threading.Event()
        self.interrupted = threading.Event()  # Ctrl-C, SIGTERM or SIGHUP came: waits end at their next turn
        self.samples: list[tuple[str, Any, Any]] = []
        self.cluster_secret = secrets.token_urlsafe(32)  # this dev cluster's nodes authenticate each other with it

    def say(self, message: str) -> None:
        """Print one step; a closed terminal or pipe (``| tee`` ended by the same Ctrl-C) must not stop a stop."""
        with contextlib.suppress(OSError):
            print(f"{self.options.prefix}: {message}", flush=True)

    def start(self) -> None:
        """Start the broker, create and feed the topics, start the nodes and print where to query."""
        started = time.monotonic()
        self.broker.start()
        took = time.monotonic() - started
        self.say(f"broker at {self.broker.bootstrap_servers} (Apache Kafka {KAFKA_VERSION}, ready in {took:.1f} s; "
                 f"state and logs in {self.root})")  # fmt: skip
        created = create_topics({"bootstrap.servers": self.broker.bootstrap_servers}, self.app)
        if created:
            self.say("created topics " + ", ".join(f"{name} ({count} partitions)" for name, count in created.items()))
        else:
            self.say(f"topics {', '.join(t.name for t in self.app.topics)} are there from the last run")
        self._feed()
        for index in range(self.options.nodes):
            self.nodes.append(self._start_node(index))  # one by one: a Ctrl-C in between stops those started
        self.say(f"starting {len(self.nodes)} node(s); each starts Spark, then applies the records already in Kafka")
        self._wait_ready()
        for node in self.nodes:
            self.say(f"GraphiQL at {node.url}/graphql ({node.id})")
        self.say(self._security())
        if self.feed is not None:
            self.feed.start()
        self._print_example()
        if self.app.dashboard is not None:
            self.say(f"dashboard at {self.nodes[0].url}/dashboard")
        self._check_interrupted()
        self.say("Ctrl-C stops everything")

    def wait(self) -> None:
        """Return after the duration, when a node exits, or on Ctrl-C (KeyboardInterrupt)."""
        deadline = time.monotonic() + self.options.duration if self.options.duration > 0 else None
        while deadline is None or time.monotonic() < deadline:
            self._check_interrupted()
            for node in self.nodes:
                if node.process.poll() is not None:
                    raise DevError(f"{node.id} exited with code {node.process.returncode}; see {node.log}")
            time.sleep(0.5)

    def _check_interrupted(self) -> None:
        """Raise KeyboardInterrupt if a stop signal came (its own KeyboardInterrupt may have been swallowed:
        Python runs a signal handler wherever the main thread is, a finalizer included, where it is lost)."""
        if self.interrupted.is_set():
            raise KeyboardInterrupt

    def stop(self) -> None:
        """Stop the feed, then the nodes, then the broker; one line per step."""
        if self.feed is not None and self.feed.is_alive():
            self.say("stopping the producer")
            self.stop_feed.set()
            self.feed.join(timeout=30)
        running = [node for node in self.nodes if node.process.poll() is None]
        for node in running:
            self.say(f"stopping {node.id}")
            node.process.send_signal(signal.SIGTERM)  # every node drains and closes its stores at once
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node in running:
            node.wait_or_kill(deadline)
        self.say("stopping the broker")
        self.broker.stop()
        self.say("stopped")

    def _config(self) -> dict[str, Any]:
        return producer_config(self.app, self.broker.bootstrap_servers)

    def _feed(self) -> None:
        if self.options.data is not None:
            self._produce_file(self.options.data)
        elif self.app.generator is not None:
            self._produce_generated()
        else:
            topic = self.app.topics[0].name
            self.say(
                f"no data: the app has no generator and no --data file was given. Produce JSON lines into {topic!r}"
                f" with:\n  iqgraph produce --app {self.options.app} --bootstrap-servers "
                f"{self.broker.bootstrap_servers} --file data.jsonl"
            )

    def _produce_file(self, path: Path) -> None:
        with path.open("rb") as lines:
            sent, bad = produce_records(self._config(), read_records(lines, self.app), self._bad_line)
        self.say(f"produced {sent} records from {path}" + (f"; skipped {bad} bad lines" if bad else ""))
        default_topic = self.app.topics[0].name
        with path.open("rb") as lines:
            for line in itertools.islice(lines, SAMPLES):
                with contextlib.suppress(orjson.JSONDecodeError):
                    raw = orjson.loads(line)
                    if isinstance(raw, dict):
                        self.samples.append((raw.get("topic", default_topic), raw.get("key"), raw.get("value")))

    def _bad_line(self, bad: BadLine) -> None:
        self.say(f"skipped {self.options.data}: {bad}")

    def _produce_generated(self) -> None:
        assert self.app.generator is not None  # noqa: S101 - checked by the caller
        start_ms = int(time.time() * 1000) - HISTORY * 20
        events = self.app.generator(7, start_ms)
        addressed = (self.app.addressed(e) for e, _ in zip(events, range(GENERATED_SAMPLES), strict=False))
        self.samples = [(topic.name, key, value) for topic, key, value in addressed]
        produce_events(self.app, self._config(), count=HISTORY, rate=None, seed=7, start_ms=start_ms)
        into = ", ".join(repr(t.name) for t in self.app.topics)
        self.say(f"produced {HISTORY} generated events into {into}; {self.options.rate:g}/s more once serving")
        self.feed = threading.Thread(target=self._produce_forever, name="dev-producer", daemon=True)

    def _produce_forever(self) -> None:
        try:
            produce_events(self.app, self._config(), count=None, rate=self.options.rate, seed=8, stop=self.stop_feed)
        except KafkaException as exc:
            self.say(f"the producer stopped: {exc}")

    def _start_node(self, index: int) -> NodeProcess:
        port = self.options.port + index
        node_id = f"node-{index}"
        flags = ["--node-id", node_id, "--port", str(port), "--state-dir", str(self.root / node_id)]
        if self.options.nodes > 1:
            peers = ",".join(f"node-{i}=http://127.0.0.1:{self.options.port + i}" for i in range(self.options.nodes))
            flags += ["--peers", peers, "--standbys", "1", "--max-lag", "100000", "--spark-master", "local[1]",
                      "--driver-memory", "768m"]  # fmt: skip
            ports = [self.options.port + i for i in range(self.options.nodes)]
            flags += ["--peer-port", str(free_ports(1, ports)[0])]  # peers' listener: any free port (they ask /healthz)
        else:
            flags += ["--spark-master", "local[2]"]
        bootstrap = self.broker.bootstrap_servers
        command = [sys.executable, "-m", "iqgraph.app.cli", "serve", "--app", self.options.app,
                   "--bootstrap-servers", bootstrap, "--max-records-per-batch", "20000", *flags]  # fmt: skip
        log = self.root / f"{node_id}.log"
        start = NodeStart(time.monotonic())
        with log.open("wb") as out:
            # its own session: the terminal's Ctrl-C reaches only this process, which stops the nodes in order
            process = subprocess.Popen(  # noqa: S603 - our own CLI
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=exit_with_parent,
                env={**os.environ, "IQGRAPH_CLUSTER_SECRET": self.cluster_secret},  # peers sign with it
            )
        return NodeProcess(node_id, f"http://127.0.0.1:{port}", process, log, start)

    def _wait_ready(self) -> None:
        """Wait until every node answers /readyz with 200, telling how their restores go and how long each took."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(self.nodes)
        while True:
            self._check_interrupted()
            for node in list(pending):
                if node.process.poll() is not None:
                    raise DevError(f"{node.id} exited with code {node.process.returncode}:\n{node.tail()}")
                seen = read_readiness(node.url)
                if line := node.start.observe(seen, time.monotonic()):
                    self.say(f"{node.id}: {line}")
                if seen is not None and seen.ready:
                    pending.remove(node)
                    self.say(node.start.ready_line(node.id, time.monotonic(), str(node.log)))
            if not pending:
                return
            if time.monotonic() > deadline:
                raise DevError(f"not ready after {READY_TIMEOUT_S:.0f} s: {[n.id for n in pending]}; see {self.root}")
            time.sleep(0.5)

    def _security(self) -> str:
        """Return whether the nodes require authentication (they read IQGRAPH_* settings from this environment)."""
        try:
            return load_settings({"app": self.options.app}).describe_security()
        except SettingsError as exc:
            return f"security settings: {exc}"

    def _print_example(self) -> None:
        try:
            response = httpx.post(f"{self.nodes[0].url}/graphql", json={"query": INTROSPECTION}, timeout=30)
            schema = schema_from_introspection(response.json()["data"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self.say(f"no example query: the schema could not be read ({exc}); GraphiQL's docs show every field")
            return
        keys = sample_keys(self.app, self.samples)
        self.say("an example query to paste into GraphiQL:\n" + example_query(schema, self.app, keys))
        subscription = example_subscription(schema, self.app, keys)
        if subscription is not None:
            url = self.nodes[0].url
            self.say(
                "a subscription to paste into GraphiQL (each new value, live; a client's websocket: "
                f"{url.replace('http', 'ws', 1)}/graphql, graphql-transport-ws; or GraphQL over SSE: POST to "
                f"{url}/graphql with Accept: text/event-stream):\n" + subscription
            )


@dataclass
class NodeProcess:
    """One ``iqgraph serve`` process of the run."""

    id: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    start: NodeStart

    def wait_or_kill(self, deadline: float) -> None:
        """Wait until the node has stopped (after SIGTERM it drains requests and closes RocksDB) or kill its group."""
        try:
            self.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # its group: Spark's JVM too
            self.process.wait()

    def tail(self, lines: int = 20) -> str:
        """Return the end of the node's log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
