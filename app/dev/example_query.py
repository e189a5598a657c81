"""An example query for an app's stores, printed by ``iqgraph dev`` beside the GraphiQL URL.

It is built from the served schema (introspected), so it is valid for any app: for each store one
point read — ``get`` (key-value), ``fetch`` (window), ``mightContain`` (bloom) — with a key seen in
the data fed to the app, and every scalar field of the value selected (a ranking: its top five over all
groups); then each entity for a key one of its stores has, with its scalar fields. ``example_subscription``
follows the first key-value store's key live (``<store>Watch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from graphql import (
    GraphQLField,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLSchema,
    build_client_schema,
    get_introspection_query,
)

from iqgraph.schema.naming import camel_case
from iqgraph.streaming.definitions import App

#: The point read tried on each store type, in this order.
POINT_READS = ("get", "fetch", "mightContain")
TOP_N = 5
INTROSPECTION = get_introspection_query(descriptions=False)
MAX_FIELDS = 8


def schema_from_introspection(result: Mapping[str, Any]) -> GraphQLSchema:
    """Return the schema described by an introspection query's data."""
    return build_client_schema(result)  # type: ignore[arg-type]


def sample_keys(app: App, records: list[tuple[str, Any, Any]]) -> dict[str, Any]:
    """Return a key per store from sample records (topic, key, value): the record key, or the store's column."""
    keys: dict[str, Any] = {}
    for store in app.stores:
        for topic, key, value in records:
            if value is None:  # a tombstone: the key is gone
                continue
            found = key if store.key is None else (value or {}).get(store.key)
            if topic == store.topic and found is not None:
                keys[store.name] = found
                break
    return keys


def example_query(schema: GraphQLSchema, app: App, keys: Mapping[str, Any]) -> str:
    """Return a query that reads keys[store] from every store that has a sample key."""
    query_type = schema.query_type
    assert query_type is not None  # noqa: S101 - every GraphQL schema has a query type
    lines = []
    for store in app.stores:
        field = query_type.fields.get(camel_case(store.name))
        if store.name in keys and field is not None:
            read = _point_read(_named(field.type), keys[store.name])
            if read:
                lines.append(f"  {camel_case(store.name)} {{ {read} }}")
    for entity in app.entities:  # an entity reads its stores at once: the first key a store of it has
        field = query_type.fields.get(camel_case(entity.name))
        key = next((keys[s] for s in entity.stores if s in keys), None)
        if field is not None and key is not None:
            lines.append(f"  {camel_case(entity.name)}(key: {orjson.dumps(key).decode()}){_selection(field)}")
    return "{\n" + "\n".join(lines) + "\n}" if lines else "{ stores { name kind keyType valueType } }"


def example_subscription(schema: GraphQLSchema, app: App, keys: Mapping[str, Any]) -> str | None:
    """Return a subscription following the sample key of the first store it can follow (None: no such store)."""
    subscription = schema.subscription_type
    for store in app.stores:
        name = f"{camel_case(store.name)}Watch"
        field = None if subscription is None else subscription.fields.get(name)
        if field is not None and store.name in keys:
            value = f"value{_selection(_named(field.type).fields['value'])}"
            key = orjson.dumps(keys[store.name]).decode()
            return f"subscription {{\n  {name}(keys: [{key}]) {{ key {value} position {{ partition offset }} }}\n}}"
    return None


def _point_read(store_type: Any, key: Any) -> str:
    if not isinstance(store_type, GraphQLObjectType):
        return ""
    for name in POINT_READS:
        field = store_type.fields.get(name)
        if field is not None:
            return f"{name}(key: {orjson.dumps(key).decode()}){_selection(field)}"
    top = store_type.fields.get("top")  # a ranking: its head over every group
    return f"top(first: {TOP_N}){_selection(top)}" if top is not None else ""


def _selection(field: GraphQLField) -> str:
    """Return the selection set of a field's type: nothing for a scalar, its scalar fields for an object."""
    named = _named(field.type)
    if not isinstance(named, GraphQLObjectType):
        return ""
    scalars = [n for n, f in named.fields.items() if not isinstance(_named(f.type), GraphQLObjectType)]
    return " { " + " ".join(scalars[:MAX_FIELDS]) + " }"


def _named(kind: Any) -> Any:
    while isinstance(kind, GraphQLNonNull | GraphQLList):
        kind = kind.of_type
    return kind
