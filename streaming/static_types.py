"""The Spark type of each store's values, found in Python from the topics' declared schemas: no JVM.

``streaming.value_types`` lets Spark analyse decode → join → transform on an empty DataFrame, which needs a
session (15-30 s to start one). What that analysis finds is fixed by our own code, so this module follows
the same rules in Python (``iqgraph schema`` prints the SDL without starting Spark):

- decode (``streaming.decode``): the Kafka columns ``_topic`` … ``_error``, all nullable, then the value's
  columns. ``from_json`` makes the declared schema nullable at every level (Spark forces its schema
  nullable) and keeps the columns' comments; string and bytes values are one nullable ``value`` column;
- a join (``streaming.joins.joined_schema``): the table's kept columns as its topic declares them;
- a transform is the user's code on a DataFrame: one that only filters keeps its records' schema (it runs on
  a stand-in DataFrame, ``streaming.filter_frame``); what any other returns only Spark can say.

What only Spark can type raises ``NeedsSparkError`` naming the store (or topic) and why: a transform that
does more than filter, a DDL string this module's parser (``streaming.ddl``) does not read, a char/varchar
or any type outside decode's, a comment with escapes. The caller then asks Spark (``value_types``) for the
whole app. The rules that turn a store's records into its value type (``value_type``, ``ranked_type``) are
the same for both paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    IntegralType,
    LongType,
    MapType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iqgraph.stores import store_class
from iqgraph.streaming.ddl import DDLError, parse_ddl
from iqgraph.streaming.decode import META_COLUMNS, value_schema
from iqgraph.streaming.definitions import App, DefinitionError, StoreDefinition, Topic
from iqgraph.streaming.filter_frame import Unsupported, filtered_schema
from iqgraph.streaming.joins import joined_schema

__all__ = ["NeedsSparkError", "check_records", "ranked_type", "static_value_types", "value_type"]

#: The records' own columns, which a transform must keep (the partials and the dead-letter topic read them).
KEPT_COLUMNS = ("_partition", "_offset", "_event_ms", "_raw_key", "_raw_value")
#: The types from_json reads (decode's value columns); anything else is left to Spark.
_DECODED = (BooleanType, NumericType, StringType, BinaryType, DateType, TimestampType, TimestampNTZType)


class NeedsSparkError(Exception):
    """A store's value type that only Spark's analysis can find; the message names the store and why."""


def static_value_types(app: App) -> dict[str, DataType]:
    """Return the Spark type of the values of every store of app, without Spark; NeedsSparkError if it cannot."""
    records: dict[str, StructType] = {}
    for topic in app.topics:
        decoded = decoded_schema(topic)
        for store in app.stores_of(topic.name):
            records[store.name] = _store_records(app, store, decoded)
    return value_types_of(app, records)


def value_types_of(app: App, records: Mapping[str, StructType]) -> dict[str, DataType]:
    """Return the value type of every store of app, given the schema of each store's records."""
    types = {store.name: value_type(store, records[store.name]) for store in app.stores}
    for store in app.stores:
        if store.ranks is not None:
            types[store.name] = ranked_type(store, types)
    return types


def decoded_schema(topic: Topic) -> StructType:
    """Return the schema of topic's decoded records (``streaming.decode``'s columns and types)."""
    declared = value_schema(topic, parse=partial(_parse_ddl, topic=topic.name))
    key: DataType = StringType() if topic.key_format == "string" else LongType()
    meta = [
        ("_topic", StringType()),
        ("_partition", IntegerType()),
        ("_offset", LongType()),
        ("_timestamp", TimestampType()),
        ("_key", key),
        ("_event_ms", LongType()),
        ("_raw_key", BinaryType()),
        ("_raw_value", BinaryType()),
        ("_error", StringType()),
    ]
    if declared is not None:
        values = [_nullable_field(f, f"topic {topic.name!r}") for f in declared.fields]
    else:
        values = [StructField("value", StringType() if topic.value_format == "string" else BinaryType(), True)]
    return StructType([StructField(name, data_type, True) for name, data_type in meta] + values)


def _parse_ddl(text: str, topic: str) -> DataType:
    """Return the type a DDL schema names, as Spark's ``DataType.fromDDL`` would; NeedsSparkError if unsure."""
    try:
        return parse_ddl(text)
    except DDLError as exc:
        raise NeedsSparkError(f"topic {topic!r}: its schema is one for Spark's DDL parser ({exc})") from None


def _nullable_field(field: StructField, where: str) -> StructField:
    """Return field as from_json reads it: nullable at every level, its comment kept."""
    comment = (field.metadata or {}).get("comment")
    if isinstance(comment, str) and "\\" in comment:  # Spark unescapes a DDL comment; streaming.ddl does not
        raise NeedsSparkError(f"{where}: column {field.name!r} has a comment with escapes")
    return StructField(field.name, _nullable(field.dataType, f"{where} column {field.name!r}"), True, field.metadata)


def _nullable(data_type: DataType, where: str) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([_nullable_field(f, where) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType, where), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType, where), _nullable(data_type.valueType, where), True)
    if isinstance(data_type, _DECODED):  # CharType and VarcharType are not StringTypes: Spark's to type
        return data_type
    raise NeedsSparkError(f"{where} is {data_type.simpleString()}, a type decode leaves to Spark")


def _store_records(app: App, store: StoreDefinition, decoded: StructType) -> StructType:
    """Return the schema of a store's records: the decoded ones after its join and its transform (if it filters)."""
    records = decoded
    if store.join is not None:
        table_topic = app.store(store.join.table).topic
        records = joined_schema(app, store, decoded, parse=partial(_parse_ddl, topic=table_topic))
    if store.transform is not None:
        try:
            records = filtered_schema(store.transform, records)
        except Unsupported as why:
            what = "ranks a store with" if store.ranks is not None else "has"
            raise NeedsSparkError(
                f"store {store.name!r} {what} a transform that does more than filter ({why})"
            ) from None
    check_records(store, records.fieldNames())
    return records


def check_records(store: StoreDefinition, columns: Sequence[str]) -> None:
    """Refuse a store's records (after its join and transform) that lack the columns the store needs."""
    missing = [c for c in KEPT_COLUMNS if c not in columns]
    if missing:
        raise DefinitionError(
            f"the transform of store {store.name!r} dropped {missing}; keep the columns {list(META_COLUMNS)}"
        )
    if store.key is not None and store.key not in columns:
        raise DefinitionError(f"store {store.name!r} is keyed by column {store.key!r}, which its records lack")


def value_type(store: StoreDefinition, records: StructType) -> DataType:
    """Return the Spark type of a store's values, given the schema of its records (a ranking: of what it keeps)."""
    agg = store.aggregate
    if store_class(store.kind).keys_only:  # a bloom filter answers whether it saw a key
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


def ranked_type(ranking: StoreDefinition, types: Mapping[str, DataType]) -> DataType:
    """Return the type of a ranking's values (those of the store it ranks); refuse values that are not numbers."""
    ranked = types[str(ranking.ranks)]
    if not isinstance(ranked, NumericType) or isinstance(ranked, DecimalType):
        raise DefinitionError(
            f"ranking {ranking.name!r} ranks {ranking.ranks!r}, whose values are {ranked.simpleString()}: rank "
            "integers or doubles"
        )
    return ranked
