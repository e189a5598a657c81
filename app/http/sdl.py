"""``iqgraph schema``: the SDL of the schema a node serves for an app, for codegen.

The stores' value types come from the topics' declared schemas (``streaming.static_types``): no JVM, and
nothing of the node's server is imported (``iqgraph schema`` answers in about 2 s). Only an app with a store
that Spark alone can type (a transform) starts a brief local Spark session, after one line on stderr saying
which store.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from pyspark.sql.types import DataType

from iqgraph.app.catalog import entity_infos, store_info
from iqgraph.app.owner.runner import owner_field_infos
from iqgraph.schema import Limits, build_schema
from iqgraph.streaming.definitions import App
from iqgraph.streaming.static_types import NeedsSparkError, static_value_types


def print_schema(app: App) -> int:
    """Print the SDL of app's schema; return the exit code."""
    try:
        types = static_value_types(app)
    except NeedsSparkError as why:
        sys.stderr.write(f"iqgraph schema: {why}: starting a local Spark session to type the stores\n")
        types = spark_value_types(app)
    sys.stdout.write(sdl(app, types))
    return 0


def sdl(app: App, types: Mapping[str, DataType]) -> str:
    """Return the SDL of the schema a node serves for app, given its stores' value types."""
    schema = build_schema(
        [store_info(app, s, types[s.name]) for s in app.stores],
        Limits(),
        entities=entity_infos(app),
        owner_fields=owner_field_infos(app),
        description=app.description,
        subscriptions=True,  # the schema a node serves
    )
    return schema.as_str() + "\n"


def spark_value_types(app: App) -> dict[str, DataType]:
    """Return the value types of app's stores as a brief local Spark session analyses them."""
    from iqgraph.streaming.session import build_spark_session
    from iqgraph.streaming.value_types import value_types

    spark = build_spark_session("local[1]", app_name="iqgraph-schema", log_level="ERROR", kafka_connector=False)
    try:
        return value_types(app, spark)
    finally:
        spark.stop()
