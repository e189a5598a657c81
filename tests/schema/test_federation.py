"""A federation v2 subgraph (``schema.federation``): the entities carry ``@key``, ``_service { sdl }`` composes with
another subgraph under Apollo Federation's own composition (``@apollo/composition``, npm, under node: tests/js), and
``_entities`` answers many representations equal to the ground truth with ONE read per store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from iqgraph.app.catalog import entity_infos
from iqgraph.app.owner.runner import owner_field_infos
from iqgraph.schema import build_schema
from tests.js import NODE_DIR, require_node
from tests.schema.conftest import Api, context_getter
from tests.support.apps import MARKET_PRODUCTS, MarketTruth, market_orders

ENTITIES = """query($r: [_Any!]!) {
  _entities(representations: $r) {
    ... on Customer { key name city orderCount totalSpend ordered } ... on Product { key name price }
  }
}"""
TRUTH = MarketTruth(market_orders())
FIELDS = ("key", "name", "city", "orderCount", "totalSpend", "ordered")
REVIEWS = """extend schema @link(url: "https://specs.apollo.dev/federation/v2.7", import: ["@key"])
type Customer @key(fields: "key") { key: String! reviews: [String!]! }
type Query { latestReviews: [String!]! }
"""


def _federated(api: Api) -> Any:
    stores = api.queries.stores()
    return build_schema(
        stores, api.limits, entities=entity_infos(api.app), owner_fields=owner_field_infos(api.app), federation=True
    )


async def _run(api: Api, schema: Any, query: str, variables: dict[str, Any] | None = None) -> Any:
    return await schema.execute(
        query, variable_values=variables, context_value=context_getter(api.queries, api.limits)()
    )


async def test_entities_of_many_representations_are_read_once_per_store_and_equal_the_truth(market: Api) -> None:
    schema = _federated(market)
    customers = [*TRUTH.customer_keys(), "nobody"]
    product = next(iter(MARKET_PRODUCTS))
    representations = [{"__typename": "Customer", "key": k} for k in customers]
    representations.insert(2, {"__typename": "Product", "key": product})
    market.queries.calls.clear()
    result = await _run(market, schema, ENTITIES, {"r": representations})
    assert result.errors is None, result.errors
    found = result.data["_entities"]
    assert found.pop(2) == TRUTH.product(product)
    assert found == [{f: TRUTH.customer(k)[f] for f in FIELDS} for k in customers]
    stores = [store for _, store, _ in market.queries.calls]
    assert sorted(stores) == ["customers", "order_count", "ordered", "products", "total_spend"], stores  # once each
    [keys] = [keys for _, store, keys in market.queries.calls if store == "order_count"]
    assert sorted(keys) == sorted(customers)  # every representation's key in the one read


async def test_a_bad_representation_is_its_own_error_only(market: Api) -> None:
    key = TRUTH.customer_keys()[0]
    representations = [{"__typename": "Nope", "key": "x"}, {"__typename": "Customer", "key": key}]
    result = await _run(market, _federated(market), ENTITIES, {"r": representations})
    assert result.data["_entities"][1]["orderCount"] == TRUTH.customer(key)["orderCount"]
    assert result.data["_entities"][0] is None
    [error] = result.errors
    assert error.path == ["_entities", 0] and error.extensions["code"] == "INVALID_ARGUMENT"


async def test_the_subgraph_sdl_composes_with_another_subgraph_under_apollo_federation(
    market: Api, tmp_path: Path
) -> None:
    result = await _run(market, _federated(market), "{ _service { sdl } }")
    sdl = result.data["_service"]["sdl"]
    assert '@link(url: "https://specs.apollo.dev/federation/v2' in sdl
    for entity in ("Customer", "Product"):
        assert f'type {entity} @key(fields: "key", resolvable: true) {{' in sdl
    (tmp_path / "iqgraph.graphql").write_text(sdl)
    (tmp_path / "reviews.graphql").write_text(REVIEWS)
    require_node()
    run = subprocess.run(
        ["node", "compose.mjs", f"iqgraph=http://iqgraph:8000/graphql@{tmp_path / 'iqgraph.graphql'}",
         f"reviews=http://reviews:4000/graphql@{tmp_path / 'reviews.graphql'}"],
        cwd=NODE_DIR, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    composed = json.loads(run.stdout.splitlines()[-1])
    assert composed["errors"] == [], composed["errors"]
    supergraph = composed["supergraph"]
    assert '@join__type(graph: IQGRAPH, key: "key", resolvable: true)' in supergraph
    assert '@join__type(graph: REVIEWS, key: "key")' in supergraph
    assert "reviews: [String!]! @join__field(graph: REVIEWS)" in supergraph


async def test_without_federation_the_schema_has_none_of_it(market: Api) -> None:
    sdl = market.schema.as_str()
    assert "_entities" not in sdl and "@key" not in sdl and "_service" not in sdl
