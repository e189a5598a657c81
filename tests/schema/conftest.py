"""Fixtures of the schema tests: real partition databases in tmp_path behind the production query path.

``Api.run`` executes a document with ``schema.execute`` and a fresh context, as the server does per
request. The StoreQueries is the node's own ClusterStoreQueries over a one-member cluster map (a single
node), subclassed only to record the batched calls it gets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import strawberry
from pyspark.sql.types import DataType
from strawberry.http import process_result
from strawberry.types import ExecutionResult

from iqgraph.app.catalog import entity_infos
from iqgraph.app.owner.runner import owner_field_infos
from iqgraph.app.query.store_queries import ClusterStoreQueries
from iqgraph.schema import EntityInfo, GraphQLApp, Limits, StoreInfo, build_schema, context_getter
from iqgraph.stores import Key, PartitionState, PartitionStores, StateDirectory
from iqgraph.streaming.definitions import App
from tests.support.apps import (
    LAB_TOPIC,
    LAB_TYPES,
    MARKET_TOPICS,
    MARKET_TYPES,
    PARTITIONS,
    SHOP_TOPIC,
    SHOP_TYPES,
    ShopTruth,
    fill_market,
    fill_shop,
    lab_app,
    make_orders,
    market_app,
    market_orders,
    shop_app,
)
from tests.support.queries import single_node

Hosted = dict[str, dict[int, PartitionStores]]


class RecordingQueries(ClusterStoreQueries):
    """The production StoreQueries, recording each batched point read it is asked for (shared by bind)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, str, list[Any]]] = []

    async def get_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        self.calls.append(("get_many", store, list(keys)))
        return await super().get_many(store, keys, max_lag)

    async def fetch_many(
        self, store: str, requests: Sequence[tuple[Key, int, int]], max_lag: int | None = None
    ) -> list[Any]:
        self.calls.append(("fetch_many", store, list(requests)))
        return await super().fetch_many(store, requests, max_lag)

    async def might_contain_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        self.calls.append(("might_contain_many", store, list(keys)))
        return await super().might_contain_many(store, keys, max_lag)


@dataclass
class Api:
    """One app's schema over its stores, executed in-process."""

    app: App
    queries: RecordingQueries
    limits: Limits = field(default_factory=Limits)
    entities: Sequence[EntityInfo] | None = None  # None: the app's
    stores: Sequence[StoreInfo] | None = None  # None: the queries' (the app's)
    schema: strawberry.Schema = field(init=False)

    def __post_init__(self) -> None:
        stores = self.queries.stores() if self.stores is None else self.stores
        entities = entity_infos(self.app) if self.entities is None else self.entities
        about, fields = self.app.description, owner_field_infos(self.app)
        self.schema = build_schema(stores, self.limits, entities=entities, description=about, owner_fields=fields)
        self.reference = build_schema(
            stores, self.limits, entities=entities, description=about, owner_fields=fields, compiled=False
        )

    async def run(
        self, query: str, variables: dict[str, Any] | None = None, extensions: dict[str, Any] | None = None
    ) -> ExecutionResult:
        """Execute query with a fresh request context (and the request's GraphQL extensions, if any).

        Every query runs twice, compiled where a plan covers it and on graphql-core alone, and the two
        responses must be the same JSON (the differential test of schema.compiled).
        """
        result = await self.execute(self.schema, query, variables, extensions)
        recorded = len(self.queries.calls)
        reference = await self.execute(self.reference, query, variables, extensions)
        del self.queries.calls[recorded:]  # tests count the calls of one execution
        assert response_json(result) == response_json(reference), query
        return result

    async def execute(
        self,
        schema: strawberry.Schema,
        query: str,
        variables: dict[str, Any] | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> ExecutionResult:
        """Execute query on schema with a fresh request context."""
        context = context_getter(self.queries, self.limits)()
        return await schema.execute(
            query, variable_values=variables, context_value=context, operation_extensions=extensions
        )

    async def data(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """Execute query and return its data, failing on any error."""
        result = await self.run(query, variables)
        assert result.errors is None, [e.formatted for e in result.errors]
        assert result.data is not None
        return result.data

    async def errors(self, query: str, variables: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Execute query and return its errors as the client sees them."""
        result = await self.run(query, variables)
        assert result.errors, f"expected errors, got {result.data}"
        return [e.formatted for e in result.errors]


class DifferentialASGI:
    """An ASGI app sending each HTTP request to two apps — compiled and lean, and Strawberry's alone —
    and failing unless both answer with the same status, Content-Type and body bytes."""

    def __init__(self, api: Api) -> None:
        self.compiled = _CountingApp(api.schema, api.queries, api.limits)
        self.reference = GraphQLApp(api.reference, api.queries, api.limits, compiled=False)

    @property
    def lean(self) -> int:
        """Return how many requests the lean path answered."""
        return self.compiled.lean

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.compiled(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message)
            if not message.get("more_body"):
                break
        compiled, reference = (
            await self._answer(self.compiled, scope, chunks),
            await self._answer(self.reference, scope, chunks),
        )
        assert _comparable(compiled) == _comparable(reference), (scope.get("query_string"), chunks)
        for message in compiled:
            await send(message)

    @staticmethod
    async def _answer(app: GraphQLApp, scope: Any, chunks: list[Any]) -> list[Any]:
        replay = iter(chunks)
        sent: list[Any] = []

        async def receive() -> Any:
            return next(replay, {"type": "http.disconnect"})

        async def send(message: Any) -> None:
            sent.append(message)

        await app(dict(scope), receive, send)
        return sent


class _CountingApp(GraphQLApp):
    lean = 0

    async def compiled_response(self, request: Any) -> Any:
        response = await super().compiled_response(request)
        self.lean += response is not None
        return response


def _comparable(messages: list[Any]) -> tuple[int, dict[bytes, bytes], bytes]:
    start = messages[0]
    headers = {k.lower(): v for k, v in start.get("headers") or [] if k.lower() in (b"content-type", b"allow")}
    body = b"".join(m.get("body", b"") for m in messages[1:])
    return start["status"], headers, body


def response_json(result: ExecutionResult) -> bytes:
    """Return the JSON a client gets for result (as the HTTP layer makes it)."""
    return orjson.dumps(process_result(result))


def open_hosted(root: Path, app: App, *topics: str) -> Hosted:
    """Open every partition of each topic in a new state directory under root."""
    directory = StateDirectory(root, app.name)
    return {topic: {p: directory.open(topic, p, app.specs(topic)) for p in range(PARTITIONS)} for topic in topics}


def close_hosted(hosted: Hosted) -> None:
    """Close every partition database."""
    for partitions in hosted.values():
        for stores in partitions.values():
            stores.close()


MakeApi = Callable[..., Api]


def api_factory(app: App, types: Mapping[str, DataType], hosted: Hosted) -> MakeApi:
    """Return make(limits=None, hosted=None, deadline_ms=50, cls=RecordingQueries) -> Api."""

    def make(
        limits: Limits | None = None,
        partitions: Hosted | None = None,
        deadline_ms: int = 50,
        cls: type[RecordingQueries] = RecordingQueries,
    ) -> Api:
        queries = single_node(app, types, hosted if partitions is None else partitions, deadline_ms, cls)
        return Api(app, queries, limits or Limits())

    return make


@pytest.fixture(scope="module")
def orders() -> list[dict[str, Any]]:
    """Return the orders the shop stores are filled with."""
    return make_orders()


@pytest.fixture(scope="module")
def truth(orders: list[dict[str, Any]]) -> ShopTruth:
    """Return the shop's expected answers."""
    return ShopTruth(orders)


def _filled_shop(root: Path, orders: list[dict[str, Any]]) -> Iterator[Hosted]:
    hosted = open_hosted(root, shop_app(), SHOP_TOPIC)
    fill_shop(hosted[SHOP_TOPIC], orders)
    yield hosted
    close_hosted(hosted)


@pytest.fixture(scope="module")
def shop_hosted(tmp_path_factory: pytest.TempPathFactory, orders: list[dict[str, Any]]) -> Iterator[Hosted]:
    """Return the shop's partitions, filled with the orders and RUNNING, shared by a module: read only."""
    yield from _filled_shop(tmp_path_factory.mktemp("shop"), orders)


@pytest.fixture
def own_shop_hosted(tmp_path: Path, orders: list[dict[str, Any]]) -> Iterator[Hosted]:
    """Return shop partitions of the test's own, filled and RUNNING, for a test that changes them."""
    yield from _filled_shop(tmp_path / "shop", orders)


@pytest.fixture
def own_shop(own_shop_hosted: Hosted) -> Api:
    """Return a shop Api over the test's own partitions."""
    return api_factory(shop_app(), SHOP_TYPES, own_shop_hosted)()


@pytest.fixture
def make_shop(shop_hosted: Hosted) -> MakeApi:
    """Return a factory of shop Apis over the filled partitions."""
    return api_factory(shop_app(), SHOP_TYPES, shop_hosted)


@pytest.fixture
def shop(make_shop: MakeApi) -> Api:
    """Return the shop Api with default limits."""
    return make_shop()


@pytest.fixture
def lab_hosted(tmp_path: Path) -> Iterator[Hosted]:
    """Return the lab app's partitions, empty (tests fill them)."""
    hosted = open_hosted(tmp_path / "lab", lab_app(), LAB_TOPIC)
    for stores in hosted[LAB_TOPIC].values():
        stores.db.set_state(PartitionState.RUNNING)
    yield hosted
    close_hosted(hosted)


@pytest.fixture
def lab(lab_hosted: Hosted) -> Api:
    """Return the lab Api (Long keys, rich values)."""
    return api_factory(lab_app(), LAB_TYPES, lab_hosted)()


@pytest.fixture(scope="module")
def market_hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosted]:
    """Return the market's partitions (three topics), filled and RUNNING, shared by a module: read only."""
    hosted = open_hosted(tmp_path_factory.mktemp("market"), market_app(), *MARKET_TOPICS)
    fill_market(hosted, market_orders())
    yield hosted
    close_hosted(hosted)


@pytest.fixture
def make_market(market_hosted: Hosted) -> MakeApi:
    """Return a factory of market Apis over the filled partitions."""
    return api_factory(market_app(), MARKET_TYPES, market_hosted)


@pytest.fixture
def market(make_market: MakeApi) -> Api:
    """Return the market Api (entities Customer and Product, relations) with default limits."""
    return make_market()
