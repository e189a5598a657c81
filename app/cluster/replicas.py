"""What this node knows of its peers' copies of partitions: state, lag, and whether the peer is down.

Filled by the peer poller (``app.cluster.health``: each member's ``/readyz`` every second) and by the peers'
own answers; read by the routing core (``app.query.routing``) for every partition it routes. A peer that
failed a forwarded request is down until its next successful poll — the next request does not try it
again first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from iqgraph.schema.types import PartitionInfo

RUNNING, UNKNOWN, DOWN = "RUNNING", "UNKNOWN", "DOWN"


@dataclass(frozen=True)
class ReplicaState:
    """What is known of one node's copy of one partition: its state and how many records it lags."""

    state: str = UNKNOWN  # CREATED | RESTORING | RUNNING | CLOSED | UNKNOWN | DOWN (the node failed a request)
    lag: int | None = None  # None: not known


NOT_KNOWN = ReplicaState()
#: (node, topic, partition) → what is known of that replica.
ReplicaStates = Callable[[str, str, int], ReplicaState]


class PeerStates:
    """The last known state and lag of each peer's partitions, and the peers known to be down."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, str, int], ReplicaState] = {}
        self._down: set[str] = set()
        self._lock = threading.Lock()

    def get(self, node: str, topic: str, partition: int) -> ReplicaState:
        """Return what is known of node's copy of topic-partition."""
        if node in self._down:
            return ReplicaState(DOWN)
        return self._states.get((node, topic, partition), NOT_KNOWN)

    def update(self, node: str, partitions: Iterable[PartitionInfo]) -> None:
        """Record a peer's own report of its partitions (it is up)."""
        with self._lock:
            for key in [k for k in self._states if k[0] == node]:
                del self._states[key]
            for p in partitions:
                self._states[node, p.topic, p.partition] = ReplicaState(p.state, p.lag)
            self._down.discard(node)

    def learn_lag(self, node: str, topic: str, partition: int, lag: int) -> None:
        """Record the lag a peer's answer reported for one partition (it is RUNNING: it answered)."""
        with self._lock:
            self._states[node, topic, partition] = ReplicaState("RUNNING", lag)

    def mark_down(self, node: str) -> None:
        """Record that node failed a request: routing skips it until it answers a poll again."""
        with self._lock:
            self._down.add(node)

    def is_down(self, node: str) -> bool:
        """Return whether node is known to be down."""
        return node in self._down
