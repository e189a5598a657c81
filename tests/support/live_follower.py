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

FOLLOW = """subscription($keys: [String!]!, $after: [PositionInput!]) {
  orderCountWatch(keys: $keys, after: $after) { key value snapshot dropped lag position { partition offset } }
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
    """Follow keys' order counts, every event kept with the time it came; after: resume after those positions."""

    query = FOLLOW

    def __init__(self, node: NodeProcess, keys: Sequence[str], after: dict[int, int] | None = None) -> None:
        super().__init__(node)
        self.keys = list(keys)
        self.after = after
        self.variables = {"keys": self.keys}
        if after is not None:
            self.variables["after"] = [{"partition": p, "offset": o} for p, o in sorted(after.items())]
        self.events: list[Followed] = []

    def started(self) -> bool:
        if self.after is not None:
            return True  # a resume sends only what changed since: nothing to wait for
        return {e.key for e in self.events} == set(self.keys)  # the first value of every key

    def positions(self) -> dict[int, int]:
        """Return the last position received of each partition (a resume's after)."""
        last: dict[int, int] = {}
        for e in list(self.events):
            last[e.partition] = max(e.offset, last.get(e.partition, -1))
        return last

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
    """Return the events whose value is not the ground truth at the position it carries, whose position is not the
    offset of one of the key's records, a pushed value that repeats (a duplicate) and positions that go back.

    truth_at(key, offset): the key's count over its partition's records before offset. Each event carries the
    position of the record that produced its value (-1: a key that never had one), in position order per partition.
    """
    wrong: list[str] = []
    ends: dict[int, int] = {}
    pushed: dict[str, int] = {}
    for e in events:
        if e.offset < ends.get(e.partition, -1):
            wrong.append(f"{e.key}: offset {e.offset} of partition {e.partition} after {ends[e.partition]}")
        ends[e.partition] = max(e.offset, ends.get(e.partition, -1))
        truth = truth_at(e.key, e.offset + 1)
        if (e.value or 0) != truth:
            wrong.append(f"{e.key}: {e.value} at offset {e.offset} of partition {e.partition}, not {truth}")
        if e.offset >= 0 and truth - truth_at(e.key, e.offset) != 1:
            wrong.append(f"{e.key}: position {e.offset} of partition {e.partition} is not one of its records")
        if not e.snapshot:
            if (e.value or 0) <= pushed.get(e.key, -1):
                wrong.append(f"{e.key}: pushed {e.value} after {pushed[e.key]}")
            pushed[e.key] = e.value or 0
    return wrong
