"""The one StoreQueries: every read routed over the cluster map, executed, failed over, merged.

A single node is a one-member map; there is no other query path. For each read:

1. key → partitions (``app.routing.key_partitions``: the producers' partitioner, detected per topic; every
   partition for a store keyed by a column; an INVALID_KEY or PARTITIONER_MISMATCH error otherwise);
2. partitions → serving replicas (``app.routing.plan``: the pure failover rules and the staleness bound);
3. execute the plan: this node's partitions are read in place (``app.local_partitions``), each peer gets ONE
   forwarded sub-request for all of its reads (``app.peers``);
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
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from iqgraph.app import routing
from iqgraph.app.local_partitions import LocalPartitions, definition_of, store_info
from iqgraph.app.membership import ClusterMap, Membership
from iqgraph.app.merging import combiner, finalize_items, finalize_many, scan_merge
from iqgraph.app.peers import PeerClient, PeerError, PeerUnavailableError
from iqgraph.app.rankings import decode_rank_cursor, encode_rank_cursor, partition_positions
from iqgraph.app.replicas import PeerStates
from iqgraph.app.scatter import decode_positions, merge_pages, merged_page
from iqgraph.schema.access import ANONYMOUS, Principal, check_read
from iqgraph.schema.errors import (
    NODE_UNAVAILABLE,
    STALE_BEYOND_BOUND,
    STORE_MIGRATED,
    STORE_NOT_AVAILABLE,
    STORE_NOT_READY,
    ApiError,
    api_error,
)
from iqgraph.schema.reports import Reports
from iqgraph.schema.types import Answer, KeyQueryMetadata, NodeInfo, PartitionInfo, Ranked, Request, Scan, StoreInfo
from iqgraph.stores import InvalidCursorError, Key, Page, StoreKind, WindowedValue
from iqgraph.streaming.definitions import App, StoreDefinition
from iqgraph.streaming.partitioner import PartitionerEvidence, evidence_from_counters, resolve

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

#: Codes after which another replica is tried in the same request.
FAILOVER_CODES = frozenset({NODE_UNAVAILABLE, STORE_NOT_READY, STORE_MIGRATED, STALE_BEYOND_BOUND})
#: Codes that may clear by themselves (a partition restoring, partitions moving): retried with backoff.
WAIT_CODES = frozenset({STORE_NOT_READY, STORE_MIGRATED})
#: Codes that say a partition could not be read now (a scan reports it missing rather than failing).
AVAILABILITY_CODES = FAILOVER_CODES | {STORE_NOT_AVAILABLE}
MAX_ROUNDS = 16


@dataclass(frozen=True)
class RetryPolicy:
    """How long a read waits for a partition that is not queryable yet (invariant 6)."""

    deadline_ms: int = 2_000
    first_backoff_ms: int = 25
    max_backoff_ms: int = 400


Ask = Callable[[routing.Server, routing.Group], Awaitable[Answer[dict[int, Any]]]]


@dataclass
class _Round:
    """The executor's bookkeeping of one request's reads across rounds of planning."""

    remaining: dict[int, list[int]]  # index -> partitions still to read
    partial: dict[int, Any]  # index -> state combined so far
    results: dict[int, Any]  # index -> final value or error
    last: dict[int, ApiError]  # index -> the last failover-able error it met
    failed: dict[int, set[str]]  # partition -> nodes excluded for the rest of the request
    waiting: dict[int, set[str]]  # partition -> nodes not ready (tried again after a backoff)

    def fail(self, index: int, partitions: Sequence[int], node: str, error: ApiError) -> None:
        """Record that node could not serve index's partitions: failover-able, or final."""
        if error.code not in FAILOVER_CODES:
            self.results[index] = error
            self.remaining.pop(index, None)
            self.partial.pop(index, None)
            return
        self.last[index] = error
        excluded = self.waiting if error.code in WAIT_CODES else self.failed
        for p in partitions:
            excluded[p].add(node)

    def succeed(
        self, index: int, partitions: Sequence[int], value: Any, combine: Callable[[Any, Any], Any] | None
    ) -> None:
        """Record index's value from partitions; final once every partition it needs is read."""
        needed = self.remaining.get(index)
        if needed is None:
            return
        if len(needed) == 1 and needed[0] in partitions and index not in self.partial:
            self.results[index] = value  # one partition, read at once: the common case
            del self.remaining[index]
            return
        old = self.partial.get(index)
        self.partial[index] = value if index not in self.partial or combine is None else combine(old, value)
        left = [p for p in self.remaining[index] if p not in partitions]
        if left:
            self.remaining[index] = left
        else:
            self.results[index] = self.partial.pop(index)
            del self.remaining[index]


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
    ) -> None:
        self.app = app
        self.local = local
        self.node_id = local.node_id
        self.membership = membership
        self.peers = peers or PeerClient(local.node_id)
        self.max_lag = max_lag
        self.retry = retry or RetryPolicy()
        self.peer_states = peer_states or PeerStates()
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

    def url_of(self, node_id: str | None) -> str | None:
        """Return the URL of a member."""
        return None if node_id is None else self.membership.current().url_of(node_id)

    def serving(
        self, topic: str, partition: int, max_lag: int | None, excluded: Collection[str] = ()
    ) -> routing.Server | routing.Refusal:
        """Return the replica that serves topic-partition now under the failover rules (a live source's choice)."""
        bound = self.max_lag if max_lag is None else max_lag
        cmap = self.membership.current()
        return routing.choose(cmap, self._replica, topic, partition, bound, excluded, self.node_id)

    def peer_failed(self, node: str) -> None:
        """Record that node failed a live source: routing skips it until it answers a poll again."""
        self._mark_down(node)

    # -- routing inputs ---------------------------------------------------------------------------

    def _local_evidence(self, topic: str) -> str:
        """Return the partitioner to route topic by from this node's own partitions' evidence (no TopicWatch)."""
        evidence = PartitionerEvidence()
        for stores in list(self.local.partitions.get(topic, {}).values()):
            evidence += evidence_from_counters(stores.db.counter)
        return resolve(self.app.kafka.partitioner, evidence)

    def _partitions_of(self, definition: StoreDefinition, key: Key, detected: str | None = None) -> tuple[int, ...]:
        return routing.store_key_partitions(self.app, definition, key, detected or self.partitioner(definition.topic))

    def _replica(self, node: str, topic: str, partition: int) -> routing.ReplicaState:
        if node == self.node_id:
            found = self.local.replica(topic, partition)
            return routing.ReplicaState(found[0], found[1]) if found else routing.ReplicaState("CLOSED")
        return self.peer_states.get(node, topic, partition)

    def _bound(self, max_lag: int | None) -> int | None:
        if self.reports.invalid is not None:
            raise self.reports.invalid
        if max_lag is not None:
            return max_lag
        return self.reports.max_lag if self.reports.max_lag is not None else self.max_lag

    # -- the executor -------------------------------------------------------------------------------

    async def _execute(
        self,
        definition: StoreDefinition,
        needs: dict[int, list[int]],
        bound: int | None,
        ask: Ask,
        combine: Callable[[Any, Any], Any] | None,
    ) -> dict[int, Any]:
        """Return per index its value (combined over its partitions) or the error it failed with."""
        topic = definition.topic
        results: dict[int, Any] = {}
        remaining = {i: list(ps) for i, ps in needs.items()}
        partial: dict[int, Any] = {}
        failed: dict[int, set[str]] = defaultdict(set)  # partition -> nodes that failed it (this request)
        waiting: dict[int, set[str]] = defaultdict(set)  # partition -> nodes that were not ready (cleared)
        last: dict[int, ApiError] = {}
        deadline = time.monotonic() + self.retry.deadline_ms / 1000
        backoff = self.retry.first_backoff_ms / 1000
        refreshed = False
        for _ in range(MAX_ROUNDS):
            if not remaining:
                break
            excluded = {p: failed[p] | waiting[p] for p in set(failed) | set(waiting)} if failed or waiting else {}
            plan = routing.plan(
                self.membership.current(), self._replica, topic, remaining, bound, excluded, self.node_id
            )
            for i, refusal in plan.refused.items():
                waited = last.get(i) is not None and last[i].code in WAIT_CODES
                if waited and time.monotonic() < deadline:
                    continue  # another round after the backoff: the partition may become ready
                results[i] = last[i] if waited else _refusal_error(refusal, bound)
                del remaining[i]
            groups = list(plan.groups.items())
            outcomes = await _gather([ask(server, group) for server, group in groups])
            state = _Round(remaining, partial, results, last, failed, waiting)
            for (server, group), outcome in zip(groups, outcomes, strict=True):
                self._apply(definition, server, group, outcome, bound, combine, state)
            if not remaining:
                break
            if any(e.code == STORE_MIGRATED for e in last.values()) and not refreshed:
                refreshed = True
                self.membership.refresh()
            if not plan.groups or all(i in plan.refused for i in remaining):
                now = time.monotonic()
                if now >= deadline:
                    for i in list(remaining):
                        results[i] = last.get(i) or _unavailable(definition, remaining[i])
                        del remaining[i]
                    break
                await asyncio.sleep(min(backoff, deadline - now))
                backoff = min(backoff * 2, self.retry.max_backoff_ms / 1000)
                waiting.clear()
        for i in remaining:
            results[i] = last.get(i) or _unavailable(definition, remaining[i])
        return results

    def _apply(
        self,
        definition: StoreDefinition,
        server: routing.Server,
        group: routing.Group,
        outcome: Answer[dict[int, Any]] | BaseException,
        bound: int | None,
        combine: Callable[[Any, Any], Any] | None,
        state: _Round,
    ) -> None:
        if isinstance(outcome, BaseException):
            error = _as_api_error(outcome)
            if isinstance(outcome, PeerUnavailableError):
                self._mark_down(server.node)
            for i, partitions in group.reads.items():
                state.fail(i, partitions, server.node, error)
            return
        topic = definition.topic
        beyond = self._beyond_bound(definition, server, group, outcome, bound)
        for p, offset in outcome.positions.items():
            if p not in beyond:
                self.reports.read_at(topic, p, offset)
        for i, partitions in group.reads.items():
            value = outcome.value.get(i)
            stale = [p for p in partitions if p in beyond]
            if stale:
                state.fail(i, stale, server.node, beyond[stale[0]])
            elif isinstance(value, Exception):
                state.fail(i, partitions, server.node, _as_api_error(value))
            else:
                if server.stale:
                    for p in partitions:
                        self.reports.stale(definition.name, p, server.node, outcome.lags.get(p, 0))
                state.succeed(i, partitions, value, combine)

    def _beyond_bound(
        self,
        definition: StoreDefinition,
        server: routing.Server,
        group: routing.Group,
        answer: Answer[Any],
        bound: int | None,
    ) -> dict[int, ApiError]:
        """Return, per partition a standby answered beyond the bound, the error that says so."""
        if not server.stale:
            return {}
        beyond: dict[int, ApiError] = {}
        for p in group.partitions:
            lag = answer.lags.get(p)
            if lag is not None and server.node != self.node_id:
                self.peer_states.learn_lag(server.node, definition.topic, p, lag)
            if bound is None or lag is None or lag > bound:
                shown = "an unknown number of" if lag is None else str(lag)
                beyond[p] = ApiError(
                    f"partition {definition.topic}-{p}: the standby {server.node} is {shown} records behind, "
                    f"more than maxLag {bound}",
                    STALE_BEYOND_BOUND,
                    partition=p,
                    bestLag=lag,
                    maxLag=bound,
                    retryAfterMs=1000,
                )
        return beyond

    def _mark_down(self, node: str) -> None:
        self.peer_states.mark_down(node)
        mark = getattr(self.membership, "mark_down", None)
        if mark is not None:
            mark(node)

    def _url(self, node: str) -> str:
        url = self.membership.current().url_of(node)
        if url is None:
            raise PeerUnavailableError(f"node {node} is not a member of the cluster any more")
        return url

    # -- lookups ------------------------------------------------------------------------------------

    async def lookup(self, store: str, kind: StoreKind, requests: Sequence[Request], max_lag: int | None) -> list[Any]:
        """Return each lookup's value (finalized state) or the error it failed with, in request order.

        The executor plans, asks and fails over per *batch* — the lookups that need the same partitions —
        not per lookup: a batch's reads are served together (one replica set, one answer each), so a getMany
        of 1,000 keys over 6 partitions is 6 entries of bookkeeping, not 1,000.
        """
        check_read(self.principal, store)
        definition = definition_of(self.app, store, kind)
        bound = self._bound(max_lag)
        results: list[Any] = [None] * len(requests)
        detected = self.partitioner(definition.topic)
        keys = [request[0] for request in requests]
        batches: dict[tuple[int, ...], list[int]] = {}
        for i, where in enumerate(routing.store_keys_partitions(self.app, definition, keys, detected)):
            if isinstance(where, Exception):
                results[i] = where
            else:
                batches.setdefault(where, []).append(i)
        members = list(batches.values())
        windowed = definition.kind is StoreKind.WINDOW

        async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
            here = list(group.reads)
            reads = [(requests[i], tuple(group.reads[b])) for b in here for i in members[b]]
            if server.node == self.node_id:
                answer = self.local.read_states(store, reads)
            else:
                assert self.peers is not None  # noqa: S101 - always set
                answer = await self.peers.lookup(self._url(server.node), store, reads, windowed, self.principal)
            return Answer(_per_batch(here, members, answer.value), answer.positions, answer.lags)

        needs = {b: list(where) for b, where in enumerate(batches)}
        found = await self._execute(definition, needs, bound, ask, _each(combiner(definition)))
        for b, value in found.items():
            _spread(results, members[b], value)
        return finalize_many(definition, results)

    async def get_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        """Return the value of each key of a key-value store, in key order (None when absent)."""
        return await self.lookup(store, StoreKind.KEY_VALUE, [(k, None, None) for k in keys], max_lag)

    async def might_contain_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        """Return, per key of a bloom store, whether it was probably added."""
        return await self.lookup(store, StoreKind.BLOOM, [(k, None, None) for k in keys], max_lag)

    async def fetch_many(
        self, store: str, requests: Sequence[tuple[Key, int, int]], max_lag: int | None = None
    ) -> list[Any]:
        """Return, per (key, time_from, time_to), the key's windows with start in that range."""
        return await self.lookup(store, StoreKind.WINDOW, list(requests), max_lag)

    # -- scans ----------------------------------------------------------------------------------------

    async def scan(
        self, store: str, kind: StoreKind, scan: Scan, first: int, after: str | None, max_lag: int | None
    ) -> Page[Any]:
        """Return one merged page of a scan over every partition of the cluster, values finalized."""
        check_read(self.principal, store)
        definition = definition_of(self.app, store, kind)
        bound = self._bound(max_lag)
        before = decode_positions(after)
        count = self.app.topic(definition.topic).partitions
        unknown = [p for p in before if not (p.isdigit() and int(p) < count)]
        if unknown:
            raise InvalidCursorError(f"after: the cursor is for another store (partitions {unknown})")
        needs = {p: [p] for p in range(count) if before.get(str(p), "") is not None}
        windowed = definition.kind is StoreKind.WINDOW

        async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
            partitions = group.partitions
            resume = {p: before[str(p)] for p in partitions if str(p) in before}
            if server.node == self.node_id:
                return self.local.scan_pages(store, scan, resume, first, partitions)
            url = self._url(server.node)
            return await self.peers.scan(url, store, scan, resume, first, partitions, windowed, self.principal)

        found = await self._execute(definition, needs, bound, ask, None)
        fatal = [v for v in found.values() if isinstance(v, ApiError) and v.code not in AVAILABILITY_CODES]
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
        scan = Scan("range", {"from_key": from_key, "to_key": to_key})
        return await self.scan(store, StoreKind.KEY_VALUE, scan, first, after, max_lag)

    async def prefix(
        self, store: str, prefix: str, first: int, after: str | None, max_lag: int | None = None
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) whose string key starts with prefix, over the cluster."""
        return await self.scan(store, StoreKind.KEY_VALUE, Scan("prefix", {"prefix": prefix}), first, after, max_lag)

    async def fetch_all(
        self, store: str, time_from: int, time_to: int, first: int, after: str | None, max_lag: int | None = None
    ) -> Page[WindowedValue]:
        """Return a page of every key's windows with start in the range, by start then key."""
        scan = Scan("fetch_all", {"time_from": time_from, "time_to": time_to})
        return await self.scan(store, StoreKind.WINDOW, scan, first, after, max_lag)

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
        args = {"from_key": from_key, "to_key": to_key, "time_from": time_from, "time_to": time_to}
        return await self.scan(store, StoreKind.WINDOW, Scan("fetch_range", args), first, after, max_lag)

    # -- counts ---------------------------------------------------------------------------------------

    async def _count(self, store: str, exact: bool, max_lag: int | None) -> int:
        check_read(self.principal, store)
        definition = definition_of(self.app, store)
        bound = self._bound(max_lag)
        needs = {p: [p] for p in range(self.app.topic(definition.topic).partitions)}

        async def ask(server: routing.Server, group: routing.Group) -> Answer[dict[int, Any]]:
            partitions = group.partitions
            if server.node == self.node_id:
                return self.local.count(store, partitions, exact)
            url = self._url(server.node)
            return await self.peers.count(url, store, partitions, exact, self.principal)

        found = await self._execute(definition, needs, bound, ask, None)
        errors = [v for v in found.values() if isinstance(v, Exception)]
        if errors:
            raise errors[0]
        return sum(found.values())

    async def count(self, store: str, max_lag: int | None = None) -> int:
        """Return the entries of a store over the cluster: exact (bloom: the filters' estimate)."""
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
        (app.rankings): ranks continue from the cursor's.
        """
        rank, index_key = decode_rank_cursor(after, store, group)
        partitions = self.app.topic(definition_of(self.app, store, StoreKind.RANKING).topic).partitions
        resume = partition_positions(index_key, partitions)
        page = await self.scan(store, StoreKind.RANKING, Scan("top", {"group": group}), first, resume, max_lag)
        return [
            Ranked(member, value, rank + i, encode_rank_cursor(store, rank + i, group, key))
            for i, (member, value, key) in enumerate(page.items, start=1)
        ]

    # -- owner-side fields ----------------------------------------------------------------------------

    async def call_many(self, field: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        """Return an owner-side field's value per key, run on a node serving the key (app.owner_calls)."""
        from iqgraph.app.owner_calls import call_many  # it runs through this class's executor

        return await call_many(self, field, keys, max_lag)


async def _gather(asks: list[Awaitable[Any]]) -> list[Any]:
    if len(asks) == 1:  # one server (always, on a single node): no task of its own
        try:
            return [await asks[0]]
        except Exception as exc:  # noqa: BLE001 - the executor turns it into the group's error
            return [exc]
    return await asyncio.gather(*asks, return_exceptions=True)


def _per_batch(batches: Sequence[int], members: Sequence[Sequence[int]], values: Sequence[Any]) -> dict[int, Any]:
    """Return per batch its lookups' values (values: every batch's, in turn); the first error fails a batch.

    The reads of one batch from one replica read the same partitions, so they fail together.
    """
    found: dict[int, Any] = {}
    start = 0
    for b in batches:
        end = start + len(members[b])
        part = values[start:end]
        found[b] = next((v for v in part if isinstance(v, Exception)), part)
        start = end
    return found


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


def _as_api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, PeerError):
        extensions = {k: v for k, v in exc.extensions.items() if k != "code"}
        if exc.code == NODE_UNAVAILABLE:
            extensions.setdefault("retryAfterMs", 1000)
        return ApiError(str(exc), exc.code, **extensions)
    if isinstance(exc, Exception):
        found = api_error(exc)
        if isinstance(found, ApiError):
            return found
    raise exc


def _refusal_error(refusal: routing.Refusal, bound: int | None) -> ApiError:
    extensions: dict[str, Any] = {"partition": refusal.partition, "retryAfterMs": 1000}
    if refusal.best_lag is not None:
        extensions["bestLag"] = refusal.best_lag
    if bound is not None:
        extensions["maxLag"] = bound
    return ApiError(refusal.message, refusal.code, **extensions)


def _unavailable(definition: StoreDefinition, partitions: list[int]) -> ApiError:
    return ApiError(
        f"no replica of {definition.topic} partitions {partitions} answered in time",
        NODE_UNAVAILABLE,
        retryAfterMs=1000,
    )


def _mapped_partitions(cmap: ClusterMap, node_id: str) -> tuple[PartitionInfo, ...]:
    found = []
    for role, partitions in (
        ("active", cmap.active_partitions(node_id)),
        ("standby", cmap.standby_partitions(node_id)),
    ):
        for topic, ps in partitions.items():
            found += [PartitionInfo(topic, p, role, "UNKNOWN", 0, 0) for p in ps]
    return tuple(sorted(found, key=lambda p: (p.topic, p.partition)))
