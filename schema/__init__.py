"""iqgraph.schema: the GraphQL schema of an app, generated from its stores.

``build_schema(stores, limits)`` makes the Strawberry schema; ``context_getter(queries, limits)`` makes
each request's context (the node's StoreQueries and fresh DataLoaders); ``GraphQLApp`` serves both over
ASGI. Naming conventions: see ``schema.builder``; errors and their codes: see ``schema.errors``.
"""

from iqgraph.schema.asgi import GraphQLApp
from iqgraph.schema.builder import IqGraphSchema, SchemaDefinitionError, build_schema
from iqgraph.schema.context import Context, ContextGetter, context_getter
from iqgraph.schema.errors import ApiError
from iqgraph.schema.limits import Limits
from iqgraph.schema.scalars import DateTime, Long
from iqgraph.schema.types import (
    EntityInfo,
    KeyQueryMetadata,
    NodeInfo,
    PartitionInfo,
    RelationInfo,
    StoreInfo,
    StoreQueries,
)

__all__ = [
    "ApiError",
    "Context",
    "ContextGetter",
    "DateTime",
    "EntityInfo",
    "GraphQLApp",
    "IqGraphSchema",
    "KeyQueryMetadata",
    "Limits",
    "Long",
    "NodeInfo",
    "PartitionInfo",
    "RelationInfo",
    "SchemaDefinitionError",
    "StoreInfo",
    "StoreQueries",
    "build_schema",
    "context_getter",
]
