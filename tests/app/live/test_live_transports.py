"""Subscriptions over the node's HTTP stack on a real uvicorn (``app.http.server.build_asgi``: RequestGuard, AuthGate,
the websocket route): GraphQL over SSE and graphql-transport-ws, with API-key authentication (headers, or a
websocket's connection_init payload), FORBIDDEN, the per-connection limit, and a stream outliving the request
deadline and ending when its client goes away."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from iqgraph.app.http.server import build_asgi
from iqgraph.app.node import Node
from iqgraph.app.security.auth import Authenticator
from iqgraph.app.security.gate import init_authenticator
from iqgraph.app.settings import Settings
from iqgraph.schema import GraphQLApp
from tests.support.live_shop import KEYS, WATCH, WATCH_WINDOWS, LiveShop, open_live_shop, where
from tests.support.servers import serve_in_thread
from tests.support.sse import sse_events
from tests.support.transport_ws import TransportWS, websocket

READER_KEY = "ik_live_reader_0123456789abcdef"  # may read per_key only
TIMEOUT_MS = 300


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LiveShop]]:
    """Serve a live shop on a free port: (its base URL, the shop), API keys required, a 300 ms request deadline."""
    root = tmp_path_factory.mktemp("live")
    keys = root / "keys.toml"
    digest = hashlib.sha256(READER_KEY.encode()).hexdigest()
    keys.write_text(f'[keys.reader]\nsha256 = "{digest}"\nscopes = ["read:per_key"]\n')
    settings = Settings(app="shop:app", auth="api-key", api_keys=keys, request_timeout_ms=TIMEOUT_MS)
    authenticator = Authenticator.from_settings(settings)
    assert authenticator is not None
    shop = open_live_shop(root)
    graphql = GraphQLApp(
        shop.schema,
        shop.queries,
        shop.limits,
        require_principal=True,
        live=shop.live,
        connection_auth=init_authenticator(authenticator),
        max_subscriptions_per_connection=2,
    )
    asgi = build_asgi(Node(settings, shop.app), graphql, authenticator=authenticator)
    with serve_in_thread(asgi, log_level="warning") as url:
        yield url.removeprefix("http://"), shop
    shop.close()


def wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_sse_streams_changes_past_the_request_deadline_until_the_client_goes(node: tuple[str, LiveShop]) -> None:
    address, shop = node
    key = next(k for k in KEYS if where(k) == 0)
    body = {"query": WATCH, "variables": {"keys": [key]}}
    headers = {"accept": "text/event-stream", "x-api-key": READER_KEY}
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"http://{address}/graphql", json=body, headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response.iter_lines())
            kind, first = next(events)
            assert kind == "next" and first["data"]["perKeyWatch"]["snapshot"] is True
            base = shop.count(key) or 0
            time.sleep(2 * TIMEOUT_MS / 1000)  # the stream outlives the request deadline
            shop.write([(key, "pen", 0)])
            kind, pushed = next(events)
            assert kind == "next"
            assert pushed["data"]["perKeyWatch"]["value"] == base + 1 == shop.count(key)
            assert shop.feed.stats().subscriptions == 1
    wait_until(lambda: shop.feed.stats().subscriptions == 0)  # the client went away: the subscription is closed


def test_sse_needs_credentials_and_refuses_a_store_the_caller_may_not_read(node: tuple[str, LiveShop]) -> None:
    address, shop = node
    url, accept = f"http://{address}/graphql", {"accept": "text/event-stream"}
    body = {"query": WATCH_WINDOWS, "variables": {"keys": [KEYS[0]]}}
    assert httpx.post(url, json=body, headers=accept).status_code == 401
    with httpx.stream("POST", url, json=body, headers={**accept, "x-api-key": READER_KEY}, timeout=10) as response:
        found = list(sse_events(response.iter_lines()))
    assert [kind for kind, _ in found] == ["next", "complete"]
    assert found[0][1]["errors"][0]["extensions"] == {"code": "FORBIDDEN", "store": "per_minute"}


def test_graphql_transport_ws_authenticates_by_connection_init_and_streams_changes(node: tuple[str, LiveShop]) -> None:
    address, shop = node
    key = next(k for k in KEYS if where(k) == 1)
    with websocket(address) as raw:
        ws = TransportWS(raw)
        assert ws.init({"Authorization": f"ApiKey {READER_KEY}"})["type"] == "connection_ack"
        ws.send({"type": "ping"})
        assert ws.receive()["type"] == "pong"
        ws.subscribe("1", WATCH, {"keys": [key]})
        snapshot = ws.receive()
        assert (snapshot["id"], snapshot["type"]) == ("1", "next")
        assert snapshot["payload"]["data"]["perKeyWatch"]["snapshot"] is True
        shop.write([(key, "pen", 0)])
        pushed = ws.receive()["payload"]["data"]["perKeyWatch"]
        assert (pushed["key"], pushed["value"], pushed["snapshot"]) == (key, shop.count(key), False)
        assert pushed["position"] == {"partition": 1, "offset": shop.orders.changed_at[key]}  # its order's offset
        ws.subscribe("2", WATCH_WINDOWS, {"keys": [key]})  # a store it may not read
        refused = ws.receive()
        assert (refused["id"], refused["type"]) == ("2", "next")
        assert refused["payload"]["errors"][0]["extensions"]["code"] == "FORBIDDEN"
        assert ws.receive() == {"id": "2", "type": "complete"}
        ws.subscribe("3", WATCH, {"keys": [key]})
        ws.receive()  # its snapshot
        ws.subscribe("4", WATCH, {"keys": [key]})  # a third at once: past the connection's limit (2)
        over = ws.receive()
        assert (over["id"], over["type"]) == ("4", "error")
        assert over["payload"][0]["extensions"] == {"code": "LIMIT_EXCEEDED", "limit": 2, "requested": 3}
        ws.send({"id": "1", "type": "complete"})
        wait_until(lambda: shop.feed.stats().subscriptions == 1)
    wait_until(lambda: shop.feed.stats().subscriptions == 0)


def test_a_websocket_without_valid_credentials_is_closed(node: tuple[str, LiveShop]) -> None:
    address, _ = node
    for payload in (None, {"Authorization": "ApiKey wrong"}, {"x-api-key": 17}):
        with websocket(address) as raw:
            ws = TransportWS(raw)
            with pytest.raises(ConnectionClosed) as closed:
                ws.init(payload)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    with pytest.raises(InvalidStatus) as refused:  # bad header credentials: refused at the handshake
        websocket(address, additional_headers={"x-api-key": "wrong"}).close()
    assert refused.value.response.status_code == 403
    with websocket(address, additional_headers={"x-api-key": READER_KEY}) as raw:  # good ones: no payload needed
        assert TransportWS(raw).init()["type"] == "connection_ack"


def test_a_subscription_asking_for_json_is_406(node: tuple[str, LiveShop]) -> None:
    address, _ = node
    body = {"query": WATCH, "variables": {"keys": [KEYS[0]]}}
    answer = httpx.post(f"http://{address}/graphql", json=body, headers={"x-api-key": READER_KEY}, timeout=10)
    assert answer.status_code == 406
    assert answer.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"
    assert "text/event-stream" in answer.json()["errors"][0]["message"]
