"""Which copy of a partition runs its pipeline: the map's active; while it is down, its first live standby — unless
the active came back and fenced that standby's changelog writer, which then yields at once (no fencing ping-pong)."""

from __future__ import annotations

import time

from iqgraph.app.cluster.membership import ClusterMap, Member, PartitionOwners
from iqgraph.app.pipeline_placement import PROMOTE_AFTER_S, YIELD_AFTER_FENCED_S, PipelinePlacement


def test_a_promoted_standby_fenced_by_the_returning_active_yields_before_its_health_checks_see_it() -> None:
    members = {n: Member(n, f"http://{n}") for n in ("node-0", "node-1", "node-2")}
    cmap = ClusterMap(1, members, {("orders", 2): PartitionOwners("node-2", ("node-0",))}, frozenset({"node-2"}))
    fenced: dict[tuple[str, int], float] = {}
    looked: list[bool] = []
    placement = PipelinePlacement("node-0", lambda: cmap, lambda t, p: fenced.get((t, p)), lambda: looked.append(True))

    placement.track_down(cmap)
    assert placement.role("orders", 2) == "standby"  # not at once: one failed request marks a peer down
    placement.down_since["node-2"] = time.monotonic() - PROMOTE_AFTER_S - 1
    assert placement.role("orders", 2) == "active"  # down long enough: the first live standby runs it
    assert placement.pipelines({"orders": [2]}) == {"orders": [2]}

    fenced[("orders", 2)] = time.monotonic()  # node-2 came back and took the changelog over
    assert placement.role("orders", 2) == "standby"  # though node-2 still looks down from here
    fenced[("orders", 2)] = time.monotonic() - YIELD_AFTER_FENCED_S - 1
    assert placement.role("orders", 2) == "active"  # long ago, and the active still down: promoted again


def test_the_active_runs_its_pipeline_and_a_node_without_membership_runs_all() -> None:
    members = {n: Member(n, f"http://{n}") for n in ("node-0", "node-2")}
    cmap = ClusterMap(1, members, {("orders", 2): PartitionOwners("node-2", ("node-0",))})
    fenced = {("orders", 2): time.monotonic()}
    assert (
        PipelinePlacement("node-2", lambda: cmap, lambda t, p: fenced.get((t, p)), lambda: None).role("orders", 2)
        == "active"
    )  # the map's active runs it, fenced or not: it takes the changelog back
    assert PipelinePlacement("node-0", lambda: None, lambda t, p: None, lambda: None).role("orders", 2) == "active"
