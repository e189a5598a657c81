"""The production query path over partition databases a test opened: one node, a one-member cluster map."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
from pyspark.sql.types import DataType
from starlette.applications import Starlette

from iqgraph.app.catalog import entity_infos
from iqgraph.app.cluster.membership import Member, StaticMembership
from iqgraph.app.http.rest import rest_routes
from iqgraph.app.owner.calls import call_many
from iqgraph.app.owner.runner import OwnerFieldRunner, owner_field_infos
from iqgraph.app.query.partitions import LocalPartitions
from iqgraph.app.query.store_queries import ClusterStoreQueries, RetryPolicy
from iqgraph.schema import GraphQLApp, Limits, build_schema
from iqgraph.stores import PartitionStores
from iqgraph.streaming.definitions import App


def single_node(
    app: App,
    types: Mapping[str, DataType],
    hosted: Mapping[str, Mapping[int, PartitionStores]],
    deadline_ms: int = 50,
    cls: type[ClusterStoreQueries] = ClusterStoreQueries,
) -> Any:
    """Return the production StoreQueries of one node hosting every partition in hosted (a one-member map).

    The tests place keys with murmur2 (apps.shop_partition), as a Java producer would: routing is told so.
    """
    local = LocalPartitions(app, hosted, owner=OwnerFieldRunner)
    member = Member(local.node_id, local.url)
    membership = StaticMembership(member.id, [member], {t.name: t.partitions for t in app.topics})
    return cls(
        app,
        types,
        local,
        membership,
        retry=RetryPolicy(deadline_ms),
        partitioner=lambda topic: "murmur2",
        owner_calls=call_many,
    )


def rest_client(queries: Any, app: App | None = None) -> httpx.AsyncClient:
    """Return a client of the REST routes of a node answering from queries (through its public GraphQL app).

    app: the app whose entities and owner-side fields the schema shows too (its relations need its entities).
    """
    limits = Limits()
    extra: dict[str, Any] = {}
    if app is not None:
        extra = {"entities": entity_infos(app), "owner_fields": owner_field_infos(app)}
    graphql = GraphQLApp(build_schema(queries.stores(), limits, **extra), queries, limits)
    app = Starlette(routes=rest_routes(queries, graphql))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node")
