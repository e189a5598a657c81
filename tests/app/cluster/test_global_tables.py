"""Global tables in the cluster map: every node hosts and serves every partition of a global topic itself;
a node hosts the co-partitioned table partitions its joins read."""

from __future__ import annotations

import pytest

from iqgraph.app.cluster.membership import (
    ClusterMap,
    Member,
    PartitionOwners,
    StaticMembership,
    with_global_topics,
    with_joined_tables,
)
from iqgraph.streaming.definitions import DefinitionError, Topic

MEMBERS = [Member(f"node-{i}", f"http://127.0.0.1:{9000 + i}") for i in range(3)]


def test_every_node_serves_every_partition_of_a_global_topic_and_its_share_of_the_others() -> None:
    for member in MEMBERS:
        membership = StaticMembership(member.id, MEMBERS, {"orders": 6}, standbys=1, global_topics={"products": 4})
        cmap = membership.current()
        hosted = cmap.hosted_partitions(member.id)
        assert hosted["products"] == [0, 1, 2, 3]
        assert all(cmap.owners_of("products", p) == PartitionOwners(member.id) for p in range(4))
        assert len(hosted["orders"]) == 4  # 2 active + 2 standby of 6 over 3 nodes: global topics change nothing
        # a peer going down leaves the node's own copies of the global topic where they are
        membership.set_down(frozenset(m.id for m in MEMBERS if m.id != member.id))
        assert membership.current().owners_of("products", 2) == PartitionOwners(member.id)


def test_with_global_topics_overlays_only_the_global_partitions() -> None:
    base = ClusterMap(3, {m.id: m for m in MEMBERS}, {("orders", 0): PartitionOwners("node-1", ("node-2",))})
    overlaid = with_global_topics(base, "node-0", {"songs": 2})
    assert overlaid.owners_of("orders", 0) == PartitionOwners("node-1", ("node-2",))
    assert overlaid.owners_of("songs", 1) == PartitionOwners("node-0")
    assert overlaid.generation == 3
    assert with_global_topics(base, "node-0", {}) is base


def test_a_global_table_must_be_a_table() -> None:
    with pytest.raises(DefinitionError, match="set table=True"):
        Topic("songs", schema="genre STRING", global_table=True)


def test_a_node_hosts_the_table_partitions_of_the_stream_partitions_it_joins() -> None:
    # a warming claimant took over customers-0 (the table) while the old owner still serves orders-0
    hosted = {"orders": [0, 3], "customers": [3], "songs": [1]}
    found = with_joined_tables(hosted, [("orders", "customers")])
    assert found == {"orders": [0, 3], "customers": [0, 3], "songs": [1]}
    assert with_joined_tables({"customers": [2]}, [("orders", "customers")]) == {"customers": [2]}
