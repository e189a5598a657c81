"""The routing core: which partitions a key is in, and which replica serves each. Pure — no I/O, no clock.

``keys_partitions(keys, …, detected)`` gives the partitions a read of each key must ask: the one the producers'
partitioner chose (``detected``: the configured partitioner, or under ``auto`` the one the sink detected
per topic); both candidates while producers are seen mixing partitioners or nothing tells them apart yet;
every partition for a store keyed by a column. A key no known partitioner explains cannot be routed with
confidence: PARTITIONER_MISMATCH, never a silent null.

``plan(cmap, replicas, topic, needs, bound, excluded, prefer)`` takes the cluster map (who is active and
standby for each partition, who is down), what is known of each replica (its state and lag), the
partitions each request needs (one for a co-partitioned key; two when producers mix partitioners;
every partition for a store keyed by a column), the request's staleness bound and the replicas that
already failed in this request, and returns a ``Plan``: per serving node, which requests to read from
which of its partitions; per request that no replica can serve, a ``Refusal`` saying why. The executor
(``app.query.store_queries``) runs a plan, and re-plans a failed peer's reads with that peer excluded.

Failover rules, per partition (docs/architecture.md draws them):

1. The active node, if it is up, not excluded, and RUNNING (or its state is not known yet: its answer
   tells).
2. Else a standby that is up, not excluded, RUNNING and within the bound (``lag <= bound``) — the least
   lagging first, this node first among equals. A standby whose state is not known yet comes after the
   known ones: its answer reports its lag, which the executor checks against the bound.
3. Else the active node while it restores: it is the only copy that will catch up; the read waits for it
   (retry with backoff) and fails STORE_NOT_READY at the deadline.
4. Else a replica only believed down — the map's down set, a missed poll or a failed request of another
   request (a node starved of CPU misses its poll while it still answers) — the active first, a standby
   only under a bound: a replica that may answer is asked before a read fails. One that fails in this
   request is excluded: only that is proof.
5. Else a refusal: STALE_BEYOND_BOUND when a standby is up but lags more than the bound (with the best lag
   available), STORE_NOT_AVAILABLE otherwise (no replica up; or stale reads are off: no bound given).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from iqgraph.app.cluster.membership import ClusterMap, PartitionOwners
from iqgraph.app.cluster.replicas import DOWN, RUNNING, UNKNOWN, ReplicaState, ReplicaStates
from iqgraph.schema.errors import PARTITIONER_MISMATCH, STALE_BEYOND_BOUND, STORE_NOT_AVAILABLE, ApiError
from iqgraph.stores import InvalidKeyError, Key, KeyCodec
from iqgraph.stores.codecs import KeyType
from iqgraph.streaming.definitions import App, KeyFormat, StoreDefinition
from iqgraph.streaming.partitioner import candidates_many, serialize_key

#: Where a read of a key goes: its partitions, or why it cannot be read.
Routed = tuple[int, ...] | InvalidKeyError | ApiError


@dataclass(frozen=True)
class Server:
    """The node that answers for a partition, and in which role."""

    node: str
    role: str  # "active" | "standby"

    @property
    def stale(self) -> bool:
        """Return whether the answer comes from a standby (and must report its lag)."""
        return self.role == "standby"


@dataclass(frozen=True)
class Refusal:
    """Why no replica of a partition can serve a read now."""

    code: str
    message: str
    partition: int
    best_lag: int | None = None


@dataclass
class Group:
    """What one node is asked: per request index, the partitions it reads there."""

    reads: dict[int, list[int]] = field(default_factory=dict)

    @property
    def partitions(self) -> list[int]:
        """Return every partition this node reads for the group."""
        return sorted({p for ps in self.reads.values() for p in ps})


@dataclass
class Plan:
    """A routed read: the groups per serving node, and the requests refused (with the first reason)."""

    groups: dict[Server, Group] = field(default_factory=dict)
    refused: dict[int, Refusal] = field(default_factory=dict)


def keys_partitions(
    keys: Sequence[Key],
    key_type: KeyType,
    key_format: KeyFormat,
    topic: str,
    partitions: int,
    co_partitioned: bool,
    detected: str,
) -> list[tuple[int, ...] | InvalidKeyError | ApiError]:
    """Return, per key, the partitions a read of it asks, or why it cannot be read (in key order).

    The keys are checked one by one and hashed as one batch (``candidates_many``).
    """
    found, routed = _checked(keys, key_type)
    if not co_partitioned:
        every = tuple(range(partitions))
        for i in routed:
            found[i] = every
        return found
    if len(routed) == len(keys) and key_format != "long" and key_type == "string":
        serialized = [key.encode() for key in keys]  # type: ignore[union-attr] # every key is a checked str
    else:
        serialized = [serialize_key(keys[i], key_format) for i in routed]
    candidates = _candidates(serialized, partitions, detected)
    for i, where in zip(routed, candidates, strict=True):
        found[i] = _mismatch(topic, detected) if where is None else where
    return found


#: The candidate partitions of the keys read lately, by (serialized key, partitions, detection): a node is asked for
#: the same keys again and again, and a key's hashes (murmur2 in Python) cost more than its RocksDB read. Cleared
#: whole when it would pass ROUTED_KEYS entries; a new detection or partition count makes keys of their own.
_ROUTED: dict[tuple[bytes, int, str], tuple[int, ...] | None] = {}
ROUTED_KEYS = 65_536


def _candidates(keys: list[bytes], partitions: int, detected: str) -> list[tuple[int, ...] | None]:
    """Return ``candidates_many`` of keys, hashing only those not routed lately."""
    found = [_ROUTED.get((key, partitions, detected), _UNSEEN) for key in keys]
    unseen = [i for i, where in enumerate(found) if where is _UNSEEN]
    if not unseen:
        return found  # type: ignore[return-value] # every entry was found
    hashed = candidates_many([keys[i] for i in unseen], partitions, detected)
    if len(_ROUTED) + len(unseen) > ROUTED_KEYS:
        _ROUTED.clear()
    keep = len(unseen) <= ROUTED_KEYS
    for i, where in zip(unseen, hashed, strict=True):
        found[i] = where
        if keep:
            _ROUTED[keys[i], partitions, detected] = where
    return found  # type: ignore[return-value] # every entry is hashed now


_UNSEEN = object()


def _checked(keys: Sequence[Key], key_type: KeyType) -> tuple[list[Routed], list[int]]:
    """Return per key () or why it cannot be read, and the indexes of the keys that can (to route)."""
    if key_type == "string" and all(type(key) is str and key for key in keys):  # the common case, in one pass
        return [()] * len(keys), list(range(len(keys)))
    codec = KeyCodec(key_type)
    found: list[Routed] = []
    routed: list[int] = []
    for key in keys:
        try:
            codec.check(key)
            if key == "":
                raise InvalidKeyError("the key is empty: give a non-empty key")
        except InvalidKeyError as exc:
            found.append(exc)
            continue
        routed.append(len(found))
        found.append(())
    return found, routed


def _mismatch(topic: str, detected: str) -> ApiError:
    return ApiError(
        f"topic {topic}: producers put keys on partitions neither murmur2 nor consistent_random explains, so "
        "this key cannot be routed with confidence; set the app's kafka partitioner to the one the producers "
        "use, or produce with murmur2_random / consistent_random",
        PARTITIONER_MISMATCH,
        topic=topic,
        partitioner=detected,
    )


def store_key_partitions(app: App, store: StoreDefinition, key: Key, detected: str) -> tuple[int, ...]:
    """Return the partitions a read of key of store asks (key_partitions with the store's topic and key type)."""
    (found,) = store_keys_partitions(app, store, [key], detected)
    if isinstance(found, Exception):
        raise found
    return found


def store_keys_partitions(
    app: App, store: StoreDefinition, keys: Sequence[Key], detected: str
) -> list[tuple[int, ...] | InvalidKeyError | ApiError]:
    """Return keys_partitions of keys of store (with the store's topic and key type)."""
    topic = app.topic(store.topic)
    return keys_partitions(
        keys,
        store.resolved_key_type(topic),
        topic.key_format,
        topic.name,
        topic.partitions,
        store.co_partitioned,
        detected,
    )


def choose(
    cmap: ClusterMap,
    replicas: ReplicaStates,
    topic: str,
    partition: int,
    bound: int | None,
    excluded: Collection[str] = (),
    prefer: str | None = None,
) -> Server | Refusal:
    """Return the replica that serves topic-partition under the failover rules, or why none can."""
    owners = cmap.owners_of(topic, partition)
    active = owners.active
    if active and active not in excluded and cmap.is_up(active):  # the common case, asked first
        if replicas(active, topic, partition).state in (RUNNING, UNKNOWN):
            return Server(active, "active")
    known = {n: replicas(n, topic, partition) for n in _replicas(owners) if cmap.is_up(n) and n not in excluded}
    usable = [n for n, s in known.items() if s.state != DOWN]
    restoring: str | None = None
    if owners.active in usable:
        if known[owners.active].state in (RUNNING, UNKNOWN):
            return Server(owners.active, "active")
        restoring = owners.active
    standbys = [(n, known[n]) for n in usable if n != owners.active]
    if bound is not None:
        fresh = [(s.lag, n != prefer, n) for n, s in standbys if s.state == RUNNING and s.lag is not None]
        within = sorted(c for c in fresh if c[0] <= bound)
        if within:
            return Server(within[0][2], "standby")
        unknown = sorted(n for n, s in standbys if s.state == UNKNOWN)
        if unknown:
            return Server(unknown[0], "standby")
    if restoring is not None:
        return Server(restoring, "active")
    suspected = [n for n in _replicas(owners) if n not in usable and n not in excluded]
    if bound is None:
        suspected = [n for n in suspected if n == owners.active]
    if suspected:  # only believed down (a missed poll, a failed request): asking it costs a refused connection
        return Server(suspected[0], "active" if suspected[0] == owners.active else "standby")
    return _refusal(owners, topic, partition, bound, standbys, usable)


def _replicas(owners: PartitionOwners) -> list[str]:
    return ([owners.active] if owners.active else []) + [n for n in owners.standbys if n != owners.active]


def _refusal(
    owners: PartitionOwners,
    topic: str,
    partition: int,
    bound: int | None,
    standbys: Sequence[tuple[str, ReplicaState]],
    usable: Sequence[str],
) -> Refusal:
    where = f"partition {topic}-{partition}"
    lags = [s.lag for _, s in standbys if s.state == RUNNING and s.lag is not None]
    if bound is not None and lags:
        best = min(lags)
        return Refusal(
            STALE_BEYOND_BOUND,
            f"{where}: its active node is not available and its best standby is {best} records behind, "
            f"more than maxLag {bound}",
            partition,
            best,
        )
    if owners.active is None:
        reason = "has no active node"
    elif owners.active in usable:
        reason = f"is not queryable on its active node {owners.active}"
    else:
        reason = f"has its active node {owners.active} down"
    if not owners.standbys:
        hint = " and no standby"
    elif bound is None:
        hint = "; a standby keeps a copy: pass maxLag (records) to read it"
    else:
        hint = " and no standby that can answer"
    return Refusal(STORE_NOT_AVAILABLE, f"{where} {reason}{hint}", partition, min(lags) if lags else None)


def plan(
    cmap: ClusterMap,
    replicas: ReplicaStates,
    topic: str,
    needs: Mapping[int, Sequence[int]],
    bound: int | None,
    excluded: Mapping[int, Collection[str]] | None = None,
    prefer: str | None = None,
) -> Plan:
    """Return where each request reads: needs maps a request index to the partitions it needs.

    excluded maps a partition to the nodes that already failed it in this request. A request is refused
    as a whole (with its first partition's reason) when any partition it needs has no replica.
    """
    excluded = excluded or {}
    chosen: dict[int, Server | Refusal] = {}
    result = Plan()
    groups = result.groups
    for index, partitions in needs.items():
        if len(partitions) == 1:  # the common case (one partition per key), without the general bookkeeping
            p = partitions[0]
            one = chosen.get(p)
            if one is None:
                one = chosen[p] = choose(cmap, replicas, topic, p, bound, excluded.get(p, ()), prefer)
            if isinstance(one, Refusal):
                result.refused[index] = one
            else:
                group = groups.get(one)
                if group is None:
                    group = groups[one] = Group()
                group.reads[index] = [p]
            continue
        servers: list[tuple[int, Server]] = []
        for p in partitions:
            server = chosen.get(p)
            if server is None:
                server = chosen[p] = choose(cmap, replicas, topic, p, bound, excluded.get(p, ()), prefer)
            if isinstance(server, Refusal):
                result.refused[index] = server
                break
            servers.append((p, server))
        else:
            for p, server in servers:
                result.groups.setdefault(server, Group()).reads.setdefault(index, []).append(p)
    return result
