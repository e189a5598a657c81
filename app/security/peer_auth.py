"""Authenticated peers: every forwarded sub-request is signed with the cluster's secret, and checked.

A node forwards a client's reads to the owners of their keys at their **internal endpoint**
(``INTERNAL_PATH``), which serves only the internal fields (``schema.internal``). Peers prove who they are
with an HMAC-SHA256, keyed by the cluster secret every node is given (``IQGRAPH_CLUSTER_SECRET``), over

    method, path, SHA-256 of the body (sent in a header too), timestamp, nonce, sending node's id, the caller
    it carries, the receiving node's id

so a signed request cannot be altered (body, path, caller) nor replayed: a timestamp more than
``WINDOW_S`` away from the receiver's clock is refused, a nonce seen within that window is refused
(``NonceCache``), and a request signed for one node is refused by every other (a captured sub-request cannot
be sent to a node holding standby copies of the same partitions within its window). The caller — the
Principal the first node authenticated — travels signed, and the owner
checks every store read against it (``schema.access.check_read``), exactly as the first node did.

Why an HMAC and not mutual TLS: it needs no certificate per node (one secret for the cluster, given like
any other setting), it works over plain HTTP in development as over HTTPS in production, and it binds
the caller's identity and the body to the request, which TLS alone does not. TLS (``app.security.tls``) adds
confidentiality on top.

What is refused gets HTTP 401 with a GraphQL error UNAUTHENTICATED; the reason is logged (with the
claimed node id and the client address), never sent. The forwarded marker header alone grants nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from base64 import urlsafe_b64decode, urlsafe_b64encode
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from iqgraph.schema.access import PRINCIPAL_SCOPE_KEY, Principal
from iqgraph.schema.errors import UNAUTHENTICATED

log = logging.getLogger(__name__)

#: The path of the internal endpoint peers send forwarded sub-requests to.
#: How far a signed request's timestamp may be from the receiver's clock, in seconds (either way).
WINDOW_S = 30.0
#: The headers of a signed sub-request.
NODE_HEADER = "x-iqgraph-node"
TIMESTAMP_HEADER = "x-iqgraph-timestamp"
NONCE_HEADER = "x-iqgraph-nonce"
CALLER_HEADER = "x-iqgraph-caller"
TO_HEADER = "x-iqgraph-to"
BODY_HEADER = "x-iqgraph-body-sha256"  # the body's SHA-256, signed: checked before the body is read
SIGNATURE_HEADER = "x-iqgraph-signature"
#: Where an authenticated sub-request's sender (its node id) and its caller are put in the ASGI scope.
PEER_SCOPE_KEY = "iqgraph.peer"
#: The most nonces remembered (a full cache refuses new requests rather than forget: see NonceCache).
MAX_NONCES = 1_000_000
_REFUSED = orjson.dumps(
    {"errors": [{"message": "peer authentication required", "extensions": {"code": UNAUTHENTICATED}}]}
)


class PeerAuthError(Exception):
    """A sub-request that is not a peer's; the message is logged only."""


def _encode_caller(caller: Principal) -> str:
    return urlsafe_b64encode(orjson.dumps(caller.to_json())).decode()


def _signature(secret: bytes, method: str, path: str, digest: str, timestamp: str, nonce: str, node: str,
               caller: str, to: str) -> str:  # fmt: skip
    message = "\n".join((method.upper(), path, digest, timestamp, nonce, node, caller, to)).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class PeerSigner:
    """Sign this node's sub-requests to peers."""

    def __init__(self, node_id: str, secret: str | bytes) -> None:
        self.node_id = node_id
        self._secret = secret.encode() if isinstance(secret, str) else secret

    def headers(self, path: str, body: bytes, caller: Principal, to: str, now: float | None = None) -> dict[str, str]:
        """Return the headers that authenticate a POST of body to path of node to, on behalf of caller."""
        timestamp = f"{time.time() if now is None else now:.3f}"
        nonce = secrets.token_urlsafe(16)
        encoded = _encode_caller(caller)
        digest = hashlib.sha256(body).hexdigest()
        signature = _signature(self._secret, "POST", path, digest, timestamp, nonce, self.node_id, encoded, to)
        return {
            BODY_HEADER: digest,
            NODE_HEADER: self.node_id,
            TO_HEADER: to,
            TIMESTAMP_HEADER: timestamp,
            NONCE_HEADER: nonce,
            CALLER_HEADER: encoded,
            SIGNATURE_HEADER: signature,
        }


class NonceCache:
    """The nonces of the last WINDOW_S seconds: a nonce seen twice is a replay.

    Only requests whose signature is valid get here (peers, not strangers), so its size is bounded by the
    peers' request rate times the window; past MAX_NONCES it refuses rather than forgets (a forgotten
    nonce could be replayed).
    """

    def __init__(self, window_s: float = WINDOW_S, max_size: int = MAX_NONCES) -> None:
        self.window_s = window_s
        self.max_size = max_size
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it expires, in insertion order
        self._lock = threading.Lock()

    def first_use(self, nonce: str, now: float) -> bool:
        """Return True if nonce was not seen within the window (and remember it), else False."""
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now:
                self._seen.popitem(last=False)
            if nonce in self._seen or len(self._seen) >= self.max_size:
                return False
            self._seen[nonce] = now + 2 * self.window_s  # a timestamp may be up to the window ahead
            return True


class PeerVerifier:
    """Check the signature, freshness and uniqueness of a peer's sub-request."""

    def __init__(self, secret: str | bytes, node_id: str, window_s: float = WINDOW_S) -> None:
        """node_id: this node's: a request signed for another is refused."""
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self.node_id = node_id
        self.window_s = window_s
        self.nonces = NonceCache(window_s)

    def verify(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, now: float | None = None
    ) -> tuple[str, Principal]:
        """Return the sending node's id and the caller it carries; raise PeerAuthError if not a peer's."""
        node, caller, digest = self.verify_head(method, path, headers, now)
        check_body(body, digest)
        return node, caller

    def verify_head(
        self, method: str, path: str, headers: Mapping[str, str], now: float | None = None
    ) -> tuple[str, Principal, str]:
        """Check a sub-request's signed headers before its body is read (the signature covers the body's declared
        SHA-256); return the sending node's id, the caller it carries and that digest (``check_body``)."""
        now = time.time() if now is None else now
        self.check_head(method, path, headers, now)
        node, nonce, caller, digest = (
            headers[NODE_HEADER],
            headers[NONCE_HEADER],
            headers[CALLER_HEADER],
            headers[BODY_HEADER],
        )
        if not self.nonces.first_use(nonce, now):
            raise PeerAuthError("replayed nonce")
        try:
            principal = Principal.from_json(orjson.loads(urlsafe_b64decode(caller)))
        except ValueError:
            raise PeerAuthError("bad caller") from None
        return node, principal, digest

    def check_head(self, method: str, path: str, headers: Mapping[str, str], now: float | None = None) -> None:
        """Raise PeerAuthError unless the headers are signed for this node, now (the nonce is not used up: a
        check the request guard makes before reading the body, ``verify_head`` then makes it whole)."""
        now = time.time() if now is None else now
        try:
            node, timestamp, nonce = headers[NODE_HEADER], headers[TIMESTAMP_HEADER], headers[NONCE_HEADER]
            caller, signature, to = headers[CALLER_HEADER], headers[SIGNATURE_HEADER], headers[TO_HEADER]
            digest = headers[BODY_HEADER]
        except KeyError as exc:
            raise PeerAuthError(f"no {exc.args[0]} header") from None
        expected = _signature(self._secret, method, path, digest, timestamp, nonce, node, caller, to)
        if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
            raise PeerAuthError("bad signature")
        if to != self.node_id:
            raise PeerAuthError(f"signed for node {to!r}, not this one ({self.node_id!r}): a replay")
        try:
            sent = float(timestamp)
        except ValueError:
            raise PeerAuthError("bad timestamp") from None
        if abs(now - sent) > self.window_s:
            raise PeerAuthError(f"timestamp {now - sent:+.1f} s away (window {self.window_s:g} s)")

    def admits(self, scope: Mapping[str, Any]) -> str | None:
        """Return why an ASGI request's signed headers are refused (logged), None if they are a peer's (the
        request guard's check before the body: ``app.http.request_guard``)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        try:
            self.check_head(scope["method"], scope["path"], headers)
        except PeerAuthError as exc:
            client = scope.get("client") or ("?", 0)
            log.warning("refused a sub-request claiming node %r from %s: %s", headers.get(NODE_HEADER), client[0], exc)
            return str(exc)
        return None


def check_body(body: bytes, digest: str) -> None:
    """Raise PeerAuthError unless body is the one whose SHA-256 the signed headers declared."""
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest().encode(), digest.encode("utf-8", "replace")):
        raise PeerAuthError("the body is not the one signed")


class PeerGate:
    """ASGI wrapper of the internal endpoint: only signed sub-requests of peers reach app.

    The signed headers are checked BEFORE the body is read (an unsigned or replayed request is refused having
    read nothing of its body); the body is then read, at most max_body_bytes, and checked against the signed
    digest. The app gets the same body, the sending node's id at ``scope[PEER_SCOPE_KEY]`` and the carried
    caller at ``scope[PRINCIPAL_SCOPE_KEY]``; ``received(node_id)`` counts each authenticated sub-request
    (metrics name peers by it).
    """

    def __init__(
        self,
        app: Any,
        verifier: PeerVerifier,
        received: Callable[[str], None] | None = None,
        max_body_bytes: int = 64 << 20,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.received = received
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve a peer's sub-request, or refuse it with 401."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        try:
            node, caller, digest = self.verifier.verify_head(scope["method"], scope["path"], headers)
            body = await _read_body(receive, self.max_body_bytes)
            check_body(body, digest)
        except PeerAuthError as exc:
            client = scope.get("client") or ("?", 0)
            log.warning("refused a sub-request claiming node %r from %s: %s", headers.get(NODE_HEADER), client[0], exc)
            await _refuse(send)
            return
        if self.received is not None:
            self.received(node)
        scope = {**scope, PEER_SCOPE_KEY: node, PRINCIPAL_SCOPE_KEY: caller}
        await self.app(scope, _replay(body, receive), send)


async def _read_body(receive: Any, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise PeerAuthError("the peer went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PeerAuthError(f"body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Any) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_REFUSED)).encode())]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": _REFUSED})
