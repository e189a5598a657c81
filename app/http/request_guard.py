"""The limits every HTTP request meets before the node's app sees it: header bytes, body bytes, a deadline,
and the work of a request whose client went away cancelled.

``RequestGuard`` wraps the node's whole ASGI app, so every path (/graphql, the REST path, /healthz,
/readyz, /metrics) meets them. Per HTTP request, in order:

1. Its request line and headers over ``max_header_bytes``: 431 at once. uvicorn's httptools parser bounds
   neither (h11 does, at ``h11_max_incomplete_event_size``), so they are counted here.
2. Its body is read here, whole, before the app runs: a Content-Length over ``max_body_bytes`` is 413 at
   once, nothing read; a body without one (chunked) is counted as it comes and refused as soon as it
   passes the limit. Both refusals close the connection, so the rest of the body is never read.
3. The app runs in the request's own task, given the body as one message, under the request's deadline
   (``request_timeout_ms`` from the request's arrival, its body's reading included). Past it, a request
   whose answer has not begun gets 504 (code TIMEOUT) at once and its work is cancelled (the task is, as by
   ``asyncio.timeout``). A request still
   running ``WATCH_AFTER_S`` after its arrival listens for its client once its body is read: if the
   client goes away before the answer begins, the task is cancelled (its reads, its peers' sub-requests:
   their connections close, so the peers' guards cancel theirs) and nothing is sent (logged at INFO).
4. An event stream (Accept lists ``text/event-stream``: GraphQL over SSE) is bounded the same way until its
   answer begins; once it streams, the deadline no longer applies (it never cuts an answer that began) and
   the app reads its client's messages itself, so it sees the disconnect of a client that goes away and
   ends its stream (its subscription) — for any other request the guard answers ``http.disconnect`` only
   once the answer is complete.

Who answers a request is decided by ``_Guarded.state``, changed only synchronously on the event loop's
thread, each change checked against the state before it: the app's first message makes it the one
answering, unless the guard refused first (``_claim``), or the client went away first. From then on, the
other's messages are dropped, never sent: one response per request, never a second one or one after a
disconnect, whatever the order in which the app, the deadline and the client's disconnect come. The
listener for the client (the only reader of uvicorn's ``receive`` once the body is read: the app gets
the body from the guard) is cancelled before the response's first message goes out: uvicorn's
``receive`` also answers ``http.disconnect`` once a response is complete, which must never read as a
client gone. The guard returns to uvicorn only once the app ended and the answer is sent.

Refusals are GraphQL-shaped (``schema.http_spec.refusal``): ``{"errors": [{"message": …, "extensions":
{"code": "LIMIT_EXCEEDED" | "TIMEOUT"}}]}``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, MutableMapping
from typing import Any, Protocol

from iqgraph.schema import http_spec
from iqgraph.schema.asgi import encode_json
from iqgraph.schema.errors import UNAUTHENTICATED

log = logging.getLogger(__name__)

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[MutableMapping[str, Any], Receive, Send], Coroutine[Any, Any, None]]

#: Why a request was cut short (``RequestGuard.count``'s reasons, the metric's label).
HEADERS_TOO_LARGE, BODY_TOO_LARGE, UNSIGNED = "headers_too_large", "body_too_large", "unsigned"
PEER_REFUSAL = "peer authentication required"
TIMED_OUT, CLIENT_GONE = "timeout", "client_gone"

#: A request still running this long after its body was read starts listening for its client's disconnect;
#: quicker ones (nearly all) pay for no listening task.
WATCH_AFTER_S = 0.1


class RequestLimits(Protocol):
    """The limits the guard applies (app.settings.Settings and schema.limits.Limits have them)."""

    @property
    def max_body_bytes(self) -> int: ...
    @property
    def max_header_bytes(self) -> int: ...
    @property
    def request_timeout_ms(self) -> int: ...


class _State(enum.Enum):
    OPEN = "nobody answered yet"
    ANSWERING = "the app's response began"
    REFUSED = "the guard answered"
    GONE = "the client went away first"


class _Guarded:
    """One request under the guard: its body, its deadline, its client, and who answers it (see the module)."""

    def __init__(
        self, guard: RequestGuard, scope: MutableMapping[str, Any], receive: Receive, send: Send, streams: bool = False
    ) -> None:
        self.guard = guard
        self.scope = scope
        self.streams = streams  # an event stream: once it answers, its app listens for the client (see the module)
        self.state = _State.OPEN
        self._receive = receive
        self._send = send
        self._body: bytes | None = None  # read whole, not yet given to the app
        self._read = False
        self._watch_due = False  # the watch delay passed while the body was still being read
        self._over = False  # nothing more will be sent
        self._over_event: asyncio.Event | None = None
        self._decided: asyncio.Event | None = None  # set once the state leaves OPEN (an event stream's app waits)
        self._watcher: asyncio.Task[None] | None = None
        self._refusal: asyncio.Task[None] | None = None
        self._task: asyncio.Task[Any] | None = None  # the request's own (uvicorn's task for it)
        self._cut = False  # the guard cancelled it (the deadline, or the client's going)
        self._timer: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        """Read the body and run the app in this request's own task; return once it ended and the answer is sent.

        The deadline and the client's going cancel this task (``_cut``), as ``asyncio.timeout`` does: the app
        sees the CancelledError at the await it is at, and it ends here, counted off (``uncancel``), unless the
        task was cancelled by someone else too (the server stopping): then it goes on up.
        """
        loop = asyncio.get_running_loop()
        timeout_s = self.guard.timeout_ms / 1000
        self._deadline = loop.time() + timeout_s
        self._task = asyncio.current_task()
        if WATCH_AFTER_S < timeout_s:
            self._timer = loop.call_later(WATCH_AFTER_S, self._due)
        else:
            self._timer = loop.call_at(self._deadline, self._expire)
        try:
            await self._serve()
        except asyncio.CancelledError:
            if not self._counted_off():
                raise  # the server stops: the request's work ends with it
        except Exception:
            if self.state is _State.REFUSED or self.state is _State.GONE:
                log.debug("%s %s failed after its refusal or its client's going", *self.named, exc_info=True)
            else:
                raise  # the app's own failure: uvicorn logs it (and answers 500 if nothing was sent)
        finally:
            self._timer.cancel()
            self._stop_watching()
        self._counted_off()  # an app that swallowed the guard's cancellation: counted off all the same
        if self._refusal is not None:
            await self._refusal  # the deadline's 504: sent before the request ends

    def _counted_off(self) -> bool:
        """Count off the guard's cancellation of the request's task, if it made one; return whether it was the
        task's only one (False: none was the guard's, or the server stops too)."""
        if not self._cut or self._task is None:
            return False
        self._cut = False
        return self._task.uncancel() == 0

    async def _serve(self) -> None:
        try:
            body = await self._read_body()
        except http_spec.RequestError as refused:
            if self._claim(_State.REFUSED):
                self.guard.count(BODY_TOO_LARGE)
                await send_refusal(self._send, refused, close=True)
            return
        if body is None:  # the client went away while sending it
            self._claim(_State.GONE)
            return
        self._body, self._read = body, True
        if self._watch_due:
            self._watch()
        await self.guard.app(self.scope, self.receive, self.send)

    async def _read_body(self) -> bytes | None:
        """Return the request's body, at most max_body_bytes (413 past them); None if the client went away."""
        limit = self.guard.body_bytes.get(self.scope["path"], self.guard.max_body_bytes)
        length = content_length(self.scope)
        if length is not None and length > limit:
            raise http_spec.body_too_large(limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise http_spec.body_too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def receive(self) -> Message:
        """Return the body (once) to the app, then ``http.disconnect`` once nothing more will be sent."""
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        if self.streams:
            return await self._receive_streaming()
        if not self._over:
            self._over_event = self._over_event or asyncio.Event()
            await self._over_event.wait()
        return {"type": "http.disconnect"}

    async def _receive_streaming(self) -> Message:
        """Return an event stream's client messages once its answer began; ``http.disconnect`` if it never will."""
        if self.state is _State.OPEN:
            self._decided = self._decided or asyncio.Event()
            await self._decided.wait()
        if self.state is _State.ANSWERING and not self._over:
            return await self._receive()  # the guard's listener is gone: the app is the only reader
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        """Send the app's message, unless the guard refused or the client went away first (then drop it)."""
        if self.state is _State.OPEN:
            self.state = _State.ANSWERING
            self._stop_watching()  # before the first message: a complete response reads as a disconnect
            self._decide()
        elif self.state is not _State.ANSWERING:
            return
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._end()
        await self._send(message)

    def _claim(self, state: _State) -> bool:
        """Take the request from the app for the guard (REFUSED) or note its client gone (GONE), if nobody answered."""
        if self.state is not _State.OPEN:
            return False
        self.state = state
        self._stop_watching()
        self._end()
        self._decide()
        return True

    def _decide(self) -> None:
        if self._decided is not None:
            self._decided.set()

    def _end(self) -> None:
        self._over = True
        if self._over_event is not None:
            self._over_event.set()

    def _due(self) -> None:
        """The watch delay passed: listen for the client once the body is read; the deadline is next."""
        if self._read:
            self._watch()
        else:
            self._watch_due = True
        self._timer = asyncio.get_running_loop().call_at(self._deadline, self._expire)

    def _expire(self) -> None:
        """The deadline passed: unless an answer began, refuse the request (504) and cancel its work."""
        if self._task is None or not self._claim(_State.REFUSED):
            return
        self._cut = True
        self._task.cancel()
        refusal = http_spec.timed_out(self.guard.timeout_ms)
        self._refusal = asyncio.get_running_loop().create_task(send_refusal(self._send, refusal, not self._read))
        log.warning("%s %s: no answer within %d ms: 504, its work cancelled", *self.named, self.guard.timeout_ms)
        self.guard.count(TIMED_OUT)

    def _gone(self) -> None:
        """The client went away: unless an answer began, cancel the request's work (nothing will be sent)."""
        if self._task is None or not self._claim(_State.GONE):
            return
        self._cut = True
        self._task.cancel()
        log.info("%s %s: the client went away before the answer: its work cancelled", *self.named)
        self.guard.count(CLIENT_GONE)

    def _watch(self) -> None:
        """Start listening for the client's disconnect (the body was read: nothing else can come)."""
        if self.state is _State.OPEN and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(_until_disconnect(self._receive, self._gone))

    def _stop_watching(self) -> None:
        """Stop listening for the client: cancelled at its await of receive, it consumed nothing."""
        if self._watcher is not None:
            self._watcher.cancel()

    @property
    def named(self) -> tuple[str, str]:
        """Return the request's method and path, for the log."""
        return self.scope["method"], self.scope["path"]


async def _until_disconnect(receive: Receive, on_gone: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    on_gone()


async def send_refusal(send: Send, error: http_spec.RequestError, close: bool) -> None:
    """Send the GraphQL-shaped refusal of error; close: end the connection after it (a body left unread)."""
    body, headers = http_spec.refusal(error)
    if close:
        headers["connection"] = "close"
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": raw})
    await send({"type": "http.response.body", "body": encode_json(body), "more_body": False})


def wants_event_stream(scope: MutableMapping[str, Any]) -> bool:
    """Return whether a request's Accept lists ``text/event-stream`` (GraphQL over SSE)."""
    for name, value in scope["headers"]:
        if name.lower() == b"accept":
            if any(part.split(b";", 1)[0].strip().lower() == b"text/event-stream" for part in value.split(b",")):
                return True
    return False


def head_bytes(scope: MutableMapping[str, Any]) -> int:
    """Return the bytes of a request's line and headers as they came (``GET /p?q HTTP/1.1``, ``name: value``)."""
    query = scope.get("query_string") or b""
    line = len(scope["method"]) + len(scope.get("raw_path") or scope["path"]) + len(query) + bool(query) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"]) + 2


def content_length(scope: MutableMapping[str, Any]) -> int | None:
    """Return a request's Content-Length, None if it has none (or not a number: the parser refuses those)."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


class RequestGuard:
    """ASGI wrapper bounding every HTTP request of the node's server (see the module's docstring)."""

    def __init__(
        self,
        app: App,
        limits: RequestLimits,
        body_bytes: Mapping[str, int] | None = None,
        count: Callable[[str], None] | None = None,
        signed: Mapping[str, Callable[[MutableMapping[str, Any]], str | None]] | None = None,
    ) -> None:
        """Args:
        body_bytes: per path, a body limit of its own (the peers' internal paths).
        signed: per path, the check of a request's signed headers (its refusal's reason, or None): a request
            it refuses gets 401 before its body is read (``app.security.peer_auth``: peers' sub-requests).
        """
        self.app = app
        self.signed = dict(signed or {})
        self.count = count or (lambda reason: None)  # each request cut short, by reason (the node's metrics)
        self.max_body_bytes = limits.max_body_bytes
        self.body_bytes = dict(body_bytes or {})  # per path, a limit of its own (the peers' internal endpoint)
        self.max_header_bytes = limits.max_header_bytes
        self.timeout_ms = limits.request_timeout_ms

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        """Serve one request within the limits (other scopes, lifespan and websockets, pass through)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = head_bytes(scope)
        if size > self.max_header_bytes:
            self.count(HEADERS_TOO_LARGE)
            await send_refusal(send, http_spec.headers_too_large(size, self.max_header_bytes), close=True)
            return
        check = self.signed.get(scope["path"])
        if check is not None and check(scope) is not None:  # nothing of an unsigned body is read
            self.count(UNSIGNED)
            await send_refusal(send, http_spec.RequestError(401, PEER_REFUSAL, UNAUTHENTICATED), close=True)
            return
        await _Guarded(self, scope, receive, send, wants_event_stream(scope)).run()
