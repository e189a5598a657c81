"""Connection hygiene for the node's listener: what uvicorn's HTTP protocol does not bound by itself.

uvicorn closes a keep-alive connection idle ``timeout_keep_alive`` seconds after a response, but it gives a
connection no deadline before its first request's headers, nor a request that sends its headers one byte at
a time; and it counts connections only to refuse a *request* (``limit_concurrency``). Sockets that send
nothing, or a header line a second, would each hold a file descriptor forever, and enough of them lock out
clients and peers. ``Hygiene`` adds to uvicorn's httptools protocol:

- a **header deadline**: a connection must deliver a request's whole head (request line and headers) within
  ``header_timeout_s`` of opening, and again of its previous response: past it the socket is closed — with a
  ``408`` when a request had begun, silently when nothing came (a browser's pre-connected socket: an answer to a
  request it has not sent could be taken for the answer to the next one);
- an **idle keep-alive timeout**: uvicorn's own (``keep_alive_timeout_s``);
- a **cap on open connections** per listener (``max_connections``): one more is answered ``503`` with a coded
  JSON error (``LIMIT_EXCEEDED``) and closed at once, before anything of it is read;
- a response's **head and body in one write** (``_HeadWithBody``): uvicorn writes them apart, two ``send`` calls
  and two TCP segments per response.

A node listens on two sockets (clients', and peers': app.http.server), each with a Hygiene of its own: a
connection is bounded, and counted, by the one of the port it came in on. Each refusal is counted in
``Hygiene.refused`` and logged once per reason and minute (with the client address). ``server_config`` is where
a node's uvicorn config is made with them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from iqgraph.schema.errors import LIMIT_EXCEEDED, TIMEOUT

log = logging.getLogger(__name__)


def _response(status: str, code: str, message: str) -> bytes:
    body = orjson.dumps({"errors": [{"message": message, "extensions": {"code": code}}]})
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Hygiene:
    """The bounds of one listener's connections, and what they refused."""

    header_timeout_s: float = 10.0
    keep_alive_timeout_s: int = 5
    max_connections: int = 4_096
    refused: Counter[str] = field(default_factory=Counter)  # "headers too slow", "too many connections"
    held: set[object] = field(default_factory=set)  # the open connections of this listener
    _logged: dict[str, float] = field(default_factory=dict)

    def refuse(self, reason: str, client: Any) -> None:
        """Count a refusal; log it at most once a minute per reason."""
        self.refused[reason] += 1
        now = time.monotonic()
        if now - self._logged.get(reason, -60.0) >= 60.0:
            self._logged[reason] = now
            log.warning("closed a connection from %s: %s (%d so far)", client, reason, self.refused[reason])

    def protocol(self, by_port: Mapping[int, Hygiene] | None = None) -> type[HttpToolsProtocol]:
        """Return uvicorn's httptools protocol bounded by this hygiene, or by by_port's for a connection that
        came in on one of its ports."""
        hygiene, ports = self, dict(by_port or {})

        class Bounded(_BoundedProtocol):
            default, by_port = hygiene, ports

        return Bounded


class _BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a cap on open connections (see the module)."""

    default: Hygiene
    by_port: dict[int, Hygiene]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._begun = False  # a request's first bytes came, not yet its whole head
        sockname = transport.get_extra_info("sockname")
        port = sockname[1] if isinstance(sockname, tuple) and len(sockname) > 1 else None
        self.bounds = self.by_port.get(port, self.default)  # type: ignore[arg-type]
        self.bounds.held.add(self)
        if len(self.bounds.held) > self.bounds.max_connections:
            self.bounds.refuse("too many connections", self.client)
            message = f"this node holds {self.bounds.max_connections} connections (max_connections): retry later"
            transport.write(_response("503 Service Unavailable", LIMIT_EXCEEDED, message))
            transport.close()
            return
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        if self._deadline is None:  # the next request of a kept-alive connection: its head has the same deadline
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._begun = False
        existing = self.cycle
        super().on_headers_complete()
        if self.cycle is not existing and self.scope["method"] != "HEAD":  # (a HEAD's answer has no body)
            self.cycle.transport = _HeadWithBody(self.transport)  # type: ignore[assignment]  # an upgrade has no cycle

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if hasattr(self, "bounds"):
            self.bounds.held.discard(self)
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.bounds.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()  # type: ignore[union-attr]
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        self.bounds.refuse("request headers not received in time", self.client)
        if self._begun:
            seconds = f"{self.bounds.header_timeout_s:g}"
            message = f"the request's headers did not arrive within {seconds} s (header_timeout_s)"
            self.transport.write(_response("408 Request Timeout", TIMEOUT, message))
        self.transport.close()


def server_config(
    asgi: Any, hygiene: Hygiene, by_port: Mapping[int, Hygiene] | None = None, **options: Any
) -> uvicorn.Config:
    """Return the uvicorn config of a node's listeners: its ASGI app behind hygiene's bounds (by_port's on their
    ports)."""
    defaults: dict[str, Any] = {"log_level": "warning", "timeout_graceful_shutdown": 10}
    return uvicorn.Config(
        asgi,
        http=hygiene.protocol(by_port),
        timeout_keep_alive=hygiene.keep_alive_timeout_s,
        **(defaults | options),
    )


class _HeadWithBody:
    """The transport one response cycle writes through: a response head announcing a Content-Length is held until
    the body's first write and goes out with it, in one write (one ``send``, one TCP segment), where uvicorn writes
    them apart: uvicorn writes the body, even an empty one, right after (a HEAD request's cycle writes none: it
    gets no such transport). Any other write (an interim ``100 Continue``, a chunked stream's head: its body may
    come much later) goes out at once; ``close`` (an app that ended without its body) sends a head still held."""

    __slots__ = ("_transport", "_head", "_wrote")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._wrote = False  # the response's head went through: the rest goes straight on

    def write(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        elif not self._wrote and not data.startswith(b"HTTP/1.1 1") and b"\r\ncontent-length:" in data:
            self._head, self._wrote = data, True
            return
        self._wrote = self._wrote or not data.startswith(b"HTTP/1.1 1")
        self._transport.write(data)

    def flush(self) -> None:
        """Send the head still held, if any."""
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # anything else a cycle may ask of its transport: the transport's
        return getattr(self._transport, name)
