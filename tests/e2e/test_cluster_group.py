"""Kafka consumer-group membership with real nodes: under KIP-848's consumer protocol a second node joins after
retention deleted every record, partitions move and restore (from the changelog), every key answers with the same
values on both nodes, and after a kill -9 on the survivor; under the classic protocol a member killed and restarted
under load loses no answer (warm-up replicas)."""

from __future__ import annotations

import contextlib
import itertools
import math
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from iqgraph.examples.shop import build_app
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port
from iqgraph.streaming.partitioner import partition_for
from tests.conftest import MakeTopic
from tests.support.cluster_load import GET_MANY, Answered, Ingest, readyz
from tests.support.ground_truth import expected
from tests.support.nodes import NodeProcess, restart_node, start_node, wait_ready, write_app_module
from tests.support.pipeline import START_MS, send

PARTITIONS = 6
NODES = "{ nodes { id state partitions { partition role state appliedOffset endOffset } } }"


def _start(home: Path, node_id: str, flags: Sequence[str] = (), session_ms: int = 2000) -> NodeProcess:
    port = free_port()
    group = ["--advertised-url", f"http://127.0.0.1:{port}", "--membership", "kafka",
             "--group-session-timeout-ms", str(session_ms)]  # fmt: skip
    return start_node(home, "groupapp", node_id, port, [*group, *flags])


def _active(node: NodeProcess) -> dict[str, list[int]]:
    found = node.post(NODES)["data"]["nodes"]
    return {n["id"]: sorted(p["partition"] for p in n["partitions"] if p["role"] == "active") for n in found}


def test_a_second_node_takes_partitions_which_restore_and_answer_the_same_and_a_killed_one_hands_them_back(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Under the consumer protocol (--group-protocol consumer); the classic protocol is the next test's."""
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(71, START_MS), 2_000))
    send(broker, topic, events)
    counts = expected(app, events).kv["order_count"]
    keys = sorted(counts)
    write_app_module(tmp_path, "groupapp", topic, PARTITIONS, broker.bootstrap_servers)
    consumer = ["--group-protocol", "consumer"]
    first = _start(tmp_path, "node-a", consumer)
    second: NodeProcess | None = None
    try:
        wait_ready([first])
        assert _active(first) == {"node-a": list(range(PARTITIONS))}
        assert first.post(GET_MANY, {"k": keys})["data"]["orderCount"]["getMany"] == [counts[k] for k in keys]
        # retention deletes every record the stores were built from: the moved partitions' new copies restore them
        # from the changelog (issue 41); a replay of the topic would count nothing
        _delete_all_records(broker, topic)

        second = _start(tmp_path, "node-b", consumer)
        wait_ready([second])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            views = [_active(first), _active(second)]
            if views[0] == views[1] and len(views[0].get("node-b", [])) > 0 and len(views[0].get("node-a", [])) > 0:
                break
            time.sleep(0.25)
        else:
            pytest.fail(f"partitions did not move: {views}")
        moved = views[0]["node-b"]
        assert sorted(views[0]["node-a"] + moved) == list(range(PARTITIONS))
        wait_ready([first, second])
        restored = [p for p in second.post(NODES)["data"]["nodes"] if p["id"] == "node-b"][0]["partitions"]
        assert {p["partition"] for p in restored if p["role"] == "active"} == set(moved)
        assert all(p["state"] == "RUNNING" and p["appliedOffset"] == p["endOffset"] for p in restored)
        for node in (first, second):
            answer: dict[str, Any] = node.post(GET_MANY, {"k": keys})
            assert answer["data"]["orderCount"]["getMany"] == [counts[k] for k in keys], (node.id, answer.get("errors"))

        second.kill()
        killed = time.monotonic()
        _wait_answering(first, keys, [counts[k] for k in keys], 60)
        print(f"consumer protocol: node-a answers every key {time.monotonic() - killed:.1f} s after node-b's kill -9")
    finally:
        for node in (first, second):
            if node is not None:
                node.kill()


def _delete_all_records(broker: KafkaBroker, topic: str) -> None:
    """Delete every record of topic, as time retention does once they are old enough."""
    admin = broker.admin()
    ends = {p: _end_offset(broker, topic, p) for p in range(PARTITIONS)}
    for future in admin.delete_records([TopicPartition(topic, p, end) for p, end in ends.items()]).values():
        future.result(timeout=30)


def _end_offset(broker: KafkaBroker, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "ends"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), 10, cached=False)[1])
    finally:
        consumer.close()


def _wait_answering(node: NodeProcess, keys: list[str], want: list[int], timeout: float) -> None:
    """Wait until node answers getMany of keys with the counts wanted, without errors."""
    deadline = time.monotonic() + timeout
    while True:
        answer = node.post(GET_MANY, {"k": keys})
        if not answer.get("errors") and answer["data"]["orderCount"]["getMany"] == want:
            return
        assert time.monotonic() < deadline, f"not answering within {timeout} s: {answer.get('errors')}"
        time.sleep(0.5)


KILLED, OUTAGE_S, AFTER_S = "node-c", 15.0, 3.0  # OUTAGE_S: at most, until the survivors took over (~11 s)
WARM_FLAGS = ["--standbys", "1", "--max-lag", "100000"]
PLACEMENT = "{ stores { name placement { partition activeNode standbyNodes } } }"
Placed = dict[int, tuple[str | None, tuple[str, ...]]]  # partition -> (active node, standby nodes)


class Load:
    """One thread per target asking it for every key (getMany) until stopped; every answer is kept."""

    def __init__(self, targets: Sequence[NodeProcess], keys: Sequence[str], ingest: Ingest) -> None:
        self.answers: list[Answered] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(node, keys, ingest), name=f"load-{node.id}", daemon=True)
            for node in targets
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(40)

    def _run(self, node: NodeProcess, keys: Sequence[str], ingest: Ingest) -> None:
        with httpx.Client() as client:
            while not self._stop.wait(0.02):  # leave the two cores some room for the nodes
                before, sent = ingest.produced, time.monotonic()
                try:
                    body = client.post(
                        f"{node.url}/graphql", json={"query": GET_MANY, "variables": {"k": list(keys)}}, timeout=30
                    ).json()
                except (httpx.HTTPError, ValueError) as exc:
                    body = {"errors": [{"message": f"{exc.__class__.__name__}: {exc}"}]}
                answer = Answered(node.id, tuple(keys), True, sent, time.monotonic(), before, ingest.produced, body)
                self.answers.append(answer)


def _placement(client: httpx.Client, node: NodeProcess) -> Placed:
    """Return node's map of store order_count: per partition, its active and standby nodes."""
    body = client.post(f"{node.url}/graphql", json={"query": PLACEMENT}, timeout=5).json()
    store = next(s for s in body["data"]["stores"] if s["name"] == "order_count")
    return {p["partition"]: (p["activeNode"], tuple(p["standbyNodes"])) for p in store["placement"]}


class Timeline:
    """In a thread, every quarter second: one node's map, and how another node's copies are (its /readyz)."""

    def __init__(self, mapper: NodeProcess, watched: NodeProcess) -> None:
        self.seen: list[tuple[float, Placed]] = []
        self.copies: list[tuple[float, dict[int, tuple[str, int]]]] = []  # partition -> (state, lag)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(mapper, watched), name="timeline", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def first(self, after: float, condition: Callable[[Placed], bool]) -> float:
        """Return how long after `after` the map first met condition (nan: never)."""
        return next((t - after for t, placed in self.seen if t >= after and condition(placed)), math.nan)

    def _run(self, mapper: NodeProcess, watched: NodeProcess) -> None:
        with httpx.Client() as client:
            while not self._stop.wait(0.25):
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError, StopIteration):
                    self.seen.append((time.monotonic(), _placement(client, mapper)))
                found = readyz(client, watched)
                copies = {p["partition"]: (p["state"], p["lag"]) for p in found[1]["partitions"]} if found else {}
                self.copies.append((time.monotonic(), copies))


def _settled(nodes: list[NodeProcess], node_id: str) -> bool:
    """Return whether every node is ready and maps the same actives, node_id serving some of them."""
    with httpx.Client() as client:
        if any((seen := readyz(client, n)) is None or seen[0] != 200 for n in nodes):
            return False
        actives = [{p: owners[0] for p, owners in _placement(client, n).items()} for n in nodes]
    return all(a == actives[0] for a in actives) and node_id in actives[0].values() and None not in actives[0].values()


def _wait_settled(nodes: list[NodeProcess], node_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _settled(nodes, node_id):
        if time.monotonic() > deadline:
            with httpx.Client() as client:
                raise AssertionError(f"maps did not settle with {node_id} active: {_placement(client, nodes[0])}")
        time.sleep(0.5)


def _group_owners(admin: AdminClient, group: str) -> dict[int, str] | None:
    """Return which node the consumer group assigns each partition (None while it is not stable)."""
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    if described.state != ConsumerGroupState.STABLE:
        return None
    return {
        tp.partition: member.client_id.removeprefix(f"{group}-")
        for member in described.members
        for tp in (member.assignment.topic_partitions if member.assignment else [])
    }


def _wait_taken_over(survivors: Sequence[NodeProcess], load: Load, admin: AdminClient, until: float) -> None:
    """Wait until the survivors took over: the killed member's partitions active on its standbys (its record
    aged out), then the group rid of its member (its session timed out) and rebalanced among the survivors,
    every survivor mapping the group's assignment as it is, each copy active on its owner's /readyz; then until
    the load has had an answer from every survivor asked after that. At `until` (the fixed outage this replaced)
    return all the same: the test's assertions and story tell what happened."""
    ids = {n.id for n in survivors}
    with httpx.Client() as client:
        while time.monotonic() < until:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError, KafkaException):
                owners = _group_owners(admin, "shop") or {}
                maps = [{p: placed[0] for p, placed in _placement(client, n).items()} for n in survivors]
                assigned = owners.keys() == set(range(PARTITIONS)) and set(owners.values()) == ids
                if assigned and all(m == owners for m in maps):
                    found = {n.id: readyz(client, n) for n in survivors}
                    roles = {
                        node: {p["partition"]: p["role"] for p in seen[1]["partitions"]} if seen else {}
                        for node, seen in found.items()
                    }
                    if all(roles[node].get(p) == "active" for p, node in owners.items()):
                        break
            time.sleep(0.25)
        else:
            return
    taken = time.monotonic()
    while time.monotonic() < until:
        if {a.node for a in list(load.answers) if a.sent >= taken} >= ids:
            return
        time.sleep(0.1)


def _caught_up(nodes: list[NodeProcess], ingest: Ingest, timeout: float = 90) -> None:
    """Wait until every node has applied every produced event of every partition it hosts."""
    ends = Counter(partition_for(k, PARTITIONS, "string", "murmur2") for k in ingest.keys)
    deadline, behind = time.monotonic() + timeout, {}
    with httpx.Client() as client:
        while time.monotonic() < deadline:
            seen = {n.id: readyz(client, n) for n in nodes}
            behind = {
                node: found if found is None or found[0] != 200 else
                [p["partition"] for p in found[1]["partitions"] if p["appliedOffset"] < ends[p["partition"]]]
                for node, found in seen.items()
            }  # fmt: skip
            if not any(behind.values()):
                return
            time.sleep(0.5)
    raise AssertionError(f"not caught up with {dict(ends)} after {timeout} s: {behind}")


def _story(timeline: Timeline, killed: float, answers: Sequence[Answered]) -> str:
    """Return, in seconds after the kill, each change of the map (active/standbys) and each failed answer."""
    lines, previous = [f"killed at epoch {time.time() - (time.monotonic() - killed):.2f}"], None
    for t, placed in timeline.seen:
        if placed != previous:
            shown = " ".join(
                f"{p}:{(a or '-')[-1]}/{''.join(n[-1] for n in s)}" for p, (a, s) in sorted(placed.items())
            )
            lines.append(f"{t - killed:7.2f} map {shown}")
        previous = placed
    shown_copies = None
    for t, copies in timeline.copies:
        states = {p: state for p, (state, _lag) in copies.items()}
        if states != shown_copies:
            where = " ".join(f"{p}:{state[:4]}/{lag}" for p, (state, lag) in sorted(copies.items())) or "down"
            lines.append(f"{t - killed:7.2f} {KILLED} copies {where}")
        shown_copies = states
    for a in answers:
        if a.errors:
            messages = sorted({e.get("message", "?")[:120] for e in a.errors})
            lines.append(f"{a.sent - killed:7.2f} {a.node} failed: {len(a.errors)} errors, e.g. {messages[:3]}")
    head, *rest = lines
    return "\n".join([head, *sorted(rest, key=lambda line: float(line.split()[0]))])


def _out_of_bounds(answer: Answered, ingest: Ingest, initial: int) -> list[str]:
    """Return what is wrong with an answer's counts: a silent null, or a count outside what was produced."""
    wrong = []
    for key, value in zip(answer.keys, answer.values(), strict=True):
        low, high = ingest.count(key, initial), ingest.count(key, answer.produced_after)
        if value is None or not low <= value <= high:
            wrong.append(f"{key}: {value} not in [{low}, {high}]")
    return wrong


def test_a_member_killed_and_restarted_under_load_loses_no_answer(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Warm-up replicas: a crashed member's partitions go to their standbys at once; back, it takes them again
    only once caught up. Reads of every key on the survivors never fail, never return a silent null."""
    started = time.monotonic()
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    ingest = Ingest(broker.bootstrap_servers, topic, app.generator(71, START_MS))
    ingest.produce(2_000)
    initial, keys = ingest.produced, sorted(set(ingest.keys))
    write_app_module(tmp_path, "groupapp", topic, PARTITIONS, broker.bootstrap_servers)
    nodes = [_start(tmp_path, node_id, WARM_FLAGS, session_ms=6000) for node_id in ("node-a", "node-b", KILLED)]
    load = Load(nodes[:2], keys, ingest)
    timeline: Timeline | None = None
    try:
        wait_ready(nodes)
        _wait_settled(nodes, KILLED, 90)
        with httpx.Client() as client:
            held = {p for p, owners in _placement(client, nodes[0]).items() if owners[0] == KILLED}
        ready_s = time.monotonic() - started
        timeline = Timeline(nodes[0], nodes[2])
        ingest.start()
        load.start()
        time.sleep(3)
        killed = time.monotonic()
        nodes[2].process.send_signal(signal.SIGKILL)
        nodes[2].process.wait(timeout=60)
        _wait_taken_over(nodes[:2], load, broker.admin(), killed + OUTAGE_S)
        restarted = time.monotonic()
        nodes[2] = restart_node(nodes[2])
        _wait_settled(nodes, KILLED, 240)
        back_s = time.monotonic() - restarted
        time.sleep(AFTER_S)
        load.stop()
        ingest.stop()
        timeline.stop()

        answers = load.answers
        failed = [
            (
                round(a.sent - killed, 1),
                a.node,
                sorted({(e.get("extensions") or {}).get("code", "?") for e in a.errors}),
            )
            for a in answers
            if a.errors or "data" not in a.body
        ]
        wrong = [
            (round(a.sent - killed, 1), a.node, w[:2])
            for a in answers
            if not a.errors and (w := _out_of_bounds(a, ingest, initial))
        ]
        stale = [a for a in answers if a.staleness]
        taken = timeline.first(killed, lambda placed: all(placed[p][0] not in (KILLED, None) for p in held))
        rejoined = timeline.first(restarted, lambda placed: any(KILLED in owners[1] for owners in placed.values()))
        again = timeline.first(restarted, lambda placed: all(placed[p][0] == KILLED for p in held))
        print(
            f"\nwarm-up failover: {len(answers)} answers, {len(failed)} failed, {len(wrong)} wrong or silent nulls, "
            f"{len(stale)} with "
            f"staleness; {KILLED} held {sorted(held)}: its standbys active {taken:.1f} s after the kill, restarted "
            f"{restarted - killed:.1f} s after it; after the restart it is back in the map in {rejoined:.1f} s, "
            f"active again in {again:.1f} s, every node ready with the same map in {back_s:.1f} s; cluster ready in "
            f"{ready_s:.0f} s, {ingest.produced} events, longest "
            f"answer {max(a.received - a.sent for a in answers):.2f} s"
        )
        print(_story(timeline, killed, answers))
        assert not failed, f"{len(failed)} of {len(answers)} answers failed (seconds after the kill): {failed[:5]}"
        assert not wrong, f"{len(wrong)} of {len(answers)} answers were wrong: {wrong[:5]}"

        _caught_up(nodes, ingest)
        truth = Counter(ingest.keys)
        everything = sorted(truth)
        for node in nodes:
            answer = node.post(GET_MANY, {"k": everything})
            assert answer["data"]["orderCount"]["getMany"] == [truth[k] for k in everything], node.id
        print(f"run {time.monotonic() - started:.0f} s")
    finally:
        load.stop()
        if timeline is not None:
            timeline.stop()
        for node in nodes:
            node.kill()
