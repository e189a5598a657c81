"""iqgraph: interactive queries over the state of PySpark streaming jobs, served as one GraphQL API.

What a user writes comes from here::

    from iqgraph import App, Topic, key_value_store, window_store, bloom_store, count, sum_, tumbling

The packages install under this one name (the source folders are mapped by setuptools' ``package-dir``):
``iqgraph.stores`` (RocksDB partition databases and store views), ``iqgraph.streaming`` (definitions,
the Kafka source, the sink, the query runner), ``iqgraph.schema`` (the GraphQL schema) and ``iqgraph.app``
(the node, its server and the command line); ``iqgraph.examples`` holds the shop and weblog apps.
Defining an app does not start a JVM: Spark is imported where a query runs.
"""

from iqgraph.streaming import (
    Aggregate,
    App,
    DefinitionError,
    Entity,
    Join,
    KafkaSettings,
    OwnerField,
    Relation,
    StoreDefinition,
    Topic,
    UserAggregation,
    aggregate,
    avg,
    bloom_store,
    collect,
    count,
    hopping,
    key_value_store,
    latest,
    max_,
    min_,
    owner_field,
    partition_for,
    ranking_store,
    sum_,
    table_store,
    tumbling,
    window_store,
)

__version__ = "0.1.0"

__all__ = [
    "Aggregate",
    "App",
    "DefinitionError",
    "Entity",
    "Join",
    "KafkaSettings",
    "OwnerField",
    "Relation",
    "StoreDefinition",
    "Topic",
    "UserAggregation",
    "__version__",
    "aggregate",
    "avg",
    "bloom_store",
    "collect",
    "count",
    "hopping",
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
