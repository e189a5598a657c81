"""Which copy of a partition runs its pipeline: the map's active; while it is down, its first live standby — unless
the active came back and fenced that standby's changelog writer, which then yields at once (no fencing ping-pong)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from iqgraph.app.cluster.membership import ClusterMap, Member, PartitionOwners
from iqgraph.app.node import PROMOTE_AFTER_S, YIELD_AFTER_FENCED_S, Node
from iqgraph.app.settings import Settings
from tests.support.apps import shop_app


class Fenced:
    """A runner whose hosted partitions say when another copy fenced their changelog writer."""

    def __init__(self) -> None:
        self.at: dict[tuple[str, int], float] = {}
        self.hosted = SimpleNamespace(fenced_since=lambda topic, partition: self.at.get((topic, partition)))


def test_a_promoted_standby_fenced_by_the_returning_active_yields_before_its_health_checks_see_it() -> None:
    node = Node(Settings(app="x:app", node_id="node-0"), shop_app())
    members = {n: Member(n, f"http://{n}") for n in ("node-0", "node-1", "node-2")}
    cmap = ClusterMap(1, members, {("orders", 2): PartitionOwners("node-2", ("node-0",))}, frozenset({"node-2"}))
    node.membership = SimpleNamespace(current=lambda: cmap)  # type: ignore[assignment]
    runner = Fenced()
    node.runner = runner  # type: ignore[assignment]

    node._down_since["node-2"] = time.monotonic()
    assert node._pipeline_role("orders", 2) == "standby"  # not at once: one failed request marks a peer down
    node._down_since["node-2"] = time.monotonic() - PROMOTE_AFTER_S - 1
    assert node._pipeline_role("orders", 2) == "active"  # down long enough: the first live standby runs it

    runner.at[("orders", 2)] = time.monotonic()  # node-2 came back and took the changelog over
    assert node._pipeline_role("orders", 2) == "standby"  # though node-2 still looks down from here
    runner.at[("orders", 2)] = time.monotonic() - YIELD_AFTER_FENCED_S - 1
    assert node._pipeline_role("orders", 2) == "active"  # long ago, and the active still down: promoted again
