"""The shop's live dashboard in headless Chromium, offline, against one real node (`iqgraph serve`: Spark, RocksDB,
the change feed): orders produced while the page is open change its numbers, which settle equal to what a GraphQL
query reads from the stores; the page loads nothing from outside loopback. On the same node: the subscription
`iqgraph dev` prints runs in GraphiQL, and the README's client (examples/follow_key.py, GraphQL over SSE) follows
a key."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from iqgraph.app.dev.example_query import INTROSPECTION, example_subscription, schema_from_introspection
from iqgraph.examples.shop import ITEMS, build_app
from iqgraph.streaming.apache_kafka import KafkaBroker
from iqgraph.streaming.broker import free_port, produce
from iqgraph.streaming.definitions import DefinitionError, iso_timestamp
from tests.conftest import MakeTopic
from tests.support.browser import browser_page, require_chromium
from tests.support.nodes import ROOT, NodeProcess, start_node, wait_ready, write_app_module

PARTITIONS = 2
CUSTOMERS = 40
BEFORE, WHILE_OPEN = 300, 700  # orders produced before the page opens, then while it is open
SETTLE_S = 120
STORES = """query($from: DateTime!) {
  itemOrdersPerMinute { fetchAll(from: $from, first: 1000) { edges { node { key start value } } } }
  topCustomers { top(first: 5) { member value rank } }
}"""
# What the page shows, read from its elements' ids and data attributes.
PAGE = """JSON.stringify({
  minute: document.getElementById("current-minute").dataset.start,
  total: Number(document.getElementById("current-total").dataset.value),
  items: Object.fromEntries(ITEMS_JSON.map((i) => [i, Number(document.getElementById("item-" + i).textContent)])),
  minutes: Object.fromEntries(Array.from(document.querySelectorAll("#minutes tbody tr"))
    .map((tr) => [tr.dataset.start, Number(tr.querySelector(".orders").textContent)])),
  top: Array.from(document.querySelectorAll("#top-customers tbody tr")).map((tr) => [
    Number(tr.querySelector(".rank").textContent), tr.querySelector(".member").textContent,
    Number(tr.querySelector(".value").dataset.value)]),
})""".replace("ITEMS_JSON", json.dumps(ITEMS))


@pytest.fixture(scope="module")
def node(
    broker: KafkaBroker, make_topic: MakeTopic, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NodeProcess, str]]:
    topic = make_topic(PARTITIONS, prefix="dashboard")
    home = tmp_path_factory.mktemp("dashboard-node")
    write_app_module(home, "dashboardapp", topic, PARTITIONS, broker.bootstrap_servers)
    started = start_node(home, "dashboardapp", "node-0", free_port())
    try:
        wait_ready([started])
        yield started, topic
    finally:
        started.kill()


def orders(rng: random.Random, count: int) -> list[tuple[bytes, bytes, None]]:
    """Return count orders of now, keyed by customer (a few customers, so that the top five move)."""
    found = []
    for n in range(count):
        customer = f"customer-{rng.randrange(CUSTOMERS):04d}"
        order = {
            "order_id": f"o-{rng.random()}-{n}",
            "customer": customer,
            "item": rng.choice(ITEMS),
            "quantity": 1,
            "amount": round(rng.uniform(2.0, 80.0), 2),
            "ts": iso_timestamp(int(time.time() * 1000)),
        }
        found.append((customer.encode(), orjson.dumps(order), None))
    return found


def order_of(customer: str) -> tuple[bytes, bytes, None]:
    """Return one order of customer, now."""
    order = {"order_id": "o-one", "customer": customer, "item": "lever", "quantity": 1, "amount": 3.0}
    return customer.encode(), orjson.dumps({**order, "ts": iso_timestamp(int(time.time() * 1000))}), None


def store_view(served: NodeProcess, since: str) -> dict[str, Any]:
    """Return what the page should show, read from the stores with one GraphQL query."""
    answer = served.post(STORES, {"from": since})
    assert "errors" not in answer, answer
    minutes: dict[str, dict[str, int]] = {}
    for edge in answer["data"]["itemOrdersPerMinute"]["fetchAll"]["edges"]:
        window = edge["node"]
        minutes.setdefault(window["start"], {})[window["key"]] = window["value"]
    newest = max(minutes, default="")
    items = {item: minutes.get(newest, {}).get(item, 0) for item in ITEMS}
    return {
        "minute": newest,
        "total": sum(items.values()),
        "items": items,
        "minutes": {start: sum(counts.values()) for start, counts in minutes.items()},
        "top": [[e["rank"], e["member"], e["value"]] for e in answer["data"]["topCustomers"]["top"]],
    }


def settled(page: Any, served: NodeProcess, since: str, produced: int) -> dict[str, Any]:
    """Wait until the stores hold every order produced and the page shows what they hold; return it."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        truth = store_view(served, since)
        shown = json.loads(page.evaluate(PAGE) or "null")
        if sum(truth["minutes"].values()) == produced and shown == truth:
            return dict(shown)
        assert time.monotonic() < deadline, f"the page did not settle:\n page {shown}\n store {truth}"
        time.sleep(0.3)


@pytest.mark.slow
def test_the_page_follows_orders_per_minute_and_the_top_customers_live(
    node: tuple[NodeProcess, str], broker: KafkaBroker, tmp_path: Path
) -> None:
    served, topic = node
    chromium = require_chromium()
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:00Z")
    rng = random.Random(13)
    produce(broker.bootstrap_servers, topic, orders(rng, BEFORE))
    with browser_page(chromium, tmp_path) as page:
        page.call("Network.enable")
        page.call("Page.navigate", url=f"{served.url}/dashboard")
        page.wait_for('document.getElementById("status").dataset.state === "live"')
        before = settled(page, served, since, BEFORE)
        produce(broker.bootstrap_servers, topic, orders(rng, WHILE_OPEN))
        after = settled(page, served, since, BEFORE + WHILE_OPEN)
        page.call("Runtime.evaluate", expression="1")  # collects the network events still on their way
        requested = [p["request"]["url"] for m, p in page.events if m == "Network.requestWillBeSent"]
        sockets = [p["url"] for m, p in page.events if m == "Network.webSocketCreated"]
    assert sum(before["minutes"].values()) == BEFORE and len(before["top"]) == 5
    assert sum(after["minutes"].values()) - sum(before["minutes"].values()) == WHILE_OPEN
    assert after["top"] != before["top"] and after["total"] >= 1
    assert f"{served.url}/dashboard" in requested
    assert f"{served.url}/graphql/static/live/graphql-transport-ws.js" in requested
    assert sockets == [f"{served.url.replace('http', 'ws', 1)}/graphql"]
    for url in [*requested, *sockets]:
        assert urllib.parse.urlsplit(url).hostname == "127.0.0.1" or url.startswith("data:"), url


@pytest.mark.slow
def test_the_dashboard_is_a_page_of_the_node_and_its_script_speaks_the_protocol(
    node: tuple[NodeProcess, str],
) -> None:
    served, _ = node
    page = httpx.get(f"{served.url}/dashboard", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "https://" not in page.text and "http://" not in page.text
    script = httpx.get(f"{served.url}/graphql/static/live/graphql-transport-ws.js", timeout=10)
    assert script.status_code == 200 and '"graphql-transport-ws"' in script.text


def test_an_app_names_a_dashboard_page_that_exists(tmp_path: Path) -> None:
    assert build_app().dashboard == ROOT / "examples" / "shop_dashboard.html"
    with pytest.raises(DefinitionError, match="dashboard .* is not a file"):
        dataclasses.replace(build_app(), dashboard=tmp_path / "missing.html")


def test_the_readme_shows_the_client_this_module_runs() -> None:
    section = (ROOT / "README.md").read_text().split("## Live subscriptions", 1)[1].split("\n## ", 1)[0]
    client = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert client is not None and "def follow(" in client[1]
    assert client[1].strip() in (ROOT / "examples" / "follow_key.py").read_text()


@pytest.mark.slow
def test_the_readme_client_follows_a_key(node: tuple[NodeProcess, str], broker: KafkaBroker) -> None:
    served, topic = node
    key = "customer-0999"  # no order of the dashboard test has it
    follower = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "follow_key.py"), served.url, key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline().split()
        assert first[:2] == [key, "None"], first
        produce(broker.bootstrap_servers, topic, [order_of(key)] * 3)
        values = []
        while not values or values[-1] != 3:
            line = follower.stdout.readline().split()
            assert line and line[0] == key, (line, follower.stderr.read() if follower.poll() is not None else "")
            values.append(int(line[1]))
    finally:
        follower.terminate()
        follower.wait(timeout=30)
    assert values == sorted(values) and values[-1] == 3
    answer = served.post("query($k: String!) { orderCount { get(key: $k) } }", {"k": key})
    assert answer["data"]["orderCount"]["get"] == 3


@pytest.mark.slow
def test_the_subscription_dev_prints_runs_in_graphiql(
    node: tuple[NodeProcess, str], broker: KafkaBroker, tmp_path: Path
) -> None:
    served, topic = node
    key = "customer-0998"
    schema = schema_from_introspection(served.post(INTROSPECTION)["data"])
    subscription = example_subscription(schema, build_app(topic, PARTITIONS), {"order_count": key})
    assert subscription is not None and "orderCountWatch" in subscription
    response = "document.querySelector('.graphiql-response').innerText"
    with browser_page(require_chromium(), tmp_path) as page:
        page.call("Page.navigate", url=f"{served.url}/graphql?q={urllib.parse.quote(subscription)}")
        page.wait_for("document.querySelector('.graphiql-execute-button') !== null")
        page.evaluate("document.querySelector('.graphiql-execute-button').click()")
        page.wait_for(f"{response}.includes('{key}')")  # the first event: the key's value now (none)
        produce(broker.bootstrap_servers, topic, [order_of(key)] * 2)
        compact = f"{response}.replace(/\\s/g, '')"
        page.wait_for(f"{compact}.includes('\"value\":2')")
        shown = page.evaluate(compact)
    assert f'"orderCountWatch":{{"key":"{key}","value":2,' in shown and '"errors"' not in shown, shown
