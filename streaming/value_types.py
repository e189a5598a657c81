"""The Spark type of each store's values: what the GraphQL schema turns into typed fields.

A store's records are the topic's decoded records after the store's join and transformation, so their schema
is found by running the decode, the join and the transformation on an empty DataFrame (analysis only, no job);
``streaming.static_types`` turns each store's records into its value type. It also finds them without Spark
for an app whose stores have no transform (``static_value_types``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import DataType, StructField, StructType

from iqgraph.streaming.decode import decode, value_schema
from iqgraph.streaming.definitions import App
from iqgraph.streaming.joins import empty_joins
from iqgraph.streaming.kafka_source import SCHEMA
from iqgraph.streaming.partials import store_frame
from iqgraph.streaming.static_types import value_types_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def value_types(app: App, spark: SparkSession) -> dict[str, DataType]:
    """Return the Spark type of the values of every store of app."""
    records: dict[str, StructType] = {}
    for topic in app.topics:
        empty = spark.createDataFrame([], SCHEMA)
        decoded = decode(empty, topic, value_schema(topic))
        good = decoded.where(decoded["_error"].isNull())
        stores = app.stores_of(topic.name)
        joins = empty_joins(spark, app, stores)
        for store in stores:
            records[store.name] = store_frame(good, store, joins.get(store.name)).schema
    return value_types_of(app, records)


def nullable(data_type: DataType, name: str = "value") -> StructField:
    """Return a nullable field of data_type (helper for schema generators)."""
    return StructField(name, data_type, True)
