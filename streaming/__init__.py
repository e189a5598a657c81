"""Streaming: store definitions, the Kafka source for Spark, the foreachBatch sink, the query runner.

What a user writes is defined here and re-exported by ``iqgraph`` (``from iqgraph import App, Topic, count, …``);
the Spark-side modules (``kafka_source``, ``sink``, ``runner``) are imported where they are used, so
that defining an app does not start a JVM.
"""

from iqgraph.streaming.collect import collect
from iqgraph.streaming.definitions import (
    Aggregate,
    App,
    DefinitionError,
    Entity,
    Event,
    EventGenerator,
    Join,
    KafkaSettings,
    Relation,
    StoreDefinition,
    Topic,
    avg,
    bloom_store,
    count,
    hopping,
    iso_timestamp,
    key_value_store,
    latest,
    max_,
    min_,
    ranking_store,
    sum_,
    table_store,
    tumbling,
    window_store,
)
from iqgraph.streaming.owner_fields import OwnerField, owner_field
from iqgraph.streaming.partitioner import partition_for
from iqgraph.streaming.sketches import histogram, hyperloglog
from iqgraph.streaming.types import BloomView, KeyValueView, StoreViews, WindowView
from iqgraph.streaming.user_aggregations import UserAggregation, aggregate

__all__ = [
    "Aggregate",
    "App",
    "BloomView",
    "DefinitionError",
    "Entity",
    "Event",
    "EventGenerator",
    "Join",
    "KafkaSettings",
    "KeyValueView",
    "OwnerField",
    "Relation",
    "StoreDefinition",
    "StoreViews",
    "Topic",
    "UserAggregation",
    "WindowView",
    "aggregate",
    "avg",
    "bloom_store",
    "collect",
    "count",
    "histogram",
    "hopping",
    "hyperloglog",
    "iso_timestamp",
    "key_value_store",
    "ranking_store",
    "latest",
    "max_",
    "min_",
    "owner_field",
    "partition_for",
    "sum_",
    "table_store",
    "tumbling",
    "window_store",
]
