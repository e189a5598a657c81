"""Review of issue 13 part 3 (helper-R), over HTTP: node B's live streams to a peer share the pool of its forwarded
reads (``PeerClient``: 64 connections), so subscriptions starve every read B forwards.

Node A is an in-process uvicorn serving ``/internal/changes`` (the real ``StreamEndpoint`` behind ``PeerGate``) and a
stand-in ``/internal/graphql``; node B is a ``Live`` with the real ``PeerClient`` (no Spark).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from iqgraph.app.cluster.peers import PeerClient
from iqgraph.app.live.stream import StreamEndpoint, changes_events
from iqgraph.app.live.watch import Live
from iqgraph.app.security.peer_auth import PeerGate, PeerVerifier
from iqgraph.schema.access import ANONYMOUS, Principal
from iqgraph.schema.wire import CHANGES_PATH, INTERNAL_PATH
from iqgraph.streaming.change_feed import ChangeFeed
from tests.support.live_shop import LiveShop, open_live_shop
from tests.support.servers import peer_healthz, serve_in_thread

SECRET = "review-cluster-secret-0123456789abcdef"  # noqa: S105 - a test cluster's


async def _internal(scope: Any, receive: Any, send: Any) -> None:
    await JSONResponse({"data": {"ok": True}})(scope, receive, send)


@pytest.fixture(scope="module")
def node_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LiveShop]]:
    shop = open_live_shop(tmp_path_factory.mktemp("review-http"))
    verifier = PeerVerifier(SECRET, "node-a")
    routes = [
        Route(CHANGES_PATH, PeerGate(StreamEndpoint(changes_events(lambda: shop.live)), verifier), methods=["POST"]),
        Route(INTERNAL_PATH, PeerGate(_internal, verifier), methods=["POST"]),
        peer_healthz(),
    ]
    with serve_in_thread(Starlette(routes=routes), log_level="warning") as url:
        yield url, shop
    shop.close()


@dataclass
class _Members:
    members: list[str] = field(default_factory=lambda: ["node-a", "node-b"])


@dataclass
class _Membership:
    def current(self) -> _Members:
        return _Members()


@dataclass
class _Queries:
    """What Live.store_changes asks of ClusterStoreQueries: the members and their URLs."""

    url: str
    membership: _Membership = field(default_factory=_Membership)

    def url_of(self, node: str) -> str | None:
        return self.url if node == "node-a" else None


async def test_watch_top_subscriptions_leave_room_for_forwarded_reads(node_a: tuple[str, LiveShop]) -> None:
    """Live.store_changes (every watchTop, the dashboard's) shares one /internal/changes stream per (peer, store,
    caller) (Broadcasts), as relays share one /internal/follow per (peer, topic, caller, copy) — on PeerClient's
    pooled client (stream_client() is _client(): max_connections=64 for every peer and every forwarded read).
    64 callers (users of a dashboard, with authentication on) hold every connection: B's next forwarded read
    waits for the pool (PEER_TIMEOUT_S = 5 s, then PoolTimeout → PeerUnavailableError: a wrong NODE_UNAVAILABLE
    for every key owned elsewhere)."""
    url, shop = node_a
    peers = PeerClient("node-b", secret=SECRET)
    peers.receiver_of = lambda url: "node-a"
    live = Live(
        shop.app,
        {},
        ChangeFeed(),
        partitioner=lambda topic: "murmur2",
        node_id="node-b",
        queries=_Queries(url),  # type: ignore[arg-type]
        peers=peers,
    )
    users = [Principal(f"user-{i}", frozenset({"per_key"})) for i in range(peers.limits.max_connections)]
    streams = [live.store_changes("per_key", principal=user) for user in users]
    try:
        assert await asyncio.gather(*(anext(s) for s in streams)) == [0] * len(streams)  # every one follows
        started = time.monotonic()
        try:
            answer = await asyncio.wait_for(peers.query(url, "{ ok }", {}, ANONYMOUS), 3.0)
        except TimeoutError:
            answer = None
        waited = time.monotonic() - started
        assert answer == {"ok": True}, f"a forwarded read got no connection in {waited:.1f} s"
    finally:
        for s in streams:
            with contextlib.suppress(Exception):
                await s.aclose()
