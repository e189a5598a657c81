"""Live sources between nodes: a peer's partitions followed over one signed event stream.

A node that serves a subscription for keys another node owns (``app.live.relay``) asks that node with one
signed POST to ``/internal/follow`` (``app.security.peer_auth``: the cluster secret, the caller carried), naming an
``Interest`` (per store, per partition, the keys), the positions it has, and whether a standby copy may
answer. The owner answers a stream of Server-Sent Events (``text/event-stream``, so the request guard lets
it run past the request deadline): ``app.live.follow``'s ``Rows``, encoded as below, and a comment every
``HEARTBEAT_S`` so that the follower notices a peer that is gone without closing the connection. Any failure
(a store the caller may not read, a partition not hosted here or that moved, a bad request) is one ``error``
event, then the end of the stream.

    request   {"topic": t, "interest": {store: {"<p>": [key, …]}}, "after": {"<p>": offset},
               "windowFrom": {store: ms | null}, "standby": bool}
    rows      data: {"p": partition, "o": position, "s": snapshot, "l": lag | null,
                     "r": [[store, key, window start | null, state, dropped], …]}
    error     data: {"error": {"message": …, "extensions": {"code": …}}}
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import httpx
import orjson

from iqgraph.app.cluster.peers import PeerUnavailableError
from iqgraph.app.live.follow import Interest, Rows
from iqgraph.app.security.peer_auth import PeerSigner
from iqgraph.schema import wire
from iqgraph.schema.access import PRINCIPAL_SCOPE_KEY, Principal
from iqgraph.schema.asgi import encode_json
from iqgraph.schema.errors import BAD_REQUEST, ApiError

log = logging.getLogger(__name__)

FOLLOW_PATH = "/internal/follow"
CHANGES_PATH = "/internal/changes"
HEARTBEAT_S = 5.0
MAX_FOLLOW_KEYS = 100_000  # keys one follow request may name (a relay opens another stream past it)
_PING = b": ping\n\n"


# -- the wire ----------------------------------------------------------------------------------------


def encode_request(
    topic: str, interest: Interest, after: Mapping[int, int], window_from: Mapping[str, int | None], standby: bool
) -> bytes:
    """Return the body of a follow request."""
    return encode_json(
        {
            "topic": topic,
            "interest": {s: {str(p): list(keys) for p, keys in ps.items()} for s, ps in interest.items()},
            "after": {str(p): o for p, o in after.items()},
            "windowFrom": dict(window_from),
            "standby": standby,
        }
    )


def decode_request(body: bytes) -> tuple[str, Interest, dict[int, int], dict[str, int | None], bool]:
    """Return a follow request's (topic, interest, after, window_from, standby); BAD_REQUEST if malformed."""
    try:
        data = orjson.loads(body)
        topic, standby = data["topic"], data["standby"]
        interest = {str(s): {int(p): list(keys) for p, keys in ps.items()} for s, ps in data["interest"].items()}
        after = {int(p): int(o) for p, o in data["after"].items()}
        window_from = {str(s): None if v is None else int(v) for s, v in data["windowFrom"].items()}
        valid = isinstance(topic, str) and isinstance(standby, bool)
        valid = valid and all(isinstance(k, str | int) for ps in interest.values() for ks in ps.values() for k in ks)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ApiError(f"not a follow request this API sends: {exc}", BAD_REQUEST) from None
    if not valid or any(p < 0 for ps in interest.values() for p in ps) or any(o < 0 for o in after.values()):
        raise ApiError("not a follow request this API sends", BAD_REQUEST)
    return topic, interest, after, window_from, standby


def encode_rows(rows: Rows) -> bytes:
    """Return one event of rows."""
    body = {"p": rows.partition, "o": rows.position, "s": rows.snapshot, "l": rows.lag, "r": rows.rows}
    return b"data: " + encode_json(body) + b"\n\n"


def encode_failure(error: Exception) -> bytes:
    """Return the event that ends a stream with error."""
    return b"data: " + encode_json(wire.encode_error(error)) + b"\n\n"


def decode_event(body: Mapping[str, Any]) -> Rows:
    """Return the rows of one event's data."""
    rows = [(r[0], r[1], r[2], r[3], r[4]) for r in body["r"]]
    return Rows(body["p"], body["o"], rows, body["s"], body["l"])


# -- the owner's side ------------------------------------------------------------------------------


class StreamEndpoint:
    """ASGI app of an internal event stream (behind ``PeerGate``): ``/internal/follow`` and ``/internal/changes``.

    events(body, caller) yields the encoded events of a request (``follow_events``, ``changes_events``); its
    failure is the stream's one error event.
    """

    def __init__(
        self, events: Callable[[bytes, Principal], AsyncIterator[bytes]], heartbeat_s: float = HEARTBEAT_S
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
                    await send({"type": "http.response.body", "body": _PING, "more_body": True})
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
            await events.put(encode_failure(exc))
        await events.put(None)


def follow_events(live: Any) -> Callable[[bytes, Principal], AsyncIterator[bytes]]:
    """Return the events of ``/internal/follow``: the rows of ``live.serve_peer`` (``app.live.watch.Live``)."""

    async def events(body: bytes, caller: Principal) -> AsyncIterator[bytes]:
        topic, interest, after, window_from, standby = decode_request(body)
        async with contextlib.aclosing(live().serve_peer(topic, interest, after, window_from, standby, caller)) as rows:
            async for found in rows:
                yield encode_rows(found)

    return events


def changes_events(live: Any) -> Callable[[bytes, Principal], AsyncIterator[bytes]]:
    """Return the events of ``/internal/changes``: ``{"n": count}`` per batch of ``live.store_changes_here``."""

    async def events(body: bytes, caller: Principal) -> AsyncIterator[bytes]:
        try:
            store = orjson.loads(body)["store"]
            assert isinstance(store, str)  # noqa: S101 - caught below
        except (ValueError, TypeError, KeyError, AssertionError):
            raise ApiError("not a changes request this API sends", BAD_REQUEST) from None
        async with contextlib.aclosing(live().store_changes_here(store, principal=caller)) as counts:
            async for n in counts:
                yield b"data: " + encode_json({"n": n}) + b"\n\n"

    return events


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# -- the follower's side ----------------------------------------------------------------------------


async def open_stream(
    client: httpx.AsyncClient,
    signer: PeerSigner,
    url: str,
    path: str,
    body: bytes,
    caller: Principal,
    heartbeat_s: float = HEARTBEAT_S,
) -> AsyncIterator[dict[str, Any]]:
    """Yield the data of each event a peer streams for a signed request to path, until it ends.

    Raises PeerUnavailableError when the peer cannot be reached, stops answering (no event or heartbeat for
    three heartbeats) or ends the stream; the ApiError of an error event.
    """
    headers = {"content-type": "application/json", "accept": "text/event-stream", **signer.headers(path, body, caller)}
    timeout = httpx.Timeout(3 * heartbeat_s, connect=2.0)
    try:
        async with client.stream("POST", f"{url}{path}", content=body, headers=headers, timeout=timeout) as r:
            if r.status_code != 200:  # refusals of the caller come as error events: this is the peer's trouble
                text = (await r.aread())[:200].decode("utf-8", "replace")  # (a 401: clocks or secrets differ)
                raise PeerUnavailableError(f"peer {url} answered a stream with HTTP {r.status_code}: {text}")
            async for data in _events(r.aiter_lines()):
                event = orjson.loads(data)
                if "error" in event:
                    raise wire.decode_error(event["error"])
                yield event
    except httpx.HTTPError as exc:
        raise PeerUnavailableError(f"peer {url} stopped streaming: {exc.__class__.__name__}") from exc
    raise PeerUnavailableError(f"peer {url} ended the stream")


async def open_follow(
    client: httpx.AsyncClient, signer: PeerSigner, url: str, body: bytes, caller: Principal
) -> AsyncIterator[Rows]:
    """Yield the rows a peer streams for a follow request (see open_stream for what it raises)."""
    async with contextlib.aclosing(open_stream(client, signer, url, FOLLOW_PATH, body, caller)) as events:  # type: ignore[type-var]
        async for event in events:
            yield decode_event(event)


async def open_changes(
    client: httpx.AsyncClient, signer: PeerSigner, url: str, store: str, caller: Principal
) -> AsyncIterator[int]:
    """Yield the counts of changed keys a peer streams for store (see open_stream for what it raises)."""
    body = encode_json({"store": store})
    async with contextlib.aclosing(open_stream(client, signer, url, CHANGES_PATH, body, caller)) as events:  # type: ignore[type-var]
        async for event in events:
            yield int(event["n"])


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
