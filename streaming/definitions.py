"""Store definitions: what a user writes to declare an app, its topics and its stores.

An app module holds an ``App``::

    app = App(
        name="shop",
        topics=[Topic("orders", schema="customer STRING, amount DOUBLE, item STRING", event_time="ts")],
        stores=[
            key_value_store("order_count", "orders", count(), description="Orders per customer"),
            window_store("orders_per_minute", "orders", count(), tumbling(minutes=1)),
            bloom_store("items_sold", "orders", key="item"),
        ],
    )

A store is fed from one topic, keyed by the record key unless ``key`` names a column, optionally
transformed by a PySpark function DataFrame → DataFrame, and aggregated by a mergeable aggregation.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from iqgraph.stores import (
    BloomSpec,
    RankingStore,
    StoreKind,
    StoreSpec,
    UserError,
    WindowSpec,
    aggregation_named,
    store_class,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from iqgraph.stores import Aggregation
    from iqgraph.streaming.owner_fields import OwnerField
    from iqgraph.streaming.user_aggregations import UserAggregation

Transform = Callable[["DataFrame"], "DataFrame"]
#: An event: (key, JSON-able value) for the app's first topic, or (topic, key, value) for any of its topics
#: (value None: a tombstone, for a table topic).
Event = tuple["str | int | None", Any] | tuple[str, "str | int | None", Any]
#: A generator of realistic events for an app: (seed, start time in epoch ms) -> endless events.
EventGenerator = Callable[[int, int], Iterator[Event]]
ValueFormat = Literal["json", "avro", "string", "bytes"]
KeyFormat = Literal["string", "long"]
#: "auto": detected per topic from the keys' arrival partitions (see streaming.partitioner).
Partitioner = Literal["auto", "murmur2", "consistent_random"]
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class DefinitionError(UserError, ValueError):
    """An app definition that cannot run; the message says what to fix."""


def iso_timestamp(epoch_ms: int) -> str:
    """Return epoch_ms as the ISO 8601 UTC text a ``TIMESTAMP`` column reads, to the millisecond (for generators)."""
    seconds, millis = divmod(epoch_ms, 1000)
    stamp = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{millis:03d}Z"


@dataclass(frozen=True)
class KafkaSettings:
    """Where the topics live; ``config`` passes through to librdkafka (SASL, SSL, …)."""

    bootstrap_servers: str = "localhost:9092"
    config: Mapping[str, str] = field(default_factory=dict)
    partitioner: Partitioner = "auto"
    dead_letter_topic: str | None = None


@dataclass(frozen=True)
class Topic:
    """An input topic: how its keys and values are encoded and where event time comes from."""

    name: str
    #: json: a Spark DDL string or StructType; avro: the Avro schema (an .avsc path, JSON text or a dict).
    schema: str | StructType | Mapping[str, Any] | None = None
    value_format: ValueFormat = "json"
    key_format: KeyFormat = "string"
    event_time: str | None = None
    partitions: int = 6
    max_value_bytes: int = 1 << 20
    #: Read as a changelog (a table): stores keep the latest value per key and a null value (tombstone)
    #: deletes the key. Only ``table_store``s read a table topic.
    table: bool = False
    #: A global table: every node consumes all its partitions into a local copy (small reference data such
    #: as songs or products), read locally and joinable from any stream without co-partitioning.
    global_table: bool = False

    def __post_init__(self) -> None:
        if self.value_format == "json" and isinstance(self.schema, Mapping):
            raise DefinitionError(f"topic {self.name!r}: a dict schema is an Avro schema: set value_format='avro'")
        if self.value_format == "json" and self.schema is None:
            raise DefinitionError(f"topic {self.name!r}: JSON values need a schema (Spark DDL or StructType)")
        if self.value_format not in ("json", "avro", "string", "bytes"):
            raise DefinitionError(f"topic {self.name!r}: value_format must be json, avro, string or bytes")
        if self.value_format == "avro":
            from iqgraph.streaming.avro import load_avro_schema  # checks it now: a bad schema fails at load

            if self.schema is None or not isinstance(self.schema, str | Mapping):
                raise DefinitionError(f"topic {self.name!r}: Avro values need schema= an .avsc path, JSON or a dict")
            load_avro_schema(self.schema, topic=self.name)
        if self.key_format not in ("string", "long"):
            raise DefinitionError(f"topic {self.name!r}: key_format must be string or long")
        if self.global_table and not self.table:
            raise DefinitionError(f"topic {self.name!r}: a global table is a table: set table=True too")


@dataclass(frozen=True)
class Aggregate:
    """A mergeable aggregation over a column (or the whole record for count and latest).

    ``user``: a user aggregation (streaming.user_aggregations; ``kind`` is then its name), fed the ``columns``.
    """

    kind: str
    column: str | None = None
    columns: tuple[str, ...] = ()
    user: UserAggregation | None = None

    def __post_init__(self) -> None:
        if self.user is None:
            aggregation_named(self.kind)
        if self.kind in ("sum", "min", "max", "avg") and not self.column:
            raise DefinitionError(f"{self.kind} needs a column: {self.kind}('amount')")


def count() -> Aggregate:
    """Count records per key."""
    return Aggregate("count")


def sum_(column: str) -> Aggregate:
    """Sum column per key."""
    return Aggregate("sum", column)


def min_(column: str) -> Aggregate:
    """Keep the smallest value of column per key."""
    return Aggregate("min", column)


def max_(column: str) -> Aggregate:
    """Keep the largest value of column per key."""
    return Aggregate("max", column)


def avg(column: str) -> Aggregate:
    """Average column per key (kept as sum and count)."""
    return Aggregate("avg", column)


def latest(*columns: str) -> Aggregate:
    """Keep the latest record per key: the whole value, or the columns named.

    Latest by offset for a store keyed by the record key (one partition holds the key); by event time for a
    store keyed by a column (ties: the greater partition, then offset).
    """
    return Aggregate("latest", columns=columns)


def tumbling(*, minutes: int = 0, seconds: int = 0, grace_seconds: int = 0, retention_hours: int = 24) -> WindowSpec:
    """Return back-to-back windows of the given size."""
    size = (minutes * 60 + seconds) * 1000
    return WindowSpec(size, grace_ms=grace_seconds * 1000, retention_ms=max(retention_hours * 3_600_000, size))


def hopping(
    *, size_seconds: int, advance_seconds: int, grace_seconds: int = 0, retention_hours: int = 24
) -> WindowSpec:
    """Return overlapping windows of size_seconds starting every advance_seconds."""
    size = size_seconds * 1000
    retention = max(retention_hours * 3_600_000, size + grace_seconds * 1000)
    return WindowSpec(size, advance_seconds * 1000, grace_seconds * 1000, retention)


@dataclass(frozen=True)
class Join:
    """Enrich a store's records with a table's value before aggregating (see streaming.joins).

    ``table`` names a ``table_store``; ``on`` the stream column holding the table's key (None: the record
    key). A join on a column needs a global table; a join on the record key of a table that is not global
    needs the same partition count (co-partitioned: joined within the partition). ``how``: "inner" drops
    records without a match, "left" keeps them with null table columns. The table's columns join under their
    own names, or ``prefix`` + name.
    """

    table: str
    on: str | None = None
    how: Literal["inner", "left"] = "inner"
    prefix: str = ""

    def __post_init__(self) -> None:
        if self.how not in ("inner", "left"):
            raise DefinitionError(f"join with {self.table!r}: how must be 'inner' or 'left', not {self.how!r}")


@dataclass(frozen=True)
class Relation:
    """A reference to an entity from a store's values (``column``) or from its keys (``column`` None).

    GraphQL traverses it: ``Relation("product", "Product", column="item")`` adds ``product: Product`` next to
    ``item`` in the store's value type; a relation whose field is named like its column replaces it.
    """

    field: str
    entity: str
    column: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.field):
            raise DefinitionError(f"relation field {self.field!r}: use a letter then letters, digits or '_'")


@dataclass(frozen=True)
class Entity:
    """One GraphQL type per key space: the stores that share a key, composed at query time.

    ``Entity("Customer", stores=["customers", "order_count", "total_spend"], table="customers")`` makes the
    type ``Customer`` (the table's columns as its fields, then one field per other store) and the root fields
    ``customer(key)``, ``customers(keys)`` and ``customersPage(first, after)``; ``plural`` defaults to the
    name in camelCase plus ``s``.
    """

    name: str
    stores: Sequence[str]
    table: str | None = None
    plural: str | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        if not re.match(r"^[A-Z][A-Za-z0-9]*$", self.name):
            raise DefinitionError(f"entity name {self.name!r}: use PascalCase (a capital, then letters or digits)")
        if not self.stores:
            raise DefinitionError(f"entity {self.name!r} composes no stores: name at least one")
        if self.table is not None and self.table not in self.stores:
            raise DefinitionError(f"entity {self.name!r}: its table {self.table!r} must be one of its stores")

    @property
    def plural_field(self) -> str:
        """Return the root field of many keys (``customers``)."""
        return self.plural or self.name[0].lower() + self.name[1:] + "s"


@dataclass(frozen=True)
class StoreDefinition:
    """One store: its kind, source topic, key, transformation and aggregation."""

    name: str
    kind: StoreKind
    topic: str
    aggregate: Aggregate = field(default_factory=count)  # a UserAggregation given is wrapped in one
    key: str | None = None
    transform: Transform | None = None
    window: WindowSpec | None = None
    bloom: BloomSpec | None = None
    description: str | None = None
    key_type: Literal["string", "int"] | None = None
    relations: tuple[Relation, ...] = ()
    join: Join | None = None
    #: A ranking store: the key-value store it ranks, and the column of that store's records naming the group.
    ranks: str | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise DefinitionError(f"store name {self.name!r}: use a letter then letters, digits or '_'")
        if not isinstance(self.aggregate, Aggregate):
            from iqgraph.streaming.user_aggregations import UserAggregation, aggregate  # it imports this module

            if not isinstance(self.aggregate, UserAggregation):
                raise DefinitionError(
                    f"store {self.name!r}: aggregate with count(), sum_(col), …, collect(…) or a UserAggregation, "
                    f"not {self.aggregate!r}"
                )
            object.__setattr__(self, "aggregate", aggregate(self.aggregate))  # a user aggregation, over its columns
        fields = [r.field for r in self.relations]
        if len(set(fields)) != len(fields):
            raise DefinitionError(f"store {self.name!r}: relation fields must be unique, got {fields}")
        if (store_class(self.kind) is RankingStore) != (self.ranks is not None):  # the ranking rules ask ranks
            raise DefinitionError(f"store {self.name!r}: ranks= goes with, and only with, a ranking (ranking_store)")

    @property
    def co_partitioned(self) -> bool:
        """Return whether the store is keyed by the record key, so the producers' partitioner finds a key.

        A store keyed by another column holds each key in whatever partition its records arrived on:
        lookups must ask every partition.
        """
        return self.key is None

    @property
    def own_rows(self) -> bool:
        """Return whether the store's records are its own rows (a transform or a join may add or drop some)."""
        return self.transform is not None or self.join is not None

    @property
    def aggregation(self) -> str:
        """Return the name of the aggregation the store's states merge with (stores.aggregations).

        ``latest`` of a store keyed by a column is ``latest_by_time``: its key's records arrive on several
        partitions, and the latest is the one with the greatest event time (ties: partition, then offset).
        """
        if store_class(self.kind).keys_only:  # a bloom filter: no aggregation, its records' latest key
            return "latest"
        if self.aggregate.kind == "latest" and not self.co_partitioned:
            return "latest_by_time"
        return self.aggregate.kind

    @property
    def state_aggregation(self) -> Aggregation:
        """Return the Aggregation the store's states merge and finalize with: a user's, or the built-in named
        by ``aggregation`` (every reader and writer of a store's states resolves it here)."""
        if self.aggregate.user is not None and not store_class(self.kind).keys_only:
            return self.aggregate.user.aggregation()
        return aggregation_named(self.aggregation)

    def spec(self, topic: Topic) -> StoreSpec:
        """Return the spec the stores package keeps this store by."""
        agg = self.state_aggregation
        return StoreSpec(self.name, self.kind, self.resolved_key_type(topic), agg, self.window, self.bloom)

    def resolved_key_type(self, topic: Topic) -> Literal["string", "int"]:
        """Return the type of this store's keys: declared, else from the topic's key format."""
        if self.key_type is not None:
            return self.key_type
        return "int" if self.key is None and topic.key_format == "long" else "string"


def key_value_store(
    name: str,
    topic: str,
    aggregate: Aggregate | UserAggregation,
    *,
    key: str | None = None,
    transform: Transform | None = None,
    description: str | None = None,
    relations: Sequence[Relation] = (),
    join: Join | None = None,
) -> StoreDefinition:
    """Define a key-value store: one aggregate per key."""
    return StoreDefinition(
        name,
        StoreKind.KEY_VALUE,
        topic,
        aggregate,  # type: ignore[arg-type]  # a UserAggregation is wrapped in __post_init__
        key,
        transform,
        description=description,
        relations=tuple(relations),
        join=join,
    )


def table_store(
    name: str,
    topic: str,
    *columns: str,
    description: str | None = None,
    relations: Sequence[Relation] = (),
) -> StoreDefinition:
    """Define the store of a table topic: the latest value per key (the columns named, or all); tombstones delete."""
    return key_value_store(name, topic, latest(*columns), description=description, relations=relations)


def window_store(
    name: str,
    topic: str,
    aggregate: Aggregate | UserAggregation,
    window: WindowSpec,
    *,
    key: str | None = None,
    transform: Transform | None = None,
    description: str | None = None,
    relations: Sequence[Relation] = (),
    join: Join | None = None,
) -> StoreDefinition:
    """Define a window store: one aggregate per key per time window."""
    return StoreDefinition(
        name,
        StoreKind.WINDOW,
        topic,
        aggregate,  # type: ignore[arg-type]  # a UserAggregation is wrapped in __post_init__
        key,
        transform,
        window,
        description=description,
        relations=tuple(relations),
        join=join,
    )


def bloom_store(
    name: str,
    topic: str,
    *,
    key: str | None = None,
    key_type: Literal["string", "int"] | None = None,
    capacity: int = 100_000,
    error_rate: float = 0.001,
    transform: Transform | None = None,
    description: str | None = None,
) -> StoreDefinition:
    """Define a bloom store: has this key (the record key, or column ``key``) been seen?"""
    bloom = BloomSpec(capacity, error_rate)
    return StoreDefinition(
        name,
        StoreKind.BLOOM,
        topic,
        Aggregate("latest"),
        key,
        transform,
        bloom=bloom,
        description=description,
        key_type=key_type,
    )


def ranking_store(
    name: str,
    of: StoreDefinition,
    *,
    group: str | None = None,
    description: str | None = None,
    relations: Sequence[Relation] = (),
) -> StoreDefinition:
    """Define a ranking: the members (keys) of key-value store ``of`` ordered by value, per ``group`` and among all.

    ``group`` names a column of ``of``'s records (after its join and transform) whose latest value per member
    is the member's group. The ranking is kept in the same partition databases as ``of``, updated in the same
    transaction: ``of`` must be keyed by the record key (a member then lives in one partition, and the top N
    of each partition merged is the top N of all) and its values numbers (count, sum, min, max, avg, or a user
    aggregation of a numeric type).
    """
    if not isinstance(of, StoreDefinition):
        raise DefinitionError(f"ranking {name!r}: of= takes the store definition it ranks, not {of!r}")
    aggregate = latest(group) if group is not None else count()
    return StoreDefinition(
        name,
        StoreKind.RANKING,
        of.topic,
        aggregate,
        of.key,
        of.transform,
        description=description,
        key_type=of.key_type,
        relations=tuple(relations),
        join=of.join,
        ranks=of.name,
        group=group,
    )


def _check_table_store(store: StoreDefinition) -> None:
    """Refuse a store of a table topic that is not a table store (latest per record key, no transform)."""
    if (
        not store_class(store.kind).keeps_tables
        or store.aggregate.kind != "latest"
        or store.key
        or store.transform
        or store.join
    ):
        raise DefinitionError(
            f"store {store.name!r} reads table topic {store.topic!r}: a table topic feeds only "
            f"table_store(...) (the latest value per record key, no key column, no transform, no join)"
        )


@dataclass(frozen=True)
class App:
    """An application: its topics, its stores and how to reach Kafka."""

    name: str
    topics: Sequence[Topic]
    stores: Sequence[StoreDefinition]
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    description: str | None = None
    generator: EventGenerator | None = None
    entities: Sequence[Entity] = ()
    #: Owner-side fields: functions run on the node owning a key (streaming.owner_fields).
    fields: Sequence[OwnerField] = ()
    #: A static HTML page the nodes serve at /dashboard (it reads the API like any client: app.http.server).
    dashboard: Path | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise DefinitionError(f"app name {self.name!r}: use a letter then letters, digits or '_'")
        if self.dashboard is not None and not Path(self.dashboard).is_file():
            raise DefinitionError(f"app {self.name!r}: dashboard {self.dashboard} is not a file")
        topics = {t.name for t in self.topics}
        names = [s.name for s in self.stores]
        if len(set(names)) != len(names):
            raise DefinitionError(f"app {self.name!r}: store names must be unique, got {names}")
        for store in self.stores:
            if store.topic not in topics:
                raise DefinitionError(f"store {store.name!r} reads topic {store.topic!r}, which the app lacks")
        for store in self.stores:  # every store's topic exists: the checks below may look any of them up
            if self.topic(store.topic).table:
                _check_table_store(store)
            if store.join is not None:
                self._check_join(store, store.join)
            if store.ranks is not None:
                self._check_ranking(store)
        self._check_entities()
        if self.fields:
            from iqgraph.streaming.owner_fields import check_owner_fields  # it imports this module

            check_owner_fields(self)

    def _check_ranking(self, ranking: StoreDefinition) -> None:
        ranked = next((s for s in self.stores if s.name == ranking.ranks), None)
        if ranked is None or not store_class(ranked.kind).rankable:
            raise DefinitionError(
                f"ranking {ranking.name!r} ranks {ranking.ranks!r}: add that key-value store to the app"
            )
        if not ranked.co_partitioned:
            raise DefinitionError(
                f"ranking {ranking.name!r} ranks {ranked.name!r}, which is keyed by column {ranked.key!r}: a ranking "
                "needs a store keyed by the record key (produce the records keyed by the member)"
            )
        if ranked.aggregate.kind in ("latest", "latest_by_time"):
            raise DefinitionError(
                f"ranking {ranking.name!r} ranks {ranked.name!r}, whose values are records (latest): rank a number"
                " (count, sum, min, max, avg or a numeric user aggregation)"
            )

    def _check_join(self, store: StoreDefinition, join: Join) -> None:
        tables = [s.name for s in self.stores if self.topic(s.topic).table]
        if join.table not in tables:
            raise DefinitionError(
                f"store {store.name!r} joins {join.table!r}, which is not a table store (tables: {tables or 'none'})"
            )
        if self.topic(self.store(join.table).topic).value_format not in ("json", "avro"):
            raise DefinitionError(f"store {store.name!r} joins {join.table!r}, whose values have no columns to join")
        table_topic, stream_topic = self.topic(self.store(join.table).topic), self.topic(store.topic)
        if table_topic.global_table:
            return
        if join.on is not None:
            raise DefinitionError(
                f"store {store.name!r} joins {join.table!r} on column {join.on!r}: a join on a column needs a "
                f"global table (Topic({table_topic.name!r}, ..., table=True, global_table=True))"
            )
        if (table_topic.partitions, table_topic.key_format) != (stream_topic.partitions, stream_topic.key_format):
            raise DefinitionError(
                f"store {store.name!r} joins {join.table!r} on the record key: topics {stream_topic.name!r} and "
                f"{table_topic.name!r} must be co-partitioned — the same partitions ({stream_topic.partitions} vs "
                f"{table_topic.partitions}) and key format ({stream_topic.key_format} vs {table_topic.key_format})"
                " — or make the table global"
            )

    def _check_entities(self) -> None:
        entities = {e.name: e for e in self.entities}
        if len(entities) != len(self.entities):
            raise DefinitionError(
                f"app {self.name!r}: entity names must be unique, got {[e.name for e in self.entities]}"
            )
        stores = {s.name: s for s in self.stores}
        for entity in self.entities:
            unknown = [name for name in entity.stores if name not in stores]
            if unknown:
                raise DefinitionError(
                    f"entity {entity.name!r} composes {unknown[0]!r}, which is not a store of the app"
                )
            rankings = [name for name in entity.stores if stores[name].ranks is not None]
            if rankings:
                raise DefinitionError(
                    f"entity {entity.name!r} composes {rankings[0]!r}, a ranking: it keeps no value per key "
                    f"(compose the store it ranks, {stores[rankings[0]].ranks!r})"
                )
            types = {name: stores[name].resolved_key_type(self.topic(stores[name].topic)) for name in entity.stores}
            if len(set(types.values())) > 1:
                raise DefinitionError(f"entity {entity.name!r}: its stores must share a key type, got {types}")
        for store in self.stores:
            for relation in store.relations:
                if relation.entity not in entities:
                    raise DefinitionError(
                        f"store {store.name!r}: relation {relation.field!r} refers to unknown entity "
                        f"{relation.entity!r} (entities: {', '.join(entities) or 'none'})"
                    )

    def entity_key_type(self, entity: Entity) -> Literal["string", "int"]:
        """Return the key type the stores of entity share."""
        store = self.store(entity.stores[0])
        return store.resolved_key_type(self.topic(store.topic))

    def copartitioned_joins(self) -> list[tuple[str, str]]:
        """Return (stream topic, table topic) of every join with a table that is not global."""
        pairs = {
            (store.topic, self.store(store.join.table).topic)
            for store in self.stores
            if store.join is not None and not self.topic(self.store(store.join.table).topic).global_table
        }
        return sorted(pairs)

    def addressed(self, event: Event) -> tuple[Topic, str | int | None, Any]:
        """Return an event's topic, key and value (a two-item event is for the first topic)."""
        if len(event) == 3:
            return self.topic(event[0]), event[1], event[2]
        return self.topics[0], event[0], event[1]

    def topic(self, name: str) -> Topic:
        """Return the topic called name; raise DefinitionError naming the app's topics."""
        for topic in self.topics:
            if topic.name == name:
                return topic
        raise DefinitionError(
            f"no topic {name!r} in app {self.name!r} (topics: {', '.join(t.name for t in self.topics)})"
        )

    def stores_of(self, topic: str) -> list[StoreDefinition]:
        """Return the stores fed from topic."""
        return [s for s in self.stores if s.topic == topic]

    def store(self, name: str) -> StoreDefinition:
        """Return the store called name; raise KeyError naming the known stores."""
        for store in self.stores:
            if store.name == name:
                return store
        raise KeyError(f"no store {name!r}; stores: {', '.join(s.name for s in self.stores)}")

    def specs(self, topic: str) -> list[StoreSpec]:
        """Return the store specs kept in each partition database of topic."""
        return [s.spec(self.topic(topic)) for s in self.stores_of(topic)]
