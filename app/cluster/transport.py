"""The HTTP transport of the peer clients: httpx's, over connections whose closing mid-request is a transport error.

Under uvloop (uvicorn's loop when it is installed, as here) a TCP transport forgets its socket once the connection
is closed, and anyio's stream then raises ``AttributeError`` on any question about it (anyio 4.x:
``self._raw_socket.getpeername()`` on ``None``). httpcore asks right after connecting (``ssl_object``) and before
reusing a kept-alive connection (``is_readable``), so a peer that resets a connection just as it is made — a node
killed with a connection in its listen backlog — surfaced as an ``AttributeError``: an internal error to the
client instead of a failover to the partition's standby. Here each such question about a closed connection gets
the answer of a closed connection (nothing to tell; readable, i.e. at its end), and the request then fails where
httpcore maps it: a ``httpx.TransportError``, which the peer client turns into ``PeerUnavailableError``.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx


class _Stream(httpcore.AsyncNetworkStream):
    """httpcore's anyio stream, answering questions about a closed connection as a closed connection's."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        try:
            return self._stream.get_extra_info(info)
        except AttributeError:  # the loop forgot the closed connection's socket
            return True if info == "is_readable" else None  # a closed connection is readable: its end


class _Backend(httpcore.AnyIOBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await super().connect_tcp(host, port, timeout, local_address, socket_options))


class PeerTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with verify and limits, its connections made by ``_Backend`` (httpx's own pool, as
    ``httpx.AsyncHTTPTransport`` builds it without a proxy, given the network backend httpx takes no argument for)."""

    def __init__(self, verify: ssl.SSLContext | bool, limits: httpx.Limits) -> None:
        super().__init__(verify=verify, limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend(),
        )
