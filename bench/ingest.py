"""Ingest throughput and produce → visible latency of one node, on Apache Kafka and the shop example.

One run, all on this machine, against one embedded Apache Kafka broker (``streaming.apache_kafka.KafkaBroker``):

1. produce ``--events`` generated shop orders into a 6-partition topic, from ``--producers`` processes in
   parallel, with ordinary batching;
2. raw consume: a plain confluent-kafka Consumer assigned every partition from offset 0 reads them all in
   bulk, the ceiling on the Kafka side (records/s); again with larger fetches;
3. for each source of ``--source`` (default both, in one run on the same topic and Spark session: Spark's own
   Kafka connector ``kafka``, then the ``iqkafka`` Python Data Source), from empty stores:
   a. ingest: a StreamRunner over the 6 partitions until every partition has applied everything: events/s
      over the whole run (Spark and Python worker warm-up included), and without the first batch (rows /
      ``triggerExecution`` of the later batches, from the streaming query's progress);
   b. latency under light load: with the runner caught up (trigger ``--trigger``), one order at a time at
      ``--rate`` per second for ``--seconds``, each with a customer key of its own, the store polled until the
      key's order count is visible: p50 and p99 in ms;
4. a summary, and as the last line one JSON object with every figure.

CPU seconds of the node (this process, the Spark JVM and its Python workers) and of the broker (its JVM) are
reported for the ingest and latency steps: on a shared machine they move less than wall time does.

Targets (printed, not asserted; the ingest issue): steady ingest ≥ 100,000 events/s and ≥ 0.25 of the raw
consume rate, produce → visible p50 ≤ 250 ms and p99 ≤ 500 ms at light load.

Usage: ``make bench-ingest`` or ``.venv/bin/python bench/ingest.py [--events N] [--max-records-per-batch M]
[--source kafka,iqkafka]``; ``--source kafka,kafka+changelog=off`` measures the changelog's cost side by side.
Run it from the repository root: Spark's Python workers import ``streaming`` from the working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

# Run as a script, bench/ comes first on sys.path; put the repository ahead of it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iqgraph.examples.shop import build_app, generate_orders  # noqa: E402
from iqgraph.stores import StateDirectory  # noqa: E402
from iqgraph.streaming.apache_kafka import KafkaBroker  # noqa: E402
from iqgraph.streaming.broker import JAVA_PARTITIONER, produce  # noqa: E402
from iqgraph.streaming.definitions import App  # noqa: E402
from iqgraph.streaming.kafka_jars import ensure_kafka_jars  # noqa: E402
from iqgraph.streaming.partitioner import partition_for  # noqa: E402
from iqgraph.streaming.runner import RunnerSettings, StreamRunner  # noqa: E402
from iqgraph.streaming.session import build_spark_session  # noqa: E402
from tests.support.spark_cluster import StandaloneCluster  # noqa: E402

PARTITIONS = 6
SEED = 11
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TARGET_EVENTS_PER_S = 100_000
TARGET_RAW_RATIO = 0.25
TARGET_P50_MS = 250.0
TARGET_P99_MS = 500.0
#: Parts of a micro-batch's triggerExecution in the query's progress (addBatch holds our sink).
DURATIONS = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")
#: Larger fetches than librdkafka's defaults.
LARGE_FETCHES = {"max.partition.fetch.bytes": 16 << 20, "fetch.max.bytes": 64 << 20}

log = logging.getLogger("bench.ingest")


# -- CPU time -------------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[int, str, float] | None:
    """Return (parent pid, name, CPU seconds of the process and its reaped children) from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
    ticks = sum(int(x) for x in rest[11:15])  # utime stime cutime cstime
    return int(rest[1]), name, ticks / os.sysconf("SC_CLK_TCK")


#: The embedded broker's JVM, whose CPU time is counted apart from the node's (set once it runs).
BROKER_PID: int | None = None


def cpu_seconds() -> dict[str, float]:
    """Return the CPU seconds used so far by this process tree: the broker apart, the node (the rest)."""
    if not Path("/proc/self/stat").exists():
        return {}
    stats = {int(d): s for d in os.listdir("/proc") if d.isdigit() and (s := _proc_stat(int(d))) is not None}
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    totals, pending = {"node": 0.0, "broker": 0.0}, [(os.getpid(), "node")]
    while pending:
        pid, part = pending.pop()
        part = "broker" if pid == BROKER_PID else part
        totals[part] += stats[pid][2]
        pending.extend((child, part) for child in children.get(pid, []) if child in stats)
    return totals


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    """Return the CPU seconds used since before (a cpu_seconds() result)."""
    return {k: round(v - before.get(k, 0.0), 1) for k, v in cpu_seconds().items()}


# -- 1. produce ----------------------------------------------------------------------------------------


def _orders(start: int, stop: int, step: int = 1) -> Iterator[tuple[bytes, bytes]]:
    """Yield the shop orders start, start + step, ... < stop of the bench's one generated sequence."""
    for customer, order in itertools.islice(generate_orders(SEED, START_MS), start, stop, step):
        yield str(customer).encode(), orjson.dumps(order)


def _produce_share(args: tuple[str, str, int, int, int]) -> int:
    """Produce every workers-th order from worker (runs in a producer process)."""
    bootstrap, topic, events, worker, workers = args
    return produce(bootstrap, topic, ((k, v, None) for k, v in _orders(worker, events, workers)))


def produce_events(bootstrap: str, topic: str, events: int, workers: int) -> float:
    """Produce the bench's events from workers processes in parallel; return the seconds it took."""
    started = time.perf_counter()
    shares = [(bootstrap, topic, events, w, workers) for w in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        sent = sum(pool.map(_produce_share, shares))
    if sent != events:
        raise RuntimeError(f"produced {sent} events, expected {events}")
    return time.perf_counter() - started


# -- 2. raw consume --------------------------------------------------------------------------------------


def raw_consume(
    bootstrap: str, topic: str, events: int, config: dict[str, Any] | None = None, timeout: float = 120.0
) -> float:
    """Read every partition from offset 0 with one plain consumer; return the seconds until events were read."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **(config or {}),
        }
    )
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        read, deadline = 0, started + timeout
        while read < events:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is not None:
                    raise RuntimeError(f"consume failed: {message.error()}")
                read += 1
            if time.perf_counter() > deadline:
                raise TimeoutError(f"raw consumer read {read} of {events} in {timeout:.0f} s")
        return time.perf_counter() - started
    finally:
        consumer.close()


# -- 3. ingest -------------------------------------------------------------------------------------------


class SinkTimes(logging.Handler):
    """Collect the sink's per-batch 'spark X ms, merge Y ms' (logger streaming.sink, INFO)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.batches: dict[int, tuple[float, float]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if str(record.msg).startswith("batch %d of %s") and isinstance(args, tuple) and len(args) == 5:
            batch_id, _, _, spark_ms, merge_ms = args
            self.batches[int(str(batch_id))] = (float(str(spark_ms)), float(str(merge_ms)))


@dataclass
class Batch:
    """One micro-batch of the streaming query, from its progress report and the sink's log."""

    batch_id: int
    rows: int
    durations_ms: dict[str, int]
    spark_ms: float | None = None
    merge_ms: float | None = None

    @property
    def trigger_ms(self) -> int:
        """Return the batch's whole duration."""
        return self.durations_ms.get("triggerExecution", 0)

    def summary(self) -> dict[str, Any]:
        """Return the batch as compact JSON-able figures."""
        sink = {} if self.spark_ms is None else {"sink_spark": round(self.spark_ms), "merge": round(self.merge_ms or 0)}
        return {"id": self.batch_id, "rows": self.rows, "ms": self.durations_ms, **sink}


def batches_of(runner: StreamRunner, sink: SinkTimes) -> list[Batch]:
    """Return the non-empty micro-batches the runner's (only) query reports, in order."""
    progress = runner._queries[0].recentProgress  # noqa: SLF001 - no public accessor yet
    result = []
    for report in progress:
        if report.numInputRows <= 0:
            continue
        durations = {k: int(v) for k, v in report.durationMs.items() if k in (*DURATIONS, "triggerExecution")}
        spark_ms, merge_ms = sink.batches.get(report.batchId, (None, None))
        result.append(Batch(report.batchId, report.numInputRows, durations, spark_ms, merge_ms))
    return result


@dataclass
class Ingest:
    """What the ingest step measured."""

    seconds: float
    events: int
    batches: list[Batch] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Return events/s from query start until every partition had applied everything."""
        return self.events / self.seconds

    @property
    def steady_rate(self) -> float | None:
        """Return events/s of every batch but the first (rows / triggerExecution)."""
        later = self.batches[1:]
        took = sum(b.trigger_ms for b in later)
        return sum(b.rows for b in later) / (took / 1000) if later and took else None


def ingest(runner: StreamRunner, topic: str, sink: SinkTimes, timeout: float) -> Ingest:
    """Start the runner over every partition and wait until it has applied every event in the topic."""
    events = sum(runner.offsets(topic).latest(range(PARTITIONS)).values())  # also an earlier source's latency orders
    cpu = cpu_seconds()
    started = time.perf_counter()
    runner.start({topic: range(PARTITIONS)})
    runner.wait_until_caught_up(timeout=timeout, poll=0.05)
    result = Ingest(time.perf_counter() - started, events, cpu=cpu_since(cpu))
    deadline = time.monotonic() + 30
    while sum(b.rows for b in result.batches) < events and time.monotonic() < deadline:
        time.sleep(0.05)  # the last progress report follows the sink's commit by a few ms
        result.batches = batches_of(runner, sink)
    return result


# -- 4. latency ------------------------------------------------------------------------------------------


def latency_events(events: int, count: int) -> list[tuple[str, bytes]]:
    """Return count orders after the bench's events, each with a customer key of its own."""
    run = uuid.uuid4().hex[:8]
    result = []
    for i, (_, order) in enumerate(itertools.islice(generate_orders(SEED, START_MS), events, events + count)):
        customer = f"latency-{run}-{i:05d}"
        result.append((customer, orjson.dumps({**order, "customer": customer})))
    return result


def measure_latency(
    runner: StreamRunner, app: App, bootstrap: str, orders: list[tuple[str, bytes]], rate: float, timeout: float = 30.0
) -> list[float]:
    """Produce orders at rate per second; return ms from produce() until each key's count is visible in the stores."""
    topic = app.topics[0]
    views = {p: s.kv("order_count") for p, s in runner.partitions[topic.name].items()}
    partitions = {k: partition_for(k, topic.partitions, topic.key_format, app.kafka.partitioner) for k, _ in orders}

    def visible(keys: list[str]) -> list[str]:
        return [key for key in keys if views[partitions[key]].get(key) is not None]

    return visible_after_produce(bootstrap, topic.name, orders, rate, visible, timeout)


def visible_after_produce(
    bootstrap: str,
    topic: str,
    orders: list[tuple[str, bytes]],
    rate: float,
    visible: Callable[[list[str]], list[str]],
    timeout: float = 30.0,
) -> list[float]:
    """Produce orders (each a key of its own) at rate per second with the Java client's partitioner and no linger;
    return ms from produce() until visible (which of the pending keys can be seen now, asked every 5 ms) has each."""
    producer = Producer({**JAVA_PARTITIONER, "linger.ms": 0, "bootstrap.servers": bootstrap})  # sent at once
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error)

    pending: dict[str, float] = {}
    latencies: list[float] = []
    started = time.perf_counter()
    sent, deadline = 0, started + len(orders) / rate + timeout
    while (sent < len(orders) or pending) and time.perf_counter() < deadline:
        if sent < len(orders) and time.perf_counter() >= started + sent / rate:
            key, value = orders[sent]
            pending[key] = time.perf_counter()
            producer.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery)
            sent += 1
        producer.poll(0)
        if pending:
            seen = visible(list(pending))
            now = time.perf_counter()
            for key in seen:
                latencies.append((now - pending.pop(key)) * 1000)
        time.sleep(0.005)  # a 5 ms poll: resolution enough, and it leaves the 2 cores to Spark
    producer.flush(10)
    if errors or pending:
        log.warning("latency: %d delivery errors, %d orders never visible", len(errors), len(pending))
    return latencies


def percentile(values: list[float], q: int) -> float | None:
    """Return the q-th percentile of values (inclusive method); None without values."""
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def medians(batches: list[Batch]) -> dict[str, Any]:
    """Return how many batches there were and their median rows and durations (ms)."""
    if not batches:
        return {"batches": 0}
    result: dict[str, Any] = {"batches": len(batches), "rows": statistics.median(b.rows for b in batches)}
    for name in ("triggerExecution", *DURATIONS):
        result[name] = statistics.median(b.durations_ms.get(name, 0) for b in batches)
    if all(b.spark_ms is not None for b in batches):
        result["sink_spark"] = round(statistics.median(b.spark_ms or 0 for b in batches))
        result["sink_merge"] = round(statistics.median(b.merge_ms or 0 for b in batches))
    return result


@dataclass
class Latency:
    """What the latency step measured."""

    rate: float
    latencies: list[float]
    batches: list[Batch]
    cpu: dict[str, float]

    def summary(self) -> dict[str, Any]:
        """Return the step's figures, JSON-able."""
        p50, p99 = percentile(self.latencies, 50), percentile(self.latencies, 99)
        return {
            "latency_p50_ms": None if p50 is None else round(p50, 1),
            "latency_p99_ms": None if p99 is None else round(p99, 1),
            "latency_samples": len(self.latencies),
            "latency_rate_per_s": self.rate,
            "latency_batches": medians(self.batches),
            "latency_cpu_s": self.cpu,
        }


def light_load(runner: StreamRunner, app: App, bootstrap: str, args: argparse.Namespace, sink: SinkTimes) -> Latency:
    """Run the latency step on a caught-up runner, after --warmup seconds of the same load (not measured)."""
    if args.warmup:  # the Spark JVM compiles the light batches' code for ~1 minute: C2 took ~0.9 of the 2 cores
        measure_latency(runner, app, bootstrap, latency_events(args.events, int(args.rate * args.warmup)), args.rate)
    orders = latency_events(args.events, int(args.rate * args.seconds))
    last, cpu = max((b.batch_id for b in batches_of(runner, sink)), default=-1), cpu_seconds()
    latencies = measure_latency(runner, app, bootstrap, orders, args.rate)
    used = cpu_since(cpu)
    time.sleep(0.5)  # the last batch's progress report
    return Latency(args.rate, latencies, [b for b in batches_of(runner, sink) if b.batch_id > last], used)


# -- 5. report -------------------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    """Return what the figures depend on besides the code."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_1min": round(os.getloadavg()[0], 2),
    }


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "n/a" if value is None else format(value, spec)


def source_summary(run: Ingest, light: Latency, raw: float) -> dict[str, Any]:
    """Return the figures of one source's ingest and latency steps, JSON-able."""
    steady = run.steady_rate
    return {
        "ingest_events": run.events,
        "ingest_events_per_s": round(run.rate),
        "ingest_events_per_s_excl_first": None if steady is None else round(steady),
        "ratio_ingest_raw": None if steady is None else round(steady / raw, 3),
        "ratio_ingest_raw_incl_first": round(run.rate / raw, 3),
        "ingest_seconds": round(run.seconds, 2),
        "ingest_cpu_s": run.cpu,
        **light.summary(),
        "batches": [b.summary() for b in run.batches],
    }


def summary(
    args: argparse.Namespace, kafka: dict[str, float], runs: dict[str, tuple[Ingest, Latency]]
) -> dict[str, Any]:
    """Return every figure of the run as one JSON-able object (per source under "sources")."""
    raw = kafka["raw_consume_rate"]
    return {
        "broker": "Apache Kafka",
        "events": args.events,
        "partitions": PARTITIONS,
        "max_records_per_batch": args.max_records_per_batch,
        "trigger": args.trigger,
        "master": args.master,
        **{k: round(v) for k, v in kafka.items()},
        "sources": {name: source_summary(run, light, raw) for name, (run, light) in runs.items()},
        "targets": {
            "events_per_s": TARGET_EVENTS_PER_S,
            "ratio_raw": TARGET_RAW_RATIO,
            "p50_ms": TARGET_P50_MS,
            "p99_ms": TARGET_P99_MS,
        },
        "machine": {**machine(), "load_1min_at_start": args.load_at_start},
        "seconds": round(time.perf_counter() - args.started, 1),
    }


def print_batches(batches: list[Batch]) -> None:
    """Print one line per ingest batch: its rows and where its time went."""
    names = " ".join(f"{d[:10]:>10}" for d in DURATIONS)
    print(f"{'batch':>5} {'rows':>7} {'trigger':>7} {names} {'sink spark':>10} {'merge':>6}  (ms)")
    for b in batches:
        cells = " ".join(f"{b.durations_ms.get(d, 0):>10,}" for d in DURATIONS)
        print(f"{b.batch_id:>5} {b.rows:>7,} {b.trigger_ms:>7,} {cells} {_fmt(b.spark_ms):>10} {_fmt(b.merge_ms):>6}")


def report(figures: dict[str, Any], producers: int) -> None:
    """Print the human-readable summary of figures (a summary() result)."""
    f = figures
    print(f"ingest bench on Apache Kafka: {f['events']:,} shop orders, {PARTITIONS} partitions, {f['machine']}")
    print(f"produce      {f['produce_rate']:>10,} records/s  ({producers} producer processes, batched)")
    print(f"raw consume  {f['raw_consume_rate']:>10,} records/s  (one confluent-kafka Consumer, default fetches)")
    print(f"raw consume  {f['raw_consume_rate_large_fetches']:>10,} records/s  (the same, {LARGE_FETCHES})")
    for name, s in f["sources"].items():
        ratio, p50 = s["ratio_ingest_raw"], s["latency_p50_ms"]
        print(f"source {name}:")
        print(
            f"  ingest     {s['ingest_events_per_s']:>10,} events/s   ({s['ingest_seconds']} s, first batch included)"
        )
        print(f"  ingest     {_fmt(s['ingest_events_per_s_excl_first']):>10} events/s   (first batch excluded)")
        print(
            f"             target ≥ {TARGET_EVENTS_PER_S:,} events/s; ingest / raw consume {_fmt(ratio, '.3f')}, ",
            end="",
        )
        print(f"target ≥ {TARGET_RAW_RATIO}; CPU s {s['ingest_cpu_s']}")
        print(
            f"  visible    p50 {_fmt(p50, ',.0f')} ms, p99 {_fmt(s['latency_p99_ms'], ',.0f')} ms "
            f"({s['latency_samples']} orders at {s['latency_rate_per_s']:g}/s), "
            f"target p50 ≤ {TARGET_P50_MS:.0f} ms, p99 ≤ {TARGET_P99_MS:.0f} ms; "
            f"CPU s {s['latency_cpu_s']}"
        )
        print(f"             batches under light load (medians): {s['latency_batches']}")


# -- the run ---------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Return the command line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events to produce and ingest")
    parser.add_argument("--max-records-per-batch", type=int, default=20_000)
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    parser.add_argument(
        "--source",
        default="kafka,iqkafka",
        help="the Kafka sources to measure in this run, in order, comma-separated: kafka (Spark's connector), "
        "iqkafka (the Python Data Source); a source may carry librdkafka settings of its own after '+', e.g. "
        "kafka+fetch.wait.max.ms=500 (an A/B of a setting in one run)",
    )
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="start a Spark standalone master and a 2-core worker on loopback and run the queries there",
    )
    parser.add_argument("--shuffle-partitions", type=int, default=2)
    parser.add_argument("--trigger", default="0 seconds", help="trigger interval of the streaming query")
    parser.add_argument("--rate", type=float, default=20.0, help="latency step: orders per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency step: how long")
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="latency step: seconds of the same load first, not measured (the JVM's JIT warms up in ~60 s)",
    )
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="an extra Spark setting")
    parser.add_argument("--kafka", action="append", default=[], metavar="KEY=VALUE", help="a librdkafka setting")
    parser.add_argument("--timeout", type=float, default=600.0, help="ingest timeout (s)")
    parser.add_argument("--verbose", action="store_true", help="print the sink's per-batch log lines")
    args = parser.parse_args()
    args.sources = [name.strip() for name in args.source.split(",") if name.strip()]
    if len(set(args.sources)) < len(args.sources):  # each source's stores and figures are kept by its name
        parser.error(f"--source names a source twice: {args.source}")
    for name in args.sources:
        RunnerSettings("-", source=name.split("+")[0])  # a ValueError names the sources there are
    args.started, args.load_at_start = time.perf_counter(), round(os.getloadavg()[0], 2)
    return args


def setup_logging(verbose: bool) -> SinkTimes:
    """Log warnings (and the sink's per-batch lines when verbose); return the collector of sink timings."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.INFO if verbose else logging.WARNING)
    sink_times = SinkTimes()
    sink_log = logging.getLogger("iqgraph.streaming.sink")
    sink_log.addHandler(sink_times)
    sink_log.setLevel(logging.INFO)
    return sink_times


@contextlib.contextmanager
def standalone_cluster(home: Path) -> Iterator[StandaloneCluster]:
    """Run a Spark standalone master and one 2-core worker on loopback (tests.support.spark_cluster)."""
    cluster = StandaloneCluster(home).start()
    try:
        cluster.add_worker(cores=2, memory="2g")
        yield cluster
    finally:
        cluster.stop()


def run_source(
    source: str, app: App, spark: Any, state: Path, args: argparse.Namespace, bootstrap: str, sink: SinkTimes
) -> tuple[Ingest, Latency]:
    """Ingest the topic from empty stores with one source, then measure latency under light load."""
    name, *own = source.split("+")  # a source's own settings: kafka+fetch.wait.max.ms=500, kafka+changelog=off
    config = dict(item.split("=", 1) for item in [*args.kafka, *own])
    changelog = config.pop("changelog", "on") != "off"  # the changelog topics (issue 41): on by default
    settings = RunnerSettings(
        bootstrap,
        kafka_config=config,
        max_records_per_batch=args.max_records_per_batch,
        trigger_interval=args.trigger,
        source=name,
        changelog=changelog,
    )
    sink.batches.clear()  # batch ids start again at 0 with each query
    runner = StreamRunner(app, spark, StateDirectory(state, app.name), settings)
    try:
        run = ingest(runner, app.topics[0].name, sink, args.timeout)
        light = light_load(runner, app, bootstrap, args, sink)
    finally:
        runner.stop()
    return run, light


def main() -> None:
    global BROKER_PID  # noqa: PLW0603 - set once, read by cpu_seconds
    args = parse_args()
    sink_times = setup_logging(args.verbose)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    app = build_app(topic, partitions=PARTITIONS)
    ensure_kafka_jars()
    with (
        KafkaBroker() as broker,
        tempfile.TemporaryDirectory(prefix="iqgraph-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        BROKER_PID = broker.pid
        broker.create_topics({topic: PARTITIONS})
        bootstrap = broker.bootstrap_servers
        kafka = {"produce_rate": args.events / produce_events(bootstrap, topic, args.events, args.producers)}
        kafka["raw_consume_rate"] = args.events / raw_consume(bootstrap, topic, args.events)
        kafka["raw_consume_rate_large_fetches"] = args.events / raw_consume(
            bootstrap, topic, args.events, LARGE_FETCHES
        )
        # the query's progress reports are where the step's batches are read: keep more than Spark's 100
        conf = dict(item.split("=", 1) for item in args.conf)
        conf = {"spark.sql.streaming.numRecentProgressUpdates": "1000", **conf}
        if args.standalone:  # the executors' CPU is the worker's, not counted in the node's CPU seconds
            cluster = stack.enter_context(standalone_cluster(Path(tmp) / "spark"))
            args.master = cluster.url
            conf = {"spark.driver.host": "127.0.0.1", "spark.executor.memory": "1g", "spark.cores.max": "2", **conf}
        spark = build_spark_session(args.master, shuffle_partitions=args.shuffle_partitions, extra_conf=conf)
        try:
            runs = {
                source: run_source(source, app, spark, Path(tmp) / f"state-{source}", args, bootstrap, sink_times)
                for source in args.sources
            }
        finally:
            spark.stop()
    figures = summary(args, kafka, runs)
    report(figures, args.producers)
    for source, (run, _) in runs.items():
        print(f"batches of source {source}:")
        print_batches(run.batches)
    print(json.dumps(figures, separators=(",", ":")))


if __name__ == "__main__":
    main()
