"""Three real nodes serving the customers example plus a global products table: entities composed across nodes,
relations two levels deep, an enrichment join, a global table on every node — equal to ground truth computed in
Python, with the forwarded requests counted (one per peer per depth)."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from iqgraph.examples import customers as example
from iqgraph.examples.shop import ITEMS, PRODUCT_SCHEMA, product
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import produce
from iqgraph.streaming.definitions import App, Entity, Relation, Topic, table_store
from iqgraph.streaming.partitioner import partition_for
from tests.conftest import MakeTopic
from tests.support.ground_truth import event_ms
from tests.support.nodes import NodeProcess, start_nodes, wait_ready
from tests.support.pipeline import START_MS

PARTITIONS = 6
EVENTS = 4_000
GLANCE = "struct<orders: bigint, spend: double, tier: string, product: string>"


def crm_app(orders: str, customers: str, products: str, bootstrap: str = "localhost:9092") -> App:
    """Return the customers example with a global products table, the Product entity, latestOrder.product, a
    ranking of customers by orders per item of their latest order, and an owner-side field reading stores of both
    co-partitioned topics and the global table."""
    from iqgraph.streaming.definitions import KafkaSettings, ranking_store
    from iqgraph.streaming.owner_fields import OwnerField

    def glance(key: str, views: Any) -> dict[str, Any]:
        latest = views.kv("latest_order").get(key)
        catalog = None if latest is None else views.kv("catalog").get(latest["item"])
        return {
            "orders": views.kv("order_count").get(key) or 0,
            "spend": views.kv("total_spend").get(key),
            "tier": (views.kv("profiles").get(key) or {}).get("tier"),
            "product": None if catalog is None else catalog["name"],
        }

    base = example.build_app(orders, customers, PARTITIONS, KafkaSettings(bootstrap_servers=bootstrap))
    product_relation = Relation("product", "Product", column="item")
    stores = [
        dataclasses.replace(s, relations=(*s.relations, product_relation)) if s.name == "latest_order" else s
        for s in base.stores
    ]
    return dataclasses.replace(
        base,
        topics=[*base.topics, Topic(products, schema=PRODUCT_SCHEMA, partitions=2, table=True, global_table=True)],
        stores=[
            *stores,
            table_store("catalog", products),
            ranking_store("top_customers", next(s for s in stores if s.name == "order_count"), group="item"),
        ],
        entities=[*base.entities, Entity("Product", stores=["catalog"], table="catalog")],
        fields=[OwnerField("glance", glance, GLANCE, store="order_count")],
    )


@dataclasses.dataclass
class Truth:
    profiles: dict[str, dict[str, Any]]
    counts: Counter[str]
    spend: dict[str, float]
    latest: dict[str, dict[str, Any]]
    minutes: dict[str, dict[int, int]]
    tiers: dict[str, float]


def ground_truth(orders: list[tuple[str, dict[str, Any]]], changes: list[tuple[str, Any]]) -> Truth:
    profiles: dict[str, Any] = {}
    for key, value in changes:
        profiles[key] = value
    final = {k: v for k, v in profiles.items() if v is not None}
    counts: Counter[str] = Counter()
    spend: dict[str, float] = defaultdict(float)
    latest: dict[str, dict[str, Any]] = {}
    minutes: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    tiers: dict[str, float] = defaultdict(float)
    for customer, order in orders:
        counts[customer] += 1
        spend[customer] += order["amount"]
        latest[customer] = order
        minutes[customer][event_ms(order, "ts") // 60_000 * 60_000] += 1
        if customer in final:  # the table is whole before the first batch of orders: every order sees its end
            tiers[final[customer]["tier"]] += order["amount"]
    return Truth(final, counts, dict(spend), latest, {k: dict(v) for k, v in minutes.items()}, dict(tiers))


@pytest.fixture(scope="module")
def crm(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[list[NodeProcess], Truth]]:
    orders, customers = make_topic(PARTITIONS, prefix="orders"), make_topic(PARTITIONS, prefix="customers")
    products = make_topic(2, prefix="products")
    app = crm_app(orders, customers, products)
    assert app.generator is not None
    events = [app.addressed(e) for e in itertools.islice(app.generator(71, START_MS), EVENTS)]
    produce(broker.bootstrap_servers, products, [(i.encode(), orjson.dumps(product(i)), None) for i in ITEMS])
    for topic in (customers, orders):
        records = [
            (str(k).encode(), None if v is None else orjson.dumps(v), None) for t, k, v in events if t.name == topic
        ]
        produce(broker.bootstrap_servers, topic, records)
    home = tmp_path_factory.mktemp("crm")
    imports = f"""
        import dataclasses
        from iqgraph.examples import customers as example
        from iqgraph.examples.shop import PRODUCT_SCHEMA
        from typing import Any
        from iqgraph.streaming.definitions import App, Entity, Relation, Topic, table_store
        PARTITIONS = 6
        GLANCE = {GLANCE!r}
    """
    (home / "crmapp.py").write_text(
        textwrap.dedent(imports)
        + inspect.getsource(crm_app)
        + f"\napp = crm_app({orders!r}, {customers!r}, {products!r}, {broker.bootstrap_servers!r})\n"
    )
    nodes = start_nodes(home, "crmapp", 3, [["--standbys", "1"]] * 3)
    try:
        wait_ready(nodes)
        orders_of = [(str(k), v) for t, k, v in events if t.name == orders]
        yield nodes, ground_truth(orders_of, [(str(k), v) for t, k, v in events if t.name == customers])
    finally:
        for node in nodes:
            node.kill()


ENTITIES = """query($k: [String!]!) { customers(keys: $k) {
  key name city tier orderCount totalSpend latestOrder { orderId item amount product { name price } }
  ordersPerMinute { start value } } }"""
RELATION = """query($k: [String!]!) { customers(keys: $k) { key latestOrder { customer { key name orderCount } } } }"""


def _forwarded(nodes: list[NodeProcess], query: str, variables: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    before = [n.metrics().value("iqgraph_forwarded_received_total", peer="node-0") for n in nodes]
    body = nodes[0].post(query, variables)
    after = [n.metrics().value("iqgraph_forwarded_received_total", peer="node-0") for n in nodes]
    return body, [int(a - b) for a, b in zip(after, before, strict=True)]


def _iso_minute(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def test_entities_equal_ground_truth_on_every_node_with_one_forwarded_request_per_peer(crm: Any) -> None:
    nodes, truth = crm
    keys = sorted({*truth.profiles, *truth.counts})[:300] + ["customer-9999"]
    assert {f"node-{partition_for(k, PARTITIONS, 'string', 'murmur2') % 3}" for k in keys} == {
        "node-0",
        "node-1",
        "node-2",
    }
    for node in nodes:
        body = node.post(ENTITIES, {"k": keys})
        assert "errors" not in body, body.get("errors")
        for key, found in zip(keys, body["data"]["customers"], strict=True):
            profile = truth.profiles.get(key, {})
            assert found["key"] == key
            assert (found["name"], found["city"], found["tier"]) == tuple(
                profile.get(c) for c in ("name", "city", "tier")
            )
            assert found["orderCount"] == (truth.counts[key] or None)
            assert found["totalSpend"] == pytest.approx(truth.spend.get(key)), key
            latest = truth.latest.get(key)
            if latest is None:
                assert found["latestOrder"] is None
            else:
                assert (found["latestOrder"]["orderId"], found["latestOrder"]["item"]) == (
                    latest["order_id"],
                    latest["item"],
                )
                assert found["latestOrder"]["product"] == {k: product(latest["item"])[k] for k in ("name", "price")}
            windows = {w["start"]: w["value"] for w in found["ordersPerMinute"] or []}
            assert windows == {_iso_minute(ms): n for ms, n in truth.minutes.get(key, {}).items()}
    # 1,000 keys x 5 stores: ONE forwarded request per peer (products is global: read locally)
    many = (keys * 4)[:1000]
    body, forwarded = _forwarded(nodes, ENTITIES, {"k": many})
    assert "errors" not in body
    assert forwarded == [0, 1, 1]


def test_a_relation_is_followed_with_one_forwarded_request_per_peer_per_depth(crm: Any) -> None:
    nodes, truth = crm
    keys = sorted(truth.latest)[:200]
    body, forwarded = _forwarded(nodes, RELATION, {"k": keys})
    assert "errors" not in body, body.get("errors")
    for key, found in zip(keys, body["data"]["customers"], strict=True):
        customer = found["latestOrder"]["customer"]
        assert customer["key"] == truth.latest[key]["customer"] == key
        assert customer["name"] == truth.profiles.get(key, {}).get("name")
        assert customer["orderCount"] == truth.counts[key]
    assert forwarded == [0, 2, 2]  # depth 1: latestOrder; depth 2: the customer's profile and order count
    # two relations deep: order -> customer -> the customer's latest order -> its product (global: local)
    deep = """query($k: [String!]!) { customers(keys: $k) { latestOrder { customer {
      latestOrder { orderId product { name } } } } } }"""
    body, forwarded = _forwarded(nodes, deep, {"k": keys})
    assert "errors" not in body, body.get("errors")
    for key, found in zip(keys, body["data"]["customers"], strict=True):
        again = found["latestOrder"]["customer"]["latestOrder"]
        assert again["orderId"] == truth.latest[key]["order_id"]
        assert again["product"] == {"name": product(truth.latest[key]["item"])["name"]}
    # depth 1 reads latest_order for the keys; depth 3 asks latest_order for the same keys (an order's customer
    # is its key): the request's loader has them already; products is global (local): nothing more forwarded
    assert forwarded == [0, 1, 1]


def test_the_global_table_is_hosted_and_read_on_every_node(crm: Any) -> None:
    nodes, _ = crm
    for node in nodes:
        data = node.post("{ node { partitions { topic partition role state } } catalog { count } }")["data"]
        mine = [p for p in data["node"]["partitions"] if p["topic"].startswith("products")]
        assert sorted(p["partition"] for p in mine) == [0, 1]
        assert all(p["role"] == "active" and p["state"] == "RUNNING" for p in mine)
        assert data["catalog"]["count"] == len(ITEMS)
    body, forwarded = _forwarded(nodes, '{ product(key: "widget") { name price category } }', {})
    assert body["data"]["product"] == product("widget")
    assert forwarded == [0, 0, 0]


def test_the_enrichment_join_sums_spend_per_tier_as_the_table_says(crm: Any) -> None:
    nodes, truth = crm
    tiers = sorted(example.TIERS)
    data = nodes[2].post("query($t: [String!]!) { spendPerTier { getMany(keys: $t) } }", {"t": tiers})["data"]
    assert data["spendPerTier"]["getMany"] == pytest.approx([truth.tiers.get(t) for t in tiers])


def test_customers_page_lists_every_profile_once(crm: Any) -> None:
    nodes, truth = crm
    seen, after = [], None
    while True:
        page = nodes[1].post(
            "query($a: String) { customersPage(first: 37, after: $a) { edges { node { key name } } "
            "pageInfo { hasNextPage endCursor } } }",
            {"a": after},
        )["data"]["customersPage"]
        seen += [(e["node"]["key"], e["node"]["name"]) for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == sorted((k, v["name"]) for k, v in truth.profiles.items())


def test_an_owner_side_field_runs_on_each_key_owner_with_one_forwarded_request_per_peer(crm: Any) -> None:
    nodes, truth = crm
    known = sorted({*truth.profiles, *truth.counts})
    keys = [*known, *(f"customer-{n:05d}" for n in range(1000 - len(known)))]  # 1,000 distinct keys
    body, forwarded = _forwarded(nodes, "query($k: [String!]!) { glanceMany(keys: $k) { orders spend tier product } }",
                                 {"k": keys})  # fmt: skip
    assert "errors" not in body, body.get("errors")
    assert forwarded == [0, 1, 1]  # every key of each peer in ONE _call sub-request
    for key, found in zip(keys, body["data"]["glanceMany"], strict=True):
        latest = truth.latest.get(key)
        assert found == {
            "orders": truth.counts[key],
            "spend": pytest.approx(truth.spend.get(key)),
            "tier": truth.profiles.get(key, {}).get("tier"),
            "product": None if latest is None else product(latest["item"])["name"],
        }, key


TOP = (
    "query($g: String, $a: String) "
    "{ topCustomers { top(group: $g, first: 7, after: $a) { member value rank cursor } } }"
)


def test_a_ranking_spanning_every_node_pages_in_order_with_ranks_that_continue(crm: Any) -> None:
    nodes, truth = crm
    items = {key: order["item"] for key, order in truth.latest.items()}
    for group in [None, *sorted(set(items.values()))[:3]]:
        members = [k for k in truth.counts if group is None or items[k] == group]
        owners = {partition_for(k, PARTITIONS, "string", "murmur2") % 3 for k in members}
        assert len(owners) == (3 if group is None else len(owners)) >= 2, group  # a group spans nodes too
        expected = sorted(((k, truth.counts[k]) for k in members), key=lambda kv: (-kv[1], kv[0]))
        for node in nodes:
            seen: list[tuple[str, int, int]] = []
            after = None
            while True:
                body = node.post(TOP, {"g": group, "a": after})
                assert "errors" not in body, body.get("errors")
                page = body["data"]["topCustomers"]["top"]
                seen += [(e["member"], e["value"], e["rank"]) for e in page]
                if len(page) < 7:
                    break
                after = page[-1]["cursor"]
            assert seen == [(k, n, i) for i, (k, n) in enumerate(expected, start=1)], (node.id, group)
