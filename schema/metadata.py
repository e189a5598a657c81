"""Metadata fields, in Kafka Streams' nouns: stores, node, nodes, keyMetadata.

``stores`` describes every store (as ``KafkaStreams.metadataForAllStreamsClients`` and the store
builders would); ``node`` and ``nodes`` are this node and the cluster as this node knows it, with the
state and lag of each partition a node hosts; ``keyMetadata(store, key)`` is ``KeyQueryMetadata``:
the key's partition, active node and standby nodes. ``keyMetadata`` takes the store by name
(``order_count``) or by field (``orderCount``), and the key as a String (decimal digits for Long keys).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import strawberry

from iqgraph.schema.dynamic import Arg, Field, resolved_field, resolver_with
from iqgraph.schema.errors import UNKNOWN_STORE, ApiError, store_errors
from iqgraph.schema.resolving import StorePlan, context
from iqgraph.schema.scalars import Long
from iqgraph.schema.types import KeyQueryMetadata as KeyQueryInfo
from iqgraph.schema.types import NodeInfo, PartitionInfo, StoreInfo


@strawberry.enum(description="The kind of a state store.")
class StoreKind(enum.Enum):
    KEY_VALUE = "key_value"
    WINDOW = "window"
    BLOOM = "bloom"
    RANKING = "ranking"


@strawberry.type(description="Where one partition of a store lives.")
class PartitionPlacement:
    partition: int
    active_node: str | None = strawberry.field(description="The id of the node serving it; null if none now.")
    standby_nodes: list[str] = strawberry.field(description="The ids of the nodes keeping standby copies.")


@strawberry.type(description="A state store of the app.")
class StoreMetadata:
    name: str = strawberry.field(description="The store's name, as defined in the app.")
    graphql_field: str | None = strawberry.field(name="field", description="The root field that queries it.")
    kind: StoreKind
    topic: str = strawberry.field(description="The topic the store is fed from.")
    partitions: int = strawberry.field(description="The topic's partition count: one RocksDB each.")
    co_partitioned: bool = strawberry.field(
        description="Whether keys are the record keys, so each key lives in the partition the producer chose."
    )
    partitioner: str = strawberry.field(
        description="How keys are routed to partitions: murmur2 or consistent_random (configured, or detected from "
        "the records), mixed (producers use both: reads ask both candidates), unknown (nothing tells them apart "
        "yet: both asked), unexplained (keys neither explains: PARTITIONER_MISMATCH)."
    )
    key_type: str = strawberry.field(description="The GraphQL type of keys: String or Long.")
    value_type: str = strawberry.field(description="The GraphQL type of values, e.g. Long or LatestOrder.")
    spark_value_type: str = strawberry.field(description="The Spark type of values, e.g. bigint or struct<…>.")
    aggregation: str | None = strawberry.field(description="count, sum, min, max, avg or latest.")
    window_size_ms: Long | None = strawberry.field(description="Window size (window stores).")
    window_advance_ms: Long | None = strawberry.field(description="Window hop (window stores).")
    false_positive_rate: float | None = strawberry.field(description="Bloom stores' false-positive rate.")
    description: str | None = strawberry.field(description="What the app says the store holds.")
    placement: list[PartitionPlacement] = strawberry.field(
        description="Where each partition lives: its active node and standby nodes, as this node knows them."
    )


@strawberry.type(description="A topic-partition as a node hosts it.")
class PartitionMetadata:
    topic: str
    partition: int
    role: str = strawberry.field(description="active or standby.")
    state: str = strawberry.field(
        description=(
            "CREATED, RESTORING, RUNNING, DATA_LOST (Kafka deleted records before they were applied) or CLOSED."
        )
    )
    applied_offset: Long = strawberry.field(description="The next offset to apply: everything before is in.")
    end_offset: Long = strawberry.field(description="The topic-partition's end offset, as last seen.")
    lag: Long = strawberry.field(description="How many records the stores are behind the topic.")
    seconds_since_applied: float = strawberry.field(
        description="Seconds since the last batch was applied to the partition (or since it opened)."
    )
    stalled: bool = strawberry.field(
        description="Records wait and no batch was applied for longer than the node's stall timeout."
    )


@strawberry.type(description="The streaming queries that keep a node's stores.")
class PipelineMetadata:
    state: str = strawberry.field(description="RUNNING, or DEAD: a query died and restarts after a backoff.")
    restarts: int = strawberry.field(description="How many times the supervisor restarted the queries.")
    deaths_in_a_row: int = strawberry.field(description="Deaths since the queries last ran for a while.")
    keeps_dying: bool = strawberry.field(description="Died so many times in a row that the node is not ready.")
    last_error: str | None = strawberry.field(description="The first line of the last death's error.")


@strawberry.type(description="A node of the cluster: one process serving this API.")
class NodeMetadata:
    id: str
    url: str
    state: str = strawberry.field(description="STARTING, RUNNING or STOPPING.")
    partitions: list[PartitionMetadata] = strawberry.field(description="The partitions the node hosts.")
    pipeline: PipelineMetadata | None = strawberry.field(
        description="How its streaming queries are doing; null when not known (a node down or starting)."
    )


@strawberry.type(description="Where a key lives (Kafka Streams' KeyQueryMetadata).")
class KeyQueryMetadata:
    store: str
    key: str
    partition: int | None = strawberry.field(
        description="The key's partition; null when it may be in more than one (see partitions and note)."
    )
    active_node: str | None = strawberry.field(description="The id of the node serving it; null if none now.")
    standby_nodes: list[str] = strawberry.field(description="The ids of the nodes keeping standby copies.")
    partitions: list[int] = strawberry.field(description="Every partition a read of the key asks.")
    note: str | None = strawberry.field(
        description="Why the key has no single partition: a store keyed by a column, or producers mixing partitioners."
    )


def store_metadata(
    info: StoreInfo, plan: StorePlan | None, placement: Sequence[KeyQueryInfo] = (), partitioner: str = "murmur2"
) -> StoreMetadata:
    """Return the metadata of store info (plan: its place in the schema, if it has one)."""
    return StoreMetadata(
        partitioner=partitioner,
        placement=[
            PartitionPlacement(
                partition=p.partition or 0, active_node=p.active_node, standby_nodes=list(p.standby_nodes)
            )
            for p in placement
        ],
        name=info.name,
        graphql_field=plan.field if plan else None,
        kind=StoreKind(info.kind),
        topic=info.topic,
        partitions=info.partitions,
        co_partitioned=info.co_partitioned,
        key_type=plan.key.graphql if plan else ("Long" if info.key_type == "int" else "String"),
        value_type=plan.value.graphql if plan else "JSON",
        spark_value_type=info.value_type.simpleString(),
        aggregation=info.aggregation,
        window_size_ms=Long(info.window_size_ms) if info.window_size_ms is not None else None,
        window_advance_ms=Long(info.window_advance_ms) if info.window_advance_ms is not None else None,
        false_positive_rate=info.false_positive_rate,
        description=info.description,
    )


def node_metadata(node: NodeInfo) -> NodeMetadata:
    """Return the metadata of a node."""
    pipeline = node.pipeline
    return NodeMetadata(
        id=node.id,
        url=node.url,
        state=node.state,
        partitions=[_partition(p) for p in node.partitions],
        pipeline=None
        if pipeline is None
        else PipelineMetadata(
            state=pipeline.state,
            restarts=pipeline.restarts,
            deaths_in_a_row=pipeline.deaths_in_a_row,
            keeps_dying=pipeline.keeps_dying,
            last_error=pipeline.last_error,
        ),
    )


def _partition(p: PartitionInfo) -> PartitionMetadata:
    return PartitionMetadata(
        topic=p.topic,
        partition=p.partition,
        role=p.role,
        state=p.state,
        applied_offset=Long(p.applied_offset),
        end_offset=Long(p.end_offset),
        lag=Long(p.lag),
        seconds_since_applied=p.seconds_since_applied,
        stalled=p.stalled,
    )


def _key_metadata(found: KeyQueryInfo, key: str) -> KeyQueryMetadata:
    return KeyQueryMetadata(
        store=found.store,
        key=key,
        partition=found.partition,
        active_node=found.active_node,
        standby_nodes=list(found.standby_nodes),
        partitions=list(found.partitions),
        note=found.note,
    )


def metadata_fields(plans: Mapping[str, StorePlan]) -> list[Field]:
    """Return the root fields stores, node, nodes and keyMetadata."""
    by_field = {plan.field: plan for plan in plans.values()}

    def stores(root: Any, info: strawberry.Info) -> list[StoreMetadata]:
        with store_errors():
            queries = context(info).queries
            return [
                store_metadata(s, plans.get(s.name), queries.placement(s.name), queries.routing_partitioner(s.name))
                for s in queries.stores()
            ]

    def node(root: Any, info: strawberry.Info) -> NodeMetadata:
        with store_errors():
            return node_metadata(context(info).queries.node())

    async def nodes(root: Any, info: strawberry.Info) -> list[NodeMetadata]:
        with store_errors():
            return [node_metadata(n) for n in await context(info).queries.nodes()]

    def key_metadata(root: Any, info: strawberry.Info, store: str, key: str) -> KeyQueryMetadata:
        plan = plans.get(store) or by_field.get(store)
        if plan is None:
            raise ApiError(f"no store named {store!r} (stores: {', '.join(plans)})", UNKNOWN_STORE)
        with store_errors():
            return _key_metadata(context(info).queries.key_metadata(plan.name, plan.key.parse(key)), key)

    store_args = [
        Arg("store", "store", str, "The store's name (or its root field)."),
        Arg("key", "key", str, "The key; for Long keys, its decimal digits."),
    ]
    return [
        resolved_field("stores", resolver_with(stores, [], list[StoreMetadata] | None), "Every store of the app."),
        resolved_field("node", resolver_with(node, [], NodeMetadata | None), "The node answering this request."),
        resolved_field(
            "nodes", resolver_with(nodes, [], list[NodeMetadata] | None), "Every node, as this node knows them."
        ),
        resolved_field(
            "keyMetadata",
            resolver_with(key_metadata, store_args, KeyQueryMetadata | None),
            "Where a key of a store lives: its partition, active node and standby nodes.",
        ),
    ]


METADATA_FIELDS = ("stores", "node", "nodes", "keyMetadata")
METADATA_TYPES = (
    "StoreKind",
    "PartitionPlacement",
    "StoreMetadata",
    "PartitionMetadata",
    "NodeMetadata",
    "KeyQueryMetadata",
)
