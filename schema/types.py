"""What the GraphQL layer needs from a node: the StoreQueries protocol and the metadata it returns.

Resolvers call a StoreQueries (held in the request context, bound to the request's reports); the app
implements it once, over the cluster map (a single node is a one-member map): keys routed to their
partitions' replicas, local partitions read in place, ONE forwarded sub-request per peer. A peer's
forwarded sub-request is answered by PeerQueries: the node's own partitions only. Subscriptions follow
keys through LiveQueries (a store read, then the owner's change feed). Nouns follow Kafka
Streams' interactive queries: KeyQueryMetadata (active node, standby nodes, partition), store metadata.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from iqgraph.schema.access import ANONYMOUS, Principal
from iqgraph.stores.scans import SCANS, Scan

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

    from iqgraph.schema.reports import Reports
    from iqgraph.stores import Key, Page, WindowedValue

#: One result per requested key: the value (None if absent), or the exception that key failed with.
Result = Any
T = TypeVar("T")
#: A point lookup: the key, and for a window store the range of window starts.
Request = tuple["Key", int | None, int | None]
#: A point read a peer serves: the lookup, and the partitions (its own) to read it from.
Read = tuple[Request, tuple[int, ...]]


@dataclass(frozen=True)
class KeyQueryMetadata:
    """Where a key lives: its partition, the node serving it actively, and its standby nodes."""

    store: str
    partition: int | None  # None: the key may be in more than one partition (see partitions)
    active_node: str | None
    standby_nodes: tuple[str, ...] = ()
    partitions: tuple[int, ...] = ()  # every partition a read of the key asks
    note: str | None = None  # why a key has no single partition (a store keyed by a column, mixed producers)


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as a node sees it."""

    topic: str
    partition: int
    role: str  # "active" | "standby"
    state: str  # CREATED | RESTORING | RUNNING | DATA_LOST | CLOSED
    applied_offset: int
    end_offset: int
    seconds_since_applied: float = 0.0  # since the last batch was applied (or the partition opened)
    stalled: bool = False  # records wait and no batch was applied for longer than the node's stall timeout
    lost: tuple[int, int] | None = None  # offsets [first, end) Kafka deleted before they were applied (this run)

    @property
    def lag(self) -> int:
        """Return how many records the partition's stores are behind the topic."""
        return max(self.end_offset - self.applied_offset, 0)


@dataclass(frozen=True)
class PipelineInfo:
    """How a node's streaming queries are doing (app.supervisor keeps it)."""

    state: str  # RUNNING | DEAD (a query died; restarting after a backoff)
    restarts: int = 0
    deaths_in_a_row: int = 0
    last_error: str | None = None
    keeps_dying: bool = False  # died so many times in a row that the node is not ready

    @property
    def healthy(self) -> bool:
        """Return whether the pipeline runs and is not dying again and again."""
        return self.state == "RUNNING" and not self.keeps_dying


@dataclass(frozen=True)
class NodeInfo:
    """A node of the cluster."""

    id: str
    url: str
    state: str  # STARTING | RUNNING | STOPPING
    partitions: tuple[PartitionInfo, ...] = ()
    pipeline: PipelineInfo | None = None  # None: not known (a peer that is down, a node still starting)


@dataclass(frozen=True)
class RelationInfo:
    """A reference from a store's values (``column``) or keys (``column`` None) to an entity's key.

    The schema adds ``field`` (camelCased) to the store's value type (a column) or entry type (the key),
    typed as the entity; a null target key resolves to null without an error. A field named like the column
    replaces it (the key stays readable as the entity's ``key``).
    """

    field: str
    entity: str
    column: str | None = None

    @property
    def replaces_column(self) -> bool:
        """Return whether the relation's field takes its column's place (named alike): the column has no field."""
        return self.field == self.column


@dataclass(frozen=True)
class EntityInfo:
    """One GraphQL type per key space: the stores sharing a key, composed at query time.

    ``table`` (optional, one of ``stores``) is a store with a struct value whose columns become fields of the
    entity itself; every other store is a field named after it. Root fields: ``<name in camelCase>(key)``,
    ``<plural>(keys)`` and ``<plural>Page(first, after)`` (paged over ``table``, else the first store).
    """

    name: str
    key_type: str  # "string" | "int"
    stores: tuple[str, ...]
    plural: str
    table: str | None = None
    description: str | None = None


@dataclass(frozen=True)
class StoreInfo:
    """A store as the schema describes it."""

    name: str
    kind: str  # "key_value" | "window" | "bloom" | "ranking"
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
    relations: tuple[RelationInfo, ...] = ()
    table: bool = False  # fed from a table topic: latest value per key, tombstones delete


@dataclass(frozen=True)
class Ranked:
    """A member of a ranking: its value, its rank (1 = the greatest value) and the cursor to resume after it."""

    member: Any
    value: Any
    rank: int
    cursor: str


#: The scans a store answers, as typed requests (``stores.scans``: RangeScan, PrefixScan, WindowScan,
#: WindowRangeScan, TopScan), and their wire names.
SCAN_KINDS = tuple(SCANS)


@dataclass(frozen=True)
class Answer(Generic[T]):
    """What a node read from its partitions, with each partition's position and lag at the read."""

    value: T
    positions: dict[int, int] = field(default_factory=dict)  # partition -> applied offset, read before the data
    lags: dict[int, int] = field(default_factory=dict)  # partition -> records behind the topic's end
    #: since when (unix time) the serving node has not reached Kafka: its copy is the last state it knew
    kafka_away_since: float | None = None


class PeerQueries(Protocol):
    """What a node answers a peer's forwarded sub-request with: states from its own partitions only."""

    def node(self) -> NodeInfo:
        """Return this node, with the role, state and lag of its partitions."""
        ...

    def read_states(self, store: str, reads: Sequence[Read]) -> Answer[list[Result]]:
        """Return the mergeable state of each read, combined over its partitions (an exception if it failed)."""
        ...

    def scan_pages(
        self, store: str, scan: Scan, positions: Mapping[int, str | None], first: int, partitions: Sequence[int]
    ) -> Answer[dict[int, Any]]:
        """Return per given partition one page of states resumed at its position (or the exception it failed with)."""
        ...

    def count(self, store: str, partitions: Sequence[int], exact: bool = True) -> Answer[dict[int, Any]]:
        """Return per given partition its entries (exact, or RocksDB's estimate; bloom: estimate) or an exception."""
        ...

    async def call(
        self, field: str, calls: Sequence[tuple[Key, tuple[int, ...]]], caller: Principal = ANONYMOUS
    ) -> Answer[list[Result]]:
        """Return an owner-side field's value per (key, partitions), run here for caller (an exception if it failed)."""
        ...


class StoreQueries(Protocol):
    """Read access to every store of the app, whichever node holds the data.

    ``max_lag`` bounds how many records behind the topic a standby's answer may be (None: the request's
    default, else the node's); an answer from a standby reports its lag in the request's reports.
    """

    def bind(self, reports: Reports, principal: Principal = ANONYMOUS) -> StoreQueries:
        """Return queries for one request: its reports, and its caller (every store read is checked against it)."""
        ...

    def stores(self) -> Sequence[StoreInfo]:
        """Return every store of the app."""
        ...

    def node(self) -> NodeInfo:
        """Return this node."""
        ...

    async def nodes(self) -> Sequence[NodeInfo]:
        """Return every node of the cluster, as this node knows them."""
        ...

    def key_metadata(self, store: str, key: Key) -> KeyQueryMetadata:
        """Return where key of store lives."""
        ...

    def placement(self, store: str) -> Sequence[KeyQueryMetadata]:
        """Return, per partition of store, its active node and standby nodes."""
        ...

    def routing_partitioner(self, store: str) -> str:
        """Return the partitioner keys of store are routed by (configured, or detected from the records)."""
        ...

    async def get_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Result]:
        """Return the value of each key of a key-value store, in key order (None when absent)."""
        ...

    async def might_contain_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Result]:
        """Return, per key of a bloom store, False if never added and True if probably added."""
        ...

    async def fetch_many(
        self, store: str, requests: Sequence[tuple[Key, int, int]], max_lag: int | None = None
    ) -> list[Result]:
        """Return, per (key, time_from, time_to), the key's windows with start in the range (a list)."""
        ...

    async def range(
        self,
        store: str,
        from_key: Key | None,
        to_key: Key | None,
        first: int,
        after: str | None,
        max_lag: int | None = None,
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) of a key-value store with from_key <= key <= to_key, in key order."""
        ...

    async def prefix(
        self, store: str, prefix: str, first: int, after: str | None, max_lag: int | None = None
    ) -> Page[tuple[Key, Any]]:
        """Return a page of (key, value) of a key-value store whose string key starts with prefix."""
        ...

    async def count(self, store: str, max_lag: int | None = None) -> int:
        """Return how many keys (key-value) or windows (window) a store holds: exact; bloom: an estimate."""
        ...

    async def approximate_count(self, store: str, max_lag: int | None = None) -> int:
        """Return RocksDB's estimate of the keys a store holds (fast; off after updates and deletes)."""
        ...

    async def fetch_all(
        self, store: str, time_from: int, time_to: int, first: int, after: str | None, max_lag: int | None = None
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
        max_lag: int | None = None,
    ) -> Page[WindowedValue]:
        """Return a page of the windows of keys in [from_key, to_key] with start in the range, by key then time."""
        ...

    async def top(
        self, store: str, group: str | None, first: int, after: str | None, max_lag: int | None = None
    ) -> list[Ranked]:
        """Return the first members of a ranking's group (None: all groups) from the greatest value down."""
        ...

    async def call_many(self, field: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Result]:
        """Return an owner-side field's value per key, each run on the node serving the key (app.owner.calls)."""
        ...


@dataclass(frozen=True)
class LiveChange:
    """One watched key's value, pushed after a committed batch or read from the store (snapshot).

    position is the offset of the record that produced the value (``stores.positions``; -1: a key that never had
    one). A partition's changes reach the subscriber in position order, so every change of the watched keys at or
    before it there has been delivered (or superseded by one delivered). Pass the last position of each partition as
    ``after`` to resume: exactly the values changed after it are sent.
    """

    key: Key
    value: Any  # finalized; None: absent or deleted; True for a bloom key; an exception if it failed
    partition: int
    position: int
    window_start: int | None = None
    window_end: int | None = None
    dropped: int = 0  # earlier values of this key (window) conflated away since the last one delivered
    snapshot: bool = False  # read from the store (start, resume, catching up after falling behind), not pushed
    lag: int | None = None  # records the copy that sent it was behind (a standby's); None: the active's


class LiveQueries(Protocol):
    """Changes of a store's keys as they are applied: what subscription resolvers follow."""

    def watch(
        self,
        store: str,
        keys: Sequence[Key],
        *,
        after: Mapping[int, int] | None = None,
        window_from: int | None = None,
        principal: Principal = ANONYMOUS,
        max_lag: int | None = None,
    ) -> AsyncGenerator[LiveChange, None]:
        """Yield the keys' current values (those newer than after), then every change, until closed.

        after: per partition, the position the subscriber has (a resume). window_from: a window store's earliest
        window start. max_lag: how far behind a standby may serve a partition whose active is down (None: the node's
        bound). Bloom stores yield each key once, when it is (probably) contained. Raises the coded error
        of a store the caller may not read, a key that cannot be routed or followed here.
        """
        ...

    def store_changes(self, store: str, *, principal: Principal = ANONYMOUS) -> AsyncGenerator[int, None]:
        """Yield 0 once store is followed, then, per committed batch that changed its keys, how many changed.

        What a subscriber that re-reads a whole result (a ranking's top) follows: read after the first yield
        (0), and again after each next one. At least one yield per such batch on any partition followed; the
        batches of a busy subscriber coalesce into one yield (the count of every key changed since the last).
        Raises FORBIDDEN for a store the caller may not read, UNKNOWN_STORE, LIMIT_EXCEEDED.
        """
        ...


@dataclass(frozen=True)
class OwnerFieldInfo:
    """An owner-side field as the schema shows it: root fields ``<name>(key)`` and ``<name>Many(keys)``."""

    name: str
    key_type: str  # "string" | "int": the keys of the store it routes by
    value_type: DataType
    store: str  # the store whose key's owner runs it
    description: str | None = None
