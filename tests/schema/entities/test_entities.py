"""Entities and relations (the market app): answers equal the ground truth, reads batch per store per depth.

Every query runs compiled and on graphql-core and must answer the same JSON (conftest ``Api.run``); the
StoreQueries calls counted are those of one execution.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

from iqgraph.app.catalog import entity_infos
from iqgraph.schema import EntityInfo, Limits, RelationInfo, SchemaDefinitionError, StoreInfo, build_schema
from iqgraph.stores import Key
from tests.schema.conftest import Api, Hosted, MakeApi, RecordingQueries
from tests.support.apps import (
    CUSTOMER_TYPE,
    LAB_TYPES,
    MARKET_CUSTOMERS,
    ORDER_TYPE,
    READING,
    MarketTruth,
    fill_lab,
    lab_app,
    market_orders,
    shop_partition,
)
from tests.support.queries import single_node

CUSTOMER = """key name city favorite { key name price } orderCount totalSpend latestOrder { orderId item }
  ordersPerMinute { start value } ordered"""
TRUTH = MarketTruth(market_orders())


def calls(api: Api) -> list[tuple[str, str, list[Any]]]:
    """Return the execution's StoreQueries calls, each with its keys sorted, in a stable order."""
    return sorted((kind, store, sorted(map(str, keys))) for kind, store, keys in api.queries.calls)


def per_store(api: Api) -> Counter[str]:
    """Return how many StoreQueries calls each store got."""
    return Counter(store for _, store, _ in api.queries.calls)


# -- entity root fields -----------------------------------------------------------------------------------


async def test_each_customer_equals_the_ground_truth(market: Api) -> None:
    for key in [*TRUTH.customer_keys(), "nobody"]:
        data = await market.data(f'{{ customer(key: "{key}") {{ {CUSTOMER} }} }}')
        assert data["customer"] == TRUTH.customer(key), key


async def test_many_customers_in_key_order_one_call_per_store(market: Api) -> None:
    keys = [*reversed(TRUTH.customer_keys()), "nobody", "customer-03", "customer-11"]
    data = await market.data(
        f"query($keys: [String!]!) {{ customerList(keys: $keys) {{ {CUSTOMER} }} }}", {"keys": keys}
    )
    assert data["customerList"] == [TRUTH.customer(k) for k in keys]
    distinct = sorted(set(keys))
    windows = sorted(str((k, -(1 << 63), (1 << 63) - 1)) for k in distinct)
    favorites = sorted({row["favorite"] for row in MARKET_CUSTOMERS.values() if row["favorite"]})
    assert calls(market) == [
        ("fetch_many", "orders_per_minute", windows),
        ("get_many", "customers", distinct),
        ("get_many", "latest_order", distinct),
        ("get_many", "order_count", distinct),
        ("get_many", "products", favorites),  # the favorites: the next depth, one call
        ("get_many", "total_spend", distinct),
        ("might_contain_many", "ordered", distinct),
    ]


async def test_one_read_ahead_per_store_not_one_future_per_key(market: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiodataloader import DataLoader

    loads: list[int] = []
    load = DataLoader.load

    def counting(self: DataLoader[Any, Any], key: Any) -> Any:
        loads.append(len(key))
        return load(self, key)

    monkeypatch.setattr(DataLoader, "load", counting)
    keys = [f"customer-{i:04d}" for i in range(1000)]
    query = "query($k: [String!]!) { customerList(keys: $k) { key name city orderCount totalSpend ordered } }"
    result = await market.execute(market.schema, query, {"k": keys})
    assert result.errors is None and result.data is not None and len(result.data["customerList"]) == 1000
    assert loads == [1000] * 4  # four stores (name and city: the table): one loader item each
    assert per_store(market) == dict.fromkeys(["customers", "order_count", "total_spend", "ordered"], 1)


async def test_a_page_lists_every_customer_of_the_table_once(market: Api) -> None:
    seen: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        market.queries.calls.clear()
        data = await market.data(
            f"query($after: String) {{ customerListPage(first: 4, after: $after) {{ edges {{ cursor "
            f"node {{ {CUSTOMER} }} }} pageInfo {{ hasNextPage endCursor }} }} }}",
            {"after": after},
        )
        page = data["customerListPage"]
        seen += [edge["node"] for edge in page["edges"]]
        assert len(page["edges"]) <= 4
        counts = per_store(market)
        assert counts["customers"] == 0  # the scan gave the table's values: no point read of it
        assert counts["order_count"] == (1 if page["edges"] else 0)
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == [TRUTH.customer(key) for key in sorted(MARKET_CUSTOMERS)]


async def test_a_page_over_a_window_store_lists_each_key_once(make_market: MakeApi) -> None:
    minute = EntityInfo("Minute", "string", ("orders_per_minute", "order_count"), "minutes")
    api = make_market()
    api = Api(api.app, api.queries, entities=[*entity_infos(api.app), minute])
    keys: list[str] = []
    after: str | None = None
    for _ in range(50):
        data = await api.data(
            "query($after: String) { minutesPage(first: 2, after: $after) { edges { node { key orderCount "
            "ordersPerMinute { value } } } pageInfo { hasNextPage endCursor } } }",
            {"after": after},
        )
        page = data["minutesPage"]
        for edge in page["edges"]:
            node = edge["node"]
            keys.append(node["key"])
            assert node["orderCount"] == TRUTH.customer(node["key"])["orderCount"]
            assert sum(w["value"] for w in node["ordersPerMinute"]) == node["orderCount"]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert keys == sorted({o["customer"] for o in TRUTH.orders})  # every key once, in key order


async def test_window_fields_take_their_range_and_batch_per_range(market: Api) -> None:
    query = """{ customerList(keys: ["customer-00", "customer-01"]) {
      early: ordersPerMinute(to: "2026-01-01T00:02:00Z") { start value }
      late: ordersPerMinute(from: "2026-01-01T00:02:00.001Z") { start value } } }"""
    data = await market.data(query)
    for key, entity in zip(["customer-00", "customer-01"], data["customerList"], strict=True):
        windows = TRUTH.customer(key)["ordersPerMinute"]
        assert entity["early"] + entity["late"] == windows
        assert all(w["start"] <= "2026-01-01T00:02:00.000Z" for w in entity["early"])
    assert [kind for kind, _, _ in market.queries.calls] == ["fetch_many"]  # both ranges in one call


async def test_fragments_run_on_graphql_core_and_still_read_ahead(market: Api) -> None:
    query = """query { customerList(keys: ["customer-00", "customer-05"]) { ...who ... on Customer { orderCount } } }
      fragment who on Customer { key name }"""
    assert market.schema.compiled.plan(query, None) is None  # type: ignore[attr-defined]
    data = await market.data(query)
    assert data["customerList"] == [
        {"key": k, "name": TRUTH.customer(k)["name"], "orderCount": TRUTH.customer(k)["orderCount"]}
        for k in ["customer-00", "customer-05"]
    ]
    assert per_store(market) == {"customers": 1, "order_count": 1}


async def test_entity_and_relation_queries_run_compiled(market: Api) -> None:
    compiled = market.schema.compiled  # type: ignore[attr-defined]
    for query in (
        f'{{ customer(key: "customer-00") {{ {CUSTOMER} }} }}',
        '{ customerList(keys: ["customer-00"], maxLag: 3) { key latestOrder { product { name } } } }',
        "{ customerListPage(first: 2) { edges { cursor node { key favorite { name } } } pageInfo { endCursor } } }",
        '{ latestOrder { get(key: "customer-00") { customer(maxLag: 1) { name } product { price } } } }',
        "{ orderCount { all(first: 2) { edges { node { customer { key } } } } } }",
    ):
        assert compiled.plan(query, None) is not None, query


# -- errors -----------------------------------------------------------------------------------------------


async def test_a_key_no_store_can_hold_is_one_invalid_key_error(market: Api) -> None:
    result = await market.run('{ customer(key: "") { key name } }')
    assert result.data == {"customer": None}
    assert [(e.path, e.extensions["code"]) for e in result.errors or []] == [  # type: ignore[index]
        (["customer"], "INVALID_KEY")
    ]
    many = await market.run('{ customerList(keys: ["customer-01", ""]) { key orderCount } }')
    assert many.data == {
        "customerList": [{"key": "customer-01", "orderCount": TRUTH.customer("customer-01")["orderCount"]}, None]
    }
    assert [(e.path, e.extensions["code"]) for e in many.errors or []] == [  # type: ignore[index]
        (["customerList", 1], "INVALID_KEY")
    ]
    validation = await market.errors("{ customer(key: 5) { key } }")
    assert [e["extensions"]["code"] for e in validation] == ["GRAPHQL_VALIDATION_FAILED"]  # as get does


async def test_a_failed_key_fails_that_entitys_fields_only(make_market: MakeApi, market_hosted: Hosted) -> None:
    lost = shop_partition("customer-01")
    orders = {p: s for p, s in market_hosted["orders"].items() if p != lost}
    api = make_market(partitions={**market_hosted, "orders": orders})
    others = [k for k in ("customer-00", "customer-02", "customer-03", "customer-05") if shop_partition(k) != lost]
    keys = ["customer-01", *others]
    result = await api.run("query($k: [String!]!) { customerList(keys: $k) { key name orderCount } }", {"k": keys})
    assert result.data is not None
    first, *rest = result.data["customerList"]
    assert first == {"key": "customer-01", "name": "Customer 1", "orderCount": None}  # the table is still there
    assert rest == [
        {"key": k, "name": TRUTH.customer(k)["name"], "orderCount": TRUTH.customer(k)["orderCount"]} for k in others
    ]
    assert [(e.path, e.extensions["code"]) for e in result.errors or []] == [  # type: ignore[index]
        (["customerList", 0, "orderCount"], "STORE_MIGRATED")
    ]


async def test_too_many_keys_and_a_negative_max_lag_are_refused(make_market: MakeApi) -> None:
    api = make_market(Limits(max_keys=2, max_page_size=5, default_page_size=5))
    errors = await api.errors('{ customerList(keys: ["a", "b", "c"]) { key } }')
    assert [e["extensions"]["code"] for e in errors] == ["LIMIT_EXCEEDED"]
    errors = await api.errors("{ customerListPage(first: 6) { pageInfo { hasNextPage } } }")
    assert [e["extensions"]["code"] for e in errors] == ["LIMIT_EXCEEDED"]
    errors = await api.errors('{ customer(key: "a", maxLag: -1) { key } }')
    assert [e["extensions"]["code"] for e in errors] == ["INVALID_ARGUMENT"]
    result = await api.run('{ latestOrder { get(key: "customer-00") { orderId product(maxLag: -1) { name } } } }')
    assert result.data == {
        "latestOrder": {"get": {"orderId": TRUTH.customer("customer-00")["latestOrder"]["orderId"], "product": None}}
    }
    assert [(e.path, e.extensions["code"]) for e in result.errors or []] == [  # type: ignore[index]
        (["latestOrder", "get", "product"], "INVALID_ARGUMENT")
    ]


class BoundRecording(RecordingQueries):
    """Also records the bound (maxLag) of each batched call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bounds: list[tuple[str, int | None]] = []

    async def get_many(self, store: str, keys: Sequence[Key], max_lag: int | None = None) -> list[Any]:
        self.bounds.append((store, max_lag))
        return await super().get_many(store, keys, max_lag)


async def test_max_lag_bounds_the_reads_of_the_field_that_takes_it(make_market: MakeApi) -> None:
    api = make_market(cls=BoundRecording)
    queries: Any = api.queries
    await api.data(
        '{ customer(key: "customer-00", maxLag: 5) { name orderCount latestOrder { product(maxLag: 2) { name } '
        "customer { name } } } }"
    )
    assert set(queries.bounds) == {
        ("customers", 5),
        ("order_count", 5),
        ("latest_order", 5),
        ("products", 2),
        ("customers", None),  # a relation takes its own bound, not the one of the field it is under
    }


# -- relations --------------------------------------------------------------------------------------------


async def test_relations_one_level_deep_batch_per_store(market: Api) -> None:
    keys = TRUTH.customer_keys()
    data = await market.data(
        "query($k: [String!]!) { latestOrder { getMany(keys: $k) { orderId item product { key name price } "
        "customer { key name orderCount } } } }",
        {"k": keys},
    )
    for key, order in zip(keys, data["latestOrder"]["getMany"], strict=True):
        truth = TRUTH.customer(key)
        if truth["latestOrder"] is None:
            assert order is None
            continue
        assert order["product"] == TRUTH.product(order["item"])
        assert order["customer"] == {"key": key, "name": truth["name"], "orderCount": truth["orderCount"]}
    ordered = sorted({o["customer"] for o in TRUTH.orders})
    items = sorted(
        {
            o["item"]
            for o in TRUTH.orders
            if TRUTH.customer(o["customer"])["latestOrder"]["orderId"] == o["order_id"] and o["item"]
        }
    )
    assert calls(market) == [
        ("get_many", "customers", ordered),
        ("get_many", "latest_order", sorted(keys)),
        ("get_many", "order_count", ordered),
        ("get_many", "products", items),
    ]


async def test_relations_two_levels_deep_batch_per_depth(market: Api) -> None:
    keys = TRUTH.customer_keys()
    data = await market.data(
        "query($k: [String!]!) { latestOrder { getMany(keys: $k) { customer { name favorite { name } "
        "latestOrder { orderId product { name price } } } } } }",
        {"k": keys},
    )
    for key, order in zip(keys, data["latestOrder"]["getMany"], strict=True):
        truth = TRUTH.customer(key)
        if order is None:
            continue
        customer = order["customer"]
        assert customer["name"] == truth["name"]
        assert customer["favorite"] == (None if truth["favorite"] is None else {"name": truth["favorite"]["name"]})
        product = TRUTH.product(truth["latestOrder"]["item"])
        assert customer["latestOrder"] == {
            "orderId": truth["latestOrder"]["orderId"],
            "product": None if product is None else {"name": product["name"], "price": product["price"]},
        }
    # depth 1: latest_order; depth 2: the customers' table and latest orders; depth 3: their products and
    # favorites, together: one call per store per depth
    assert per_store(market) == {"latest_order": 2, "customers": 1, "products": 1}


async def test_a_null_target_key_is_null_without_an_error(market: Api) -> None:
    last = TRUTH.orders[-1]
    assert last["item"] is None
    data = await market.data(f'{{ latestOrder {{ get(key: "{last["customer"]}") {{ item product {{ name }} }} }} }}')
    assert data == {"latestOrder": {"get": {"item": None, "product": None}}}
    nobody = await market.data('{ customer(key: "customer-03") { favorite { key } } }')  # favorite: null
    assert MARKET_CUSTOMERS["customer-03"]["favorite"] is None and nobody == {"customer": {"favorite": None}}


async def test_relations_from_keys_follow_the_entry_key(market: Api) -> None:
    data = await market.data(
        "{ orderCount { all(first: 100) { edges { node { key value customer { key city } } } } } }"
    )
    for edge in data["orderCount"]["all"]["edges"]:
        node = edge["node"]
        assert node["customer"] == {"key": node["key"], "city": TRUTH.customer(node["key"])["city"]}
    assert per_store(market) == {"customers": 1}
    market.queries.calls.clear()
    data = await market.data('{ ordersPerMinute { fetch(key: "customer-02") { value customer { name } } } }')
    windows = data["ordersPerMinute"]["fetch"]
    assert windows and all(w["customer"] == {"name": "Customer 2"} for w in windows)
    assert per_store(market) == {"orders_per_minute": 1, "customers": 1}


async def test_a_relation_to_a_column_replaces_it_and_keeps_the_key(market: Api) -> None:
    sdl = market.schema.as_str()
    latest = sdl.split("type LatestOrder {")[1].split("}")[0]
    assert "customer(" in latest and "customer: String" not in latest  # replaced: named like its column
    assert "item: String" in latest and "product(" in latest  # added next to its column
    customer = sdl.split("type Customer {")[1].split("\n}")[0]
    assert "favorite(" in customer and "favorite: String" not in customer  # the table's relation, on the entity
    data = await market.data('{ latestOrder { get(key: "customer-00") { customer { key } } } }')
    assert data == {"latestOrder": {"get": {"customer": {"key": "customer-00"}}}}


async def test_long_keys_and_targets_of_another_type(lab_hosted: Hosted) -> None:
    fill_lab(lab_hosted, {12: READING, 7: {**READING, "sensor_id": "12"}, 8: {**READING, "sensor_id": "abc"}})
    queries = single_node(lab_app(), LAB_TYPES, lab_hosted, 50, RecordingQueries)
    stores = [
        dataclasses.replace(s, relations=(RelationInfo("sensor", "Sensor", "sensor_id"),)) if s.name == "reading" else s
        for s in queries.stores()
    ]
    sensor = EntityInfo("Sensor", "int", ("lab_count", "reading", "lab_seen"), "sensors")
    api = Api(lab_app(), queries, entities=[sensor], stores=stores)
    data = await api.data("{ sensors(keys: [12, 7, 99]) { key labCount labSeen reading { sensorId } } }")
    assert data["sensors"] == [
        {"key": 12, "labCount": 1, "labSeen": True, "reading": {"sensorId": "s-7"}},
        {"key": 7, "labCount": 1, "labSeen": True, "reading": {"sensorId": "12"}},
        {"key": 99, "labCount": None, "labSeen": False, "reading": None},
    ]
    result = await api.run("{ reading { getMany(keys: [7, 8]) { sensorId sensor { key labCount } } } }")
    assert result.data == {
        "reading": {
            "getMany": [{"sensorId": "12", "sensor": {"key": 12, "labCount": 1}}, {"sensorId": "abc", "sensor": None}]
        }
    }
    assert [(e.path, e.extensions["code"]) for e in result.errors or []] == [  # type: ignore[index]
        (["reading", "getMany", 1, "sensor"], "INVALID_KEY")  # "abc" names no Long key
    ]
    too_big = await api.run("{ sensor(key: 9223372036854775808) { key } }")
    assert too_big.data == {"sensor": None} and [e.extensions["code"] for e in too_big.errors or []] == [  # type: ignore[index]
        "INVALID_KEY"
    ]


# -- definitions ------------------------------------------------------------------------------------------


def _kv(name: str, value: Any = None, relations: Sequence[RelationInfo] = (), kind: str = "key_value") -> StoreInfo:
    extra: dict[str, Any] = {"false_positive_rate": 0.01} if kind == "bloom" else {}
    return StoreInfo(name, kind, "string", value or LongType(), "t", 1, True, relations=tuple(relations), **extra)


def _refused(stores: Sequence[StoreInfo], entities: Sequence[EntityInfo], match: str) -> str:
    with pytest.raises(SchemaDefinitionError, match=match) as refused:
        build_schema(stores, entities=entities)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_definition_errors_are_one_line_each() -> None:
    table, count, latest = _kv("customers", CUSTOMER_TYPE), _kv("order_count"), _kv("latest_order", ORDER_TYPE)
    customer = EntityInfo("Customer", "string", ("customers", "order_count"), "customerList", table="customers")
    ok = [table, count, latest]
    build_schema(ok, entities=[customer])  # the base case builds
    _refused(ok, [dataclasses.replace(customer, plural="customers")], r"root field 'customers'.*plural=")
    _refused(ok, [dataclasses.replace(customer, name="OrderCount")], r"root field 'orderCount'.*rename the entity")
    _refused(
        ok, [dataclasses.replace(customer, name="LatestOrder", plural="x")], r"type 'LatestOrder'.*rename the entity"
    )
    _refused(
        ok, [dataclasses.replace(customer, stores=("customers", "nope"))], r"composes 'nope', which is not a store"
    )
    _refused(
        ok, [dataclasses.replace(customer, table="latest_order")], r"table 'latest_order' must be one of its stores"
    )
    _refused(ok, [dataclasses.replace(customer, key_type="int")], r"int keys but its store 'customers' has string keys")
    _refused(ok, [customer, dataclasses.replace(customer, name="Client")], r"root field 'customerList'.*plural=")
    clash = _kv("customers", StructType([*CUSTOMER_TYPE.fields, StructField("order_count", LongType())]))
    _refused([clash, count], [customer], r"column 'order_count' of table 'customers' and store 'order_count'")
    bloom = _kv("seen", BooleanType(), kind="bloom")
    _refused([bloom, count], [EntityInfo("Seen", "string", ("seen", "order_count"), "seens")], r"bloom store.*table")
    window = _kv("minutes", CUSTOMER_TYPE, kind="window")
    _refused(
        [window], [EntityInfo("Minute", "string", ("minutes",), "ms", "minutes")], r"window store: give a key-value"
    )
    _refused(ok, [dataclasses.replace(customer, name="Cust-omer")], r"'Cust-omer': a type name is a letter")


def test_relation_errors_name_store_relation_and_column() -> None:
    customer = EntityInfo("Customer", "string", ("order_count",), "customerList")

    def refused(store: StoreInfo, match: str) -> None:
        message = _refused([_kv("order_count"), store], [customer], match)
        assert store.name in message and store.relations[0].field in message

    refused(_kv("latest", ORDER_TYPE, [RelationInfo("buyer", "Client", "customer")]), r"no entity 'Client'.*Customer")
    refused(_kv("latest", ORDER_TYPE, [RelationInfo("buyer", "Customer", "cust")]), r"'cust' is not a column")
    refused(_kv("count2", LongType(), [RelationInfo("buyer", "Customer", "x")]), r"column 'x'.*bigint, not a struct")
    refused(_kv("seen", BooleanType(), [RelationInfo("buyer", "Customer")], "bloom"), r"bloom store has no entries")
    refused(_kv("latest", ORDER_TYPE, [RelationInfo("item", "Customer", "customer")]), r"field 'item'.*rename")
    refused(_kv("count2", LongType(), [RelationInfo("value", "Customer")]), r"entries have a field 'value'")


def test_a_table_without_columns_is_a_store_field() -> None:
    entity = EntityInfo("Customer", "string", ("order_count", "total"), "customerList", table="total")
    sdl = build_schema([_kv("order_count"), _kv("total")], entities=[entity]).as_str()
    customer = sdl.split("type Customer {")[1].split("\n}")[0]
    assert "orderCount: Long" in customer and "total: Long" in customer
    assert "Every Customer, a page at a time, in key order: the keys of store total." in sdl


def test_no_entities_leave_the_schema_as_it_was() -> None:
    stores = [_kv("order_count"), _kv("customers")]
    assert build_schema(stores).as_str() == build_schema(stores, entities=()).as_str()


async def test_without_reading_ahead_fields_still_read_once_per_store(
    market: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    import iqgraph.schema.entities.batches

    monkeypatch.setattr(iqgraph.schema.entities.batches, "subfields", lambda info, through=(): [])  # no selection hint
    keys = TRUTH.customer_keys()
    data = await market.data(f"query($k: [String!]!) {{ customerList(keys: $k) {{ {CUSTOMER} }} }}", {"k": keys})
    assert data["customerList"] == [TRUTH.customer(k) for k in keys]
    assert set(per_store(market).values()) == {1}  # the first field of a store reads it for the whole batch


def test_an_entity_arrival_dropped_unawaited_leaves_no_never_awaited_coroutine() -> None:
    """A request cancelled mid-way (a node's stop) drops the entity arrivals it had not awaited: no coroutine
    exists until one is awaited, so nothing warns 'coroutine ... was never awaited' in the node's log."""
    import gc
    import warnings

    from iqgraph.schema.entities.batches import _Arrival

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arrival = _Arrival(None, [], None)  # type: ignore[arg-type]
        assert hasattr(arrival, "__await__")
        del arrival
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
