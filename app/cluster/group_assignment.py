"""What a member of the group publishes, and the map every node builds from it: pure, no I/O, no clock.

A ``MemberRecord`` (the value of a node's key in the metadata topic, JSON) says who the node is, what the
consumer group assigned it (its *claim*, at a group generation) and the state and lag of every partition
it hosts. ``build_map`` turns the latest record of each node into the ``ClusterMap``: the same records give
the same map on every node.

Warm-up replicas follow Kafka Streams' high-availability assignor (KIP-441): a claim makes its claimant
the active node only once its copy is caught up — RUNNING and at most ``acceptable.recovery.lag``
records behind (``ACCEPTABLE_RECOVERY_LAG``, Kafka Streams' default 10,000). Until then a caught-up copy
elsewhere keeps the active role and the claimant warms up as a standby, so routing never sends reads to
a copy that is still restoring while another can answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from iqgraph.app.cluster.membership import ClusterMap, Member, PartitionOwners, standbys_for
from iqgraph.app.cluster.replicas import RUNNING, ReplicaState

__all__ = ["ACCEPTABLE_RECOVERY_LAG", "MemberRecord", "TopicPartitionKey", "build_map", "is_caught_up"]

#: Kafka Streams' default ``acceptable.recovery.lag``: a RUNNING copy this close to the end may be active.
ACCEPTABLE_RECOVERY_LAG = 10_000
TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class MemberRecord:
    """What a node publishes: who it is, where it is reached, what it claims, how its copies are, as of when.

    ``active`` is what the group assigned it (its claim, at ``generation``); ``hosted`` the state and lag of
    every partition it runs a pipeline for (active, standby or warming up).
    """

    node_id: str
    url: str
    active: Mapping[str, tuple[int, ...]]
    generation: int
    time: float
    hosted: Mapping[TopicPartitionKey, ReplicaState] = field(default_factory=dict)

    def encode(self) -> bytes:
        """Return the record's JSON value (hosted as ``{topic: {partition: [state, lag]}}``)."""
        hosted: dict[str, dict[str, list[str | int | None]]] = {}
        for (topic, p), replica in sorted(self.hosted.items()):
            hosted.setdefault(topic, {})[str(p)] = [replica.state, replica.lag]
        body = {"node_id": self.node_id, "url": self.url, "generation": self.generation, "time": self.time}
        active = {t: list(ps) for t, ps in self.active.items()}
        return json.dumps({**body, "active": active, "hosted": hosted}).encode()

    @classmethod
    def decode(cls, value: bytes) -> MemberRecord:
        """Return the record encoded in value (raises ValueError, KeyError or TypeError if malformed).

        A record without ``hosted`` (from a node before warm-up replicas) reports no copy.
        """
        body = json.loads(value)
        active = {str(t): tuple(int(p) for p in ps) for t, ps in body["active"].items()}
        hosted = {
            (str(topic), int(p)): ReplicaState(str(state), None if lag is None else int(lag))
            for topic, ps in body.get("hosted", {}).items()
            for p, (state, lag) in ps.items()
        }
        node, url = str(body["node_id"]), str(body["url"])
        return cls(node, url, active, int(body["generation"]), float(body["time"]), hosted)

    def caught_up(self, tp: TopicPartitionKey, recovery_lag: int) -> bool:
        """Return whether this node's copy of tp is caught up (see is_caught_up)."""
        return is_caught_up(self.hosted.get(tp), recovery_lag)


def is_caught_up(replica: ReplicaState | None, recovery_lag: int) -> bool:
    """Return whether a copy is RUNNING and known to be at most recovery_lag records behind."""
    return replica is not None and replica.state == RUNNING and replica.lag is not None and replica.lag <= recovery_lag


def build_map(
    records: Mapping[str, MemberRecord],
    *,
    now: float,
    liveness_s: float,
    standbys: int,
    floor: int = 0,
    recovery_lag: int = ACCEPTABLE_RECOVERY_LAG,
) -> ClusterMap:
    """Return the map of the live records; pure: the same records give the same map on every node.

    Per partition, its claimant is the live member whose record claims it at the highest generation:

    1. the claimant is active if its copy is caught up (RUNNING, lag <= recovery_lag);
    2. else a caught-up copy on another live member is active — the claimant's standbys first (they host
       the partition anyway, so the active role moves between them without any node starting or stopping
       a pipeline), then the others (the previous owner), by id; never by lag, which moves with every
       record and would flap the role between caught-up copies — and the claimant warms up as a standby.
       Every other caught-up copy stays a standby while the claimant warms up: the one chosen may be a
       member that just crashed (its record lives until it expires), and a copy dropped would restore
       from scratch when the map changes again;
    3. else the most advanced copy among the claimant and its standbys is active — RUNNING first, then the
       least lag, the claimant among equals; the claimant when none of them reports a copy. Reads wait
       for a restoring active: better one seconds from RUNNING (a standby restarting its pipeline) than
       a claimant that has just started, or is not even serving yet.

    A partition no live record claims (its claimant's record expired, or a rebalance is between revoke
    and assign) goes at once to the best live member hosting it: RUNNING first, then caught up, then the
    least lag among copies not caught up, then by id (a restoring copy only when no copy runs: reads then
    wait for it rather than fail at once). Its standbys are standbys_for that node, plus every other
    member hosting it: no copy is dropped while nobody claims the partition. It has no owner only if no
    live member hosts it.

    Standbys are otherwise standbys_for the claimant over the live ids, plus the warming claimant. The
    map's generation is the highest group generation seen (at least floor).
    """
    live = {node: r for node, r in records.items() if now - r.time <= liveness_s}
    claims: dict[TopicPartitionKey, MemberRecord] = {}
    for record in sorted(live.values(), key=lambda r: (r.generation, r.time, r.node_id)):
        claims.update({(topic, p): record for topic, ps in record.active.items() for p in ps})
    ids = sorted(live)
    owners = {tp: _claimed(tp, r, live, ids, standbys, recovery_lag) for tp, r in claims.items()}
    for tp in sorted({tp for r in live.values() for tp in r.hosted} - set(claims)):
        owners[tp] = _unclaimed(tp, live, ids, standbys, recovery_lag)
    generation = max([floor, *(r.generation for r in live.values())])
    return ClusterMap(generation, {node: Member(node, r.url) for node, r in live.items()}, owners)


def _claimed(
    tp: TopicPartitionKey,
    claimant: MemberRecord,
    live: Mapping[str, MemberRecord],
    ids: list[str],
    standbys: int,
    recovery_lag: int,
) -> PartitionOwners:
    """Return the owners of tp claimed by claimant: it, or a caught-up copy while it warms up."""
    assigned = standbys_for(claimant.node_id, ids, standbys)
    if claimant.caught_up(tp, recovery_lag):
        return PartitionOwners(claimant.node_id, assigned)
    others = [r for r in live.values() if r is not claimant and r.caught_up(tp, recovery_lag)]
    if others:
        best = min(others, key=lambda r: (r.node_id not in assigned, r.node_id)).node_id
    else:  # nobody caught up: the most advanced copy among those the claim places, the claimant among equals
        hosts = [r for r in (claimant, *(live[n] for n in assigned)) if tp in r.hosted]
        ranked = sorted((r.hosted[tp].state != RUNNING, _lag(r, tp), r is not claimant, r.node_id) for r in hosts)
        best = ranked[0][-1] if ranked else claimant.node_id
    if best == claimant.node_id:
        return PartitionOwners(best, assigned)
    kept = sorted(r.node_id for r in others if r.node_id != best and r.node_id not in assigned)
    return PartitionOwners(best, (claimant.node_id, *(n for n in assigned if n != best), *kept))


def _unclaimed(
    tp: TopicPartitionKey, live: Mapping[str, MemberRecord], ids: list[str], standbys: int, recovery_lag: int
) -> PartitionOwners:
    """Return the owners of tp, which no live record claims, from the live members that host it."""
    hosts = [r for r in live.values() if tp in r.hosted]
    best = min(hosts, key=lambda r: (*_advance(r, tp, recovery_lag), r.node_id)).node_id
    assigned = standbys_for(best, ids, standbys)
    kept = sorted(r.node_id for r in hosts if r.node_id != best and r.node_id not in assigned)
    return PartitionOwners(best, (*assigned, *kept))


def _advance(record: MemberRecord, tp: TopicPartitionKey, recovery_lag: int) -> tuple[bool, bool, float]:
    """Return how far record's copy of tp is from the end, as a sort key: RUNNING first, then caught up, then lag.

    Caught-up copies rank equal whatever their lag: lags move with every record, and a choice made on them
    would flap the active role between caught-up copies (each flip moves reads and restarts pipelines).
    """
    caught_up = record.caught_up(tp, recovery_lag)
    return record.hosted[tp].state != RUNNING, not caught_up, 0.0 if caught_up else _lag(record, tp)


def _lag(record: MemberRecord, tp: TopicPartitionKey) -> float:
    lag = record.hosted[tp].lag
    return float("inf") if lag is None else lag
