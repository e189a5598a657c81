"""Every shipped example's stores filled from its generator through the real sink, and its node's query path:
what the tests that walk every store of every example read (``filled_example`` in tests/app/conftest.py).

Spark computes the partials (the session's Spark); the partitions are real RocksDB; one node's production query
path answers REST (``app.http.rest``) and GraphQL (``Example.graphql``, as a given caller).
"""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path
from typing import Any

import httpx
from graphql import GraphQLObjectType, get_named_type, is_leaf_type
from pyspark.sql import SparkSession
from starlette.applications import Starlette

from iqgraph.app.catalog import entity_infos
from iqgraph.app.dev.example_query import example_query, sample_keys
from iqgraph.app.http.rest import rest_routes
from iqgraph.app.owner.runner import owner_field_infos
from iqgraph.schema import GraphQLApp, Limits, build_schema
from iqgraph.schema.access import ANONYMOUS, PRINCIPAL_SCOPE_KEY, Principal
from iqgraph.schema.naming import camel_case
from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.streaming.decode import serialize_value
from iqgraph.streaming.definitions import App
from iqgraph.streaming.kafka_source import SCHEMA
from iqgraph.streaming.partitioner import partition_for, serialize_key
from iqgraph.streaming.sink import StoreSink
from iqgraph.streaming.static_types import NeedsSparkError, static_value_types
from iqgraph.streaming.value_types import value_types
from tests.support.queries import single_node

EXAMPLES = ["bookings", "customers", "music", "shop", "weblog"]
EVENTS = 600
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


class Example:
    """One example app's stores filled from its generator, and clients of its REST routes and GraphQL."""

    def __init__(self, app: App, spark: SparkSession, root: Path) -> None:
        self.app = app
        directory = StateDirectory(root, app.name)
        self.hosted: dict[str, dict[int, PartitionStores]] = {
            t.name: {p: directory.open(t.name, p, app.specs(t.name)) for p in range(t.partitions)} for t in app.topics
        }
        for partitions in self.hosted.values():
            for stores in partitions.values():
                stores.db.set_state(PartitionState.RUNNING)
        self._ingest(spark)
        try:
            types = static_value_types(app)
        except NeedsSparkError:
            types = value_types(app, spark)
        self.queries = single_node(app, types, self.hosted)
        limits = Limits(max_page_size=1_000)
        schema = build_schema(
            self.queries.stores(), limits, entities=entity_infos(app), owner_fields=owner_field_infos(app)
        )
        self.schema = schema._schema  # noqa: SLF001 - graphql-core's: the types a client selects from
        graphql = GraphQLApp(schema, self.queries, limits)
        self._reference = GraphQLApp(schema, self.queries, limits, compiled=False)
        routes = rest_routes(self.queries, graphql)
        self.rest = httpx.AsyncClient(transport=httpx.ASGITransport(app=Starlette(routes=routes)), base_url="http://n")
        self._graphql = graphql

    def _ingest(self, spark: SparkSession) -> None:
        """Apply the generator's first EVENTS events, tables' topics first (joins read them as of now)."""
        assert self.app.generator is not None
        rows: dict[str, list[tuple[Any, ...]]] = {t.name: [] for t in self.app.topics}
        offsets: dict[tuple[str, int], int] = {}
        for i, event in enumerate(itertools.islice(self.app.generator(7, START_MS), EVENTS)):
            topic, key, value = self.app.addressed(event)
            raw_key = None if key is None else serialize_key(key, topic.key_format)
            p = (
                i % topic.partitions
                if key is None
                else partition_for(key, topic.partitions, topic.key_format, "murmur2")
            )
            offset = offsets.get((topic.name, p), 0)
            offsets[(topic.name, p)] = offset + 1
            raw = None if value is None else serialize_value(topic, value)
            at = dt.datetime.fromtimestamp((START_MS + i * 1_000) / 1000, dt.UTC)
            rows[topic.name].append((raw_key, raw, topic.name, p, offset, at))
        for topic in sorted(self.app.topics, key=lambda t: not t.table):
            sink = StoreSink(self.app, topic, self.hosted[topic.name], tables=lambda name: self.hosted.get(name, {}))
            sink(spark.createDataFrame(rows[topic.name], SCHEMA), 0)

    async def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return the data of query, asked by a caller who reads everything; it must have no error."""
        body = await self.response(query, variables)
        assert not body.get("errors"), (query, body["errors"])
        return body["data"]

    async def response(
        self, query: str, variables: dict[str, Any] | None = None, caller: Principal = ANONYMOUS, compiled: bool = True
    ) -> dict[str, Any]:
        """Return the whole GraphQL response of query asked by caller (compiled plans, or graphql-core alone)."""
        app = self._graphql if compiled else self._reference

        async def as_caller(scope: Any, receive: Any, send: Any) -> None:
            await app({**scope, PRINCIPAL_SCOPE_KEY: caller}, receive, send)

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=as_caller), base_url="http://n") as c:
            response = await c.post("/graphql", json={"query": query, "variables": variables or {}})
        return response.json()

    def every_root_query(self) -> str:
        """Return the query ``iqgraph dev`` prints: a read of every store (its top for a ranking) and every entity,
        with keys the generator's events have."""
        assert self.app.generator is not None
        events = itertools.islice(self.app.generator(7, START_MS), EVENTS)
        samples = [(topic.name, key, value) for topic, key, value in map(self.app.addressed, events)]
        return example_query(self.schema, self.app, sample_keys(self.app, samples))

    def selection(self, store: str, *path: str) -> str:
        """Return the selection of every field of what path (fields from store's type) leads to, a relation in its
        column's place as ``{ key }`` (written apart from REST's)."""
        named = get_named_type(self.schema.query_type.fields[camel_case(store)].type)  # type: ignore[union-attr]
        for field in path:
            named = get_named_type(named.fields[field].type)
        return _every_field(named, self.keyed(store))

    def keyed(self, store: str) -> frozenset[str]:
        """Return the fields of store's value that are relations in their column's place (named like it)."""
        info = next(s for s in self.queries.stores() if s.name == store)
        return frozenset(camel_case(r.field) for r in info.relations if r.replaces_column)

    def close(self) -> None:
        for partitions in self.hosted.values():
            for stores in partitions.values():
                stores.close()


def _every_field(named: Any, keyed: frozenset[str]) -> str:
    if is_leaf_type(named):
        return ""
    assert isinstance(named, GraphQLObjectType)
    fields = [
        name + ("{ key }" if f.args else _every_field(get_named_type(f.type), keyed))
        for name, f in named.fields.items()
        if not f.args or name in keyed
    ]
    return "{ " + " ".join(fields) + " }"
