"""A broker killed under a running node (the issue's drill): nothing lost, nothing applied twice, queries answer.

Three Apache Kafka brokers (replication factor 3, min.insync.replicas 2) and ONE real node counting and summing
the records of a 3-partition topic. An idempotent acks=all producer sends all along, a client asks the node for
every key all along, and `KafkaOffsets` (the node's offsets client) lists the end offsets all along. Mid-ingest
the leader of partition 0 is killed with SIGKILL; the producer keeps producing (two in-sync replicas of three
are enough). The broker stays dead until its partitions have new leaders, the producer goes on through them (a
record acknowledged after the kill in every partition) and the node has applied such a record in every partition;
then it is started again. Then:
- the node went on at most AFTER_KAFKA_S after the producer did (Kafka's own part, 3-11 s here), the broker still
  dead (a lost machine): Spark's source lists each batch's offsets with the admin client of kafka-clients 4.4.0,
  which looks a dead leader's partitions up again (with 3.9.2 a listing begun at the kill waited for the broker's
  return or 60 s: tests/streaming/test_spark_kafka_client.py);
- every answer of the run came without an error, and none counted more than had been produced for its key
  (nothing applied twice, never invented) nor less than the node had answered before (a single node's store
  only grows); the node never went 5 s without answering;
- the brokers acknowledged each record once, at consecutive offsets (idempotence: nothing twice in the log),
  and the stores end exactly at what the producer had acknowledged (nothing lost);
- every offset listing answered, with true offsets (librdkafka answered FENCED_LEADER_EPOCH and offset -1001
  before `streaming.kafka_offsets` retried them);
- every partition is RUNNING, the node is ready, and its streaming query never died (no restart).
It prints what it measured: records, answers, errors by code, and per partition the seconds from the kill to
the first record acknowledged after it and to the node's applying one.
"""

from __future__ import annotations

import random
import textwrap
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import KafkaError, Message, Producer

from iqgraph.streaming.apache_kafka import KafkaBroker, KafkaCluster
from iqgraph.streaming.broker import BATCHING, JAVA_PARTITIONER, free_port
from iqgraph.streaming.kafka_jars import ensure_kafka_jars
from iqgraph.streaming.kafka_offsets import KafkaOffsets, KafkaSourceError
from tests.support.nodes import NodeProcess, start_node, wait_ready

PARTITIONS = 3
KEYS = [f"k{i:02d}" for i in range(40)]
INITIAL = 400  # records produced before the node starts: every key has some
RATE = 200.0  # records per second while the drill runs
WARM_UP_S = 3.0  # load before the kill
OUTAGE_S = 60.0  # the broker dead at most: until every partition is led and written without it (~5 s)
#: From the producer's first record acknowledged after the kill (in every partition) to the node's applying one, the
#: broker still dead, at most. With kafka-clients 3.9.2 under Spark's source: 56.0 s in 1 run of 4 (the listing's
#: 60 s deadline; 1.4-3.1 s in the others: where the kill lands decides); with 4.4.0: 2.9-7.3 s in 7 runs. The rest
#: is room for a loaded machine (the suite's: 12.1 s once in an earlier remedy's CI run).
AFTER_KAFKA_S = 20.0
AFTER_S = 60.0  # load after the broker is back, at most: until every partition goes on with it in sync
#: Fast failover on one machine (as in tests/streaming/test_apache_kafka.py): a dead broker is fenced in ~3 s.
FAST_FAILOVER = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "5000",
}
QUERY = "query($k: [String!]!) { hits { getMany(keys: $k) } total { getMany(keys: $k) } }"

APP = """
from iqgraph.streaming.definitions import App, KafkaSettings, Topic, count, key_value_store, sum_

app = App(
    "drill",
    [Topic({topic!r}, schema="amount BIGINT", event_time=None, partitions={partitions})],
    [key_value_store("hits", {topic!r}, count()), key_value_store("total", {topic!r}, sum_("amount"))],
    kafka=KafkaSettings(bootstrap_servers={servers!r}),
)
"""


class Background:
    """A daemon thread running `_run` from `start` until `stop` (which may come first, or twice)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)

    def _run(self) -> None:
        raise NotImplementedError


class Ingest(Background):
    """An idempotent acks=all producer sending RATE records per second; what it handed over and got acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer({**JAVA_PARTITIONER, **BATCHING, "bootstrap.servers": bootstrap})
        self.handed: Counter[str] = Counter()  # records per key handed to the producer (acknowledged or not yet)
        self.handed_sum: Counter[str] = Counter()
        self.acked: list[tuple[str, int, int, int, float]] = []  # (key, amount, partition, offset, time acknowledged)
        self.failed: list[KafkaError] = []
        self._random = random.Random(7)  # noqa: S311 - test data
        super().__init__()

    def produce(self, count: int) -> None:
        """Produce count records now and wait until the brokers acknowledged them."""
        for i in range(count):
            self._one(KEYS[i % len(KEYS)])
        self.flush()

    def stop(self) -> None:
        """Stop producing and wait until every record handed over is acknowledged (or failed)."""
        super().stop()
        self.flush()

    def flush(self) -> None:
        assert self.producer.flush(60) == 0, "records left unacknowledged after 60 s"

    def acked_end(self, partition: int) -> int:
        """Return the offset after the last acknowledged record of partition (0 if none)."""
        return 1 + max((offset for _, _, p, offset, _ in list(self.acked) if p == partition), default=-1)

    def _one(self, key: str) -> None:
        amount = self._random.randint(1, 9)
        self.handed[key] += 1  # counted before it is sent: an answer counting it never finds it missing
        self.handed_sum[key] += amount
        value = orjson.dumps({"amount": amount})

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                self.failed.append(error)
            else:
                at = time.monotonic()
                offset = message.offset()  # None: a retry found it written (librdkafka#4438): offset unsaid
                self.acked.append((key, amount, message.partition() or 0, -1 if offset is None else offset, at))

        self.producer.produce(self.topic, key=key.encode(), value=value, on_delivery=delivered)
        self.producer.poll(0)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._one(self._random.choice(KEYS))
            next_at += 1 / RATE
            self._stop.wait(max(next_at - time.monotonic(), 0))


class Asker(Background):
    """A client asking the node for every key's count and sum all along, checking each answer as it comes."""

    def __init__(self, node: NodeProcess, ingest: Ingest) -> None:
        self.node = node
        self.ingest = ingest
        self.answered: list[float] = []  # when each answer came
        self.errors: Counter[str] = Counter()  # by extensions.code (or HTTP status, or the client's exception)
        self.wrong: list[str] = []
        self.longest_s = 0.0
        self._last: dict[str, tuple[int, int]] = {}
        super().__init__()

    def longest_gap(self, start: float, end: float) -> float:
        """Return the longest time without an answer between start and end."""
        times = [start, *(at for at in self.answered if start < at < end), end]
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    def _run(self) -> None:
        with httpx.Client() as client:
            while not self._stop.is_set():
                self._ask(client)
                self._stop.wait(0.05)  # leave the two cores some room

    def _ask(self, client: httpx.Client) -> None:
        sent = time.monotonic()
        try:
            response = client.post(
                f"{self.node.url}/graphql", json={"query": QUERY, "variables": {"k": KEYS}}, timeout=30
            )
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            body = {"errors": [{"extensions": {"code": exc.__class__.__name__}}]}
            response = None
        self.answered.append(time.monotonic())
        self.longest_s = max(self.longest_s, self.answered[-1] - sent)
        if response is not None and response.status_code >= 400 and not body.get("errors"):
            body = {"errors": [{"extensions": {"code": f"HTTP {response.status_code}"}}]}
        for error in body.get("errors") or []:
            self.errors[(error.get("extensions") or {}).get("code") or str(error.get("message"))[:80]] += 1
        if not body.get("errors"):
            self._check(body["data"])

    def _check(self, data: dict[str, Any]) -> None:
        """Record what is wrong with an answer: a null, more than produced, or less than answered before."""
        handed, handed_sum = dict(self.ingest.handed), dict(self.ingest.handed_sum)  # read after the answer came
        for key, hits, total in zip(KEYS, data["hits"]["getMany"], data["total"]["getMany"], strict=True):
            before = self._last.get(key, (0, 0))
            if hits is None or total is None:
                self.wrong.append(f"{key}: null")
            elif hits > handed.get(key, 0) or total > handed_sum.get(key, 0):
                self.wrong.append(
                    f"{key}: {hits} records, sum {total}; produced {handed.get(key)}, {handed_sum.get(key)}"
                )
            elif hits < before[0] or total < before[1]:
                self.wrong.append(f"{key}: {hits}, {total} after {before}")
            else:
                self._last[key] = (hits, total)


class OffsetsProbe(Background):
    """The node's offsets client (`KafkaOffsets`, its timeout) asked for every end offset all along, in a thread."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.offsets = KafkaOffsets({"bootstrap.servers": bootstrap}, topic)
        self.answers = 0
        self.errors: list[str] = []
        self.wrong: list[str] = []  # an offset below 0, or below one answered before (ends only grow)
        self.longest_s = 0.0
        self._last = dict.fromkeys(range(PARTITIONS), 0)
        super().__init__()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            began = time.monotonic()
            try:
                ends = self.offsets.latest(range(PARTITIONS))
            except KafkaSourceError as exc:
                self.errors.append(str(exc))
                continue
            finally:
                self.longest_s = max(self.longest_s, time.monotonic() - began)
            self.answers += 1
            self.wrong += [f"{p}: {end} after {self._last[p]}" for p, end in ends.items() if end < self._last[p]]
            self._last.update(ends)


class ReadyLog(Background):
    """The node's /readyz every 0.2 s in a thread: (time, status, body) of each answer."""

    def __init__(self, node: NodeProcess) -> None:
        self.node = node
        self.seen: list[tuple[float, int, dict[str, Any]]] = []
        super().__init__()

    def first(self, after: float, partition: int, beyond: int) -> float | None:
        """Return when the node first showed partition applied beyond an offset, after a time (None: never)."""
        return next(
            (at for at, _, body in list(self.seen) if at > after and applied(body).get(partition, 0) > beyond), None
        )

    def _run(self) -> None:
        with httpx.Client() as client:
            while not self._stop.wait(0.2):
                try:
                    response = client.get(f"{self.node.url}/readyz", timeout=5)
                    self.seen.append((time.monotonic(), response.status_code, response.json()))
                except (httpx.HTTPError, ValueError):
                    continue


def applied(body: dict[str, Any]) -> dict[int, int]:
    """Return the applied offset of each partition a /readyz body shows."""
    return {p["partition"]: p["appliedOffset"] for p in body.get("partitions") or []}


@dataclass
class Drill:
    """What the drill saw."""

    node: NodeProcess
    ingest: Ingest
    asker: Asker
    ready: ReadyLog
    probe: OffsetsProbe
    victim: int = -1  # the killed broker's node id
    victim_partitions: list[int] = field(default_factory=list)  # the partitions it led
    ends_at_kill: dict[int, int] = field(default_factory=dict)  # acknowledged end offset of each partition
    killed: float = 0.0
    restarted: float = 0.0
    caught_up: float = 0.0

    def producer_back(self) -> dict[int, float]:
        """Return, per partition, seconds from the kill to the first record acknowledged after it (inf: none)."""
        acked = list(self.ingest.acked)
        return {
            p: min((at for _, _, q, offset, at in acked if q == p and offset >= end), default=float("inf"))
            - self.killed
            for p, end in self.ends_at_kill.items()
        }

    def node_back(self) -> dict[int, float]:
        """Return, per partition, seconds from the kill to the node's applying a record acknowledged after it."""
        return {
            p: (self.ready.first(self.killed, p, end) or float("inf")) - self.killed
            for p, end in self.ends_at_kill.items()
        }


def leaders(cluster: KafkaCluster, topic: str) -> dict[int, int]:
    """Return each partition's leader (broker id) as the cluster's metadata shows it."""
    partitions = cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions
    return {p: meta.leader for p, meta in partitions.items()}


def wait_isr(cluster: KafkaCluster, topic: str, timeout: float = 30) -> None:
    """Wait until every partition of topic has its three replicas in sync again."""
    deadline = time.monotonic() + timeout
    while True:
        partitions = cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions
        if all(len(meta.isrs) == 3 for meta in partitions.values()):
            return
        assert time.monotonic() < deadline, f"{topic}: replicas not all in sync {timeout} s after the restart"
        time.sleep(0.2)


def wait_led_without(cluster: KafkaCluster, topic: str, victim: int, timeout: float = OUTAGE_S) -> None:
    """Wait until every partition of topic has a leader other than the killed broker victim."""
    deadline, led = time.monotonic() + timeout, {}
    while True:
        led = leaders(cluster, topic)
        if len(led) == PARTITIONS and all(leader not in (victim, -1) for leader in led.values()):
            return
        assert time.monotonic() < deadline, f"{topic}: no new leader {timeout} s after broker {victim}'s kill: {led}"
        time.sleep(0.2)


def wait_acked(drill: Drill, ends: dict[int, int], timeout: float) -> None:
    """Wait until, in every partition, the producer got a record after ends (acknowledged end offsets) acknowledged."""
    deadline = time.monotonic() + timeout
    while any(drill.ingest.acked_end(p) <= end for p, end in ends.items()):
        assert not drill.ingest.failed, drill.ingest.failed[:3]
        assert time.monotonic() < deadline, f"no record acknowledged after {ends} in {timeout} s"
        time.sleep(0.1)


def wait_going_on(drill: Drill, since: float, ends: dict[int, int], timeout: float) -> None:
    """Wait until, in every partition, the node has applied the record after ends (the acknowledged end offsets at
    `since`): one the producer got acknowledged after `since`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(drill.ready.first(since, p, end) is not None for p, end in ends.items()):
            return
        assert drill.node.process.poll() is None, drill.node.log.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(
        f"the node applied no record acknowledged after {ends} in {timeout:.1f} s: {drill.ready.seen[-1:]}"
    )


def wait_caught_up(drill: Drill, timeout: float = 60) -> None:
    """Wait until the node is ready and has applied every acknowledged record."""
    ends = {p: drill.ingest.acked_end(p) for p in range(PARTITIONS)}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = drill.ready.seen[-1:]
        if seen and seen[0][1] == 200 and applied(seen[0][2]) == ends:
            drill.caught_up = seen[0][0]
            return
        assert drill.node.process.poll() is None, drill.node.log.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(
        f"not caught up with {ends} in {timeout} s: {drill.ready.seen[-1:]}\n{drill.node.log.read_text()[-3000:]}"
    )


def _rounded(seconds: dict[int, float]) -> dict[int, float]:
    return {p: round(s, 1) for p, s in sorted(seconds.items())}


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drill]:
    """Run the drill: cluster, node, ingest and queries; kill -9 a leader mid-ingest, restart it, catch up."""
    ensure_kafka_jars()
    home = tmp_path_factory.mktemp("broker-loss")
    with KafkaCluster(size=3, heap="256m", properties=FAST_FAILOVER) as cluster:
        topic = f"drill-{free_port()}"
        cluster.create_topics({topic: PARTITIONS}, {"min.insync.replicas": "2"})
        ingest = Ingest(cluster.bootstrap_servers, topic)
        ingest.produce(INITIAL)
        app = APP.format(topic=topic, partitions=PARTITIONS, servers=cluster.bootstrap_servers)
        (home / "drillapp.py").write_text(textwrap.dedent(app))
        node = start_node(home, "drillapp", "node-0", free_port())
        probe = OffsetsProbe(cluster.bootstrap_servers, topic)
        result = Drill(node, ingest, Asker(node, ingest), ReadyLog(node), probe)
        try:
            wait_ready([node], timeout=120)
            result.ready.start()
            probe.start()
            ingest.start()
            result.asker.start()
            time.sleep(WARM_UP_S)
            led = leaders(cluster, topic)
            result.victim = led[0]
            result.victim_partitions = sorted(p for p, leader in led.items() if leader == result.victim)
            victim: KafkaBroker = next(b for b in cluster.brokers if b.node_id == result.victim)
            victim.kill()
            result.killed = time.monotonic()
            result.ends_at_kill = {p: ingest.acked_end(p) for p in range(PARTITIONS)}
            wait_led_without(cluster, topic, result.victim)
            wait_acked(result, result.ends_at_kill, OUTAGE_S)
            wait_going_on(result, result.killed, result.ends_at_kill, OUTAGE_S)
            victim.start()
            result.restarted = time.monotonic()
            wait_isr(cluster, topic)
            back = time.monotonic()
            wait_going_on(result, back, {p: ingest.acked_end(p) for p in range(PARTITIONS)}, AFTER_S)
            ingest.stop()
            wait_caught_up(result)
            for stopped in (result.asker, result.ready, probe):
                stopped.stop()
            yield result
        finally:
            ingest.stop()
            for stopped in (result.asker, result.ready, probe):
                stopped.stop()
            node.kill()


def report(drill: Drill) -> str:
    """Return what the drill measured, in one paragraph."""
    asker, probe = drill.asker, drill.probe
    during = sum(1 for at in asker.answered if drill.killed < at < drill.restarted)
    return (
        f"broker {drill.victim} (leader of partitions {drill.victim_partitions}) killed, back after "
        f"{drill.restarted - drill.killed:.1f} s; {len(drill.ingest.acked)} records acknowledged; "
        f"{len(asker.answered)} answers ({during} while it was dead), errors {dict(asker.errors)}, longest "
        f"{asker.longest_s:.2f} s, longest without an answer {asker.longest_gap(drill.killed, drill.caught_up):.2f} s; "
        f"seconds from the kill to a record acknowledged after it {_rounded(drill.producer_back())}, to the node's "
        f"applying one {_rounded(drill.node_back())} (per partition); caught up "
        f"{drill.caught_up - drill.killed:.1f} s after the kill; pipeline {drill.ready.seen[-1][2].get('pipeline')}; "
        f"end offsets listed {probe.answers}× (errors {len(probe.errors)}, wrong {len(probe.wrong)}, longest "
        f"{probe.longest_s:.1f} s)"
    )


@pytest.mark.slow  # three broker JVMs, a node's Spark and the drill's ~15 s on two cores: ~55 s
def test_a_killed_broker_loses_nothing_applies_nothing_twice_and_queries_answer(drill: Drill) -> None:
    ingest, asker, probe = drill.ingest, drill.asker, drill.probe
    print(f"\nbroker loss: {report(drill)}")

    # the node went on soon after Kafka did, the broker still dead
    after_kafka = max(drill.node_back().values()) - max(drill.producer_back().values())
    assert after_kafka <= AFTER_KAFKA_S, f"the node went on {after_kafka:.1f} s after the producer: {report(drill)}"

    # queries answered all along, never wrong
    assert not asker.errors, f"{sum(asker.errors.values())} errors in {len(asker.answered)} answers: {asker.errors}"
    assert not asker.wrong, f"{len(asker.wrong)} wrong answers, e.g. {asker.wrong[:5]}"
    assert asker.longest_gap(drill.killed, drill.caught_up) < 5, "the node stopped answering"

    # the producer: every record acknowledged once, at consecutive offsets from 0 (its retries through the leader
    # change wrote nothing twice)
    assert not ingest.failed, ingest.failed[:3]
    assert len(ingest.acked) == sum(ingest.handed.values())
    by_partition: dict[int, list[int]] = defaultdict(list)
    for _, _, partition, offset, _ in ingest.acked:
        by_partition[partition].append(offset)
    for partition, offsets in by_partition.items():
        known = sorted(o for o in offsets if o >= 0)  # the unsaid ones (-1) fill the gaps between them
        assert len(set(known)) == len(known) and known[-1:] < [len(offsets)], f"partition {partition}: duplicates"

    # ListOffsets through one long-lived admin client (as the node's runner and topic watch ask) stayed true
    assert not probe.errors, f"{len(probe.errors)} of {probe.answers} offset listings failed, e.g. {probe.errors[:2]}"
    assert not probe.wrong, f"{len(probe.wrong)} wrong end offsets, e.g. {probe.wrong[:3]}"
    shown = [p["endOffset"] for _, _, body in drill.ready.seen for p in body.get("partitions") or []]
    assert min(shown) >= 0, f"the node showed end offset {min(shown)}"

    # the stores: exactly what was acknowledged, each record once; every partition RUNNING, the node ready
    hits: Counter[str] = Counter(key for key, *_ in ingest.acked)
    total: Counter[str] = Counter()
    for key, amount, *_ in ingest.acked:
        total[key] += amount
    truth = {"hits": {"getMany": [hits[k] for k in KEYS]}, "total": {"getMany": [total[k] for k in KEYS]}}
    assert drill.node.post(QUERY, {"k": KEYS}) == {"data": truth}
    assert drill.node.post("{ hits { count } }") == {"data": {"hits": {"count": len(KEYS)}}}
    ready = httpx.get(f"{drill.node.url}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    partitions = ready.json()["partitions"]
    assert sorted((p["partition"], p["state"]) for p in partitions) == [(p, "RUNNING") for p in range(PARTITIONS)]
    # the query rode through the leader's move and the broker's return: it never died
    assert ready.json()["pipeline"]["restarts"] == 0, ready.json()["pipeline"]
