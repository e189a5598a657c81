"""Owner-side fields on one node: typed in the SDL, values equal to ground truth, batched into one call per
request, a failing key INTERNAL (the others answer), a slow one TIMEOUT, views that cannot write."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import pytest
from strawberry.types import ExecutionResult

from iqgraph.app.catalog import entity_infos
from iqgraph.app.owner.runner import owner_field_infos
from iqgraph.schema import Limits, build_schema, context_getter
from iqgraph.schema.errors import SchemaDefinitionError
from iqgraph.schema.types import OwnerFieldInfo
from iqgraph.streaming.definitions import App
from iqgraph.streaming.owner_fields import owner_field
from tests.schema.conftest import Hosted, RecordingQueries
from tests.support.apps import MARKET_CUSTOMERS, MARKET_TYPES, PARTITIONS, MarketTruth, market_app, market_orders
from tests.support.queries import single_node

SUMMARY = "struct<orders: bigint, spend: double, city: string, minutes: int, ordered: boolean, items: array<string>>"
STARTED = threading.Event()


@owner_field("order_count", returns=SUMMARY, description="A customer at a glance")
def customer_summary(key: str, views: Any) -> dict[str, Any]:
    profile = views.kv("customers").get(key) or {}
    windows = views.window("orders_per_minute").fetch(key)
    latest = views.kv("latest_order").get(key)
    return {
        "orders": views.kv("order_count").get(key) or 0,
        "spend": views.kv("total_spend").get(key),
        "city": profile.get("city"),
        "minutes": len(windows),
        "ordered": views.bloom("ordered").might_contain(key),
        "items": [] if latest is None else [latest["item"]],
    }


@owner_field("order_count")
def fragile(key: str, views: Any) -> str:
    if key == "customer-03":
        raise ValueError("the secret detail that must not reach the client")
    return f"{key}: {views.kv('order_count').get(key)}"


@owner_field("order_count", returns="double", timeout_s=0.2)
def slow(key: str, views: Any) -> float:
    if key == "customer-04":
        STARTED.set()
        time.sleep(1.0)
    return float(views.kv("total_spend").get(key) or 0.0)


@owner_field("order_count", returns="bigint")
def vandal(key: str, views: Any) -> int:
    view = views.kv("order_count")
    view.put(None, key, 1_000_000)  # no such method: the views read only
    return 0


@owner_field("order_count", returns="bigint")
def digger(key: str, views: Any) -> int:
    from iqgraph.stores.codecs import encode_value

    stores = views.kv("order_count")._partitions[0]  # the live stores the views once kept
    stores.db.family("order_count")[key.encode()] = encode_value(1_000_000)
    return 0


@owner_field("order_count", returns="double")
def infinite(key: str, views: Any) -> float:
    return float("inf") if key == "customer-01" else float("nan")


@owner_field("order_count", returns="struct<orders: bigint>")
def mistyped(key: str, views: Any) -> Any:
    return {"orders": "many"} if key == "customer-01" else {"orders": 1, "extra": 2}


@owner_field("order_count", returns="struct<raw: binary, parts: array<binary>>")
def raw_bytes(key: str, views: Any) -> dict[str, Any]:
    return {"raw": b"\xff\x00\xfe", "parts": [b"ok", bytearray(b"\x80")]}


def _app() -> App:
    return dataclasses.replace(
        market_app(), fields=[customer_summary, fragile, slow, vandal, digger, infinite, mistyped, raw_bytes]
    )


class OwnerApi:
    """The market with owner-side fields, over the production query path of one node."""

    def __init__(self, hosted: Hosted) -> None:
        self.app = _app()
        self.queries = single_node(self.app, MARKET_TYPES, hosted, cls=RecordingQueries)
        self.limits = Limits()
        self.schema = build_schema(
            self.queries.stores(),
            self.limits,
            entities=entity_infos(self.app),
            owner_fields=owner_field_infos(self.app),
        )

    async def run(self, query: str, variables: dict[str, Any] | None = None) -> ExecutionResult:
        context = context_getter(self.queries, self.limits)()
        return await self.schema.execute(query, variable_values=variables, context_value=context)


@pytest.fixture
def api(market_hosted: Hosted) -> OwnerApi:
    return OwnerApi(market_hosted)


def _truth() -> MarketTruth:
    return MarketTruth(market_orders())


def _expected_summary(key: str) -> dict[str, Any] | None:
    orders = [o for o in market_orders() if o["customer"] == key]
    minutes = {o["ms"] // 60_000 for o in orders}
    return {
        "orders": len(orders),
        "spend": pytest.approx(sum(o["amount"] for o in orders)) if orders else None,
        "city": MARKET_CUSTOMERS.get(key, {}).get("city"),
        "minutes": len(minutes),
        "ordered": bool(orders),
        "items": [orders[-1]["item"]] if orders else [],
    }


def test_fields_are_typed_in_the_sdl(api: OwnerApi) -> None:
    sdl = api.schema.as_str()
    assert '"""A customer at a glance"""\n  customerSummary(' in sdl
    assert 'customerSummary(\n    """The key."""\n    key: String!' in sdl
    assert "): CustomerSummary\n" in sdl
    assert "customerSummaryMany(" in sdl and "): [CustomerSummary]\n" in sdl
    summary = sdl[sdl.index("type CustomerSummary {") :].split("}")[0]
    for field in (
        "orders: Long",
        "spend: Float",
        "city: String",
        "minutes: Int",
        "ordered: Boolean",
        "items: [String]",
    ):
        assert field in summary
    assert "): String\n" in sdl[sdl.index("  fragile(") :]
    assert "): Float\n" in sdl[sdl.index("  slow(") :]
    assert "_call(" not in sdl  # the internal endpoint's (build_internal_schema)


async def test_values_equal_ground_truth_in_one_call_per_request(api: OwnerApi) -> None:
    keys = [*_truth().customer_keys(), "customer-99"]
    query = """query($k: [String!]!) { customerSummaryMany(keys: $k) { orders spend city minutes ordered items }
      one: customerSummary(key: "customer-01") { orders } }"""
    calls: list[tuple[str, list[Any]]] = []
    real = api.queries.call_many

    async def recording(field: str, keys: Any, max_lag: int | None = None) -> list[Any]:
        calls.append((field, list(keys)))
        return await real(field, keys, max_lag)

    api.queries.call_many = recording  # type: ignore[method-assign]
    result = await api.run(query, {"k": keys})
    assert result.errors is None, result.errors
    assert result.data is not None
    for key, found in zip(keys, result.data["customerSummaryMany"], strict=True):
        expected = _expected_summary(key)
        assert found == expected, key
    assert result.data["one"] == {"orders": _expected_summary("customer-01")["orders"]}  # type: ignore[index]
    assert [field for field, _ in calls] == ["customer_summary"]  # both fields' keys: one batch
    assert len(calls[0][1]) == len(keys)


async def test_a_failing_function_is_internal_for_that_key_only(
    api: OwnerApi, caplog: pytest.LogCaptureFixture
) -> None:
    keys = ["customer-01", "customer-03", "customer-05"]
    with caplog.at_level(logging.ERROR, logger="iqgraph.app.owner.runner"):
        result = await api.run("query($k: [String!]!) { fragileMany(keys: $k) }", {"k": keys})
    assert result.data is not None
    counts = _truth()
    assert result.data["fragileMany"][0] == f"customer-01: {sum(o['customer'] == 'customer-01' for o in counts.orders)}"
    assert result.data["fragileMany"][1] is None
    assert result.data["fragileMany"][2].startswith("customer-05: ")
    assert result.errors is not None
    [error] = [e.formatted for e in result.errors]
    assert error["extensions"]["code"] == "INTERNAL"
    assert error["path"] == ["fragileMany", 1]
    assert "secret" not in error["message"]
    [record] = [r for r in caplog.records if "customer-03" in r.getMessage()]
    assert "fragile" in record.getMessage() and record.exc_info is not None
    assert "the secret detail" in str(record.exc_info[1])


async def test_a_slow_function_times_out_and_the_others_answer(api: OwnerApi) -> None:
    STARTED.clear()
    keys = ["customer-04", "customer-01", "customer-02"]
    began = time.monotonic()
    result = await api.run("query($k: [String!]!) { slowMany(keys: $k) }", {"k": keys})
    elapsed = time.monotonic() - began
    assert STARTED.is_set()
    assert elapsed < 0.9  # answered at the timeout, not when the sleeping thread returns
    assert result.data is not None and result.errors is not None
    assert result.data["slowMany"][0] is None
    spend = {c: pytest.approx(v) for c, v in _spend().items()}
    assert result.data["slowMany"][1:] == [spend["customer-01"], spend["customer-02"]]
    [error] = [e.formatted for e in result.errors]
    assert error["extensions"] == {"code": "TIMEOUT", "field": "slow", "timeoutMs": 200}
    assert error["path"] == ["slowMany", 0]


def _spend() -> dict[str, float]:
    found: dict[str, float] = {}
    for order in market_orders():
        found[order["customer"]] = found.get(order["customer"], 0.0) + order["amount"]
    return found


async def test_views_are_read_only(api: OwnerApi) -> None:
    before = (await api.run('{ orderCount { get(key: "customer-01") } }')).data
    result = await api.run('{ vandal(key: "customer-01") }')
    assert result.data == {"vandal": None}
    assert result.errors is not None and result.errors[0].formatted["extensions"]["code"] == "INTERNAL"
    assert (await api.run('{ orderCount { get(key: "customer-01") } }')).data == before
    views = api.queries.local.owner_fields  # what a function gets: read methods only
    from iqgraph.app.owner.views import LocalBloomView, LocalKeyValueView, LocalWindowView

    for cls in (LocalKeyValueView, LocalWindowView, LocalBloomView):
        public = {n for n in dir(cls) if not n.startswith("_")}
        assert public <= {"get", "get_many", "range", "prefix", "fetch", "might_contain", "might_contain_many"}
    assert views is not None


def _reachable(root: Any, depth: int = 6) -> list[tuple[str, Any]]:
    """Return every object reachable from root through public or single-underscore names (no dunders)."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def walk(path: str, obj: Any, left: int) -> None:
        if id(obj) in seen or left == 0 or isinstance(obj, str | int | float | bool | bytes | type(None)):
            return
        seen.add(id(obj))
        found.append((path, obj))
        if isinstance(obj, dict):
            items: list[tuple[str, Any]] = [(f"[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, list | tuple | set | frozenset):
            items = [(f"[{i}]", v) for i, v in enumerate(obj)]
        else:
            names = [n for n in dir(obj) if not n.startswith("__")]
            items = []
            for name in names:
                try:
                    items.append((f".{name}", getattr(obj, name)))
                except Exception:  # noqa: BLE001, S112 - a property that cannot be read here reaches nothing
                    continue
        for label, value in items:
            walk(path + label, value, left - 1)

    walk("views", root, depth)
    return found


async def test_views_keep_no_store_where_a_plain_or_private_name_reaches_it(api: OwnerApi) -> None:
    from iqgraph.app.owner.views import LocalStoreViews
    from iqgraph.app.query.partitions import LocalPartitions
    from iqgraph.stores import PartitionStores
    from iqgraph.streaming.partitioner import partition_for

    before = (await api.run('{ orderCount { get(key: "customer-01") } }')).data
    result = await api.run('{ digger(key: "customer-01") }')  # the reviewer's write through view._partitions
    assert result.errors is not None and result.errors[0].formatted["extensions"]["code"] == "INTERNAL"
    assert (await api.run('{ orderCount { get(key: "customer-01") } }')).data == before
    local = api.queries.local
    partition = partition_for("customer-01", PARTITIONS, "string", "murmur2")
    views = LocalStoreViews(local, local.app.store("order_count"), (partition,))
    for view in (
        views.kv("order_count"),
        views.window("orders_per_minute"),
        views.bloom("ordered"),
        views.kv("customers"),
    ):
        assert view is not None
    for path, obj in _reachable(views):
        assert not isinstance(obj, PartitionStores | LocalPartitions), path
        assert type(obj).__module__.split(".")[-1] not in ("partition", "rocksdict"), path


async def test_nan_infinities_and_values_of_another_type_are_internal_on_the_owner_and_logged(
    api: OwnerApi, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="iqgraph.app.owner.runner"):
        for field, selection in (("infinite", ""), ("mistyped", " { orders }")):
            query = f'{{ {field}Many(keys: ["customer-01", "customer-02"]){selection} }}'
            result = await api.run(query)
            assert result.data == {f"{field}Many": [None, None]}
            assert result.errors is not None
            assert [e.formatted["extensions"]["code"] for e in result.errors] == ["INTERNAL", "INTERNAL"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("infinite" in m and "'customer-01'" in m and "inf is not a finite number" in m for m in messages)
    assert any("infinite" in m and "'customer-02'" in m and "nan is not a finite number" in m for m in messages)
    assert any("mistyped" in m and "'customer-01'" in m and "'many' is not a integer" in m for m in messages)
    assert any("mistyped" in m and "'customer-02'" in m and "['extra']" in m for m in messages)


async def test_binary_values_are_base64_whatever_their_bytes(api: OwnerApi) -> None:
    import base64

    result = await api.run('{ rawBytes(key: "customer-01") { raw parts } }')
    assert result.errors is None
    assert result.data == {
        "rawBytes": {
            "raw": base64.b64encode(b"\xff\x00\xfe").decode(),
            "parts": [base64.b64encode(b"ok").decode(), base64.b64encode(b"\x80").decode()],
        }
    }
    sdl = api.schema.as_str()
    raw = sdl[sdl.index("type RawBytes {") :].split("}")[0]
    assert "raw: String" in raw and "parts: [String]" in raw and "base64" in raw


def test_call_is_an_internal_field() -> None:
    from iqgraph.schema.internal import INTERNAL_FIELDS
    from iqgraph.schema.owner_fields import CALL_FIELD

    assert CALL_FIELD in INTERNAL_FIELDS


async def test_invalid_keys_and_limits_are_coded(api: OwnerApi) -> None:
    result = await api.run('{ fragile(key: "") }')
    assert result.errors is not None and result.errors[0].formatted["extensions"]["code"] == "INVALID_KEY"
    many = ["customer-01"] * (api.limits.max_keys + 1)
    result = await api.run("query($k: [String!]!) { fragileMany(keys: $k) }", {"k": many})
    assert result.errors is not None and result.errors[0].formatted["extensions"]["code"] == "LIMIT_EXCEEDED"


def test_a_root_field_taken_is_refused_when_the_schema_is_built(api: OwnerApi) -> None:
    clash = OwnerFieldInfo("order_count", "string", MARKET_TYPES["order_count"], "order_count")
    with pytest.raises(SchemaDefinitionError, match="would add the root field 'orderCount', which store"):
        build_schema(api.queries.stores(), entities=entity_infos(api.app), owner_fields=[clash])
    metadata = OwnerFieldInfo("nodes", "string", MARKET_TYPES["order_count"], "order_count")
    with pytest.raises(SchemaDefinitionError, match="'nodes', which the metadata has"):
        build_schema(api.queries.stores(), entities=entity_infos(api.app), owner_fields=[metadata])
    entity = OwnerFieldInfo("customer_list", "string", MARKET_TYPES["order_count"], "order_count")
    with pytest.raises(SchemaDefinitionError, match="'customerList', which an entity has"):
        build_schema(api.queries.stores(), entities=entity_infos(api.app), owner_fields=[entity])


def test_without_owner_fields_the_schema_is_unchanged(api: OwnerApi) -> None:
    stores, entities = api.queries.stores(), entity_infos(api.app)
    plain = build_schema(stores, entities=entities).as_str()
    assert plain == build_schema(stores, entities=entities, owner_fields=()).as_str()
    assert "_call" not in plain


async def test_a_peer_answers_call_from_its_own_partitions_in_the_wire_format(api: OwnerApi) -> None:
    from iqgraph.app.owner.runner import owner_field_infos
    from iqgraph.schema import wire
    from iqgraph.schema.access import Principal
    from iqgraph.schema.builder import build_internal_schema
    from iqgraph.schema.context import request_context
    from iqgraph.streaming.partitioner import partition_for

    keys = ["customer-01", "customer-03"]
    calls = [(k, (partition_for(k, PARTITIONS, "string", "murmur2"),)) for k in keys]
    variables = {"field": "fragile", "keys": wire.encode_calls(calls)}
    internal = build_internal_schema(api.limits, owner_field_infos(api.app))
    forwarded = request_context(api.queries, api.limits, local=api.queries.local)
    result = await internal.execute(wire.CALL, variable_values=variables, context_value=forwarded)
    assert result.errors is None and result.data is not None
    answer = wire.decode_call_answer(result.data["_call"])
    assert answer.value[0].found and answer.value[0].value.startswith("customer-01: ")
    assert answer.value[1].found and answer.value[1].value.code == "INTERNAL"
    assert sorted(answer.positions) == sorted({p for _, (p,) in calls})
    # the public schema has no _call; the caller a peer carries must be allowed the field's store
    client = context_getter(api.queries, api.limits)()
    refused = await api.schema.execute(wire.CALL, variable_values=variables, context_value=client)
    assert refused.errors is not None and any("Cannot query field '_call'" in e.message for e in refused.errors)
    stranger = Principal("stranger", frozenset({"latest_order"}))
    forbidden = request_context(api.queries, api.limits, local=api.queries.local, principal=stranger)
    denied = await internal.execute(wire.CALL, variable_values=variables, context_value=forbidden)
    assert denied.errors is not None and denied.errors[0].formatted["extensions"]["code"] == "FORBIDDEN"
    assert denied.errors[0].formatted["extensions"]["store"] == owner_field_infos(api.app)[0].store
    too_many = {"field": "fragile", "keys": wire.encode_calls(calls * api.limits.max_keys)}
    over = await internal.execute(wire.CALL, variable_values=too_many, context_value=forwarded)
    assert over.errors is not None and over.errors[0].formatted["extensions"]["code"] == "LIMIT_EXCEEDED"


def test_a_boxed_value_shaped_like_an_error_is_a_value() -> None:
    from iqgraph.schema import wire
    from iqgraph.schema.errors import ApiError
    from iqgraph.schema.types import Answer

    values = [
        wire.Owned(True, {"error": "a struct's column"}),
        wire.Owned(False, ApiError("no", "TIMEOUT")),
        ApiError("moved", "STORE_MIGRATED"),
    ]
    decoded = wire.decode_call_answer(wire.encode_call_answer(Answer(values, {0: 5})))
    assert decoded.value[0] == wire.Owned(True, {"error": "a struct's column"})
    found, error = decoded.value[1]
    assert not found and isinstance(error, ApiError) and error.code == "TIMEOUT"
    assert isinstance(decoded.value[2], ApiError) and decoded.value[2].code == "STORE_MIGRATED"  # the replica's
    assert decoded.positions == {0: 5}


async def test_a_function_reading_a_store_the_caller_may_not_read_fails_that_key_forbidden(api: OwnerApi) -> None:
    from iqgraph.schema.access import Principal
    from iqgraph.schema.context import request_context

    query = '{ customerSummary(key: "customer-01") { orders spend } orderCount { get(key: "customer-01") } }'
    stores = {"order_count", "customers", "orders_per_minute", "latest_order", "ordered"}  # not total_spend
    for caller, forbidden in ((Principal("some", frozenset(stores)), True), (Principal("all", None), False)):
        context = request_context(api.queries, api.limits, principal=caller)
        result = await api.schema.execute(query, context_value=context)
        assert (
            result.data is not None
            and result.data["orderCount"]["get"] == _truth().customer("customer-01")["orderCount"]
        )
        if forbidden:  # the function opened total_spend: that key's error, the value never read
            assert result.data["customerSummary"] is None
            assert [e.formatted["extensions"] for e in result.errors or []] == [
                {"code": "FORBIDDEN", "store": "total_spend"}
            ]
        else:
            assert result.errors is None and result.data["customerSummary"]["spend"] is not None
