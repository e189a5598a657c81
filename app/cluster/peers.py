"""The peer client: forwarded sub-requests to other nodes' internal endpoints, over one httpx client.

Each call is ONE GraphQL request to one peer (the documents and encodings are ``schema.wire``'s), except
point reads: the lookups of every store sent to one peer for one caller within the same two turns of the
event loop go out together as ONE request, each an aliased ``_lookup`` (``wire.lookups``): an entity of
five stores, or one depth of relations, costs one sub-request per peer, not one per store. Each lookup
gets its own answer, or its own error.

Every sub-request goes to the peer's internal endpoint (``wire.INTERNAL_PATH``; the peer answers from
its own partitions only) on the peer's own listener for peers: members are known by the URL clients reach them
at, and each tells where its peer listener is on ``/healthz`` (its ``peerPort`` on the host it was reached at, or
its ``peerUrl`` when set: ``peer_url`` asks once and keeps it until a connection to it is refused — a node
restarted with another --peer-port is asked again). Signed
with the cluster secret and carrying the caller (``peer_auth.PeerSigner``):
the owner checks the caller may read each store. Explicit timeouts and connection limits; keep-alive
connections are reused across requests; a connection the peer closes as it is made fails as unreachable
(``transport``). Counts what it sends per peer, and tells an optional PeerObserver
(the node's metrics) of each request sent and each that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import orjson

from iqgraph.app.cluster.transport import PeerTransport
from iqgraph.app.security.peer_auth import PeerSigner
from iqgraph.schema import tracing, wire
from iqgraph.schema.access import Principal
from iqgraph.schema.errors import NODE_UNAVAILABLE
from iqgraph.schema.live import peer_streams
from iqgraph.schema.live.peer_streams import Rows
from iqgraph.schema.types import Answer, NodeInfo, Read, Scan
from iqgraph.schema.wire import (
    CHANGES_PATH,
    FOLLOW_PATH,
    HEALTH_PATH,
    HEARTBEAT_S,
    INTERNAL_PATH,
    PEER_TIMEOUT_S,
    encode_json,
)

STREAM_CONNECTIONS = 512  # live streams to peers (app.live.relay bounds them: 256 upstreams, and change counts)


class PeerError(Exception):
    """A peer answered a forwarded sub-request with an error."""

    def __init__(self, message: str, code: str, extensions: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.extensions = dict(extensions or {"code": code})


class PeerUnavailableError(PeerError):
    """The peer could not be reached, timed out or failed (5xx)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, NODE_UNAVAILABLE)


class PeerObserver(Protocol):
    """Hears what the peer client sends and what fails."""

    def sent_to(self, url: str) -> None:
        """A sub-request is being sent to the peer at url."""
        ...

    def failed(self, url: str, code: str) -> None:
        """The peer at url failed a sub-request (NODE_UNAVAILABLE) or answered it with an error code."""
        ...


@dataclass(frozen=True)
class _Lookup:
    """One store's point reads waiting to go to a peer with the others of the same turn."""

    store: str
    reads: list[list[Any]]
    answer: asyncio.Future[Any]


def _settle(answer: asyncio.Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    if answer.done():  # its request was cancelled meanwhile
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(value)


def _peer_error(url: str, error: Mapping[str, Any]) -> PeerError:
    extensions = error.get("extensions") or {}
    message = error.get("message", "no answer")
    return PeerError(f"peer {url}: {message}", str(extensions.get("code", "INTERNAL")), extensions)


class PeerClient:
    """Send forwarded sub-requests to peers."""

    def __init__(
        self,
        node_id: str,
        *,
        timeout_s: float = PEER_TIMEOUT_S,
        connect_timeout_s: float = 1.0,
        max_connections: int = 64,
        observer: PeerObserver | None = None,
        verify: ssl.SSLContext | bool = True,
        secret: str | bytes | None = None,
    ) -> None:
        self.node_id = node_id
        self.signer = PeerSigner(node_id, secret or secrets.token_bytes(32))  # none: no peer would accept
        #: the id of the member reached at a URL: the receiver a request is signed for (set by who knows the
        #: members: ``ClusterStoreQueries``); "" signs for nobody, and the peer refuses it
        self.receiver_of: Callable[[str], str] = lambda url: ""
        self.verify = verify  # how peers' certificates are verified (app.security.tls.peer_verify)
        self.observer = observer
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.sent: Counter[str] = Counter()
        self._peer_urls: dict[str, str] = {}  # a member's URL: its peer listener's
        self._clients: dict[int, httpx.AsyncClient] = {}
        self._streams: dict[int, httpx.AsyncClient] = {}
        self._pending: dict[tuple[int, str, Principal], list[_Lookup]] = {}
        self._tasks: set[asyncio.Future[None]] = set()

    def _client(self) -> httpx.AsyncClient:
        loop = id(asyncio.get_running_loop())
        client = self._clients.get(loop)
        if client is None:
            transport = PeerTransport(self.verify, self.limits)
            client = self._clients[loop] = httpx.AsyncClient(timeout=self.timeout, transport=transport)
        return client

    def stream_client(self) -> httpx.AsyncClient:
        """Return this event loop's client of peers' event streams (``stream``): a pool of its own, so
        long-lived streams never take the connections forwarded reads need."""
        loop = id(asyncio.get_running_loop())
        client = self._streams.get(loop)
        if client is None:
            limits = httpx.Limits(max_connections=STREAM_CONNECTIONS, max_keepalive_connections=8)
            transport = PeerTransport(self.verify, limits)
            client = self._streams[loop] = httpx.AsyncClient(timeout=self.timeout, transport=transport)
        return client

    async def peer_url(self, url: str) -> str:
        """Return the URL of the peer listener of the member at url, as its /healthz says; PeerUnavailableError
        if it cannot be asked or does not say."""
        found = self._peer_urls.get(url)
        if found is not None:
            return found
        try:
            response = await self._client().get(f"{url}{HEALTH_PATH}")
        except httpx.HTTPError as exc:
            raise PeerUnavailableError(f"peer {url} is unreachable: {exc.__class__.__name__}") from exc
        try:
            found = _peer_listener(url, response.json())
        except (ValueError, KeyError, TypeError):
            raise PeerUnavailableError(
                f"peer {url} names no peer listener on {HEALTH_PATH} (HTTP {response.status_code}): "
                "is it a node of this cluster, started with peers?"
            ) from None
        self._peer_urls[url] = found
        return found

    def _refused(self, url: str, exc: httpx.HTTPError) -> None:
        if isinstance(exc, httpx.ConnectError):  # its peer listener may have moved: ask again next time
            self._peer_urls.pop(url, None)

    async def query(self, url: str, query: str, variables: Mapping[str, Any], caller: Principal) -> Any:
        """Return the data of one forwarded GraphQL request; raise PeerError / PeerUnavailableError."""
        body = await self._observed(url, query, variables, caller)
        if body.get("errors"):
            error = _peer_error(url, body["errors"][0])
            if self.observer is not None:
                self.observer.failed(url, error.code)
            raise error
        return body["data"]

    async def _observed(self, url: str, query: str, variables: Mapping[str, Any], caller: Principal) -> dict[str, Any]:
        self.sent[url] += 1
        if self.observer is None:
            return await self._send(url, query, variables, caller)
        self.observer.sent_to(url)
        try:
            return await self._send(url, query, variables, caller)
        except PeerError as exc:
            self.observer.failed(url, exc.code)
            raise

    async def _send(self, url: str, query: str, variables: Mapping[str, Any], caller: Principal) -> dict[str, Any]:
        content = encode_json({"query": query, "variables": variables})
        to = self.receiver_of(url)
        headers = {"content-type": "application/json", **self.signer.headers(INTERNAL_PATH, content, caller, to)}
        target = await self.peer_url(url)
        with tracing.span("forwarded request", {"server.address": to or url}, "CLIENT") as forwarded:
            tracing.inject(headers)  # the peer's spans continue this trace
            try:
                response = await self._client().post(f"{target}{INTERNAL_PATH}", content=content, headers=headers)
            except httpx.HTTPError as exc:
                self._refused(url, exc)
                raise PeerUnavailableError(f"peer {url} is unreachable: {exc.__class__.__name__}") from exc
            if forwarded is not None:
                forwarded.set_attribute("http.response.status_code", response.status_code)
                forwarded.set_attribute("http.request.body.size", len(content))
                forwarded.set_attribute("http.response.body.size", len(response.content))
        if response.status_code >= 500:
            raise PeerUnavailableError(f"peer {url} failed with HTTP {response.status_code}")
        try:
            body = orjson.loads(response.content)
        except ValueError as exc:
            raise PeerUnavailableError(f"peer {url} answered something that is not JSON") from exc
        if not isinstance(body, dict):
            raise PeerUnavailableError(f"peer {url} answered JSON that is not a GraphQL response")
        return body

    async def lookup(
        self, url: str, store: str, reads: Sequence[Read], windowed: bool, caller: Principal
    ) -> Answer[list[Any]]:
        """Return the peer's states of point reads of store (each read names its partitions).

        Sent with the other lookups for the same peer made within two turns of the event loop, in one request.
        """
        loop = asyncio.get_running_loop()
        key = (id(loop), url, caller)
        batch = self._pending.get(key)
        if batch is None:
            batch = self._pending[key] = []
            # two turns: every DataLoader batch of this step starts (each in a task of its own) before it leaves
            loop.call_soon(loop.call_soon, self._flush, key)
        found: asyncio.Future[Any] = loop.create_future()
        batch.append(_Lookup(store, wire.encode_reads(reads), found))
        return wire.decode_lookup(await found, windowed)

    def _flush(self, key: tuple[int, str, Principal]) -> None:
        batch = self._pending.pop(key, [])
        _, url, caller = key
        for start in range(0, len(batch), wire.MAX_LOOKUPS):
            task = asyncio.ensure_future(self._send_lookups(url, caller, batch[start : start + wire.MAX_LOOKUPS]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_lookups(self, url: str, caller: Principal, batch: list[_Lookup]) -> None:
        try:
            await self._answer_lookups(url, caller, batch)
        except Exception as exc:  # every waiting lookup hears why (PeerUnavailableError, mostly)
            for item in batch:
                _settle(item.answer, error=exc)
        finally:  # none hangs, whatever happened (a malformed answer, a cancellation)
            for item in batch:
                _settle(item.answer, error=PeerUnavailableError(f"peer {url} gave no answer for store {item.store}"))

    async def _answer_lookups(self, url: str, caller: Principal, batch: list[_Lookup]) -> None:
        variables, fields = wire.lookup_variables([(item.store, item.reads) for item in batch])
        body = await self._observed(url, wire.lookups(len(batch)), variables, caller)
        data, errors = body.get("data"), body.get("errors") or []
        if not isinstance(data, dict | None) or not isinstance(errors, list):
            raise PeerUnavailableError(f"peer {url} answered something that is not a GraphQL response")
        by_field = {str((e.get("path") or ["?"])[0]): e for e in errors if isinstance(e, dict)}
        failed = 0
        for field, item in zip(fields, batch, strict=True):
            answer = (data or {}).get(field)
            if answer is not None:
                _settle(item.answer, value=answer)
            elif field in by_field:  # its own error: that store's, never another's
                failed += 1
                _settle(item.answer, error=_peer_error(url, by_field[field]))
        if failed and self.observer is not None:
            self.observer.failed(url, _peer_error(url, next(iter(by_field.values()))).code)

    async def scan(
        self,
        url: str,
        store: str,
        scan: Scan,
        positions: Mapping[int, str | None],
        first: int,
        partitions: Sequence[int],
        windowed: bool,
        caller: Principal,
    ) -> Answer[dict[int, Any]]:
        """Return the peer's page (or error) per partition of a scan of store."""
        variables = {
            "store": store,
            "scan": scan.to_wire(),  # its own wire form (stores.scans.scan_from_wire reads it back)
            "positions": {str(p): c for p, c in positions.items()},
            "first": first,
            "partitions": list(partitions),
        }
        return wire.decode_scan((await self.query(url, wire.SCAN, variables, caller))["_scan"], windowed)

    async def count(
        self, url: str, store: str, partitions: Sequence[int], exact: bool, caller: Principal
    ) -> Answer[dict[int, Any]]:
        """Return the peer's count (or error) per partition of entries of store."""
        variables = {"store": store, "partitions": list(partitions), "exact": exact}
        return wire.decode_count((await self.query(url, wire.COUNT, variables, caller))["_count"])

    async def call(
        self, url: str, field: str, calls: Sequence[tuple[Any, tuple[int, ...]]], caller: Principal
    ) -> Answer[list[Any]]:
        """Return the peer's answer per (key, partitions) of an owner-side field run there."""
        variables = {"field": field, "keys": wire.encode_calls(calls)}
        return wire.decode_call_answer((await self.query(url, wire.CALL, variables, caller))["_call"])

    # -- live streams (the follower's side; the owner's: app.live.stream) ----------------------------------

    async def follow(self, url: str, body: bytes, caller: Principal) -> AsyncIterator[Rows]:
        """Yield the rows a peer streams for a follow request (``peer_streams.encode_follow``; see ``stream``)."""
        async with contextlib.aclosing(self.stream(url, FOLLOW_PATH, body, caller)) as events:  # type: ignore[type-var]
            async for event in events:
                yield peer_streams.decode_rows(event)

    async def changes(self, url: str, store: str, caller: Principal) -> AsyncIterator[int]:
        """Yield the counts of changed keys a peer streams for store (see ``stream``)."""
        body = peer_streams.encode_changes(store)
        async with contextlib.aclosing(self.stream(url, CHANGES_PATH, body, caller)) as events:  # type: ignore[type-var]
            async for event in events:
                yield int(event["n"])

    async def stream(
        self, url: str, path: str, body: bytes, caller: Principal, heartbeat_s: float = HEARTBEAT_S
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield the data of each event a peer streams for a signed request to path, until it ends.

        Raises PeerUnavailableError when the peer cannot be reached, stops answering (no event or heartbeat for
        three heartbeats) or ends the stream; the ApiError of an error event.
        """
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        headers |= self.signer.headers(path, body, caller, self.receiver_of(url))
        tracing.inject(headers)  # a live upstream: the peer's stream continues the watch's trace
        timeout = httpx.Timeout(3 * heartbeat_s, connect=2.0)
        client = self.stream_client()
        target = await self.peer_url(url)
        try:
            async with client.stream("POST", f"{target}{path}", content=body, headers=headers, timeout=timeout) as r:
                if r.status_code != 200:  # refusals of the caller come as error events: this is the peer's trouble
                    text = (await r.aread())[:200].decode("utf-8", "replace")  # (a 401: clocks or secrets differ)
                    raise PeerUnavailableError(f"peer {url} answered a stream with HTTP {r.status_code}: {text}")
                async for data in _events(r.aiter_lines()):
                    event = orjson.loads(data)
                    if "error" in event:
                        raise wire.decode_error(event["error"])
                    yield event
        except httpx.HTTPError as exc:
            self._refused(url, exc)
            raise PeerUnavailableError(f"peer {url} stopped streaming: {exc.__class__.__name__}") from exc
        raise PeerUnavailableError(f"peer {url} ended the stream")

    async def node(self, url: str, caller: Principal) -> NodeInfo:
        """Return the peer's own node metadata."""
        return wire.decode_node((await self.query(url, wire.NODE, {}, caller))["node"])


def _peer_listener(url: str, health: Any) -> str:
    """Return the peer listener's URL a member's /healthz gives: its --advertised-peer-url, else the host it was
    reached at with its peer port (what reached the clients' listener reaches the peers' on the same machine: a
    node listening on 0.0.0.0 cannot say its own address)."""
    if health.get("peerUrl"):
        return str(health["peerUrl"]).rstrip("/")
    port = int(health["peerPort"])
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


async def _events(lines: AsyncIterator[str]) -> AsyncGenerator[bytes, None]:
    """Yield the data of each Server-Sent Event (comments are heartbeats)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data).encode()
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
