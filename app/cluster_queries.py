"""StoreQueries across the cluster: route keys to their owners, forward one sub-request per peer, merge.

For a lookup, keys are grouped by the node serving their partition (the active node, or — when stale
reads are allowed with ``max_lag`` and the active node is down — a standby); local keys are read here,
each peer gets ONE forwarded request for all of its keys. A store not keyed by the record key is read
from every partition's server and the states are merged. Scans ask every partition's server in
parallel and merge the pages under one cursor holding each partition's position; a server that fails
leaves its partitions out of the page and reports them (``partial``), never a silent gap. A peer
answering STORE_MIGRATED (it does not own what we sent) makes us refresh the map and retry once.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from iqgraph.app.local_queries import LocalStoreQueries
from iqgraph.app.membership import ClusterMap, Membership
from iqgraph.app.merging import Request, combiner, finalize, finalize_items, scan_merge
from iqgraph.app.peers import PeerClient, PeerError, PeerUnavailableError
from iqgraph.app.point_lookups import PointLookups
from iqgraph.app.scatter import decode_positions, merge_pages, merged_page
from iqgraph.schema.errors import ApiError
from iqgraph.schema.types import KeyQueryMetadata, NodeInfo, PartitionInfo, Scan, StoreInfo
from iqgraph.stores import Key, Page, StoreError, StoreKind, WindowedValue
from iqgraph.streaming.definitions import StoreDefinition

NOT_AVAILABLE = "STORE_NOT_AVAILABLE"
LAG_EXCEEDED = "LAG_EXCEEDED"
NOT_OWNER_CODES = ("STORE_MIGRATED", "NOT_OWNER")


@dataclass(frozen=True)
class Server:
    """The node that answers for a partition, and in which role."""

    node: str
    role: str  # "active" | "standby"


@dataclass
class Group:
    """What one node is asked for: the indexes of the lookups and the partitions they fall in."""

    indexes: list[int] = field(default_factory=list)
    partitions: set[int] = field(default_factory=set)


class ClusterStoreQueries(PointLookups):
    """Answer store queries for every key, whichever node holds it."""

    def __init__(
        self,
        local: LocalStoreQueries,
        membership: Membership,
        peers: PeerClient,
        *,
        max_lag: int | None = None,
        authorization: str | None = None,
    ) -> None:
        self.local = local
        self.app = local.app
        self.membership = membership
        self.peers = peers
        self.max_lag = max_lag
        self.authorization = authorization
        self.staleness: list[dict[str, Any]] = []
        self.partial: list[dict[str, Any]] = []

    def bind(self, request: Any) -> ClusterStoreQueries:
        """Return queries for one request: its Authorization header, its own staleness report."""
        authorization = None if request is None else request.headers.get("authorization")
        return ClusterStoreQueries(
            self.local, self.membership, self.peers, max_lag=self.max_lag, authorization=authorization
        )

    # -- metadata -------------------------------------------------------------------------------

    def stores(self) -> Sequence[StoreInfo]:
        """Return every store of the app."""
        return self.local.stores()

    def node(self) -> NodeInfo:
        """Return this node."""
        return self.local.node()

    async def nodes(self) -> Sequence[NodeInfo]:
        """Return every member: this node, and each peer as it reports itself (or DOWN)."""
        cmap = self.membership.current()
        peers = [m for m in cmap.members.values() if m.id != self.local.node_id]
        answers = await asyncio.gather(
            *(self.peers.node(m.url, self.authorization) for m in peers), return_exceptions=True
        )
        found = [self.local.node()]
        for member, answer in zip(peers, answers, strict=True):
            if isinstance(answer, BaseException):
                found.append(NodeInfo(member.id, member.url, "DOWN", self._mapped_partitions(cmap, member.id)))
            else:
                found.append(_node_info(answer))
        return sorted(found, key=lambda n: n.id)

    def _mapped_partitions(self, cmap: ClusterMap, node_id: str) -> tuple[PartitionInfo, ...]:
        found = []
        for role, partitions in (
            ("active", cmap.active_partitions(node_id)),
            ("standby", cmap.standby_partitions(node_id)),
        ):
            for topic, ps in partitions.items():
                found += [PartitionInfo(topic, p, role, "UNKNOWN", 0, 0) for p in ps]
        return tuple(sorted(found, key=lambda p: (p.topic, p.partition)))

    def key_metadata(self, store: str, key: Key) -> KeyQueryMetadata:
        """Return the partition of key and the nodes serving it, in Kafka Streams' nouns."""
        definition = self.local.definition(store)
        partition = self.local.partition_of(definition, key)
        if partition is None:
            return KeyQueryMetadata(store, None, None)
        owners = self.membership.current().owners_of(definition.topic, partition)
        return KeyQueryMetadata(store, partition, owners.active, owners.standbys)

    def placement(self, store: str) -> list[KeyQueryMetadata]:
        """Return, per partition of store, its active and standby nodes from the cluster map."""
        definition = self.local.definition(store)
        cmap = self.membership.current()
        found = []
        for p in range(self.app.topic(definition.topic).partitions):
            owners = cmap.owners_of(definition.topic, p)
            found.append(KeyQueryMetadata(store, p, owners.active, owners.standbys))
        return found

    # -- routing ----------------------------------------------------------------------------------

    def _server(self, cmap: ClusterMap, topic: str, partition: int) -> Server | ApiError:
        owners = cmap.owners_of(topic, partition)
        if owners.active is not None and cmap.is_up(owners.active):
            return Server(owners.active, "active")
        if self.max_lag is not None:
            for standby in owners.standbys:
                if cmap.is_up(standby):
                    return Server(standby, "standby")
        reason = "has no active node" if owners.active is None else f"has its active node {owners.active} down"
        hint = "" if owners.standbys else " and no standby"
        allow = (
            " (stale reads from a standby are off: set --max-lag)" if owners.standbys and self.max_lag is None else ""
        )
        return ApiError(
            f"partition {topic}-{partition} {reason}{hint}{allow}",
            NOT_AVAILABLE,
            retryAfterMs=1000,
            partition=partition,
        )

    # -- lookups ----------------------------------------------------------------------------------

    async def _lookup(self, store: str, kind: StoreKind, requests: Sequence[Request]) -> list[Any]:
        definition = self.local.definition(store, kind)
        states = await self.lookup_states(definition, list(requests), retry=True)
        return [finalize(definition, s) for s in states]

    async def lookup_states(self, definition: StoreDefinition, requests: list[Request], retry: bool) -> list[Any]:
        """Return the merged state of each lookup, asking each serving node once."""
        cmap = self.membership.current()
        results: list[Any] = [None] * len(requests)
        groups = self._group(cmap, definition, requests, results)
        asks = [
            self._ask(cmap, definition, server, [requests[i] for i in g.indexes], g.partitions)
            for server, g in groups.items()
        ]
        # One server (always, on a single node) needs no task of its own: await it in place.
        answers = [await asks[0]] if len(asks) == 1 else await asyncio.gather(*asks)
        combine = combiner(definition)
        merged: set[int] = set()
        for group, answer in zip(groups.values(), answers, strict=True):
            for i, value in zip(group.indexes, answer, strict=True):
                if isinstance(results[i], Exception):
                    continue
                if isinstance(value, Exception) or i not in merged:
                    results[i] = value
                else:
                    results[i] = combine(results[i], value)
                merged.add(i)
        if retry:
            await self._retry_not_owned(definition, requests, results)
        return results

    def _group(
        self, cmap: ClusterMap, definition: StoreDefinition, requests: list[Request], results: list[Any]
    ) -> dict[Server, Group]:
        groups: dict[Server, Group] = defaultdict(Group)
        topic = definition.topic
        valid = []
        servers: dict[int, Server | ApiError] = {}  # per partition: routing is per partition, not per key
        for i, request in enumerate(requests):
            try:
                partition = self.local.partition_of(definition, request[0])
            except StoreError as exc:
                results[i] = exc
                continue
            if partition is None:
                valid.append(i)
                continue
            server = servers.get(partition)
            if server is None:
                server = servers[partition] = self._server(cmap, topic, partition)
            if isinstance(server, ApiError):
                results[i] = server
            else:
                groups[server].indexes.append(i)
                groups[server].partitions.add(partition)
        if valid:  # a store not keyed by the record key: every partition's server is asked
            for p in range(self.app.topic(topic).partitions):
                server = self._server(cmap, topic, p)
                if isinstance(server, ApiError):
                    for i in valid:
                        results[i] = server
                    return {}
                groups[server].partitions.add(p)
            for group in groups.values():
                group.indexes = sorted({*group.indexes, *valid})
        return groups

    async def _ask(
        self,
        cmap: ClusterMap,
        definition: StoreDefinition,
        server: Server,
        requests: list[Request],
        partitions: set[int],
    ) -> list[Any]:
        stale = server.role == "standby"
        try:
            if server.node == self.local.node_id:
                found = await self.local.lookup_states(definition.name, requests, sorted(partitions))
                lag = {str(p.partition): p.lag for p in self.local.node().partitions} if stale else {}
            else:
                url = cmap.url_of(server.node) or ""
                answer = await self.peers.lookup(
                    url, definition.name, requests, sorted(partitions), stale, self.authorization
                )
                found = [_decode_state(definition, r) for r in answer["results"]]
                lag = answer.get("lag") or {}
        except PeerUnavailableError as exc:
            self._mark_down(server.node)
            return [ApiError(str(exc), exc.code, retryAfterMs=1000)] * len(requests)
        except PeerError as exc:
            return [ApiError(str(exc), exc.code, **{k: v for k, v in exc.extensions.items() if k != "code"})] * len(
                requests
            )
        if stale:
            return self._check_lag(definition, server, partitions, lag, requests, found)
        return found

    def _check_lag(
        self,
        definition: StoreDefinition,
        server: Server,
        partitions: set[int],
        lag: dict[str, int],
        requests: list[Request],
        found: list[Any],
    ) -> list[Any]:
        worst = max((int(lag.get(str(p), 0)) for p in partitions), default=0)
        for p in sorted(partitions):
            self.staleness.append(
                {"store": definition.name, "partition": p, "node": server.node, "lag": int(lag.get(str(p), 0))}
            )
        if self.max_lag is not None and worst > self.max_lag:
            error = ApiError(
                f"the standby {server.node} is {worst} records behind, more than maxLag {self.max_lag}",
                LAG_EXCEEDED,
                lag=worst,
                retryAfterMs=1000,
            )
            return [error] * len(requests)
        return found

    def _mark_down(self, node_id: str) -> None:
        mark = getattr(self.membership, "mark_down", None)
        if mark is not None:
            mark(node_id)

    async def _retry_not_owned(self, definition: StoreDefinition, requests: list[Request], results: list[Any]) -> None:
        again = [i for i, r in enumerate(results) if isinstance(r, ApiError) and r.code in NOT_OWNER_CODES]
        if not again:
            return
        self.membership.refresh()
        retried = await self.lookup_states(definition, [requests[i] for i in again], retry=False)
        for i, value in zip(again, retried, strict=True):
            results[i] = value

    # -- scans ------------------------------------------------------------------------------------

    async def scan(self, store: str, kind: StoreKind, scan: Scan, first: int, after: str | None) -> Page[Any]:
        """Return one merged page of a scan over every partition of the cluster, values finalized."""
        definition = self.local.definition(store, kind)
        before = decode_positions(after)
        cmap = self.membership.current()
        groups: dict[Server, list[int]] = defaultdict(list)
        missing: dict[int, str] = {}
        for p in range(self.app.topic(definition.topic).partitions):
            if before.get(str(p), "") is None:
                continue
            server = self._server(cmap, definition.topic, p)
            if isinstance(server, ApiError):
                missing[p] = server.message
            else:
                groups[server].append(p)
        answers = await asyncio.gather(
            *(self._scan_on(cmap, definition, s, scan, before, first, ps) for s, ps in groups.items()),
            return_exceptions=True,
        )
        pages: dict[str, Page[Any]] = {}
        for (server, partitions), answer in zip(groups.items(), answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, PeerUnavailableError):
                    self._mark_down(server.node)
                if not isinstance(answer, PeerError | StoreError):
                    raise answer
                missing.update({p: str(answer) for p in partitions})
            else:
                pages.update(answer)
        items, positions = merge_pages(pages, first, scan_merge(self.app, definition, scan))
        page = merged_page(items, positions, before)
        if missing:
            self.partial.append(
                {"store": store, "missingPartitions": sorted(missing), "reasons": sorted(set(missing.values()))}
            )
            if page.next_cursor is None:
                page = Page(page.items, merged_page([], {}, before).next_cursor)
        return Page(finalize_items(definition, scan, page.items), page.next_cursor)

    async def _scan_on(
        self,
        cmap: ClusterMap,
        definition: StoreDefinition,
        server: Server,
        scan: Scan,
        before: dict[str, Any],
        first: int,
        partitions: list[int],
    ) -> dict[str, Page[Any]]:
        positions = {str(p): before[str(p)] for p in partitions if str(p) in before}
        if server.node == self.local.node_id:
            return await self.local.scan_pages(definition.name, scan, positions, first, partitions)
        url = cmap.url_of(server.node) or ""
        answer = await self.peers.scan(
            url,
            definition.name,
            {"kind": scan.kind, "args": scan.args},
            positions,
            first,
            partitions,
            self.authorization,
        )
        return {
            p: Page([_decode_item(definition, i) for i in page["items"]], page["next"]) for p, page in answer.items()
        }

    async def range(
        self, store: str, from_key: Key | None, to_key: Key | None, first: int, after: str | None
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) with from_key <= key <= to_key, in key order, over the cluster."""
        scan = Scan("range", {"from_key": from_key, "to_key": to_key})
        return await self.scan(store, StoreKind.KEY_VALUE, scan, first, after)

    async def prefix(self, store: str, prefix: str, first: int, after: str | None) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) whose string key starts with prefix, over the cluster."""
        return await self.scan(store, StoreKind.KEY_VALUE, Scan("prefix", {"prefix": prefix}), first, after)

    async def fetch_all(
        self, store: str, time_from: int, time_to: int, first: int, after: str | None
    ) -> Page[WindowedValue]:
        """Return a page of every key's windows with start in the range, by start then key."""
        scan = Scan("fetch_all", {"time_from": time_from, "time_to": time_to})
        return await self.scan(store, StoreKind.WINDOW, scan, first, after)

    async def fetch_range(
        self,
        store: str,
        from_key: Key | None,
        to_key: Key | None,
        time_from: int,
        time_to: int,
        first: int,
        after: str | None,
    ) -> Page[WindowedValue]:
        """Return a page of windows of keys in [from_key, to_key] with start in the range, by key then time."""
        args = {"from_key": from_key, "to_key": to_key, "time_from": time_from, "time_to": time_to}
        return await self.scan(store, StoreKind.WINDOW, Scan("fetch_range", args), first, after)

    async def approximate_count(self, store: str) -> int:
        """Return about how many keys the store holds over the cluster."""
        definition = self.local.definition(store)
        cmap = self.membership.current()
        groups: dict[Server, list[int]] = defaultdict(list)
        for p in range(self.app.topic(definition.topic).partitions):
            server = self._server(cmap, definition.topic, p)
            if isinstance(server, ApiError):
                raise server
            groups[server].append(p)

        async def count(server: Server, partitions: list[int]) -> int:
            if server.node == self.local.node_id:
                return await self.local.count_states(store, partitions)
            return await self.peers.count(cmap.url_of(server.node) or "", store, partitions, self.authorization)

        try:
            return sum(await asyncio.gather(*(count(s, ps) for s, ps in groups.items())))
        except PeerError as exc:
            raise ApiError(str(exc), exc.code) from exc


def _decode_state(definition: StoreDefinition, value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"error"}:
        error = value["error"]
        extensions = dict(error.get("extensions") or {})
        code = str(extensions.pop("code", "INTERNAL"))
        return ApiError(str(error.get("message")), code, **extensions)
    if definition.kind is StoreKind.WINDOW and value is not None:
        return [WindowedValue(k, s, e, v) for k, s, e, v in value]
    return value


def _decode_item(definition: StoreDefinition, item: list[Any]) -> Any:
    if definition.kind is StoreKind.WINDOW:
        key, start, end, state = item
        return WindowedValue(key, start, end, state)
    return (item[0], item[1])


def _node_info(data: dict[str, Any]) -> NodeInfo:
    partitions = tuple(
        PartitionInfo(p["topic"], p["partition"], p["role"], p["state"], p["appliedOffset"], p["endOffset"])
        for p in data.get("partitions") or []
    )
    return NodeInfo(data["id"], data["url"], data["state"], partitions)
