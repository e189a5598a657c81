"""A subscriber in a thread: one graphql-transport-ws connection to a node, following keys' order counts, every
event kept with the time it came (the failover tests check them against the produced ground truth)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed

from tests.app.cluster_nodes import NodeProcess
from tests.app.test_live_transports import TransportWS, websocket

FOLLOW = """subscription($keys: [String!]!) {
  orderCountWatch(keys: $keys) { key value snapshot dropped lag position { partition offset } }
}"""


@dataclass
class Followed:
    """One event: when it came, and what it said."""

    at: float
    key: str
    value: int | None
    snapshot: bool
    dropped: int
    lag: int | None
    partition: int
    offset: int


@dataclass
class Follower:
    """Follow keys on a node from a thread until stopped; errors and the end of the stream are kept."""

    node: NodeProcess
    keys: Sequence[str]
    events: list[Followed] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, timeout: float = 30) -> None:
        """Start following; return once the first value of every key has come."""
        self._thread = threading.Thread(target=self._run, name="live-follower", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while {e.key for e in self.events} != set(self.keys):
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"no first value of every key after {timeout} s: {self.events[-5:]}"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def latest(self) -> dict[str, int | None]:
        """Return each key's last value received."""
        return {e.key: e.value for e in list(self.events)}

    def _run(self) -> None:
        try:
            with websocket(self.node.url.removeprefix("http://")) as raw:
                ws = TransportWS(raw)
                ws.init()
                ws.subscribe("1", FOLLOW, {"keys": list(self.keys)})
                while not self._stop.is_set():
                    try:
                        message = ws.receive(timeout=0.5)
                    except TimeoutError:
                        continue
                    if message["type"] != "next" or message["payload"].get("errors"):
                        self.errors.append(message)
                        return
                    e = message["payload"]["data"]["orderCountWatch"]
                    position = e["position"]
                    self.events.append(
                        Followed(
                            time.monotonic(),
                            e["key"],
                            e["value"],
                            e["snapshot"],
                            e["dropped"],
                            e["lag"],
                            position["partition"],
                            position["offset"],
                        )
                    )
        except (ConnectionClosed, OSError) as exc:
            self.errors.append(repr(exc))


TOP = "subscription { topCustomersWatchTop(first: 5) { entries { member value rank } } }"


@dataclass
class TopFollower:
    """Follow the shop's top 5 customers by spend on a node from a thread: every top received, and errors."""

    node: NodeProcess
    tops: list[list[dict[str, Any]]] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, timeout: float = 30) -> None:
        """Start following; return once the first top has come."""
        self._thread = threading.Thread(target=self._run, name="top-follower", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.tops:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"no top after {timeout} s"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        try:
            with websocket(self.node.url.removeprefix("http://")) as raw:
                ws = TransportWS(raw)
                ws.init()
                ws.subscribe("1", TOP, {})
                while not self._stop.is_set():
                    try:
                        message = ws.receive(timeout=0.5)
                    except TimeoutError:
                        continue
                    if message["type"] != "next" or message["payload"].get("errors"):
                        self.errors.append(message)
                        return
                    self.tops.append(message["payload"]["data"]["topCustomersWatchTop"]["entries"])
        except (ConnectionClosed, OSError) as exc:
            self.errors.append(repr(exc))


def wrong_values(events: Sequence[Followed], truth_at: Callable[[str, int], int]) -> list[str]:
    """Return the events whose value is not the ground truth at the position it stands for, a pushed value that
    repeats (a duplicate) and positions that go back.

    truth_at(key, offset): the key's count over its partition's records before offset. Every event of a batch
    (or a snapshot) but the last carries the position from before it, the last the batch's: a value stands for
    the position that ends its run. Every partition holds records when the follower starts (positions > 0).
    """
    wrong: list[str] = []
    ends: dict[int, int] = {}
    runs: dict[int, list[Followed]] = {}
    pushed: dict[str, int] = {}
    for e in events:
        end, run = ends.get(e.partition, 0), runs.setdefault(e.partition, [])
        if e.offset < end:
            wrong.append(f"{e.key}: offset {e.offset} of partition {e.partition} after {end}")
        run.append(e)
        if e.offset > end:
            wrong += [
                f"{r.key}: {r.value} at offset {e.offset} of partition {r.partition}, not {truth_at(r.key, e.offset)}"
                for r in run
                if (r.value or 0) != truth_at(r.key, e.offset)
            ]
            ends[e.partition] = e.offset
            run.clear()
        if not e.snapshot:
            if (e.value or 0) <= pushed.get(e.key, -1):
                wrong.append(f"{e.key}: pushed {e.value} after {pushed[e.key]}")
            pushed[e.key] = e.value or 0
    wrong += [f"{r.key}: {r.value} of a batch whose last change never came" for run in runs.values() for r in run]
    return wrong
