"""The one StoreQueries: every read routed over the cluster map, executed, failed over, merged.

A single node is a one-member map; there is no other query path. For each read:

1. key → partitions (``app.query.routing.keys_partitions``: the producers' partitioner, detected per topic;
   every partition for a store keyed by a column; an INVALID_KEY or PARTITIONER_MISMATCH error otherwise);
2. partitions → serving replicas (``app.query.routing.plan``: the pure failover rules and the staleness bound);
3. execute the plan: this node's partitions are read in place (``app.query.partitions``), each peer gets ONE
   forwarded sub-request for all of its reads (``app.cluster.peers``);
4. a replica that fails — unreachable, 5xx, NODE_UNAVAILABLE, STORE_NOT_READY, STORE_MIGRATED, or a standby
   whose answer is beyond the bound — is excluded and its reads are re-planned in the same request; a
   partition that is only restoring is retried with backoff until the deadline (STORE_NOT_READY then);
5. states of one read from several partitions are combined, then finalized; each answer's positions and
   a standby's lag go to the request's reports (``schema.reports``).

Scans do the same per partition and merge the pages under one cursor; a partition no replica can serve
is left out of the page and reported (PARTIAL_RESULT), never a silent gap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from iqgraph.app.catalog import definition_of, store_info
from iqgraph.app.cluster.membership import ClusterMap, Membership
from iqgraph.app.cluster.peers import PeerClient
from iqgraph.app.cluster.replicas import PeerStates
from iqgraph.app.query import routing
from iqgraph.app.query.batches import batches, per_batch
from iqgraph.app.query.executor import (
    Accept,
    Ask,
    ClusterReplicas,
    Failover,
    RetryPolicy,
    Unserved,
    beyond_bound,
    execute,
)
from iqgraph.app.query.merging import combiner, finalize_items, finalize_many, scan_merge
from iqgraph.app.query.partitions import LocalPartitions
from iqgraph.app.query.rankings import decode_rank_cursor, encode_rank_cursor, partition_positions
from iqgraph.app.query.scatter import decode_positions, merge_pages, merged_page
from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.schema.errors import ApiError, properties
from iqgraph.schema.reports import Reports
from iqgraph.schema.types import Answer, KeyQueryMetadata, NodeInfo, PartitionInfo, Ranked, Request, Scan, StoreInfo
from iqgraph.stores import (
    BloomStore,
    InvalidCursorError,
    Key,
    KeyValueStore,
    Page,
    PrefixScan,
    RangeScan,
    StoreView,
    TopScan,
    WindowedValue,
    WindowRangeScan,
    WindowScan,
    WindowStore,
    store_class,
)
from iqgraph.stores.distinct import BloomBits, KeyDigests, distinct_count
from iqgraph.streaming.definitions import App, StoreDefinition
from iqgraph.streaming.partitioner import PartitionerEvidence, evidence_from_counters, resolve

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

__all__ = ["ClusterStoreQueries", "OwnerCalls", "RetryPolicy"]

#: How owner-side fields are called over the cluster (``app.owner.calls.call_many``, given by the node):
#: (the request's queries, field, keys, maxLag) → a value or an error per key.
OwnerCalls = Callable[["ClusterStoreQueries", str, Sequence[Key], int | None], Awaitable[list[Any]]]


class ClusterStoreQueries:
    """Answer store queries for every key, whichever node holds it (schema.types.StoreQueries)."""

    def __init__(
        self,
        app: App,
        value_types: Mapping[str, DataType],
        local: LocalPartitions,
        membership: Membership,
        peers: PeerClient | None = None,
        *,
        max_lag: int | None = None,
        retry: RetryPolicy | None = None,
        peer_states: PeerStates | None = None,
        partitioner: Callable[[str], str] | None = None,
        owner_calls: OwnerCalls | None = None,
    ) -> None:
        self.app = app
        self.local = local
        self.node_id = local.node_id
        self.membership = membership
        self.peers = peers or PeerClient(local.node_id)
        self.peers.receiver_of = self.member_at  # each sub-request is signed for the member it goes to
        self.max_lag = max_lag
        self.retry = retry or RetryPolicy()
        self.peer_states = peer_states or PeerStates()
        self.replicas = ClusterReplicas(membership, local.node_id, local.replica, self.peer_states)
        self._owner_calls = owner_calls
        self.partitioner = partitioner or self._local_evidence
        self.reports = Reports()
        self.principal = ANONYMOUS  # the caller: every store read is checked (schema.access.check_read)
        self._infos = [store_info(app, s, value_types[s.name]) for s in app.stores]

    def bind(self, reports: Reports, principal: Principal = ANONYMOUS) -> ClusterStoreQueries:
        """Return queries for one request: its reports, and its caller (peers carry it, signed)."""
        bound = object.__new__(type(self))  # copy.copy, without its reduce protocol (once per request)
        bound.__dict__.update(self.__dict__)
        bound.reports = reports
        bound.principal = principal
        return bound

    # -- metadata ---------------------------------------------------------------------------------

    def stores(self) -> Sequence[StoreInfo]:
        """Return every store of the app."""
        return self._infos

    def node(self) -> NodeInfo:
        """Return this node."""
        return self.local.node()

    async def nodes(self) -> Sequence[NodeInfo]:
        """Return every member: this node, and each peer as it reports itself (or DOWN)."""
        cmap = self.membership.current()
        others = [m for m in cmap.members.values() if m.id != self.node_id]
        answers = await asyncio.gather(
            *(self.peers.node(m.url, self.principal) for m in others), return_exceptions=True
        )
        found = [self.local.node()]
        for member, answer in zip(others, answers, strict=True):
            if isinstance(answer, NodeInfo):
                self.peer_states.update(member.id, answer.partitions)
                found.append(answer)
            else:
                found.append(NodeInfo(member.id, member.url, "DOWN", _mapped_partitions(cmap, member.id)))
        return sorted(found, key=lambda n: n.id)

    def key_metadata(self, store: str, key: Key) -> KeyQueryMetadata:
        """Return the partition(s) of key and the nodes serving them, in Kafka Streams' nouns."""
        definition = definition_of(self.app, store)
        partitions = self._partitions_of(definition, key)
        if not definition.co_partitioned:
            note = (
                f"store {store} is keyed by a column, not the record key: any partition may hold the key, "
                "and reads ask every partition"
            )
            return KeyQueryMetadata(store, None, None, (), partitions, note)
        if len(partitions) > 1:
            note = (
                f"producers of {definition.topic} use more than one partitioner: the key may be in any of "
                f"partitions {list(partitions)}, and reads ask each"
            )
            return KeyQueryMetadata(store, None, None, (), partitions, note)
        owners = self.membership.current().owners_of(definition.topic, partitions[0])
        return KeyQueryMetadata(store, partitions[0], owners.active, owners.standbys, partitions)

    def placement(self, store: str) -> list[KeyQueryMetadata]:
        """Return, per partition of store, its active and standby nodes from the cluster map."""
        definition = definition_of(self.app, store)
        cmap = self.membership.current()
        found = []
        for p in range(self.app.topic(definition.topic).partitions):
            owners = cmap.owners_of(definition.topic, p)
            found.append(KeyQueryMetadata(store, p, owners.active, owners.standbys, (p,)))
        return found

    def routing_partitioner(self, store: str) -> str:
        """Return the partitioner store's keys are routed by: configured, or detected under auto."""
        return self.partitioner(definition_of(self.app, store).topic)

    def member_at(self, url: str) -> str:
        """Return the id of the member reached at url ("" when none is)."""
        return next((m.id for m in self.membership.current().members.values() if m.url == url), "")

    def url_of(self, node_id: str | None) -> str | None:
        """Return the URL of a member."""
        return None if node_id is None else self.membership.current().url_of(node_id)

    # -- routing inputs ---------------------------------------------------------------------------

    def _local_evidence(self, topic: str) -> str:
        """Return the partitioner to route topic by from this node's own partitions' evidence (no TopicWatch)."""
        evidence = PartitionerEvidence()
        for stores in list(self.local.partitions.get(topic, {}).values()):
            evidence += evidence_from_counters(stores.db.counter)
        return resolve(self.app.kafka.partitioner, evidence)

    def _partitions_of(self, definition: StoreDefinition, key: Key, detected: str | None = None) -> tuple[int, ...]:
        return routing.store_key_partitions(self.app, definition, key, detected or self.partitioner(definition.topic))

    def bound(self, max_lag: int | None) -> int | None:
        """Return a read's staleness bound: its maxLag, else the request's, else the node's."""
        if self.reports.invalid is not None:
            raise self.reports.invalid
        if max_lag is not None:
            return max_lag
        return self.reports.max_lag if self.reports.max_lag is not None else self.max_lag

    # -- through the executor -------------------------------------------------------------------------

    def failover(self, topic: str, max_lag: int | None, *, patient: bool = False) -> Failover:
        """Return a new failover state for one request (or one watch) over topic's partitions."""
        return Failover(self.replicas, topic, self.bound(max_lag), self.retry, patient=patient)

    async def run(
        self,
        definition: StoreDefinition,
        max_lag: int | None,
        needs: Mapping[int, Sequence[int]],
        ask: Ask,
        combine: Callable[[Any, Any], Any] | None,
    ) -> dict[int, Any]:
        """Return per item its value (combined over its partitions) or its error, read where the executor says."""
        failover = self.failover(definition.topic, max_lag)
        return await execute(failover, needs, ask, self._accept(definition, failover.bound), combine, definition.name)

    def _accept(self, definition: StoreDefinition, bound: int | None) -> Accept:
        """Return how an answer is taken: a standby beyond the bound fails over, positions and lags reported."""
        topic = definition.topic

        def accept(server: routing.Server, group: routing.Group, answer: Answer[dict[int, Any]]) -> dict[int, Any]:
            beyond = self._beyond_bound(topic, server, group, answer, bound)
            for p, offset in answer.positions.items():
                if p not in beyond:
                    self.reports.read_at(topic, p, offset)
            found: dict[int, Any] = {}
            for i, partitions in group.reads.items():
                value = answer.value.get(i)
                stale = [p for p in partitions if p in beyond]
                if stale:
                    found[i] = Unserved(beyond[stale[0]], stale)
                    continue
                away = answer.kafka_away_since  # an active answers too, from the last state it knew
                if (server.stale or away is not None) and not isinstance(value, Exception):
                    for p in partitions:
                        self.reports.stale(definition.name, p, server.node, answer.lags.get(p, 0), away)
                found[i] = value
            return found

        return accept

    def _beyond_bound(
        self, topic: str, server: routing.Server, group: routing.Group, answer: Answer[Any], bound: int | None
    ) -> dict[int, ApiError]:
        """Return, per partition a standby answered beyond the bound, the error that says so."""
        if not server.stale:
            return {}
        beyond: dict[int, ApiError] = {}
        for p in group.partitions:
            lag = answer.lags.get(p)
            if lag is not None and server.node != self.node_id:
                self.peer_states.learn_lag(server.node, topic, p, lag)
            if bound is None or lag is None or lag > bound:
                beyond[p] = beyond_bound(topic, server.node, p, lag, bound)
        return beyond

    # -- lookups ------------------------------------------------------------------------------------

    async def lookup(
        self, store: str, kind: type[StoreView], requests: Sequence[Request], max_lag: int | None
    ) -> list[Any]:
        """Return each lookup's value (finalized state) or the error it failed with, in request order.

        kind: the class of store the caller reads (``KeyValueStore``, ``WindowStore``, ``BloomStore``); another
        kind is UNKNOWN_STORE.

        The executor plans, asks and fails over per *batch* — the lookups that need the same partitions —
        not per lookup: a batch's reads are served together (one replica set, one answer each), so a getMany
        of 1,000 keys over 6 partitions is 6 entries of bookkeeping, not 1,000.
        """
        check_read(self.principal, store)
        definition = definition_of(self.app, store, kind.kind)
        self.bound(max_lag)  # a bad maxLag fails before any read
        keys = [request[0] for request in requests]
        routed = batches(self.app, definition, keys, self.partitioner(definition.topic))
        results: list[Any] = [routed.errors.get(i) for i in range(len(requests))]
        windowed = kind.windowed

        async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
            reads = [(requests[i], partitions) for _, i, partitions in routed.of(group.reads)]
            if server.node == self.node_id:
                answer = self.local.read_states(store, reads)
            else:
                url = self.replicas.url_of(server.node)
                answer = await self.peers.lookup(url, store, reads, windowed, self.principal)
            values = per_batch(list(group.reads), routed.members, answer.value)
            found = dict(zip(group.reads, map(_first_error, values), strict=True))
            return Answer(found, answer.positions, answer.lags, answer.kafka_away_since)

        found = await self.run(definition, max_lag, routed.needs(), ask, _each(combiner(definition)))
        for b, value in found.items():
            _spread(results, routed.members[b], value)
        return finalize_many(definition, results)

    async def get_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        """Return the value of each key of a key-value store, in key order (None when absent)."""
        return await self.lookup(store, KeyValueStore, [(k, None, None) for k in keys], max_lag)

    async def might_contain_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        """Return, per key of a bloom store, whether it was probably added."""
        return await self.lookup(store, BloomStore, [(k, None, None) for k in keys], max_lag)

    async def fetch_many(
        self, store: str, requests: Sequence[tuple[Key, int, int]], max_lag: int | None = None
    ) -> list[Any]:
        """Return, per (key, time_from, time_to), the key's windows with start in that range."""
        return await self.lookup(store, WindowStore, list(requests), max_lag)

    # -- scans ----------------------------------------------------------------------------------------

    async def scan(self, store: str, scan: Scan, first: int, after: str | None, max_lag: int | None) -> Page[Any]:
        """Return one merged page of a scan over every partition of the cluster, values finalized (a store of
        another kind than the scan reads is UNKNOWN_STORE)."""
        check_read(self.principal, store)
        definition = definition_of(self.app, store, scan.store_kind)
        self.bound(max_lag)
        before = decode_positions(after)
        count = self.app.topic(definition.topic).partitions
        unknown = [p for p in before if not (p.isdigit() and int(p) < count)]
        if unknown:
            raise InvalidCursorError(f"after: the cursor is for another store (partitions {unknown})")
        needs = {p: [p] for p in range(count) if before.get(str(p), "") is not None}
        windowed = store_class(scan.store_kind).windowed

        async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
            partitions = group.partitions
            resume = {p: before[str(p)] for p in partitions if str(p) in before}
            if server.node == self.node_id:
                return self.local.scan_pages(store, scan, resume, first, partitions)
            url = self.replicas.url_of(server.node)
            return await self.peers.scan(url, store, scan, resume, first, partitions, windowed, self.principal)

        found = await self.run(definition, max_lag, needs, ask, None)
        fatal = [v for v in found.values() if isinstance(v, ApiError) and not properties(v.code).transient]
        if fatal:  # the scan itself is wrong (a cursor, a store): one error, not one per partition
            raise fatal[0]
        pages = {str(p): v for p, v in found.items() if isinstance(v, Page)}
        missing = {p: v.message for p, v in found.items() if isinstance(v, ApiError)}
        items, positions = merge_pages(pages, first, scan_merge(self.app, definition, scan))
        page = merged_page(items, positions, before)
        if missing:
            self.reports.missing(store, missing)
        return Page(finalize_items(definition, scan, page.items), page.next_cursor)

    async def range(
        self,
        store: str,
        from_key: Key | None,
        to_key: Key | None,
        first: int,
        after: str | None,
        max_lag: int | None = None,
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) with from_key <= key <= to_key, in key order, over the cluster."""
        return await self.scan(store, RangeScan(from_key, to_key), first, after, max_lag)

    async def prefix(
        self, store: str, prefix: str, first: int, after: str | None, max_lag: int | None = None
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) whose string key starts with prefix, over the cluster."""
        return await self.scan(store, PrefixScan(prefix), first, after, max_lag)

    async def fetch_all(
        self, store: str, time_from: int, time_to: int, first: int, after: str | None, max_lag: int | None = None
    ) -> Page[WindowedValue]:
        """Return a page of every key's windows with start in the range, by start then key."""
        return await self.scan(store, WindowScan(time_from, time_to), first, after, max_lag)

    async def fetch_range(
        self,
        store: str,
        from_key: Key | None,
        to_key: Key | None,
        time_from: int,
        time_to: int,
        first: int,
        after: str | None,
        max_lag: int | None = None,
    ) -> Page[WindowedValue]:
        """Return a page of windows of keys in [from_key, to_key] with start in the range, by key then time."""
        scan = WindowRangeScan(from_key, to_key, time_from, time_to)
        return await self.scan(store, scan, first, after, max_lag)

    # -- counts ---------------------------------------------------------------------------------------

    async def _count(self, store: str, exact: bool, max_lag: int | None) -> int:
        check_read(self.principal, store)
        definition = definition_of(self.app, store)
        self.bound(max_lag)
        needs = {p: [p] for p in range(self.app.topic(definition.topic).partitions)}

        async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
            partitions = group.partitions
            if server.node == self.node_id:
                return self.local.count(store, partitions, exact)
            url = self.replicas.url_of(server.node)
            return await self.peers.count(url, store, partitions, exact, self.principal)

        found = await self.run(definition, max_lag, needs, ask, None)
        errors = [v for v in found.values() if isinstance(v, Exception)]
        if errors:
            raise errors[0]
        sets = [v for v in found.values() if isinstance(v, KeyDigests | BloomBits)]
        if sets:  # a store keyed by a column: a key counts once, however many partitions hold it
            return distinct_count(sets)
        return sum(found.values())

    async def count(self, store: str, max_lag: int | None = None) -> int:
        """Return the distinct keys of a store over the cluster — (key, window) pairs of a window store, members of a
        ranking: exact (bloom: the filters' estimate; of a store keyed by a column, their union's)."""
        return await self._count(store, True, max_lag)

    async def approximate_count(self, store: str, max_lag: int | None = None) -> int:
        """Return RocksDB's estimate of the keys a store holds over the cluster."""
        return await self._count(store, False, max_lag)

    # -- rankings -------------------------------------------------------------------------------------

    async def top(
        self, store: str, group: str | None, first: int, after: str | None, max_lag: int | None = None
    ) -> list[Ranked]:
        """Return the first members of a ranking's group (None: all) over the cluster, greatest value first.

        Each partition's page of its index, resumed after the cursor's index key, merged and cut at first
        (app.query.rankings): ranks continue from the cursor's.
        """
        rank, index_key = decode_rank_cursor(after, store, group)
        scan = TopScan(group)
        partitions = self.app.topic(definition_of(self.app, store, scan.store_kind).topic).partitions
        resume = partition_positions(index_key, partitions)
        page = await self.scan(store, scan, first, resume, max_lag)
        return [
            Ranked(member, value, rank + i, encode_rank_cursor(store, rank + i, group, key))
            for i, (member, value, key) in enumerate(page.items, start=1)
        ]

    # -- owner-side fields ----------------------------------------------------------------------------

    async def call_many(self, field: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        """Return an owner-side field's value per key, run on a node serving the key (``app.owner.calls``)."""
        if self._owner_calls is None:
            raise ApiError(f"owner-side field {field!r}: this node's queries serve no owner-side fields", "INTERNAL")
        return await self._owner_calls(self, field, keys, max_lag)


def _first_error(values: list[Any]) -> Any:
    """Return a batch's values, or the first error among them: the reads of one batch from one replica read the
    same partitions, so they fail together."""
    return next((v for v in values if isinstance(v, Exception)), values)


def _each(combine: Callable[[Any, Any], Any]) -> Callable[[list[Any], list[Any]], list[Any]]:
    """Return how two partitions' values of one batch combine: lookup by lookup."""
    return lambda a, b: [combine(x, y) for x, y in zip(a, b, strict=True)]


def _spread(results: list[Any], indexes: Sequence[int], value: Any) -> None:
    """Put a batch's values (or its error, in each place) at its lookups' indexes."""
    if isinstance(value, Exception):
        for i in indexes:
            results[i] = value
        return
    for i, v in zip(indexes, value, strict=True):
        results[i] = v


def _mapped_partitions(cmap: ClusterMap, node_id: str) -> tuple[PartitionInfo, ...]:
    found = []
    for role, partitions in (
        ("active", cmap.active_partitions(node_id)),
        ("standby", cmap.standby_partitions(node_id)),
    ):
        for topic, ps in partitions.items():
            found += [PartitionInfo(topic, p, role, "UNKNOWN", 0, 0) for p in ps]
    return tuple(sorted(found, key=lambda p: (p.topic, p.partition)))
