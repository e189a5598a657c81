"""Exactly once through crashes: SIGKILL the pipeline before, during and after batch writes, restart,
and the stores equal a run that never crashed."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from iqgraph.examples.shop import build_app
from iqgraph.stores import PartitionState, StateDirectory
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from tests.conftest import MakeTopic
from tests.support.pipeline import START_MS, assert_equal_to_ground_truth, send
from tests.support.plays import assert_plays_equal, make_plays, plays_app, read_plays, truth
from tests.support.readback import read_back
from tests.support.tables import changelog, table_app
from tests.support.tables import truth as table_truth

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
EVENTS = 3_000


def _child(broker: KafkaBroker, topic: str, state: Path, *extra: str) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "tests.streaming.crash_child",
        "--bootstrap",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--partitions",
        str(PARTITIONS),
        "--state",
        str(state),
        *extra,
    ]
    log = (state.parent / "child.log").open("a")
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)


def _run(broker: KafkaBroker, topic: str, state: Path, *extra: str) -> int:
    child = _child(broker, topic, state, *extra)
    child.communicate(timeout=300)
    if child.returncode not in (0, -signal.SIGKILL):
        log = (state.parent / "child.log").read_text()
        raise AssertionError(f"node process failed ({child.returncode}):\n{log[-3000:]}")
    return child.returncode


def _kill_after_first_write(broker: KafkaBroker, topic: str, state: Path) -> int:
    """Kill the node at a moment of the parent's choosing: shortly after its first write, mid-batch."""
    child = _child(broker, topic, state, "--batch", "300")
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("WROTE"):
            time.sleep(0.4)
            os.kill(child.pid, signal.SIGKILL)
            break
    child.communicate(timeout=60)
    return child.returncode


def test_sigkill_at_any_point_then_restart_gives_exactly_the_ground_truth(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(PARTITIONS, prefix="orders")
    app = build_app(topic, PARTITIONS)
    assert app.generator is not None
    events = list(itertools.islice(app.generator(23, START_MS), EVENTS))
    send(broker, topic, events)
    state = tmp_path / "state"

    assert _run(broker, topic, state, "--crash", "before-write", "--at", "2") == -signal.SIGKILL
    assert _run(broker, topic, state, "--crash", "after-write", "--at", "2") == -signal.SIGKILL
    assert _kill_after_first_write(broker, topic, state) == -signal.SIGKILL
    assert _run(broker, topic, state) == 0

    directory = StateDirectory(state, app.name)
    partitions = [directory.open(topic, p, app.specs(topic)) for p in range(PARTITIONS)]
    try:
        for stores in partitions:
            stores.db.set_state(PartitionState.RUNNING)
        assert sum(s.db.next_offset() for s in partitions) == EVENTS
        actual: Any = read_back(app, partitions)
        assert_equal_to_ground_truth(app, actual, events)
    finally:
        for stores in partitions:
            stores.close()


def test_a_table_with_tombstones_through_sigkills_equals_its_last_change_per_key(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(PARTITIONS, prefix="customers")
    app = table_app(topic, PARTITIONS)
    changes = changelog(5, 1_500, keys=120)
    records = [(k.encode(), None if v is None else orjson.dumps(v), None) for k, v in changes]
    produce(broker.bootstrap_servers, topic, records)
    state = tmp_path / "state"
    table = ("--table", "--batch", "200")
    assert _run(broker, topic, state, *table, "--crash", "before-write", "--at", "2") == -signal.SIGKILL
    assert _run(broker, topic, state, *table, "--crash", "after-write", "--at", "3") == -signal.SIGKILL
    assert _run(broker, topic, state, *table) == 0

    directory = StateDirectory(state, app.name)
    partitions = [directory.open(topic, p, app.specs(topic)) for p in range(PARTITIONS)]
    try:
        found: dict[str, Any] = {}
        counted = 0
        for stores in partitions:
            stores.db.set_state(PartitionState.RUNNING)
            kv = stores.kv("customers")
            found.update({k: {c: x for c, x in v.items() if x is not None} for k, v in kv.all(limit=10_000).items})
            counted += kv.count()
        assert sum(s.db.next_offset() for s in partitions) == len(changes)
        assert found == table_truth(changes)
        assert counted == len(found)
    finally:
        for stores in partitions:
            stores.close()


def test_collections_and_user_aggregations_through_a_sigkill_equal_python(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(PARTITIONS, prefix="plays")
    app = plays_app(topic, PARTITIONS)
    plays = make_plays(13, 900)
    produce(broker.bootstrap_servers, topic, [(k.encode(), orjson.dumps(v), None) for k, v in plays])
    state = tmp_path / "state"
    options = ("--plays", "--batch", "150")
    assert _run(broker, topic, state, *options, "--crash", "after-write", "--at", "2") == -signal.SIGKILL
    assert _run(broker, topic, state, *options) == 0

    directory = StateDirectory(state, app.name)
    hosted = {topic: {p: directory.open(topic, p, app.specs(topic)) for p in range(PARTITIONS)}}
    try:
        for stores in hosted[topic].values():
            stores.db.set_state(PartitionState.RUNNING)
        assert sum(s.db.next_offset() for s in hosted[topic].values()) == len(plays)
        assert_plays_equal(read_plays(app, hosted), truth(plays, PARTITIONS))
    finally:
        for stores in hosted[topic].values():
            stores.close()
