"""The owner-side field runner on one node's partitions: JSON-able values, views that read only what is local,
and workers that a stuck function cannot hold forever."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row

from iqgraph.app.local_partitions import LocalPartitions
from iqgraph.app.owner_fields import OwnerFieldRunner, as_json
from iqgraph.schema.errors import ApiError
from iqgraph.streaming.definitions import App, key_value_store, sum_
from iqgraph.streaming.owner_fields import OwnerField
from iqgraph.streaming.partitioner import partition_for
from tests.schema.apps import PARTITIONS, fill_market, market_app, market_orders
from tests.schema.conftest import Hosted, close_hosted, open_hosted

RELEASE = threading.Event()


def _stuck(key: str, views: Any) -> float:
    RELEASE.wait(5)
    return 1.0


def _by_item(key: str, views: Any) -> float:
    return float(views.kv("spend_per_item").get("widget") or 0.0)


def _app() -> App:
    base = market_app()
    stores = [*base.stores, key_value_store("spend_per_item", "orders", sum_("amount"), key="item")]
    fields = [
        OwnerField("stuck", _stuck, "double", "order_count", timeout_s=0.1),
        OwnerField("by_item", _by_item, "double", "order_count"),
    ]
    return dataclasses.replace(base, stores=stores, fields=fields)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalPartitions]:
    app = _app()
    hosted: Hosted = open_hosted(tmp_path, app, "orders", "customers", "products")
    fill_market(hosted, market_orders())
    yield LocalPartitions(app, hosted)
    close_hosted(hosted)


def _call(key: str) -> tuple[str, tuple[int, ...]]:
    return key, (partition_for(key, PARTITIONS, "string", "murmur2"),)


def test_values_become_json_the_schema_converts() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert as_json({"at": when, "day": when.date(), "price": decimal.Decimal("1.10"), "pair": (1, "a")}) == {
        "at": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "price": "1.10",
        "pair": [1, "a"],
    }
    assert as_json(Row(genre="jazz", plays=3)) == {"genre": "jazz", "plays": 3}
    assert as_json({1: "one"}) == [[1, "one"]]  # a map with non-string keys: its pairs
    with pytest.raises(TypeError, match="returned a object"):
        as_json(object())


async def test_a_stuck_worker_times_out_its_key_and_then_the_keys_waiting(local: LocalPartitions) -> None:
    RELEASE.clear()
    runner = OwnerFieldRunner(local, workers=1, queue_timeout_s=0.3)
    try:
        answer = await asyncio.wait_for(runner.call("stuck", [_call("customer-01"), _call("customer-02")]), 5)
    finally:
        RELEASE.set()
        runner.close()
    first, second = answer.value
    assert isinstance(first, ApiError) and first.code == "TIMEOUT" and "ran longer than 0.1 s" in first.message
    assert isinstance(second, ApiError) and second.code == "TIMEOUT" and "free worker" in second.message
    assert answer.positions  # the partitions' positions, read before the data


async def test_a_view_of_a_store_keyed_by_a_column_is_refused(
    local: LocalPartitions, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="iqgraph.app.owner_fields"):
        answer = await local.call("by_item", [_call("customer-01")])
    [error] = answer.value
    assert isinstance(error, ApiError) and error.code == "INTERNAL"
    [record] = caplog.records
    assert "by_item" in record.getMessage() and "customer-01" in record.getMessage()
    assert record.exc_info is not None and "keyed by column 'item'" in str(record.exc_info[1])


async def test_a_partition_not_hosted_fails_its_keys_for_another_replica(local: LocalPartitions) -> None:
    key = "customer-01"
    elsewhere = (partition_for(key, PARTITIONS, "string", "murmur2") + 1) % PARTITIONS
    hosted = {t: {p: s for p, s in ps.items() if p != elsewhere} for t, ps in local.partitions.items()}
    partial = LocalPartitions(local.app, hosted)
    answer = await partial.call("stuck", [(key, (elsewhere,))])
    [error] = answer.value
    assert type(error).__name__ == "StoreMigratedError"
