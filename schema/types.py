"""What the GraphQL layer needs from a node: the StoreQueries protocol and the metadata it returns.

Resolvers call a StoreQueries (held in the request context); the app implements it — locally over the
node's partition databases, and across the cluster by forwarding to the owners. Nouns follow Kafka
Streams' interactive queries: KeyQueryMetadata (active node, standby nodes, partition), store metadata.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

    from iqgraph.stores import Key, Page, WindowedValue

#: One result per requested key: the value (None if absent), or the exception that key failed with.
Result = Any


@dataclass(frozen=True)
class KeyQueryMetadata:
    """Where a key lives: its partition, the node serving it actively, and its standby nodes."""

    store: str
    partition: int | None  # None: the store is not co-partitioned; every partition may hold the key
    active_node: str | None
    standby_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as a node sees it."""

    topic: str
    partition: int
    role: str  # "active" | "standby"
    state: str  # CREATED | RESTORING | RUNNING | CLOSED
    applied_offset: int
    end_offset: int

    @property
    def lag(self) -> int:
        """Return how many records the partition's stores are behind the topic."""
        return max(self.end_offset - self.applied_offset, 0)


@dataclass(frozen=True)
class NodeInfo:
    """A node of the cluster."""

    id: str
    url: str
    state: str  # STARTING | RUNNING | STOPPING
    partitions: tuple[PartitionInfo, ...] = ()


@dataclass(frozen=True)
class StoreInfo:
    """A store as the schema describes it."""

    name: str
    kind: str  # "key_value" | "window" | "bloom"
    key_type: str  # "string" | "int"
    value_type: DataType
    topic: str
    partitions: int
    co_partitioned: bool
    description: str | None = None
    aggregation: str | None = None
    window_size_ms: int | None = None
    window_advance_ms: int | None = None
    false_positive_rate: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


SCAN_KINDS = ("range", "prefix", "fetch_all", "fetch_range")


@dataclass(frozen=True)
class Scan:
    """A scan of one store: its kind and arguments (JSON-able, so that it can be forwarded to a peer)."""

    kind: str
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in SCAN_KINDS:
            raise ValueError(f"unknown scan {self.kind!r}; known: {SCAN_KINDS}")


class PeerQueries(Protocol):
    """What a node answers a peer's forwarded sub-request with: states from given partitions only."""

    def node(self) -> NodeInfo:
        """Return this node, with the role, state and lag of its partitions."""
        ...

    async def lookup_states(
        self, store: str, requests: Sequence[tuple[Key, int | None, int | None]], partitions: Sequence[int] | None
    ) -> list[Result]:
        """Return the mergeable state of each lookup from the given partitions (an exception where it failed)."""
        ...

    async def scan_pages(
        self, store: str, scan: Scan, positions: Mapping[str, str | None], first: int, partitions: Sequence[int] | None
    ) -> dict[str, Page[Any]]:
        """Return one page of states per given partition not exhausted, resumed at its position."""
        ...

    async def count_states(self, store: str, partitions: Sequence[int] | None) -> int:
        """Return the approximate number of keys in the given partitions."""
        ...


class StoreQueries(Protocol):
    """Read access to every store of the app, whichever node holds the data."""

    def stores(self) -> Sequence[StoreInfo]:
        """Return every store of the app."""
        ...

    def node(self) -> NodeInfo:
        """Return this node."""
        ...

    def nodes(self) -> Sequence[NodeInfo] | Awaitable[Sequence[NodeInfo]]:
        """Return every node of the cluster, as this node knows them (a cluster may await its peers)."""
        ...

    def key_metadata(self, store: str, key: Key) -> KeyQueryMetadata:
        """Return where key of store lives."""
        ...

    def placement(self, store: str) -> Sequence[KeyQueryMetadata]:
        """Return, per partition of store, its active node and standby nodes."""
        ...

    async def get_many(self, store: str, keys: Sequence[Key]) -> list[Result]:
        """Return the value of each key of a key-value store, in key order (None when absent)."""
        ...

    async def might_contain_many(self, store: str, keys: Sequence[Key]) -> list[Result]:
        """Return, per key of a bloom store, False if never added and True if probably added."""
        ...

    async def fetch_many(self, store: str, requests: Sequence[tuple[Key, int, int]]) -> list[Result]:
        """Return, per (key, time_from, time_to), the key's windows with start in the range (a list)."""
        ...

    async def range(
        self, store: str, from_key: Key | None, to_key: Key | None, first: int, after: str | None
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) of a key-value store with from_key <= key <= to_key, in key order."""
        ...

    async def prefix(self, store: str, prefix: str, first: int, after: str | None) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) of a key-value store whose string key starts with prefix."""
        ...

    async def approximate_count(self, store: str) -> int:
        """Return about how many keys a store holds (all partitions)."""
        ...

    async def fetch_all(
        self, store: str, time_from: int, time_to: int, first: int, after: str | None
    ) -> Page[WindowedValue]:
        """Return a page of every key's windows with start in [time_from, time_to], by start then key."""
        ...

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
        """Return a page of the windows of keys in [from_key, to_key] with start in the range, by key then time."""
        ...
