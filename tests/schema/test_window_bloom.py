"""Window store fields (fetch, fetchAll, fetchRange) and bloom store fields (mightContain…)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.schema.conftest import Api
from tests.support.apps import START_MS, ShopTruth, iso

WINDOW = "key start end value"


async def test_fetch_returns_a_keys_windows_oldest_first(shop: Api, truth: ShopTruth) -> None:
    data = await shop.data(f'{{ ordersPerMinute {{ fetch(key: "customer-00") {{ {WINDOW} }} }} }}')
    expected = sorted((start, n) for (key, start), n in truth.minute_counts().items() if key == "customer-00")
    assert data["ordersPerMinute"]["fetch"] == [
        {"key": "customer-00", "start": iso(s), "end": iso(s + 60_000), "value": n} for s, n in expected
    ]


async def test_fetch_bounds_the_window_start_inclusively_by_iso_time_or_epoch_ms(shop: Api) -> None:
    query = """query($f: DateTime, $t: DateTime) {
      ordersPerMinute { fetch(key: "customer-00", from: $f, to: $t) { start } }
    }"""
    minute = START_MS + 60_000
    by_iso = await shop.data(query, {"f": iso(minute), "t": iso(minute + 60_000)})
    by_ms = await shop.data(query, {"f": minute, "t": minute + 60_000})
    starts = [w["start"] for w in by_iso["ordersPerMinute"]["fetch"]]
    assert starts == [iso(minute), iso(minute + 60_000)]
    assert by_ms == by_iso
    just_after = await shop.data(query, {"f": "2026-01-01T00:01:00.000001Z", "t": None})
    assert iso(minute) not in [w["start"] for w in just_after["ordersPerMinute"]["fetch"]]


async def test_two_fetches_of_one_key_with_different_ranges_get_their_own_windows(shop: Api) -> None:
    first_minute = iso(START_MS)
    data = await shop.data(
        f"""{{ ordersPerMinute {{
          early: fetch(key: "customer-00", to: "{first_minute}") {{ start }}
          late: fetch(key: "customer-00", from: "{iso(START_MS + 1)}") {{ start }}
        }} }}"""
    )
    assert [w["start"] for w in data["ordersPerMinute"]["early"]] == [first_minute]
    assert first_minute not in [w["start"] for w in data["ordersPerMinute"]["late"]]


async def windows_of(api: Api, field: str, first: int, args: str = "") -> list[dict[str, Any]]:
    """Return every window of a window connection, following endCursor."""
    found: list[dict[str, Any]] = []
    after = None
    query = f"query($a: String) {{ ordersPerMinute {{ {field}({args} first: {first}, after: $a) {{ edges {{ node {{ {WINDOW} }} }} pageInfo {{ hasNextPage endCursor }} }} }} }}"  # noqa: E501
    for _ in range(200):
        page = (await api.data(query, {"a": after}))["ordersPerMinute"][field]
        found += [e["node"] for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = page["pageInfo"]["endCursor"]
    raise AssertionError("pagination does not end")


async def test_fetch_all_pages_by_start_then_key(shop: Api, truth: ShopTruth) -> None:
    found = await windows_of(shop, "fetchAll", 4)
    expected = sorted((start, key, n) for (key, start), n in truth.minute_counts().items())
    assert [(w["start"], w["key"], w["value"]) for w in found] == [(iso(s), k, n) for s, k, n in expected]


async def test_fetch_range_pages_by_key_then_start_within_keys_and_times(shop: Api, truth: ShopTruth) -> None:
    args = f'fromKey: "customer-02", toKey: "customer-04", from: "{iso(START_MS + 60_000)}",'
    found = await windows_of(shop, "fetchRange", 3, args)
    expected = sorted(
        (key, start, n)
        for (key, start), n in truth.minute_counts().items()
        if "customer-02" <= key <= "customer-04" and start >= START_MS + 60_000
    )
    assert [(w["key"], w["start"], w["value"]) for w in found] == [(k, iso(s), n) for k, s, n in expected]


async def test_a_hopping_window_store_has_overlapping_windows(shop: Api, truth: ShopTruth) -> None:
    data = await shop.data('{ spendPerMinute { fetch(key: "customer-00") { start end value } } }')
    windows = data["spendPerMinute"]["fetch"]
    spend = truth.per_customer(lambda o: (o["ms"], o["amount"]))["customer-00"]
    first = windows[0]
    assert first["end"] == iso(START_MS + 60_000)  # starts a minute before the first order
    assert sum(a for ms, a in spend if ms < START_MS + 60_000) == pytest.approx(first["value"])


async def test_bloom_fields_answer_membership_and_report_the_rate(shop: Api) -> None:
    data = await shop.data(
        """{ itemsSold {
          widget: mightContain(key: "widget") nothing: mightContain(key: "flux-capacitor")
          mightContainMany(keys: ["gizmo", "flux-capacitor", "gadget"]) falsePositiveRate approximateCount
        } }"""
    )
    assert data["itemsSold"] == {
        "widget": True,
        "nothing": False,
        "mightContainMany": [True, False, True],
        "falsePositiveRate": 0.001,
        "approximateCount": data["itemsSold"]["approximateCount"],
    }
    assert data["itemsSold"]["approximateCount"] >= 3
