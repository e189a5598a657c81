"""Every store of every shipped example, over REST and over GraphQL: the same values in the same words, and each
store's ``count`` the number of distinct keys a full scan finds.

Each example's generated events go through the real sink (Spark computes the partials, on the session's Spark)
into real RocksDB partitions; one node's production query path answers both REST (``app.http.rest``) and a
GraphQL query written here from the schema's own types (every field of every value, as a client would select).
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from graphql import GraphQLObjectType, get_named_type, is_leaf_type
from pyspark.sql import SparkSession
from starlette.applications import Starlette

from iqgraph.app.catalog import entity_infos
from iqgraph.app.http.rest import rest_routes
from iqgraph.app.owner.runner import owner_field_infos
from iqgraph.schema import GraphQLApp, Limits, build_schema
from iqgraph.schema.naming import camel_case
from iqgraph.stores import PartitionState, PartitionStores, StateDirectory, StoreKind
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
KEYS_PER_STORE = 8


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
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self._graphql), base_url="http://n") as c:
            response = await c.post("/graphql", json={"query": query, "variables": variables or {}})
        body = response.json()
        assert not body.get("errors"), (query, body["errors"])
        return body["data"]

    def selection(self, store: str, *path: str) -> str:
        """Return the selection of every field of what path (fields from store's type) leads to (written apart from
        REST's)."""
        named = get_named_type(self.schema.query_type.fields[camel_case(store)].type)  # type: ignore[union-attr]
        for field in path:
            named = get_named_type(named.fields[field].type)
        return _every_field(named)

    def close(self) -> None:
        for partitions in self.hosted.values():
            for stores in partitions.values():
                stores.close()


def _every_field(named: Any) -> str:
    if is_leaf_type(named):
        return ""
    assert isinstance(named, GraphQLObjectType)
    fields = [name + _every_field(get_named_type(f.type)) for name, f in named.fields.items() if not f.args]
    return "{ " + " ".join(fields) + " }"


@pytest.fixture(params=EXAMPLES)
def example(request: pytest.FixtureRequest, spark: SparkSession, tmp_path: Path) -> Iterator[Example]:
    module = __import__(f"iqgraph.examples.{request.param}", fromlist=["app"])
    found = Example(module.app, spark, tmp_path)
    yield found
    found.close()


async def _all(example: Example, field: str, kind: StoreKind) -> list[dict[str, Any]]:
    """Return every entry of a key-value (all) or window (fetchAll) store, page by page."""
    scan = "all" if kind is not StoreKind.WINDOW else "fetchAll"
    node = example.selection(field, scan, "edges", "node")
    query = f"query($a: String) {{ {camel_case(field)} {{ {scan}(first: 1000, after: $a) {{ edges {{ node {node} }} "
    query += "pageInfo { hasNextPage endCursor } } } }"
    found: list[dict[str, Any]] = []
    after = None
    while True:
        page = (await example.graphql(query, {"a": after}))[camel_case(field)][scan]
        found += [edge["node"] for edge in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = page["pageInfo"]["endCursor"]


async def test_every_store_answers_the_same_over_rest_and_graphql_and_counts_its_distinct_keys(
    example: Example,
) -> None:
    walked = set()
    for info in example.queries.stores():
        store, kind, root = info.name, StoreKind(info.kind), camel_case(info.name)
        rest_count = (await example.rest.get(f"/stores/{store}/count")).json()
        if kind is StoreKind.BLOOM:
            graphql = (await example.graphql(f"{{ {root} {{ approximateCount }} }}"))[root]["approximateCount"]
            assert rest_count == {"store": store, "approximateCount": graphql}
        else:
            graphql = (await example.graphql(f"{{ {root} {{ count }} }}"))[root]["count"]
            assert rest_count == {"store": store, "count": graphql}
        if kind is StoreKind.KEY_VALUE:
            entries = await _all(example, store, kind)
            assert graphql == len({e["key"] for e in entries}), f"{store}: count is not its distinct keys"
            for entry in entries[:KEYS_PER_STORE]:
                key = entry["key"]
                selection = example.selection(store, "get")
                key_type = "String" if info.key_type == "string" else "Long"
                query = f"query($k: {key_type}!) {{ {root} {{ get(key: $k) {selection} }} }}"
                value = (await example.graphql(query, {"k": key}))[root]["get"]
                got = await example.rest.get(f"/stores/{store}/keys/{quote(str(key), safe='')}")
                assert got.status_code == 200, got.text
                assert got.json() == {"store": store, "key": key, "value": value} and value == entry["value"]
        elif kind is StoreKind.WINDOW:
            entries = await _all(example, store, kind)
            assert graphql == len({(e["key"], e["start"]) for e in entries}), f"{store}: count is not its pairs"
            for entry in entries[:KEYS_PER_STORE]:
                key, start = entry["key"], entry["start"]
                ms = int(dt.datetime.fromisoformat(start).timestamp() * 1000)
                selection = example.selection(store, "fetch")
                query = f"query($k: String!, $f: DateTime) {{ {root} {{ fetch(key: $k, from: $f) {selection} }} }}"
                windows = (await example.graphql(query, {"k": key, "f": start}))[root]["fetch"]
                for since in (quote(start), ms):  # ISO 8601 or epoch ms, as GraphQL's DateTime takes them
                    got = await example.rest.get(f"/stores/{store}/keys/{quote(str(key), safe='')}?from={since}")
                    assert got.json() == {"store": store, "key": key, "windows": windows}
        elif kind is StoreKind.BLOOM:
            for key in ["nobody-at-all"]:
                query = f'{{ {root} {{ mightContain(key: "{key}") }} }}'
                value = (await example.graphql(query))[root]["mightContain"]
                got = (await example.rest.get(f"/stores/{store}/keys/{key}")).json()
                assert got == {"store": store, "key": key, "mightContain": value}
        elif kind is StoreKind.RANKING:
            selection = example.selection(store, "top")
            top = (await example.graphql(f"{{ {root} {{ top(first: 5) {selection} }} }}"))[root]["top"]
            assert top, f"{store}: an empty ranking proves nothing"
            got = (await example.rest.get(f"/stores/{store}/top?first=5")).json()
            assert got == {"store": store, "group": None, "top": top}
        walked.add(kind)
    assert walked, "no store walked"


README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize("example", ["shop"], indirect=True)
async def test_the_readmes_rest_curls_answer_on_the_shop_with_the_fields_it_names(example: Example) -> None:
    """README "Querying" → "REST": each curl line's path answers 200 on the shop, with the top-level fields its
    comment names first."""
    block = README.read_text().split("### REST", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("curl -s")]
    assert len(lines) >= 6
    for line in lines:
        path = re.search(r"localhost:8000(/[^' ]+)", line).group(1)  # type: ignore[union-attr]
        response = await example.rest.get(path)
        assert response.status_code == 200, (path, response.text)
        comment = line.split("#", 1)[1]
        if "{" in comment:
            _has_named_fields(comment[comment.index("{") :], response.json(), path)


def _has_named_fields(shape: str, body: Any, path: str) -> None:
    """Check body has the fields a README comment's shape names: {"a", "b": {"c"}} (nested objects checked too)."""
    depth, items, current = 0, [], ""
    for char in shape[1:]:
        if char == "}" and depth == 0:
            break
        depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    for item in items:
        name, _, rest = item.partition(":")
        name = name.strip().strip('"')
        assert isinstance(body, dict) and name in body, (path, name, body)
        if rest.strip().startswith("{"):
            _has_named_fields(rest.strip(), body[name], path)
