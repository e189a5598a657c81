"""The peer client against a real HTTP server on loopback: marker and Authorization headers, errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from iqgraph.app.peers import PeerClient, PeerError, PeerUnavailableError
from iqgraph.schema.asgi import FORWARDED_HEADER
from iqgraph.streaming.broker import free_port

SEEN: list[dict[str, Any]] = []


async def graphql(request: Request) -> JSONResponse:
    body = await request.json()
    SEEN.append({"headers": dict(request.headers), "body": body})
    if body["variables"].get("store") == "broken":
        return JSONResponse({"data": None, "errors": [{"message": "no", "extensions": {"code": "UNKNOWN_STORE"}}]})
    return JSONResponse({"data": {"_count": {"counts": {"1": 40, "4": 2}, "positions": {"1": 7}, "lags": {"1": 0}}}})


@pytest.fixture(scope="module")
def peer_url() -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Route("/graphql", graphql, methods=["POST"])]),
            host="127.0.0.1",
            port=port,
            log_level="error",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


async def test_forwarded_requests_carry_the_marker_and_the_callers_authorization(peer_url: str) -> None:
    client = PeerClient("node-7")
    answer = await client.count(peer_url, "order_count", [1, 4], True, "Bearer secret")
    assert (answer.value, answer.positions, answer.lags) == ({1: 40, 4: 2}, {1: 7}, {1: 0})
    request = SEEN[-1]
    assert request["headers"][FORWARDED_HEADER] == "node-7"
    assert request["headers"]["authorization"] == "Bearer secret"
    assert request["body"]["variables"] == {"store": "order_count", "partitions": [1, 4], "exact": True}
    assert client.sent[peer_url] == 1


async def test_peer_errors_keep_their_code_and_dead_peers_are_unavailable(peer_url: str) -> None:
    client = PeerClient("node-7", timeout_s=1.0)
    with pytest.raises(PeerError) as failed:
        await client.count(peer_url, "broken", [0], True, None)
    assert failed.value.code == "UNKNOWN_STORE"
    assert "authorization" not in SEEN[-1]["headers"]
    with pytest.raises(PeerUnavailableError):
        await client.count(f"http://127.0.0.1:{free_port()}", "order_count", [0], True, None)
