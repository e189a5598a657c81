"""The browser's graphql-transport-ws client (schema/static/live/graphql-transport-ws.js) in headless Chromium,
against a scripted server on loopback: credentials from the page's fragment in connection_init, a pong for the
server's ping, and after a dropped connection a new one on which the running subscription is sent again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from iqgraph.schema.graphiql import graphiql_mount
from tests.support.browser import browser_page, require_chromium
from tests.support.servers import serve_in_thread

PAGE = """<!doctype html><html><body><p id="seen"></p>
<script src="/graphql/static/live/graphql-transport-ws.js"></script>
<script>
  const seen = document.getElementById("seen");
  const live = IqGraphLive.connect(IqGraphLive.endpoint(), { payload: IqGraphLive.credentials(), retryMs: [100] });
  live.subscribe({ query: "subscription { n }" }, {
    next: (result) => { seen.textContent += result.data.n + " "; },
    complete: () => { seen.textContent += "complete"; },
  });
</script></body></html>"""


class ScriptedServer:
    """graphql-transport-ws, scripted: the first connection drops after one event, the second completes."""

    def __init__(self) -> None:
        self.received: list[list[dict[str, Any]]] = []  # per connection, the client's messages in order

    async def serve(self, websocket: WebSocket) -> None:
        await websocket.accept(subprotocol="graphql-transport-ws")
        received: list[dict[str, Any]] = []
        self.received.append(received)

        async def expect(kind: str) -> dict[str, Any]:
            message: dict[str, Any] = await asyncio.wait_for(websocket.receive_json(), 10)
            received.append(message)
            assert message["type"] == kind, message
            return message

        await expect("connection_init")
        await websocket.send_json({"type": "connection_ack"})
        subscribe = await expect("subscribe")
        n = len(self.received)
        await websocket.send_json({"type": "ping"})
        await expect("pong")
        await websocket.send_json({"id": subscribe["id"], "type": "next", "payload": {"data": {"n": n}}})
        if n == 1:
            await websocket.close(1011)  # dropped: the client connects again
            return
        await websocket.send_json({"id": subscribe["id"], "type": "complete"})
        await websocket.receive()  # until the client goes away


@pytest.fixture
def server() -> Iterator[tuple[str, ScriptedServer]]:
    scripted = ScriptedServer()

    async def page(_: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    app = Starlette(
        routes=[Route("/page", page), graphiql_mount("/graphql"), WebSocketRoute("/graphql", scripted.serve)]
    )
    with serve_in_thread(app) as url:
        yield url, scripted


def test_the_client_authenticates_answers_pings_and_subscribes_again_after_a_drop(
    server: tuple[str, ScriptedServer], tmp_path: Path
) -> None:
    url, scripted = server
    with browser_page(require_chromium(), tmp_path) as page:
        page.call("Page.navigate", url=f"{url}/page#token=t0k")
        page.wait_for('document.getElementById("seen").textContent === "1 2 complete"', timeout_s=30)
    assert len(scripted.received) == 2
    for connection in scripted.received:
        init, subscribe, pong = connection[:3]
        assert init == {"type": "connection_init", "payload": {"Authorization": "Bearer t0k"}}
        assert subscribe["payload"] == {"query": "subscription { n }"} and pong["type"] == "pong"
