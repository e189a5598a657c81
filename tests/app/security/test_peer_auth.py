"""Peers' signed sub-requests (app.peer_auth): what verifies, what is refused, and the gate in front of the app."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from iqgraph.app.http.request_guard import RequestGuard
from iqgraph.app.security.peer_auth import (
    PEER_SCOPE_KEY,
    NonceCache,
    PeerAuthError,
    PeerGate,
    PeerSigner,
    PeerVerifier,
)
from iqgraph.app.settings import Settings
from iqgraph.schema.access import ANONYMOUS, PRINCIPAL_SCOPE_KEY, Principal
from iqgraph.schema.wire import INTERNAL_PATH

SECRET = "cluster-secret"  # noqa: S105 - a test's
BODY = b'{"query":"{ node { id } }","variables":{}}'
ALICE = Principal("alice", frozenset({"order_count"}))


def _headers(body: bytes = BODY, caller: Principal = ALICE, now: float = 1_000.0) -> dict[str, str]:
    return PeerSigner("node-1", SECRET).headers(INTERNAL_PATH, body, caller, "node-0", now=now)


def test_a_signed_request_verifies_once_with_its_sender_and_caller() -> None:
    verifier = PeerVerifier(SECRET, "node-0")
    headers = _headers()
    assert verifier.verify("POST", INTERNAL_PATH, headers, BODY, now=1_010.0) == ("node-1", ALICE)
    with pytest.raises(PeerAuthError, match="replayed"):
        verifier.verify("POST", INTERNAL_PATH, headers, BODY, now=1_011.0)
    everyone = _headers(caller=ANONYMOUS)
    assert verifier.verify("POST", INTERNAL_PATH, everyone, BODY, now=1_000.0)[1] == ANONYMOUS


@pytest.mark.parametrize(
    ("why", "change"),
    [
        ("bad signature", lambda h, b: ({**h, "x-iqgraph-signature": "0" * 64}, b, 1_000.0, SECRET, "POST")),
        ("not the one signed", lambda h, b: (h, b + b" ", 1_000.0, SECRET, "POST")),  # the body changed
        ("bad signature", lambda h, b: ({**h, "x-iqgraph-body-sha256": "0" * 64}, b, 1_000.0, SECRET, "POST")),
        ("bad signature", lambda h, b: ({**h, "x-iqgraph-node": "node-2"}, b, 1_000.0, SECRET, "POST")),
        (
            "bad signature",
            lambda h, b: (
                {**h, "x-iqgraph-caller": _headers(caller=ANONYMOUS)["x-iqgraph-caller"]},
                b,
                1_000.0,
                SECRET,
                "POST",
            ),
        ),  # fmt: skip
        ("bad signature", lambda h, b: (h, b, 1_000.0, "another-secret", "POST")),
        ("bad signature", lambda h, b: (h, b, 1_000.0, SECRET, "GET")),
        ("bad signature", lambda h, b: ({**h, "x-iqgraph-to": "node-2"}, b, 1_000.0, SECRET, "POST")),  # re-addressed
        ("timestamp", lambda h, b: (h, b, 1_031.0, SECRET, "POST")),  # too old
        ("timestamp", lambda h, b: (h, b, 969.0, SECRET, "POST")),  # from the future
        (
            "no x-iqgraph-signature",
            lambda h, b: ({k: v for k, v in h.items() if k != "x-iqgraph-signature"}, b, 1_000.0, SECRET, "POST"),
        ),  # fmt: skip
    ],
)
def test_anything_altered_stale_or_missing_is_refused(why: str, change: Any) -> None:
    headers, body, now, secret, method = change(_headers(), BODY)
    with pytest.raises(PeerAuthError, match=why):
        PeerVerifier(secret, "node-0").verify(method, INTERNAL_PATH, headers, body, now=now)


def test_the_nonce_cache_forgets_after_the_window_and_refuses_when_full() -> None:
    cache = NonceCache(window_s=30, max_size=2)
    assert cache.first_use("a", 0.0) and not cache.first_use("a", 59.0)
    assert cache.first_use("b", 1.0)
    assert not cache.first_use("c", 2.0)  # full: it refuses rather than forget a nonce still in the window
    assert cache.first_use("a", 61.0)  # expired (twice the window: a timestamp may be up to it ahead)


async def test_the_gate_gives_the_app_the_same_body_sender_and_caller_and_refuses_the_rest() -> None:
    seen: list[tuple[bytes, str, Principal]] = []
    received: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append((message["body"], scope[PEER_SCOPE_KEY], scope[PRINCIPAL_SCOPE_KEY]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = PeerGate(app, PeerVerifier(SECRET, "node-0"), received.append, max_body_bytes=1_000)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://node") as client:
        signed = PeerSigner("node-1", SECRET).headers(INTERNAL_PATH, BODY, ALICE, "node-0")
        assert (await client.post(INTERNAL_PATH, content=BODY, headers=signed)).status_code == 200
        replayed = await client.post(INTERNAL_PATH, content=BODY, headers=signed)
        unsigned = await client.post(INTERNAL_PATH, content=BODY, headers={"x-iqgraph-forwarded": "node-1"})
        big = b"x" * 2_000
        too_big = await client.post(
            INTERNAL_PATH,
            content=big,
            headers=PeerSigner("node-1", SECRET).headers(INTERNAL_PATH, big, ALICE, "node-0"),
        )
    assert seen == [(BODY, "node-1", ALICE)] and received == ["node-1"]
    for refused in (replayed, unsigned, too_big):
        assert refused.status_code == 401
        assert refused.json()["errors"][0]["extensions"] == {"code": "UNAUTHENTICATED"}


def test_a_signature_of_any_characters_is_refused_not_an_error() -> None:
    for signature in ("\xe9" * 64, "😀", ""):
        with pytest.raises(PeerAuthError, match="bad signature"):
            PeerVerifier(SECRET, "node-0").verify(
                "POST", INTERNAL_PATH, {**_headers(), "x-iqgraph-signature": signature}, BODY, now=1_000.0
            )


def test_a_request_signed_for_one_node_is_refused_by_every_other() -> None:
    """A sub-request captured on its way to node-0 (say, a standby of the same partitions elsewhere) is refused
    by node-2 and node-3 within its window, and still answered by node-0."""
    headers = _headers()
    for other in ("node-2", "node-3", ""):
        with pytest.raises(PeerAuthError, match="signed for node 'node-0'"):
            PeerVerifier(SECRET, other).verify("POST", INTERNAL_PATH, headers, BODY, now=1_001.0)
    assert PeerVerifier(SECRET, "node-0").verify("POST", INTERNAL_PATH, headers, BODY, now=1_001.0)[0] == "node-1"


async def test_the_gate_refuses_an_unsigned_request_without_reading_its_body() -> None:
    """The signed headers are checked first: an unsigned, replayed or mis-addressed request is refused having read
    nothing of its body (six unsigned 60 MiB posts cost no memory); a signed one whose body is not the signed
    one is refused once read."""
    reads: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    def request(headers: dict[str, str], body: bytes) -> tuple[dict[str, Any], Any]:
        async def receive() -> dict[str, Any]:
            reads.append(len(body))
            return {"type": "http.request", "body": body, "more_body": False}

        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        return {"type": "http", "method": "POST", "path": INTERNAL_PATH, "headers": raw}, receive

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    gate = PeerGate(app, PeerVerifier(SECRET, "node-0"))
    signed = PeerSigner("node-1", SECRET).headers(INTERNAL_PATH, BODY, ALICE, "node-0")
    big = b"x" * (60 << 20)
    for headers in ({}, {**signed, "x-iqgraph-to": "node-0", "x-iqgraph-signature": "0" * 64}):
        await gate(*request(headers, big), send)
    assert reads == [] and [m["status"] for m in sent if "status" in m] == [401, 401]
    await gate(*request(signed, BODY + b" "), send)  # signed, but another body
    assert reads == [len(BODY) + 1] and sent[-2]["status"] == 401
    fresh = PeerSigner("node-1", SECRET).headers(INTERNAL_PATH, BODY, ALICE, "node-0")
    await gate(*request(fresh, BODY), send)
    assert sent[-2]["status"] == 200


async def test_the_request_guard_refuses_an_unsigned_sub_request_before_reading_its_body() -> None:
    """What the node serves: the request guard reads a request's body before the app runs, so for the peers' paths
    it checks the signed headers first — six unsigned 60 MiB posts get 401 with nothing of their bodies read."""
    reads: list[int] = []
    ran: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ran.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    verifier = PeerVerifier(SECRET, "node-0")
    guard = RequestGuard(app, Settings(), {INTERNAL_PATH: 64 << 20}, signed={INTERNAL_PATH: verifier.admits})
    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def post(headers: dict[str, str], body: bytes) -> None:
        async def receive() -> dict[str, Any]:
            reads.append(len(body))
            return {"type": "http.request", "body": body, "more_body": False}

        raw = [(k.encode(), v.encode()) for k, v in {**headers, "content-length": str(len(body))}.items()]
        await guard({"type": "http", "method": "POST", "path": INTERNAL_PATH, "headers": raw}, receive, send)

    big = b"x" * (60 << 20)
    await asyncio.gather(*(post({"content-type": "application/json"}, big) for _ in range(6)))
    assert statuses == [401] * 6 and reads == [] and ran == []
    await post(PeerSigner("node-1", SECRET).headers(INTERNAL_PATH, BODY, ALICE, "node-0"), BODY)
    assert statuses[-1] == 200 and reads == [len(BODY)] and ran == [INTERNAL_PATH]
