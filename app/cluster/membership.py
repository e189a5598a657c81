"""Cluster membership: who the nodes are and which partitions each serves, actively or as a standby.

Two modes behind one interface (``Membership``):
- static (``StaticMembership``): nodes listed in settings; partition p's active node is p mod N over the
  sorted node ids, its k standbys the next k nodes; a peer whose health check fails is down;
- kafka group (``app.cluster.group_membership.GroupMembership``): the consumer-group protocol assigns partitions
  and every node publishes its assignment to a compacted metadata topic that every node tails.

``ClusterMap`` is pure data: the routing layer asks it "who owns this partition" (faust's Router.key_store);
sending the request there is the peer client's job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """A node of the cluster: its id and the URL its GraphQL API is reached at."""

    id: str
    url: str


@dataclass(frozen=True)
class PartitionOwners:
    """The node serving a partition actively, and the nodes keeping standby copies of it."""

    active: str | None
    standbys: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterMap:
    """Which node serves which topic-partition, as of one generation of the membership."""

    generation: int
    members: Mapping[str, Member]
    owners: Mapping[tuple[str, int], PartitionOwners]
    down: frozenset[str] = field(default_factory=frozenset)

    def owners_of(self, topic: str, partition: int) -> PartitionOwners:
        """Return the owners of topic-partition (no active node if it is unassigned)."""
        return self.owners.get((topic, partition), PartitionOwners(None))

    def active_partitions(self, node_id: str) -> dict[str, list[int]]:
        """Return, per topic, the partitions node_id serves actively."""
        return self._partitions(node_id, lambda owners: owners.active == node_id)

    def standby_partitions(self, node_id: str) -> dict[str, list[int]]:
        """Return, per topic, the partitions node_id keeps as a standby."""
        return self._partitions(node_id, lambda owners: node_id in owners.standbys)

    def _partitions(self, node_id: str, wanted: Callable[[PartitionOwners], bool]) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for (topic, partition), owners in sorted(self.owners.items()):
            if wanted(owners):
                found.setdefault(topic, []).append(partition)
        return found

    def hosted_partitions(self, node_id: str) -> dict[str, list[int]]:
        """Return, per topic, every partition node_id runs a pipeline for (active and standby)."""
        hosted = self.active_partitions(node_id)
        for topic, partitions in self.standby_partitions(node_id).items():
            hosted[topic] = sorted({*hosted.get(topic, []), *partitions})
        return hosted

    def url_of(self, node_id: str) -> str | None:
        """Return the URL of node_id, if it is a member."""
        member = self.members.get(node_id)
        return None if member is None else member.url

    def is_up(self, node_id: str) -> bool:
        """Return whether node_id is a member not known to be down."""
        return node_id in self.members and node_id not in self.down


def standbys_for(active: str, member_ids: Sequence[str], count: int) -> tuple[str, ...]:
    """Return the count nodes after active in sorted id order (cyclic): its standbys."""
    ordered = sorted(member_ids)
    if active not in ordered or count <= 0:
        return ()
    start = ordered.index(active)
    others = [ordered[(start + i) % len(ordered)] for i in range(1, len(ordered))]
    return tuple(others[:count])


def modulo_map(
    members: Sequence[Member], partitions: Mapping[str, int], standbys: int, generation: int = 1
) -> ClusterMap:
    """Return the static map: partition p's active node is p mod N over the sorted node ids."""
    ids = sorted(m.id for m in members)
    owners = {
        (topic, p): PartitionOwners(ids[p % len(ids)], standbys_for(ids[p % len(ids)], ids, standbys))
        for topic, count in partitions.items()
        for p in range(count)
    }
    return ClusterMap(generation, {m.id: m for m in members}, owners)


def with_global_topics(cmap: ClusterMap, node_id: str, topics: Mapping[str, int]) -> ClusterMap:
    """Return cmap with every partition of the global topics served by node_id itself.

    A global table (``Topic(table=True, global_table=True)``) is consumed whole by every node into a local
    copy: its partitions take no part in assignment, and each node reads its own copy (no forwarding).
    """
    if not topics:
        return cmap
    owners = dict(cmap.owners)
    owners.update({(topic, p): PartitionOwners(node_id) for topic, count in topics.items() for p in range(count)})
    return ClusterMap(cmap.generation, cmap.members, owners, cmap.down)


def with_joined_tables(hosted: Mapping[str, list[int]], joins: Sequence[tuple[str, str]]) -> dict[str, list[int]]:
    """Return hosted (per topic, the partitions a node hosts) with, for each (stream, table) of a join with a
    co-partitioned table, the table's partitions of the stream's partitions hosted too.

    A stream partition joined with a co-partitioned table reads that table's same partition on this node; the
    map assigns topics' partitions one by one (a warming claimant can take over the table's partition before
    the stream's), so the node keeps its own copy of each such table partition (reported as a standby).
    """
    found = {topic: list(partitions) for topic, partitions in hosted.items()}
    for stream, table in joins:
        found[table] = sorted({*found.get(table, []), *found.get(stream, [])})
    return {topic: partitions for topic, partitions in found.items() if partitions}


class Membership(Protocol):
    """Where a node learns the cluster map, and hears when it changes."""

    node_id: str

    def start(self) -> None:
        """Join the cluster (or start watching it)."""
        ...

    def stop(self) -> None:
        """Leave the cluster."""
        ...

    def current(self) -> ClusterMap:
        """Return the latest cluster map."""
        ...

    def refresh(self) -> ClusterMap:
        """Re-read the map now (after a peer answered NOT_OWNER) and return it."""
        ...

    def subscribe(self, callback: Callable[[ClusterMap], None]) -> None:
        """Call callback with every new map (from a background thread)."""
        ...


class StaticMembership:
    """Nodes from settings; the map only changes when a peer goes down or comes back."""

    def __init__(
        self,
        node_id: str,
        members: Sequence[Member],
        partitions: Mapping[str, int],
        standbys: int = 0,
        global_topics: Mapping[str, int] | None = None,
    ) -> None:
        ids = [m.id for m in members]
        if node_id not in ids:
            raise ValueError(f"--node-id {node_id!r} is not among the peers {ids}; list this node in --peers")
        if len(set(ids)) != len(ids):
            raise ValueError(f"peer ids must be unique, got {ids}")
        if not 0 <= standbys < len(ids):
            raise ValueError(f"--standbys must be between 0 and {len(ids) - 1} for {len(ids)} nodes")
        self.node_id = node_id
        self._base = with_global_topics(modulo_map(members, partitions, standbys), node_id, global_topics or {})
        self._map = self._base
        self._callbacks: list[Callable[[ClusterMap], None]] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Nothing to join: the map is known from settings."""

    def stop(self) -> None:
        """Nothing to leave."""

    def current(self) -> ClusterMap:
        """Return the map with the peers currently known to be down."""
        return self._map

    def refresh(self) -> ClusterMap:
        """Return the map: in static mode it cannot be newer elsewhere."""
        return self._map

    def subscribe(self, callback: Callable[[ClusterMap], None]) -> None:
        """Call callback when a peer's health changes."""
        self._callbacks.append(callback)

    def mark_down(self, node_id: str) -> None:
        """Treat node_id as down now (a forwarded request to it failed); health checks bring it back."""
        self.set_down(self._map.down | {node_id})

    def set_down(self, down: frozenset[str]) -> None:
        """Record which peers failed their health check (this node is never down to itself).

        A change is logged once, "peers down: a, b" (or "none"), whichever path saw it: the poller, or a
        forwarded request that failed (``mark_down``), which often notices a dead peer first.
        """
        down = down - {self.node_id}
        with self._lock:
            if down == self._map.down:
                return
            self._map = ClusterMap(self._map.generation + 1, self._base.members, self._base.owners, down)
            log.warning("peers down: %s", ", ".join(sorted(down)) or "none")
        for callback in self._callbacks:
            callback(self._map)


def parse_peers(text: str) -> list[Member]:
    """Return the members of a --peers list: 'id=url' items, or plain URLs named node-0, node-1, … in order."""
    members = []
    for index, item in enumerate(part.strip() for part in text.split(",") if part.strip()):
        node_id, sep, url = item.partition("=")
        if not sep:
            node_id, url = f"node-{index}", item
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"peer {item!r}: give a URL like http://host:8000 (optionally id=URL)")
        members.append(Member(node_id.strip(), url.strip().rstrip("/")))
    return members
