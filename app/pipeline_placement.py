"""Which hosted partitions this node runs the pipeline of (and writes the changelog of), and which it follows.

The cluster map's active copy of a partition runs its pipeline; its standbys follow its changelog. While the active
has been down for ``PROMOTE_AFTER_S``, its first live standby runs it, from the offsets its changelog position
carries — not at once: a peer is marked down on one failed request, and two writers taking the changelog over fence
each other. A promoted standby whose changelog writer another copy fenced (the active, back) yields at once, even
before its health checks see that copy up, and is promoted again only after ``YIELD_AFTER_FENCED_S``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from iqgraph.app.cluster.membership import ClusterMap

PROMOTE_AFTER_S = 5.0  # a partition's active down this long: its first live standby runs the pipeline
YIELD_AFTER_FENCED_S = 60.0  # a promoted standby fenced by another copy runs the pipeline again only after this


class PipelinePlacement:
    """Where each hosted partition's pipeline runs, as this node sees the cluster map."""

    def __init__(
        self,
        node_id: str,
        current: Callable[[], ClusterMap | None],
        fenced_since: Callable[[str, int], float | None],
        look_again: Callable[[], None],
    ) -> None:
        """Args:
        current: the cluster map now (None: no membership, this node runs every pipeline it hosts).
        fenced_since: when (time.monotonic()) another copy took a partition's changelog over from this node.
        look_again: called once a peer has been down PROMOTE_AFTER_S (a promotion may be due).
        """
        self.node_id = node_id
        self.current = current
        self.fenced_since = fenced_since
        self.look_again = look_again
        self.down_since: dict[str, float] = {}  # peer -> time.monotonic() it was first seen down

    def role(self, topic: str, partition: int) -> str:
        """Return "active" when this node runs the pipeline of a hosted partition and writes its changelog, else
        "standby" (it follows the changelog)."""
        cmap = self.current()
        if cmap is None:
            return "active"
        owners = cmap.owners_of(topic, partition)
        if owners.active is None or owners.active == self.node_id:
            return "active"
        since = self.down_since.get(owners.active)
        if owners.active in cmap.down and since is not None and time.monotonic() - since >= PROMOTE_AFTER_S:
            live = [node for node in owners.standbys if node not in cmap.down]
            if live and live[0] == self.node_id and not self._fenced_lately(topic, partition):
                return "active"
        return "standby"

    def pipelines(self, hosted: Mapping[str, list[int]]) -> dict[str, list[int]]:
        """Return the hosted partitions this node runs the pipeline of."""
        return {t: [p for p in ps if self.role(t, p) == "active"] for t, ps in hosted.items()}

    def track_down(self, cmap: ClusterMap) -> None:
        """Note since when each peer is down; look again once one has been down PROMOTE_AFTER_S."""
        now = time.monotonic()
        for node in cmap.down:
            if node not in self.down_since:
                self.down_since[node] = now
                timer = threading.Timer(PROMOTE_AFTER_S + 0.1, self.look_again)
                timer.daemon = True
                timer.start()
        for node in [n for n in self.down_since if n not in cmap.down]:
            del self.down_since[node]

    def _fenced_lately(self, topic: str, partition: int) -> bool:
        """Return whether another copy took partition's changelog over from this node less than YIELD_AFTER_FENCED_S
        ago (taking it back would fence that copy's first batch in turn, and so on)."""
        fenced = self.fenced_since(topic, partition)
        return fenced is not None and time.monotonic() - fenced < YIELD_AFTER_FENCED_S
