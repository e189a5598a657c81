"""The Kafka drill of issue 42: three iqgraph nodes with standbys on a three-broker Apache Kafka cluster, under an
acks=all idempotent producer and a reader of every key, through a rolling restart of the brokers, a kill -9 of the
active controller, and the whole cluster down for 30 s.

`run_drill` runs it and returns what it saw (`Drill`); tests/e2e/test_kafka_drill.py checks it and
bench/kafka_drill.py prints its figures. Everything is real: the brokers are `KafkaCluster` members (each restarted
on its own data directory), the nodes `iqgraph serve` processes, the reader plain HTTP.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import ConfigResource, ResourceType

from iqgraph.examples.shop import build_app
from iqgraph.streaming.apache_kafka import KafkaBroker, KafkaCluster
from iqgraph.streaming.broker import free_port
from iqgraph.streaming.changelog import changelog_topic
from iqgraph.streaming.definitions import App, Event
from iqgraph.streaming.kafka_jars import ensure_kafka_jars
from tests.support.cluster_load import Answered, Ingest, ask, readyz
from tests.support.nodes import NodeProcess, start_nodes, wait_ready, write_app_module
from tests.support.pipeline import START_MS
from tests.support.topic_records import records_of

PARTITIONS = 6
RATE = 40.0  # orders per second while the drill runs (two cores: six JVMs and three nodes share them)
INITIAL = 1_500  # orders acknowledged before the nodes start: the keys the reader asks for
MAX_LAG = 100_000
FLAGS = ["--standbys", "1", "--max-lag", str(MAX_LAG)]
WARM_UP_S = 24.0  # load before the first restart (the nodes are ready): 12 s, then 12 s of baseline measured
DOWN_S = 30.0  # the whole cluster down
AFTER_S = 120.0  # at most, after each broker's return: until every node applied a record acknowledged after it
#: Fast failover on one machine (as in test_kafka_broker_loss): a killed broker is fenced in ~3 s.
FAST_FAILOVER = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "5000",
}
#: KafkaRaftClient's INFO line on each change of its quorum state, e.g. "Completed transition to Leader(..., epoch=3".
_TRANSITION = re.compile(r"Completed transition to (\w+)\((?:[^\n]*?epoch=(\d+))?")


class AckedIngest(Ingest):
    """`Ingest` (an idempotent acks=all producer of shop orders at `rate` per second) that also keeps each order's
    value and hand-over time, and what the brokers acknowledged: (index, partition, offset, when)."""

    def __init__(self, bootstrap: str, topic: str, events: Iterator[Event], rate: float = RATE) -> None:
        # metadata asked every 5 s (librdkafka's default: 5 min): once, after the whole cluster's return, this
        # producer tried no broker again for 150 s (its last line "new leader-1 not found in cache" at the stop)
        super().__init__(bootstrap, topic, events, rate, {"topic.metadata.refresh.interval.ms": 5000})
        self.values: list[Any] = []
        self.sent: dict[bytes, int] = {}  # each order's value as sent -> its index (an order id is unique)
        self.handed_at: list[float] = []
        #: (index, partition, offset, when); offset -1: acknowledged without one, as librdkafka reports an order a
        #: retry found already written (DUPLICATE_SEQUENCE_NUMBER after a lost answer, librdkafka#4438)
        self.acked: list[tuple[int, int, int, float]] = []

    def acked_ends(self) -> dict[int, int]:
        """Return each partition's offset after its last acknowledged order (0 if none)."""
        ends = dict.fromkeys(range(PARTITIONS), 0)
        for _, partition, offset, _ in list(self.acked):
            ends[partition] = max(ends[partition], offset + 1)
        return ends

    def without_offset(self) -> list[tuple[int, int, int, float]]:
        """Return the acknowledgements that came without an offset."""
        return [a for a in self.acked if a[2] < 0]

    def _one(self) -> None:
        key, value = next(self.events)
        assert isinstance(key, str)
        index = len(self.keys)
        self.at[key].append(index)  # recorded before it is sent: an answer counting it never finds it missing
        self.keys.append(key)
        self.values.append(value)
        sent = orjson.dumps(value)
        self.sent[sent] = index
        self.handed_at.append(time.monotonic())

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                self.failed.append(error)
            else:
                offset = message.offset()  # None: written, at an offset the answer did not say
                at = time.monotonic()
                self.acked.append((index, message.partition() or 0, -1 if offset is None else offset, at))

        self.producer.produce(self.topic, key=key.encode(), value=sent, on_delivery=delivered)
        self.producer.poll(0)


class Loops:
    """Steps run again and again, each in a thread of its own with a pause after each run, from start to stop."""

    def __init__(self, pause: float) -> None:
        self.pause = pause
        self._steps: list[Callable[[httpx.Client], None]] = []
        self._stop = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._running: list[Future[None]] = []

    def add(self, step: Callable[[httpx.Client], None]) -> None:
        self._steps.append(step)

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(len(self._steps), thread_name_prefix=type(self).__name__)
        self._running = [self._pool.submit(self._loop, step) for step in self._steps]

    def stop(self) -> None:
        self._stop.set()
        futures.wait(self._running, 40)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for done in self._running:
            if done.done():
                done.result()  # a step that raised says so here

    def _loop(self, step: Callable[[httpx.Client], None]) -> None:
        with httpx.Client() as client:
            while not self._stop.is_set():
                step(client)
                self._stop.wait(self.pause)


class Reader(Loops):
    """Each node asked for every key's order count (getMany) all along, in a loop of its own."""

    def __init__(self, nodes: Sequence[NodeProcess], keys: Sequence[str], ingest: AckedIngest) -> None:
        super().__init__(0.1)  # leave the two cores some room
        self.answers: list[Answered] = []
        for node in nodes:
            self.add(functools.partial(self._ask, node, keys, ingest))

    def _ask(self, node: NodeProcess, keys: Sequence[str], ingest: AckedIngest, client: httpx.Client) -> None:
        self.answers.append(ask(client, node, keys, True, ingest))


class ReadyLog(Loops):
    """Every node's /readyz every 0.25 s: (time, node id, status, body)."""

    def __init__(self, nodes: Sequence[NodeProcess]) -> None:
        super().__init__(0.25)
        self.nodes = nodes
        self.seen: list[tuple[float, str, int, dict[str, Any]]] = []
        self.add(self._poll)

    def progressed(self, node: str, since: float, ends: dict[int, int]) -> float | None:
        """Return when node first showed every partition it is active for applied beyond ends (None: never)."""
        for at, seen_node, _, body in list(self.seen):
            if seen_node != node or at < since:
                continue
            active = [p for p in body.get("partitions") or [] if p["role"] == "active"]
            if active and all(p["appliedOffset"] > ends[p["partition"]] for p in active):
                return at
        return None

    def longest_still(self, node: str, start: float, end: float) -> float:
        """Return the longest time between start and end in which node's active partitions applied nothing."""
        changes, last = [start], None
        for at, seen_node, _, body in list(self.seen):
            if seen_node == node and start <= at <= end:
                applied = sum(p["appliedOffset"] for p in body.get("partitions") or [] if p["role"] == "active")
                if last is not None and applied != last:
                    changes.append(at)
                last = applied
        changes.append(end)
        return max(b - a for a, b in itertools.pairwise(changes))

    def _poll(self, client: httpx.Client) -> None:
        for node in self.nodes:
            seen = readyz(client, node)
            if seen is not None:
                self.seen.append((time.monotonic(), node.id, *seen))


@dataclass
class Return:
    """A broker (or the whole cluster) back: when, the acknowledged ends then, and each node's first progress."""

    what: str
    at: float
    ends: dict[int, int]
    progress: dict[str, float] = field(default_factory=dict)  # node id -> seconds from `at` to its progress

    @property
    def slowest(self) -> float:
        return max(self.progress.values(), default=float("inf"))


@dataclass
class Drill:
    """What the drill saw."""

    app: App
    topic: str
    nodes: list[NodeProcess]
    ingest: AckedIngest
    reader: Reader
    ready: ReadyLog
    keys: list[str]
    initial: int
    home: Path
    began: float = 0.0
    baseline: tuple[float, float] = (0.0, 0.0)  # the warm-up's second half: freshness with every broker up
    roll: tuple[float, float] = (0.0, 0.0)  # first SIGTERM of the rolling restart, every node's progress after it
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # each broker of the roll: SIGTERM, progress
    controller: int = -1  # the controller-leader broker killed with SIGKILL
    killed: tuple[float, float] = (0.0, 0.0)
    down: tuple[float, float] = (0.0, 0.0)  # the first SIGTERM of the whole cluster, the cluster ready again
    returns: list[Return] = field(default_factory=list)
    settled: list[tuple[str, float]] = field(default_factory=list)  # (after what, seconds until every node applied it)
    topics: dict[str, tuple[int, str]] = field(default_factory=dict)  # topic -> (replicas, min.insync.replicas)
    caught_up: float = 0.0
    ended: float = 0.0
    #: What the input topic holds at the end, read back from Kafka: partition -> [(offset, key, value)]
    held: dict[int, list[tuple[int, bytes | None, bytes | None]]] = field(default_factory=dict)

    def held_orders(self) -> list[tuple[int, int, int]]:
        """Return (partition, offset, index of the order handed over) of every record the input topic holds, in
        partition and offset order; a record that is no order handed over fails."""
        found = []
        for partition, records in sorted(self.held.items()):
            for offset, _, value in records:
                index = self.ingest.sent.get(value or b"")
                assert index is not None, f"{self.topic}[{partition}]@{offset} holds no order handed over: {value!r}"
                found.append((partition, offset, index))
        return found

    def misplaced(self) -> list[tuple[int, int, int, float]]:
        """Return the acknowledgements (index, partition, offset, when) the input topic contradicts: the order is not
        at the offset acknowledged or, acknowledged without one (offset -1: a retry found it written), nowhere in
        the partition acknowledged."""
        held = self.held_orders()
        at = {(partition, offset): index for partition, offset, index in held}
        anywhere = {(partition, index) for partition, _, index in held}
        return [
            (index, partition, offset, when)
            for index, partition, offset, when in self.ingest.acked
            if ((partition, index) not in anywhere if offset < 0 else at.get((partition, offset)) != index)
        ]

    @functools.cached_property
    def doubled(self) -> Counter[int]:
        """The orders the input topic holds more than once, with their extra copies: an idempotent producer's
        retry after it bumped its epoch (KIP-360) may write a record twice (librdkafka#4953; the Java client's
        too in some cases), and a node applies every record the topic holds. Read once `held` is."""
        assert self.held, "the input topic was not read back yet"
        copies = Counter(index for _, _, index in self.held_orders())
        return Counter({index: n - 1 for index, n in copies.items() if n > 1})

    def held_events(self) -> list[tuple[str, Any]]:
        """Return the orders as the input topic holds them, per partition in offset order: the ground truth's
        input (what every copy of the stores must equal)."""
        return [(self.ingest.keys[index], self.ingest.values[index]) for _, _, index in self.held_orders()]

    def most(self, key: str, before: int) -> int:
        """Return how many of key's records the topic may hold among the first `before` orders handed over: those
        orders and their extra copies."""
        extra = sum(n for index, n in self.doubled.items() if index < before and self.ingest.keys[index] == key)
        return self.ingest.count(key, before) + extra

    def freshness(self, start: float, end: float, since: str = "handed") -> list[float]:
        """Return, for each order handed over between start and end whose key the reader asks for, the seconds
        from its hand-over (since "acked": from its acknowledgement; "handed-acked": from its hand-over to its
        acknowledgement) to the first answer that counted it (inf when none did)."""
        by_key: dict[str, tuple[list[float], list[int]]] = {}
        for answer in sorted((a for a in self.reader.answers if not a.errors), key=lambda a: a.received):
            for key, value in zip(answer.keys, answer.values(), strict=True):
                times, best = by_key.setdefault(key, ([], []))
                times.append(answer.received)
                best.append(max(value or 0, best[-1] if best else 0))
        acked = {index: at for index, _, _, at in self.ingest.acked}
        seconds = []
        for index, handed in enumerate(self.ingest.handed_at):
            key = self.ingest.keys[index]
            if not start <= handed <= end or key not in by_key:
                continue
            if since == "handed-acked":
                seconds.append(acked.get(index, float("inf")) - handed)
                continue
            times, best = by_key[key]
            seen = bisect.bisect_left(best, self.ingest.count(key, index) + 1)  # this order is the key's nth
            origin = handed if since == "handed" else acked.get(index, float("inf"))
            seconds.append(times[seen] - origin if seen < len(times) else float("inf"))
        return seconds


def controller_leader(cluster: KafkaCluster) -> KafkaBroker:
    """Return the broker that leads the KRaft controller quorum now, as the members' raft logs say: the running one
    whose last transition was to Leader, at the highest epoch."""
    leaders: list[tuple[int, KafkaBroker]] = []
    for broker in cluster.brokers:
        if broker.running:
            transitions = _TRANSITION.findall(broker.output())
            if transitions and transitions[-1][0].startswith("Leader"):
                leaders.append((int(transitions[-1][1] or 0), broker))
    assert leaders, "no running broker logged a transition to Leader"
    return max(leaders, key=lambda found: found[0])[1]


def wait_in_sync(cluster: KafkaCluster, timeout: float = 120) -> None:
    """Wait until every partition of every topic (the input, the changelogs, Kafka's own) has all its replicas
    in sync."""
    deadline, short = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        try:
            metadata = cluster.admin().list_topics(timeout=5)
        except Exception:  # noqa: BLE001 - a cluster coming back answers later
            time.sleep(0.5)
            continue
        short = {
            f"{name}-{p}": len(meta.isrs)
            for name, topic in metadata.topics.items()
            for p, meta in topic.partitions.items()
            if len(meta.isrs) < len(meta.replicas) or meta.leader < 0
        }
        if not short and len(metadata.brokers) == len(cluster.brokers):
            return
        time.sleep(0.25)
    raise AssertionError(f"replicas not all in sync {timeout} s on: {dict(list(short.items())[:8])}")


def topic_settings(cluster: KafkaCluster, names: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Return each topic's replication factor and effective min.insync.replicas."""
    admin = cluster.admin()
    metadata = admin.list_topics(timeout=10)
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    found = {}
    for resource, future in admin.describe_configs(resources, request_timeout=10).items():
        config = future.result(timeout=10)
        replicas = len(next(iter(metadata.topics[resource.name].partitions.values())).replicas)
        found[resource.name] = (replicas, config["min.insync.replicas"].value)
    return found


def note_return(drill: Drill, what: str) -> Return:
    """Record that a broker (or the cluster) is back now, with the acknowledged ends at this moment."""
    back = Return(what, time.monotonic(), drill.ingest.acked_ends())
    drill.returns.append(back)
    return back


def wait_progress(drill: Drill, back: Return, timeout: float = AFTER_S) -> None:
    """Wait until every node has applied, in every partition it is active for, an order acknowledged after the
    return; record each node's time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in drill.nodes:
            assert node.process.poll() is None, f"{node.id} exited:\n{node.log.read_text()[-3000:]}"
            if node.id not in back.progress:
                at = drill.ready.progressed(node.id, back.at, back.ends)
                if at is not None:
                    back.progress[node.id] = at - back.at
        if len(back.progress) == len(drill.nodes):
            return
        time.sleep(0.25)
    missing = [n.id for n in drill.nodes if n.id not in back.progress]
    raise AssertionError(
        f"after {back.what}: {missing} applied nothing acknowledged after {back.ends} in {timeout} s; "
        f"last /readyz: {[s for s in drill.ready.seen if s[1] in missing][-1:]}"
    )


def settle(drill: Drill, after: str, timeout: float = AFTER_S) -> None:
    """Wait until every node has applied, in every partition it is active for, every order acknowledged by now:
    the orders of one step are queryable before the next step begins, so each step's freshness is its own (the
    last orders of the roll were counted in the roll's figures while the controller's kill -9 held them up)."""
    now = time.monotonic()
    back = Return(f"settled after {after}", now, drill.ingest.acked_ends())
    wait_progress(drill, back, timeout)
    drill.settled.append((after, back.slowest))


def wait_caught_up(drill: Drill, timeout: float = 180) -> None:
    """Wait until every node is ready and every copy (active and standby) applied every acknowledged order."""
    ends = drill.ingest.acked_ends()
    deadline, behind = time.monotonic() + timeout, dict[str, Any]()
    with httpx.Client() as client:
        while time.monotonic() < deadline:
            behind = {}
            for node in drill.nodes:
                seen = readyz(client, node)
                copies = seen[1].get("partitions") or [] if seen else []
                late = {
                    p["partition"]: p["appliedOffset"] for p in copies if p["appliedOffset"] != ends[p["partition"]]
                }
                if seen is None or seen[0] != 200 or late or len(copies) != 2 * PARTITIONS // len(drill.nodes):
                    behind[node.id] = late or (seen[0] if seen else None)
            if not behind:
                drill.caught_up = time.monotonic()
                return
            time.sleep(0.5)
    raise AssertionError(f"not caught up with {ends} in {timeout} s: {behind}")


def stop_nodes(nodes: Sequence[NodeProcess], timeout: float = 60) -> None:
    """Stop the nodes cleanly (SIGTERM to all, then wait for each); kill one still running after timeout."""
    deadline = time.monotonic() + timeout
    alive = [node for node in nodes if node.process.poll() is None]
    for node in alive:
        node.process.terminate()
    for node in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(max(deadline - time.monotonic(), 0.1))
        node.kill()


def run_drill(home: Path) -> Iterator[Drill]:
    """Run the drill in home (the brokers' data, the nodes' state and logs); yield what it saw with the nodes stopped
    and the cluster still up, then stop everything."""
    ensure_kafka_jars()
    began = time.monotonic()
    cluster = KafkaCluster(size=3, heap="256m", properties=FAST_FAILOVER, data_dir=home / "kafka")
    cluster.start()
    controller_leader(cluster)  # the kill -9 needs it from the raft logs: fail now, not minutes in
    nodes: list[NodeProcess] = []
    ingest: AckedIngest | None = None
    reader: Reader | None = None
    ready: ReadyLog | None = None
    try:
        topic = f"orders-{free_port()}"
        cluster.create_topics({topic: PARTITIONS}, {"min.insync.replicas": "2"})
        app = build_app(topic, PARTITIONS)
        assert app.generator is not None
        ingest = AckedIngest(cluster.bootstrap_servers, topic, app.generator(42, START_MS))
        ingest.produce(INITIAL)
        assert not ingest.failed, ingest.failed[:3]
        write_app_module(home, "drillapp", topic, PARTITIONS, cluster.bootstrap_servers)
        nodes = start_nodes(home, "drillapp", 3, [FLAGS] * 3)
        wait_ready(nodes)
        keys = sorted(set(ingest.keys))
        reader, ready = Reader(nodes, keys, ingest), ReadyLog(nodes)
        drill = Drill(app, topic, nodes, ingest, reader, ready, keys, ingest.produced, home, began)
        names = [topic, changelog_topic(app.name, topic)]
        ready.start()
        ingest.start()
        reader.start()
        time.sleep(WARM_UP_S / 2)
        drill.baseline = (time.monotonic(), time.monotonic() + WARM_UP_S / 2)
        time.sleep(WARM_UP_S / 2)
        _roll(drill, cluster)
        _kill_controller(drill, cluster)
        _whole_cluster_down(drill, cluster)
        ingest.stop()
        assert not ingest.failed, ingest.failed[:3]
        wait_caught_up(drill)
        drill.held = {p: records_of(cluster.bootstrap_servers, topic, p) for p in range(PARTITIONS)}
        reader.stop()
        ready.stop()
        drill.topics = topic_settings(cluster, names)
        drill.ended = time.monotonic()
        stop_nodes(nodes)
        yield drill
    finally:
        for running in (reader, ready):
            if running is not None:
                running.stop()
        if ingest is not None:
            ingest.halt()
        for node in nodes:
            node.kill()
        cluster.stop()


def _roll(drill: Drill, cluster: KafkaCluster) -> None:
    """Restart the brokers one by one: SIGTERM, start, wait until every replica is in sync, next."""
    start = time.monotonic()
    for broker in cluster.brokers:
        stopped = time.monotonic()
        broker.stop(60)
        broker.start()
        back = note_return(drill, f"broker {broker.node_id} restarted (roll)")
        wait_in_sync(cluster)
        wait_progress(drill, back)
        drill.steps.append((broker.node_id, stopped, time.monotonic()))
    drill.roll = (start, time.monotonic())
    settle(drill, "the roll")


def _kill_controller(drill: Drill, cluster: KafkaCluster) -> None:
    """kill -9 the broker leading the controller quorum, start it again, wait until every replica is in sync."""
    victim = controller_leader(cluster)
    drill.controller = victim.node_id
    killed = time.monotonic()
    victim.kill()
    time.sleep(5.0)  # dead long enough to be fenced (broker.session.timeout.ms 3 s) and a new controller elected
    victim.start()
    drill.killed = (killed, time.monotonic())
    back = note_return(drill, f"broker {victim.node_id} (controller leader) back from kill -9")
    wait_in_sync(cluster)
    wait_progress(drill, back)
    settle(drill, "the kill -9")


def _whole_cluster_down(drill: Drill, cluster: KafkaCluster) -> None:
    """Stop every broker (a controlled shutdown, data kept), wait DOWN_S with none running, start them again."""
    down = time.monotonic()
    cluster.stop()
    time.sleep(DOWN_S)  # from the moment the last broker is gone
    cluster.start()
    drill.down = (down, time.monotonic())
    back = note_return(drill, "the whole cluster back")
    wait_in_sync(cluster)
    wait_progress(drill, back)


def percentile(values: Sequence[float], q: float) -> float:
    """Return the q-th percentile (nearest rank) of values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))] if ordered else 0.0


def errors_by_kind(answers: Sequence[Answered]) -> Counter[str]:
    """Return the failed answers counted by their first error's code (or text)."""
    kinds: Counter[str] = Counter()
    for answer in answers:
        for error in answer.errors[:1]:
            code = (error.get("extensions") or {}).get("code") if isinstance(error, dict) else None
            kinds[str(code or (error.get("message") if isinstance(error, dict) else error))[:80]] += 1
    return kinds


def wrong(drill: Drill) -> list[str]:
    """Return what is wrong in the answers' values: a null, more than handed over, less than acknowledged first."""
    found = []
    for answer in (a for a in drill.reader.answers if not a.errors):
        for key, value in zip(answer.keys, answer.values(), strict=True):
            bounds = drill.ingest.count(key, drill.initial), drill.most(key, answer.produced_after)
            if value is None or not bounds[0] <= value <= bounds[1]:
                found.append(f"{answer.node} {key}: {'null' if value is None else value} not in {list(bounds)}")
    return found


def still(drill: Drill, start: float, end: float) -> float:
    """Return the longest time between start and end in which some node's active partitions applied nothing."""
    return max(drill.ready.longest_still(node.id, start, end) for node in drill.nodes)


def spread(seconds: Sequence[float]) -> str:
    """Return a freshness sample as p50, p99 and max."""
    return (
        f"p50 {percentile(seconds, 50):.2f} s, p99 {percentile(seconds, 99):.2f} s, "
        f"max {max(seconds, default=0):.2f} s ({len(seconds)} orders)"
    )


def figures(drill: Drill) -> str:
    """Return what the drill measured, in a few lines."""
    answers = drill.reader.answers
    steps = "; ".join(
        f"broker {b} ({end - start:.0f} s): {spread(drill.freshness(start, end))}, acknowledged after "
        f"{spread(drill.freshness(start, end, 'handed-acked'))}, longest without applying "
        f"{still(drill, start, end):.1f} s"
        for b, start, end in drill.steps
    )
    returns = "; ".join(
        f"{r.what}: nodes progressed after {', '.join(f'{n} {s:.1f} s' for n, s in sorted(r.progress.items()))}"
        for r in drill.returns
    )
    return (
        f"kafka drill: {drill.ingest.produced} orders ({len(drill.ingest.acked)} acknowledged, "
        f"{len(drill.ingest.failed)} failed, {len(drill.ingest.without_offset())} without an offset) at "
        f"{drill.ingest.rate:.0f}/s; {len(answers)} answers of "
        f"{len(drill.keys)} keys each, {sum(1 for a in answers if a.errors)} failed {dict(errors_by_kind(answers))}, "
        f"{len(wrong(drill))} wrong or null, {sum(1 for a in answers if a.staleness)} with staleness; Kafka holds "
        f"{sum(drill.doubled.values())} extra copies of orders (the producer's retries after an epoch bump)\n"
        f"freshness, every broker up (baseline): {spread(drill.freshness(*drill.baseline))}\n"
        f"freshness, rolling restart ({drill.roll[1] - drill.roll[0]:.1f} s): {spread(drill.freshness(*drill.roll))}"
        f"\n  of which produce -> acknowledged: {spread(drill.freshness(*drill.roll, since='handed-acked'))}; "
        f"acknowledged -> queryable: {spread(drill.freshness(*drill.roll, since='acked'))}"
        f"\n  by broker: {steps}\n"
        f"controller leader {drill.controller} killed, back after {drill.killed[1] - drill.killed[0]:.1f} s; "
        f"whole cluster down {drill.down[1] - drill.down[0]:.1f} s (first SIGTERM to ready); freshness after the "
        f"roll: {spread(drill.freshness(drill.roll[1], drill.ended))}\n"
        f"{returns}\n"
        f"every node applied what was acknowledged: {'; '.join(f'after {w} in {t:.1f} s' for w, t in drill.settled)}\n"
        f"longest a node applied nothing: roll {still(drill, *drill.roll):.1f} s, controller kill "
        f"{still(drill, drill.killed[0], drill.killed[1] + 20):.1f} s (to 20 s after its return), whole cluster "
        f"{still(drill, drill.down[0], drill.down[1] + 20):.1f} s (to 20 s after its return)\n"
        f"caught up {drill.caught_up - drill.down[1]:.1f} s after the cluster's return; "
        f"topics {drill.topics}; run {drill.ended - drill.began:.0f} s"
    )
