"""Ingest throughput and produce → visible latency of one node, on the embedded broker and the shop example.

One run, five steps, all on this machine:

1. produce ``--events`` generated shop orders into a 6-partition topic of an embedded Tansu broker, from
   ``--producers`` processes in parallel (Tansu takes one record per request, ~5k records/s per producer);
2. raw consume: a plain confluent-kafka Consumer assigned every partition from offset 0 reads them all in
   bulk — the ceiling for the Kafka side, in records/s;
3. ingest: a StreamRunner over the 6 partitions, from empty stores, until every partition has applied
   everything; events/s over the whole run (Spark / Python worker warm-up included) and without the first
   batch (the streaming query's progress: rows and ``triggerExecution`` of the later batches);
4. latency under light load: with the runner caught up (trigger ``--trigger``), single orders at ``--rate``
   per second for ``--seconds``, each with a new customer key; the store is polled until the key's count is
   visible; p50 and p99 in ms;
5. a summary, and as the last line one JSON object with every figure.

The targets (printed, not asserted): ≥ 100,000 events/s, ≥ 0.3 of the raw consume rate, p50 ≤ 500 ms.

Usage: ``make bench-ingest`` or ``.venv/bin/python bench/ingest.py [--events N] [--max-records-per-batch M]``.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

# Run as a script, bench/ comes first on sys.path; put the repository ahead of it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.shop import build_app, generate_orders  # noqa: E402
from stores import StateDirectory  # noqa: E402
from streaming.broker import JAVA_PARTITIONER, ONE_RECORD_PER_REQUEST, EmbeddedBroker, produce  # noqa: E402
from streaming.definitions import App  # noqa: E402
from streaming.partitioner import partition_for  # noqa: E402
from streaming.runner import RunnerSettings, StreamRunner  # noqa: E402
from streaming.session import build_spark_session  # noqa: E402

PARTITIONS = 6
SEED = 11
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TARGET_EVENTS_PER_S = 100_000
TARGET_RAW_RATIO = 0.3
TARGET_P50_MS = 500.0
DURATIONS = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")

log = logging.getLogger("bench.ingest")


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


#: Fetch settings under which Tansu serves a consumer ~3x faster than librdkafka's defaults (fewer, larger fetches).
LARGE_FETCHES = {"max.partition.fetch.bytes": 16 << 20, "fetch.max.bytes": 64 << 20}


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
        if record.msg.startswith("batch %d of %s") and isinstance(args, tuple) and len(args) == 5:
            self.batches[int(args[0])] = (float(args[3]), float(args[4]))


@dataclass
class Batch:
    """One micro-batch of the streaming query, from its progress report and the sink's log."""

    batch_id: int
    rows: int
    durations_ms: dict[str, int]
    spark_ms: float | None = None
    merge_ms: float | None = None

    def summary(self) -> dict[str, Any]:
        """Return the batch as compact JSON-able figures."""
        extra = {} if self.spark_ms is None else {"sink_spark": round(self.spark_ms), "sink_merge": round(self.merge_ms or 0)}
        return {"id": self.batch_id, "rows": self.rows, "ms": self.durations_ms, **extra}


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

    @property
    def rate(self) -> float:
        """Return events/s from query start until every partition had applied everything."""
        return self.events / self.seconds

    @property
    def steady_rate(self) -> float | None:
        """Return events/s of every batch but the first (rows / triggerExecution)."""
        later = self.batches[1:]
        took = sum(b.durations_ms.get("triggerExecution", 0) for b in later)
        return sum(b.rows for b in later) / (took / 1000) if later and took else None


def ingest(runner: StreamRunner, topic: str, events: int, sink: SinkTimes, timeout: float) -> Ingest:
    """Start the runner over every partition and wait until it has applied every event."""
    started = time.perf_counter()
    runner.start({topic: range(PARTITIONS)})
    runner.wait_until_caught_up(timeout=timeout, poll=0.05)
    result = Ingest(time.perf_counter() - started, events)
    deadline = time.monotonic() + 30
    while sum(b.rows for b in result.batches) < events and time.monotonic() < deadline:
        time.sleep(0.05)  # the last progress report follows the sink's commit by a few ms
        result.batches = batches_of(runner, sink)
    return result


# -- 4. latency ------------------------------------------------------------------------------------------


def latency_events(app: App, events: int, count: int) -> list[tuple[str, bytes]]:
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
    """Produce orders at rate per second; return ms from produce() until each key's count is visible."""
    topic = app.topics[0]
    views = {p: s.kv("order_count") for p, s in runner.partitions[topic.name].items()}
    producer = Producer({**JAVA_PARTITIONER, **ONE_RECORD_PER_REQUEST, "bootstrap.servers": bootstrap})
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error)

    pending: dict[str, tuple[int, float]] = {}
    latencies: list[float] = []
    started = time.perf_counter()
    sent, deadline = 0, started + len(orders) / rate + timeout
    while (sent < len(orders) or pending) and time.perf_counter() < deadline:
        now = time.perf_counter()
        if sent < len(orders) and now >= started + sent / rate:
            key, value = orders[sent]
            partition = partition_for(key, topic.partitions, topic.key_format, app.kafka.partitioner)
            pending[key] = (partition, time.perf_counter())
            producer.produce(topic.name, key=key.encode(), value=value, on_delivery=on_delivery)
            sent += 1
        producer.poll(0)
        for key, (partition, sent_at) in list(pending.items()):
            if views[partition].get(key) is not None:
                latencies.append((time.perf_counter() - sent_at) * 1000)
                del pending[key]
        time.sleep(0.001)
    producer.flush(10)
    if errors or pending:
        log.warning("latency: %d delivery errors, %d orders never visible", len(errors), len(pending))
    return latencies


def medians(batches: list[Batch]) -> dict[str, Any]:
    """Return the median durations (ms) and rows of batches, with how many there were."""
    if not batches:
        return {"batches": 0}
    result: dict[str, Any] = {"batches": len(batches), "rows": statistics.median(b.rows for b in batches)}
    for name in ("triggerExecution", *DURATIONS):
        result[name] = statistics.median(b.durations_ms.get(name, 0) for b in batches)
    if all(b.spark_ms is not None for b in batches):
        result["sink_spark"] = round(statistics.median(b.spark_ms or 0 for b in batches))
        result["sink_merge"] = round(statistics.median(b.merge_ms or 0 for b in batches))
    return result


def percentile(values: list[float], q: int) -> float | None:
    """Return the q-th percentile of values (inclusive method), None when there are fewer than two."""
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


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


def report(
    args: argparse.Namespace, figures: dict[str, Any], run: Ingest, latencies: list[float], light: list[Batch]
) -> None:
    """Print the human-readable summary, then the JSON summary as the last line."""
    raw, steady = figures["raw_consume_rate"], run.steady_rate
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    print(f"ingest bench: {args.events:,} shop orders, {PARTITIONS} partitions, {machine()}")
    print(f"produce      {figures['produce_rate']:>10,.0f} records/s  ({args.producers} producer processes)")
    print(f"raw consume  {raw:>10,.0f} records/s  (one confluent-kafka Consumer, all partitions)")
    print(f"raw consume  {figures['raw_consume_rate_large_fetches']:>10,.0f} records/s  (the same with {LARGE_FETCHES})")
    print(f"ingest       {run.rate:>10,.0f} events/s  ({run.seconds:.1f} s, first batch included)")
    print(f"ingest       {_fmt(steady):>10} events/s  (first batch excluded)   target ≥ {TARGET_EVENTS_PER_S:,}")
    print(f"ratio        {_fmt(steady and steady / raw, '.3f'):>10} of raw consume             target ≥ {TARGET_RAW_RATIO}")
    print(f"visible p50  {_fmt(p50, ',.0f'):>10} ms  p99 {_fmt(p99, ',.0f')} ms  ({len(latencies)} orders at {args.rate:g}/s)"
          f"   target p50 ≤ {TARGET_P50_MS:.0f}")
    light_medians = medians(light)
    print(f"  batches under light load: {light_medians}")
    print(f"{'batch':>5} {'rows':>7} {'trigger':>7} " + " ".join(f"{d[:10]:>10}" for d in DURATIONS)
          + f" {'sink spark':>10} {'merge':>6}  (ms)")
    for b in run.batches:
        cells = " ".join(f"{b.durations_ms.get(d, 0):>10,}" for d in DURATIONS)
        print(f"{b.batch_id:>5} {b.rows:>7,} {b.durations_ms.get('triggerExecution', 0):>7,} {cells} "
              f"{_fmt(b.spark_ms):>10} {_fmt(b.merge_ms):>6}")
    summary = {
        "events": args.events,
        "partitions": PARTITIONS,
        "max_records_per_batch": args.max_records_per_batch,
        "trigger": args.trigger,
        "master": args.master,
        **{k: round(v) for k, v in figures.items()},
        "ingest_events_per_s": round(run.rate),
        "ingest_seconds": round(run.seconds, 2),
        "ingest_events_per_s_excl_first": None if steady is None else round(steady),
        "ratio_ingest_raw": None if steady is None else round(steady / raw, 3),
        "ratio_ingest_raw_incl_first": round(run.rate / raw, 3),
        "latency_p50_ms": None if p50 is None else round(p50, 1),
        "latency_p99_ms": None if p99 is None else round(p99, 1),
        "latency_samples": len(latencies),
        "latency_rate_per_s": args.rate,
        "latency_batch_medians_ms": light_medians,
        "batches": [b.summary() for b in run.batches],
        "targets": {"events_per_s": TARGET_EVENTS_PER_S, "ratio_raw": TARGET_RAW_RATIO, "p50_ms": TARGET_P50_MS},
        "machine": machine(),
        "seconds": round(time.perf_counter() - args.started, 1),
    }
    print(json.dumps(summary, separators=(",", ":")))


# -- the run ---------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Return the command line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events to produce and ingest")
    parser.add_argument("--max-records-per-batch", type=int, default=20_000)
    parser.add_argument("--producers", type=int, default=4, help="producer processes (Tansu: ~5k records/s each)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--shuffle-partitions", type=int, default=2)
    parser.add_argument("--trigger", default="0 seconds", help="trigger interval of the streaming query")
    parser.add_argument("--rate", type=float, default=20.0, help="latency step: orders per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency step: how long")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    parser.add_argument("--timeout", type=float, default=600.0, help="ingest timeout (s)")
    parser.add_argument("--verbose", action="store_true", help="print the sink's per-batch log lines")
    args = parser.parse_args()
    args.started = time.perf_counter()
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sink_times = SinkTimes()
    sink_log = logging.getLogger("streaming.sink")
    sink_log.addHandler(sink_times)
    sink_log.setLevel(logging.INFO)
    for handler in logging.getLogger().handlers:  # the sink's per-batch INFO lines only with --verbose
        handler.setLevel(logging.INFO if args.verbose else logging.WARNING)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    app = build_app(topic, partitions=PARTITIONS)
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="iqgraph-bench-") as tmp:
        broker.create_topics({topic: PARTITIONS})
        bootstrap = broker.bootstrap_servers
        figures = {"produce_rate": args.events / produce_events(bootstrap, topic, args.events, args.producers)}
        figures["raw_consume_rate"] = args.events / raw_consume(bootstrap, topic, args.events)
        figures["raw_consume_rate_large_fetches"] = args.events / raw_consume(bootstrap, topic, args.events, LARGE_FETCHES)
        extra = dict(item.split("=", 1) for item in args.conf)
        spark = build_spark_session(args.master, shuffle_partitions=args.shuffle_partitions, extra_conf=extra)
        settings = RunnerSettings(bootstrap, max_records_per_batch=args.max_records_per_batch, trigger_interval=args.trigger)
        runner = StreamRunner(app, spark, StateDirectory(Path(tmp) / "state", app.name), settings)
        try:
            run = ingest(runner, topic, args.events, sink_times, args.timeout)
            orders = latency_events(app, args.events, int(args.rate * args.seconds))
            latencies = measure_latency(runner, app, bootstrap, orders, args.rate)
            time.sleep(0.5)  # the last batch's progress report
            light = batches_of(runner, sink_times)[len(run.batches) :]
        finally:
            runner.stop()
            spark.stop()
    report(args, figures, run, latencies, light)


if __name__ == "__main__":
    main()
