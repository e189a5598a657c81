"""A subscriber in a thread: one graphql-transport-ws connection to a node, following keys' order counts, every
event kept with the time it came (the failover tests check them against the produced ground truth)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import ConnectionClosed

from tests.support.nodes import NodeProcess
from tests.support.transport_ws import TransportWS, websocket

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


class _Subscriber:
    """One graphql-transport-ws subscription to a node, read in a thread until stopped; errors are kept."""

    query = ""
    variables: dict[str, Any] = {}

    def __init__(self, node: NodeProcess) -> None:
        self.node = node
        self.errors: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30) -> None:
        """Start following; return once it has what it waits for first (``started``)."""
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.started():
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"{type(self).__name__} not started after {timeout} s"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def started(self) -> bool:
        raise NotImplementedError

    def received(self, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            with websocket(self.node.url.removeprefix("http://")) as raw:
                ws = TransportWS(raw)
                ws.init()
                ws.subscribe("1", self.query, self.variables)
                while not self._stop.is_set():
                    try:
                        message = ws.receive(timeout=0.5)
                    except TimeoutError:
                        continue
                    if message["type"] != "next" or message["payload"].get("errors"):
                        self.errors.append(message)
                        return
                    self.received(message["payload"]["data"])
        except (ConnectionClosed, OSError) as exc:
            self.errors.append(repr(exc))


class Follower(_Subscriber):
    """Follow keys' order counts, every event kept with the time it came."""

    query = FOLLOW

    def __init__(self, node: NodeProcess, keys: Sequence[str]) -> None:
        super().__init__(node)
        self.keys = list(keys)
        self.variables = {"keys": self.keys}
        self.events: list[Followed] = []

    def started(self) -> bool:
        return {e.key for e in self.events} == set(self.keys)  # the first value of every key

    def latest(self) -> dict[str, int | None]:
        """Return each key's last value received."""
        return {e.key: e.value for e in list(self.events)}

    def received(self, data: dict[str, Any]) -> None:
        e = data["orderCountWatch"]
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


TOP = "subscription { topCustomersWatchTop(first: 5) { entries { member value rank } lag } }"


class TopFollower(_Subscriber):
    """Follow the shop's top 5 customers by spend: every top received."""

    query = TOP

    def __init__(self, node: NodeProcess) -> None:
        super().__init__(node)
        self.tops: list[list[dict[str, Any]]] = []
        self.lags: list[int | None] = []  # per top: the standbys' lag when one answered (null: the actives)

    def started(self) -> bool:
        return bool(self.tops)

    def received(self, data: dict[str, Any]) -> None:
        self.tops.append(data["topCustomersWatchTop"]["entries"])
        self.lags.append(data["topCustomersWatchTop"]["lag"])

    def fell(self) -> list[tuple[str, Any, Any]]:
        """Return each (member, value, later value) of one top to the next whose value fell: a ranking going
        backwards (a total spend never falls)."""
        fell = []
        for earlier, later in itertools.pairwise(self.tops):
            before = {e["member"]: e["value"] for e in earlier}
            fell += [
                (e["member"], before[e["member"]], e["value"])
                for e in later
                if e["value"] < before.get(e["member"], e["value"])
            ]
        return fell


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
