"""Live sources between nodes, the owner's side: the endpoints of peers' signed event streams.

A node that serves a subscription for keys another node owns (``app.live.relay``) asks that node with one
signed POST to ``wire.FOLLOW_PATH`` (``app.security.peer_auth``: the cluster secret, the caller carried),
naming an ``Interest`` (per store, per partition, the keys), the positions it has, and whether a standby copy
may answer; ``wire.CHANGES_PATH`` streams a store's change counts. The owner answers Server-Sent Events
(``text/event-stream``, so the request guard lets it run past the request deadline), a comment every
``wire.HEARTBEAT_S`` so that the follower notices a peer that is gone without closing the connection. Any
failure (a store the caller may not read, a partition not hosted here or that moved, a bad request) is one
``error`` event, then the end of the stream. The formats are ``schema.wire``'s; the follower's side is
``PeerClient.follow`` / ``changes`` (``app.cluster.peers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from iqgraph.schema import wire
from iqgraph.schema.access import PRINCIPAL_SCOPE_KEY, Principal
from iqgraph.schema.live import peer_streams

log = logging.getLogger(__name__)

PING = b": ping\n\n"  # a heartbeat: an event-stream comment


# -- the owner's side ------------------------------------------------------------------------------


class StreamEndpoint:
    """ASGI app of an internal event stream (behind ``PeerGate``): ``/internal/follow`` and ``/internal/changes``.

    events(body, caller) yields the encoded events of a request (``follow_events``, ``changes_events``); its
    failure is the stream's one error event.
    """

    def __init__(
        self, events: Callable[[bytes, Principal], AsyncIterator[bytes]], heartbeat_s: float = wire.HEARTBEAT_S
    ) -> None:
        self.events = events
        self.heartbeat_s = heartbeat_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        principal: Principal = scope[PRINCIPAL_SCOPE_KEY]
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        events: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)
        producer = asyncio.create_task(self._produce(body, principal, events))
        gone = asyncio.create_task(_until_disconnect(receive))
        try:
            while True:
                getting = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait({getting, gone}, timeout=self.heartbeat_s, return_when="FIRST_COMPLETED")
                if gone in done:
                    getting.cancel()
                    return
                if getting not in done:
                    getting.cancel()
                    await send({"type": "http.response.body", "body": PING, "more_body": True})
                    continue
                event = getting.result()
                if event is None:
                    break
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return  # the peer went away while we wrote
        finally:
            for task in (producer, gone):
                task.cancel()
            for task in (producer, gone):
                with contextlib.suppress(BaseException):
                    await task

    async def _produce(self, body: bytes, principal: Principal, events: asyncio.Queue[bytes | None]) -> None:
        try:
            async with contextlib.aclosing(self.events(body, principal)) as found:  # type: ignore[type-var]
                async for event in found:
                    await events.put(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is the stream's one error event
            await events.put(peer_streams.encode_failure(exc))
        await events.put(None)


def follow_events(live: Any) -> Callable[[bytes, Principal], AsyncIterator[bytes]]:
    """Return the events of ``/internal/follow``: the rows of ``live.serving.follow`` (``app.live.serving``)."""

    async def events(body: bytes, caller: Principal) -> AsyncIterator[bytes]:
        topic, interest, after, window_from, standby = peer_streams.decode_follow(body)
        async with contextlib.aclosing(
            live().serving.follow(topic, interest, after, window_from, standby, caller)
        ) as rows:
            async for found in rows:
                yield peer_streams.encode_rows(found)

    return events


def changes_events(live: Any) -> Callable[[bytes, Principal], AsyncIterator[bytes]]:
    """Return the events of ``/internal/changes``: ``{"n": count}`` per batch of ``live.changes.here``
    (``app.live.store_changes``)."""

    async def events(body: bytes, caller: Principal) -> AsyncIterator[bytes]:
        store = peer_streams.decode_changes(body)
        async with contextlib.aclosing(live().changes.here(store, principal=caller)) as counts:
            async for n in counts:
                yield peer_streams.encode_changed(n)

    return events


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
