"""iqgraph: interactive queries over the state of PySpark streaming jobs, served as one GraphQL API.

Everything a user writes comes from here, and only from here (the examples import nothing else)::

    from iqgraph import App, Topic, key_value_store, window_store, bloom_store, count, sum_, tumbling

- an app: ``App``, ``Topic``, ``KafkaSettings``, the stores (``key_value_store``, ``window_store``,
  ``bloom_store``, ``table_store``, ``ranking_store``), ``Join``, ``Entity``, ``Relation``;
- aggregations: ``count``, ``sum_``, ``min_``, ``max_``, ``avg``, ``latest``, ``collect``, a user's own
  (``UserAggregation``, ``aggregate``) and the ready-made sketches ``hyperloglog`` and ``histogram``;
  windows: ``tumbling``, ``hopping``;
- an event generator: ``Event``, ``EventGenerator``, ``iso_timestamp`` (epoch ms as a timestamp column's text);
- owner-side fields: ``owner_field``, ``OwnerField``, and what the function receives, ``StoreViews`` (with
  ``KeyValueView``, ``WindowView``, ``BloomView`` and the ``WindowedValue`` a window view returns);
- errors: ``UserError``, the root of every error a user can fix at start (``DefinitionError`` among them);
- ``partition_for``: the partition of a key, as the producers' partitioner puts it.

The packages install under this one name (the source folders are mapped by setuptools' ``package-dir``):
``iqgraph.stores`` (RocksDB partition databases and store views), ``iqgraph.streaming`` (definitions,
the Kafka source, the sink, the query runner), ``iqgraph.schema`` (the GraphQL schema) and ``iqgraph.app``
(the node, its server and the command line); ``iqgraph.examples`` holds the example apps. Their modules are
the implementation, not the API. Defining an app does not start a JVM: Spark is imported where a query runs.
"""

from iqgraph.stores import UserError, WindowedValue
from iqgraph.streaming import (
    Aggregate,
    App,
    BloomView,
    DefinitionError,
    Entity,
    Event,
    EventGenerator,
    Join,
    KafkaSettings,
    KeyValueView,
    OwnerField,
    Relation,
    StoreDefinition,
    StoreViews,
    Topic,
    UserAggregation,
    WindowView,
    aggregate,
    avg,
    bloom_store,
    collect,
    count,
    histogram,
    hopping,
    hyperloglog,
    iso_timestamp,
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
    "UserError",
    "WindowView",
    "WindowedValue",
    "__version__",
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
    "latest",
    "max_",
    "min_",
    "owner_field",
    "partition_for",
    "ranking_store",
    "sum_",
    "table_store",
    "tumbling",
    "window_store",
]
