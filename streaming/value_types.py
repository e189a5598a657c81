"""The Spark type of each store's values: what the GraphQL schema turns into typed fields.

A store's records are the topic's decoded records after the store's transformation, so the value type
is found by running the decode and the transformation on an empty DataFrame (analysis only, no job).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    IntegralType,
    LongType,
    NumericType,
    StructField,
    StructType,
)

from iqgraph.stores import StoreKind
from iqgraph.streaming.decode import decode, value_schema
from iqgraph.streaming.definitions import App, DefinitionError, StoreDefinition
from iqgraph.streaming.joins import empty_joins
from iqgraph.streaming.kafka_source import SCHEMA
from iqgraph.streaming.partials import store_frame

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _aggregate_type(store: StoreDefinition, records: StructType) -> DataType:
    agg = store.aggregate
    if store.kind is StoreKind.BLOOM:
        return BooleanType()
    if agg.kind == "count":
        return LongType()
    if agg.user is not None:  # typed by the user; its rows are the columns named (default: all)
        return agg.user.spark_type(_columns_type(store, records))
    if agg.kind == "latest":
        return _columns_type(store, records)
    column = str(agg.column)
    if column not in records.fieldNames():
        raise DefinitionError(f"store {store.name!r} aggregates column {column!r}, which its records lack")
    data_type = records[column].dataType
    if not isinstance(data_type, NumericType):
        raise DefinitionError(
            f"store {store.name!r}: {agg.kind} needs a numeric column; {column!r} is {data_type.simpleString()}"
        )
    if agg.kind != "avg" and isinstance(data_type, IntegralType):
        return LongType()
    return DoubleType()


def _columns_type(store: StoreDefinition, records: StructType) -> StructType:
    """Return the struct of the columns a store keeps (latest) or aggregates (a user aggregation's rows)."""
    names = store.aggregate.columns or tuple(n for n in records.fieldNames() if not n.startswith("_"))
    missing = [n for n in names if n not in records.fieldNames()]
    if missing:
        raise DefinitionError(f"store {store.name!r} uses columns {missing}, which its records lack")
    return StructType([records[n] for n in names])


def value_types(app: App, spark: SparkSession) -> dict[str, DataType]:
    """Return the Spark type of the values of every store of app."""
    types: dict[str, DataType] = {}
    for topic in app.topics:
        empty = spark.createDataFrame([], SCHEMA)
        decoded = decode(empty, topic, value_schema(topic))
        good = decoded.where(decoded["_error"].isNull())
        stores = app.stores_of(topic.name)
        joins = empty_joins(spark, app, stores)
        for store in stores:
            types[store.name] = _aggregate_type(store, store_frame(good, store, joins.get(store.name)).schema)
    for store in app.stores:
        if store.kind is StoreKind.RANKING:
            types[store.name] = _ranked_type(store, types)
    return types


def _ranked_type(ranking: StoreDefinition, types: dict[str, DataType]) -> DataType:
    """Return the type of a ranking's values (those of the store it ranks); refuse values that are not numbers."""
    ranked = types[str(ranking.ranks)]
    if not isinstance(ranked, NumericType) or isinstance(ranked, DecimalType):
        raise DefinitionError(
            f"ranking {ranking.name!r} ranks {ranking.ranks!r}, whose values are {ranked.simpleString()}: rank "
            "integers or doubles"
        )
    return ranked


def nullable(data_type: DataType, name: str = "value") -> StructField:
    """Return a nullable field of data_type (helper for schema generators)."""
    return StructField(name, data_type, True)
