"""GraphQL metrics: requests and latency per root field and store, errors per code, keys per lookup.

The schema gets its metric objects by injection (a registry of the test's own, as each node has one),
and the tests read them back from that registry.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from iqgraph.schema import Limits, build_schema
from iqgraph.schema.metrics import GraphQLMetrics, metric_code
from tests.schema.conftest import Api, MakeApi


def _metrics(registry: CollectorRegistry) -> GraphQLMetrics:
    return GraphQLMetrics(
        Counter("requests", "", ["field", "store"], registry=registry),
        Histogram("duration_seconds", "", ["field", "store"], registry=registry),
        Counter("errors", "", ["code"], registry=registry),
        Histogram("lookup_keys", "", ["store"], registry=registry, buckets=(1, 2, 5, 10)),
    )


class Measured:
    """A shop Api whose schema reports to a registry of its own."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.registry = CollectorRegistry()
        api.schema = build_schema(api.queries.stores(), api.limits, metrics=_metrics(self.registry))

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def requests(self, field: str, store: str = "") -> float:
        return self.value("requests_total", field=field, store=store)

    def timed(self, field: str, store: str = "") -> float:
        return self.value("duration_seconds_count", field=field, store=store)

    def errors(self, code: str) -> float:
        return self.value("errors_total", code=code)

    def lookups(self, store: str) -> tuple[float, float]:
        """Return (batches, keys) looked up in store."""
        return self.value("lookup_keys_count", store=store), self.value("lookup_keys_sum", store=store)

    def labels_of(self, metric: str) -> list[dict[str, str]]:
        return [s.labels for m in self.registry.collect() for s in m.samples if s.name == metric]


@pytest.fixture
def measured(make_shop: MakeApi) -> Measured:
    return Measured(make_shop(Limits(max_keys=5)))


async def test_each_root_field_is_counted_and_timed_with_its_store(measured: Measured) -> None:
    await measured.api.data('{ orderCount { get(key: "customer-00") } itemsSold { mightContain(key: "widget") } }')
    await measured.api.data('{ orderCount { get(key: "customer-01") } }')
    await measured.api.data("{ node { id } stores { name } }")
    assert measured.requests("orderCount", "order_count") == 2
    assert measured.timed("orderCount", "order_count") == 2
    assert measured.requests("itemsSold", "items_sold") == 1
    assert measured.requests("node") == measured.requests("stores") == 1
    assert measured.value("duration_seconds_sum", field="node", store="") > 0


async def test_a_store_argument_names_the_store_only_when_it_is_one(measured: Measured) -> None:
    query = 'query($s: String!) { keyMetadata(store: $s, key: "customer-00") { partition } }'
    await measured.api.data(query, {"s": "total_spend"})
    await measured.api.data('{ keyMetadata(store: "order_count", key: "customer-00") { partition } }')
    errors = await measured.api.errors(query, {"s": "made-up-by-a-client"})
    assert errors[0]["extensions"]["code"] == "UNKNOWN_STORE"
    assert measured.requests("keyMetadata", "total_spend") == 1
    assert measured.requests("keyMetadata", "order_count") == 1
    assert measured.requests("keyMetadata", "") == 1
    assert measured.errors("UNKNOWN_STORE") == 1
    assert all(labels.get("store") != "made-up-by-a-client" for labels in measured.labels_of("requests_total"))


async def test_root_fields_in_fragments_are_counted(measured: Measured) -> None:
    await measured.api.data(
        'query { ...F ... on Query { totalSpend { get(key: "customer-00") } } } '
        'fragment F on Query { orderCount { get(key: "customer-00") } }'
    )
    assert measured.requests("orderCount", "order_count") == 1
    assert measured.requests("totalSpend", "total_spend") == 1


async def test_errors_are_counted_per_code_and_invalid_documents_name_no_field(measured: Measured) -> None:
    await measured.api.errors("{ orderCount { get(key: ")
    await measured.api.errors("{ fieldAClientMadeUp }")
    await measured.api.errors('{ orderCount { getMany(keys: ["a", "b", "c", "d", "e", "f"]) } }')
    assert measured.errors("GRAPHQL_PARSE_FAILED") == 1
    assert measured.errors("GRAPHQL_VALIDATION_FAILED") == 1
    assert measured.errors("LIMIT_EXCEEDED") == 1
    assert measured.requests("", "") == 2
    assert measured.requests("orderCount", "order_count") == 1
    assert {labels["field"] for labels in measured.labels_of("requests_total")} == {"", "orderCount"}


async def test_keys_per_lookup_are_one_batch_per_store_per_request(measured: Measured) -> None:
    await measured.api.data(
        '{ orderCount { a: get(key: "customer-00") b: get(key: "customer-01") '
        'many: getMany(keys: ["customer-02", "customer-03", "customer-00"]) } '
        'itemsSold { mightContainMany(keys: ["widget", "never-sold"]) } }'
    )
    await measured.api.data('{ orderCount { get(key: "customer-05") } }')
    batches, keys = measured.lookups("order_count")
    assert (batches, keys) == (2, 5)  # 4 distinct keys in one batch (the loader dedupes), then 1
    assert measured.lookups("items_sold") == (1, 2)
    assert measured.value("lookup_keys_bucket", store="order_count", le="1.0") == 1
    first = next(keys for _, store, keys in measured.api.queries.calls if store == "order_count")
    assert sorted(first) == ["customer-00", "customer-01", "customer-02", "customer-03"]


async def test_a_store_not_ready_is_counted_with_its_code(make_shop: MakeApi) -> None:
    measured = Measured(make_shop(partitions={}))
    errors = await measured.api.errors('{ orderCount { get(key: "customer-00") } }')
    code = errors[0]["extensions"]["code"]
    assert measured.errors(code) == 1
    assert measured.requests("orderCount", "order_count") == 1


def test_error_codes_are_bounded_labels() -> None:
    assert metric_code("STORE_NOT_READY") == "STORE_NOT_READY"
    assert metric_code("store not ready; drop table") == "OTHER"
    assert metric_code(None) == "OTHER"
    assert metric_code("X" * 80) == "OTHER"
