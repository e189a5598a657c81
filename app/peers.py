"""The peer client: forwarded sub-requests to other nodes' GraphQL endpoints, over one httpx client.

Each call is ONE GraphQL request to one peer (the documents and encodings are ``schema.wire``'s),
marked with the forwarded header (the peer answers from its own partitions only) and carrying the
caller's Authorization header. Explicit timeouts and
connection limits; keep-alive connections are reused across requests. Counts what it sends per peer,
and tells an optional PeerObserver (the node's metrics) of each request sent and each that failed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from iqgraph.schema import wire
from iqgraph.schema.asgi import FORWARDED_HEADER
from iqgraph.schema.errors import NODE_UNAVAILABLE
from iqgraph.schema.types import Answer, NodeInfo, Read, Scan


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


class PeerClient:
    """Send forwarded sub-requests to peers."""

    def __init__(
        self,
        node_id: str,
        *,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 1.0,
        max_connections: int = 64,
        observer: PeerObserver | None = None,
    ) -> None:
        self.node_id = node_id
        self.observer = observer
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.sent: Counter[str] = Counter()
        self._clients: dict[int, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        loop = id(asyncio.get_running_loop())
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = httpx.AsyncClient(timeout=self.timeout, limits=self.limits)
        return client

    async def query(self, url: str, query: str, variables: Mapping[str, Any], authorization: str | None) -> Any:
        """Return the data of one forwarded GraphQL request; raise PeerError / PeerUnavailableError."""
        self.sent[url] += 1
        if self.observer is None:
            return await self._send(url, query, variables, authorization)
        self.observer.sent_to(url)
        try:
            return await self._send(url, query, variables, authorization)
        except PeerError as exc:
            self.observer.failed(url, exc.code)
            raise

    async def _send(self, url: str, query: str, variables: Mapping[str, Any], authorization: str | None) -> Any:
        headers = {FORWARDED_HEADER: self.node_id}
        if authorization:
            headers["authorization"] = authorization
        try:
            response = await self._client().post(
                f"{url}/graphql", json={"query": query, "variables": variables}, headers=headers
            )
        except httpx.HTTPError as exc:
            raise PeerUnavailableError(f"peer {url} is unreachable: {exc.__class__.__name__}") from exc
        if response.status_code >= 500:
            raise PeerUnavailableError(f"peer {url} failed with HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError as exc:
            raise PeerUnavailableError(f"peer {url} answered something that is not JSON") from exc
        if body.get("errors"):
            error = body["errors"][0]
            extensions = error.get("extensions") or {}
            raise PeerError(f"peer {url}: {error.get('message')}", str(extensions.get("code", "INTERNAL")), extensions)
        return body["data"]

    async def lookup(
        self, url: str, store: str, reads: Sequence[Read], windowed: bool, authorization: str | None
    ) -> Answer[list[Any]]:
        """Return the peer's states of point reads of store (each read names its partitions)."""
        data = await self.query(url, wire.LOOKUP, {"store": store, "reads": wire.encode_reads(reads)}, authorization)
        return wire.decode_lookup(data["_lookup"], windowed)

    async def scan(
        self,
        url: str,
        store: str,
        scan: Scan,
        positions: Mapping[int, str | None],
        first: int,
        partitions: Sequence[int],
        windowed: bool,
        authorization: str | None,
    ) -> Answer[dict[int, Any]]:
        """Return the peer's page (or error) per partition of a scan of store."""
        variables = {
            "store": store,
            "scan": {"kind": scan.kind, "args": scan.args},
            "positions": {str(p): c for p, c in positions.items()},
            "first": first,
            "partitions": list(partitions),
        }
        return wire.decode_scan((await self.query(url, wire.SCAN, variables, authorization))["_scan"], windowed)

    async def count(
        self, url: str, store: str, partitions: Sequence[int], exact: bool, authorization: str | None
    ) -> Answer[dict[int, Any]]:
        """Return the peer's count (or error) per partition of entries of store."""
        variables = {"store": store, "partitions": list(partitions), "exact": exact}
        return wire.decode_count((await self.query(url, wire.COUNT, variables, authorization))["_count"])

    async def node(self, url: str, authorization: str | None) -> NodeInfo:
        """Return the peer's own node metadata."""
        return wire.decode_node((await self.query(url, wire.NODE, {}, authorization))["node"])
