"""The peer client against a real HTTP server on loopback: marker and Authorization headers, errors."""

from __future__ import annotations

import asyncio
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
from iqgraph.schema import wire
from iqgraph.schema.asgi import FORWARDED_HEADER
from iqgraph.schema.types import Answer
from iqgraph.streaming.broker import free_port

SEEN: list[dict[str, Any]] = []


def _lookups(variables: dict[str, Any]) -> JSONResponse:
    """Answer aliased _lookup fields: each read's state is [store, key]; store "broken" fails its field;
    a request with store "garbled" is answered with something that is not a GraphQL response."""
    if "garbled" in variables.values():
        return JSONResponse({"errors": ["boom"], "data": [1]})
    data: dict[str, Any] = {}
    errors = []
    for name in [v for v in variables if v.startswith("s")]:
        alias, store = f"l{name[1:]}", variables[name]
        if store == "broken":
            data[alias] = None
            errors.append({"message": "no such store", "path": [alias], "extensions": {"code": "UNKNOWN_STORE"}})
        else:
            reads = wire.decode_reads(variables[f"r{name[1:]}"])
            data[alias] = wire.encode_lookup(Answer([[store, key] for (key, _, _), _ in reads], {0: 3}, {0: 0}))
    return JSONResponse({"data": data, **({"errors": errors} if errors else {})})


async def graphql(request: Request) -> JSONResponse:
    body = await request.json()
    SEEN.append({"headers": dict(request.headers), "body": body})
    if "s0" in body["variables"]:
        return _lookups(body["variables"])
    if "reads" in body["variables"]:  # one store: the plain _lookup document
        variables = body["variables"]
        reads = wire.decode_reads(variables["reads"])
        answer = Answer([[variables["store"], key] for (key, _, _), _ in reads], {0: 3}, {0: 0})
        return JSONResponse({"data": {"_lookup": wire.encode_lookup(answer)}})
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


async def test_lookups_of_several_stores_for_one_peer_go_out_as_one_request_each_with_its_answer(
    peer_url: str,
) -> None:
    client = PeerClient("node-7")
    stores = ["order_count", "total_spend", "broken", "latest_order", "orders_per_minute"]
    before = len(SEEN)
    answers = await asyncio.gather(
        *(client.lookup(peer_url, store, [(("c-1", None, None), (0,)), (("c-2", None, None), (0,))], False, None)
          for store in stores),
        return_exceptions=True,
    )  # fmt: skip
    assert len(SEEN) == before + 1 and client.sent[peer_url] == 1
    for store, answer in zip(stores, answers, strict=True):
        if store == "broken":
            assert isinstance(answer, PeerError) and answer.code == "UNKNOWN_STORE"
        else:
            assert isinstance(answer, Answer) and answer.value == [[store, "c-1"], [store, "c-2"]]
            assert answer.positions == {0: 3}
    # alone, a lookup keeps the one-field document
    await client.lookup(peer_url, "order_count", [(("c-3", None, None), (0,))], False, None)
    assert SEEN[-1]["body"]["query"] == wire.LOOKUP


async def test_a_malformed_answer_to_coalesced_lookups_fails_each_of_them_and_hangs_none(peer_url: str) -> None:
    client = PeerClient("node-7")
    reads = [(("c-1", None, None), (0,))]
    answers = await asyncio.wait_for(
        asyncio.gather(*(client.lookup(peer_url, s, reads, False, None) for s in ("garbled", "order_count")),
                       return_exceptions=True),
        timeout=10,
    )  # fmt: skip
    assert all(isinstance(a, PeerUnavailableError) for a in answers), answers
