"""app.request_guard: header and body limits, the deadline and the client's disconnect, message by message
against a stand-in of uvicorn's request cycle, then over real keep-alive connections to an in-process uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from iqgraph.app.http.request_guard import WATCH_AFTER_S, RequestGuard
from iqgraph.schema import Limits
from tests.support.servers import serve_in_thread

LIMITS = Limits(max_body_bytes=100, max_header_bytes=400, request_timeout_ms=300)


class Cycle:
    """uvicorn's RequestResponseCycle as an app sees it: receive and send, with its rules.

    receive answers the body's messages, then waits; it answers ``http.disconnect`` once the client is
    gone OR the response is complete (as uvicorn does). send refuses a second response or a message after
    the response completed, as uvicorn does; after a disconnect it drops messages silently.
    """

    def __init__(self, body: list[bytes] | None = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        chunks = body if body is not None else [b""]
        self.messages = [
            {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
        ]
        self.headers = headers or []
        self.received = 0
        self.sent: list[dict[str, Any]] = []
        self.disconnected = False
        self.complete = False
        self.event = asyncio.Event()
        self.event.set()

    @property
    def scope(self) -> dict[str, Any]:
        return {"type": "http", "method": "POST", "path": "/p", "raw_path": b"/p", "query_string": b"",
                "headers": self.headers}  # fmt: skip

    async def receive(self) -> dict[str, Any]:
        while not (self.disconnected or self.complete) and self.received >= len(self.messages):
            self.event.clear()
            await self.event.wait()
        if self.disconnected or self.complete:
            return {"type": "http.disconnect"}
        self.received += 1
        return self.messages[self.received - 1]

    async def send(self, message: dict[str, Any]) -> None:
        if self.disconnected:
            return
        assert not self.complete, f"a message after the response completed: {message}"
        started = any(m["type"] == "http.response.start" for m in self.sent)
        assert (message["type"] == "http.response.start") != started, f"a second response start: {message}"
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.complete = True
            self.event.set()

    def disconnect(self) -> None:
        self.disconnected = True
        self.event.set()

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)

    @property
    def body(self) -> Any:
        return orjson.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))

    def header(self, name: bytes) -> bytes | None:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return dict(start["headers"]).get(name)


class Recorder:
    """An app answering {"body": …} after delay seconds, noting what happened to it."""

    def __init__(self, delay: float = 0, after: float = 0, swallow: bool = False) -> None:
        self.delay, self.after, self.swallow = delay, after, swallow
        self.bodies: list[bytes] = []
        self.cancelled = False
        self.finished = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.bodies.append((await receive())["body"])
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            if not self.swallow:
                raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": orjson.dumps({"body": self.bodies[-1].decode()})})
        await asyncio.sleep(self.after)  # work after the response (uvicorn's receive now says disconnect)
        self.finished = True


def code(cycle: Cycle) -> str:
    return str(cycle.body["errors"][0]["extensions"]["code"])


async def test_a_body_within_the_limit_reaches_the_app_once() -> None:
    app, cycle = Recorder(), Cycle([b"x" * 60, b"y" * 40])
    await RequestGuard(app, LIMITS)(cycle.scope, cycle.receive, cycle.send)
    assert cycle.status == 200 and app.bodies == [b"x" * 60 + b"y" * 40]


async def test_the_app_runs_in_the_requests_own_task_and_a_cut_leaves_no_cancellation_behind() -> None:
    """No task per request: the app runs in the task uvicorn gave the request. The deadline cancels that task's
    work and counts its cancellation off, whether the app let it through or swallowed it."""
    tasks: list[asyncio.Task[Any] | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        tasks.append(asyncio.current_task())
        await Recorder()(scope, receive, send)

    cycle = Cycle([b"{}"])
    await RequestGuard(app, LIMITS)(cycle.scope, cycle.receive, cycle.send)
    assert cycle.status == 200 and tasks == [asyncio.current_task()]
    for swallow in (False, True):
        slow, cut = Recorder(delay=5, swallow=swallow), Cycle([b"{}"])
        await RequestGuard(slow, LIMITS)(cut.scope, cut.receive, cut.send)
        assert cut.status == 504 and slow.cancelled
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0.01)  # and nothing cancels this task later


async def test_a_content_length_over_the_limit_is_refused_unread() -> None:
    app, cycle = Recorder(), Cycle([b"x" * 500], [(b"content-length", b"500")])
    await RequestGuard(app, LIMITS)(cycle.scope, cycle.receive, cycle.send)
    assert cycle.status == 413 and code(cycle) == "LIMIT_EXCEEDED" and cycle.received == 0
    assert cycle.header(b"connection") == b"close" and app.bodies == []


async def test_a_chunked_body_is_cut_off_at_the_limit() -> None:
    app, cycle = Recorder(), Cycle([b"x" * 60] * 1000)
    await RequestGuard(app, LIMITS)(cycle.scope, cycle.receive, cycle.send)
    assert cycle.status == 413 and code(cycle) == "LIMIT_EXCEEDED" and cycle.received == 2
    assert cycle.header(b"connection") == b"close" and app.bodies == []


async def test_headers_over_the_limit_are_refused() -> None:
    app = Recorder()
    within = Cycle(headers=[(b"x-big", b"x" * 300)])
    await RequestGuard(app, LIMITS)(within.scope, within.receive, within.send)
    over = Cycle(headers=[(b"x-big", b"x" * 400)])
    await RequestGuard(app, LIMITS)(over.scope, over.receive, over.send)
    assert within.status == 200
    assert over.status == 431 and code(over) == "LIMIT_EXCEEDED" and over.header(b"connection") == b"close"


async def test_past_the_deadline_before_an_answer_is_504_and_the_work_cancelled() -> None:
    app, cycle = Recorder(delay=5, swallow=True), Cycle([b"{}"])  # it even tries to answer when cancelled
    started = time.monotonic()
    await RequestGuard(app, LIMITS)(cycle.scope, cycle.receive, cycle.send)
    assert 0.25 < time.monotonic() - started < 1
    assert cycle.status == 504 and code(cycle) == "TIMEOUT" and app.cancelled
    assert cycle.header(b"connection") is None  # the body was read: the connection stays usable
    assert len(cycle.sent) == 2  # its late answer was dropped


async def test_a_body_slower_than_the_deadline_is_504() -> None:
    app, cycle = Recorder(), Cycle([b"{"])
    cycle.messages[0]["more_body"] = True  # the rest never comes
    await RequestGuard(app, LIMITS)(cycle.scope, cycle.receive, cycle.send)
    assert cycle.status == 504 and code(cycle) == "TIMEOUT" and cycle.header(b"connection") == b"close"
    assert app.bodies == []


async def test_an_answer_begun_before_the_deadline_is_left_to_finish() -> None:
    app, cycle = Recorder(delay=0.2, after=0.3), Cycle([b"{}"])
    await RequestGuard(app, LIMITS)(cycle.scope, cycle.receive, cycle.send)
    assert cycle.status == 200 and app.finished and not app.cancelled


async def test_a_client_gone_before_the_answer_cancels_the_work_and_nothing_is_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, cycle = Recorder(delay=5, swallow=True), Cycle([b"{}"])
    guarded = asyncio.ensure_future(RequestGuard(app, Limits())(cycle.scope, cycle.receive, cycle.send))
    await asyncio.sleep(WATCH_AFTER_S + 0.1)
    with caplog.at_level(logging.INFO, logger="iqgraph.app.http.request_guard"):
        cycle.disconnect()
        await asyncio.wait_for(guarded, 1)
    assert app.cancelled and cycle.sent == []
    assert "the client went away before the answer" in caplog.text


async def test_a_complete_response_never_reads_as_a_client_gone() -> None:
    """uvicorn's receive says http.disconnect once the response is complete: the work after it goes on."""
    app, cycle = Recorder(delay=WATCH_AFTER_S + 0.1, after=0.2), Cycle([b"{}"])
    await RequestGuard(app, Limits())(cycle.scope, cycle.receive, cycle.send)
    assert cycle.status == 200 and app.finished and not app.cancelled


@pytest.mark.parametrize("at", [0.1, 0.2, 0.3, 0.31, 0.4])
async def test_the_deadline_and_the_answer_at_once_give_one_response(at: float) -> None:
    app, cycle = Recorder(delay=at), Cycle([b"{}"])
    await RequestGuard(app, LIMITS)(cycle.scope, cycle.receive, cycle.send)
    assert cycle.status in (200, 504) and cycle.complete  # Cycle.send fails on a second response


@pytest.mark.parametrize("at", [0.05, 0.15, 0.25])
async def test_a_disconnect_and_the_answer_at_once_give_at_most_one_response(at: float) -> None:
    app, cycle = Recorder(delay=0.15), Cycle([b"{}"])
    guarded = asyncio.ensure_future(RequestGuard(app, Limits())(cycle.scope, cycle.receive, cycle.send))
    await asyncio.sleep(at)
    cycle.disconnect()
    await asyncio.wait_for(guarded, 1)
    assert cycle.status in (None, 200)  # Cycle.send fails on a second response
    assert cycle.sent == [] if app.cancelled else app.finished


# -- over real connections: uvicorn in a thread, a keep-alive connection per client ---------------------------


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Answer {"id": the request's x-id, "port": the client's port} after the ?ms= in its query string."""
    if scope["type"] != "http":
        return
    body = (await receive())["body"]
    query = dict(p.split("=") for p in scope["query_string"].decode().split("&") if "=" in p)
    await asyncio.sleep(int(query.get("ms", 0)) / 1000)
    answer = {"id": dict(scope["headers"]).get(b"x-id", b"").decode(), "port": scope["client"][1], "len": len(body)}
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": orjson.dumps(answer)})


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    limits = Limits(max_body_bytes=1000, max_header_bytes=2000, request_timeout_ms=300)
    with serve_in_thread(RequestGuard(echo, limits), log_level="warning") as url:
        yield url


def _abandon(url: str, stop: threading.Event) -> None:
    """Keep sending requests that are slower than the watch delay and closing the connection midway."""
    host, port = url.removeprefix("http://").split(":")
    while not stop.is_set():
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(b"POST /?ms=250 HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            time.sleep(0.15)


def test_one_keep_alive_connection_answers_each_request_with_its_own_response(server: str) -> None:
    """The regression test of 'HTTP 294': fast, slow (504), refused (413, 431) and good requests on one
    connection, while other clients abandon requests: every response parses and is the right one."""
    stop = threading.Event()
    abandoning = [threading.Thread(target=_abandon, args=(server, stop), daemon=True) for _ in range(3)]
    for thread in abandoning:
        thread.start()
    seen: dict[int, int] = {}
    try:
        with httpx.Client(base_url=server, limits=httpx.Limits(max_connections=1)) as client:
            for i in range(300):
                kind = i % 50 - 45  # 0 to 4 close the run: 48 is refused 413, 49 431, both close the connection
                ms = {0: 150, 1: 280, 2: 400}.get(kind, 0)
                headers = {"x-id": str(i), **({"x-big": "y" * 3000} if kind == 4 else {})}
                body = b"x" * 2000 if kind == 3 else b"{}"
                response = client.post(f"/?ms={ms}", content=body, headers=headers)
                if kind in (3, 4):
                    assert response.status_code == (413 if kind == 3 else 431), response.text
                elif kind == 2 or (kind == 1 and response.status_code == 504):
                    assert response.json()["errors"][0]["extensions"]["code"] == "TIMEOUT", response.text
                else:
                    assert response.status_code == 200 and response.json()["id"] == str(i), response.text
                    port = response.json()["port"]
                    seen[port] = seen.get(port, 0) + 1
    finally:
        stop.set()
        for thread in abandoning:
            thread.join(5)
    assert len(seen) == 6 and min(seen.values()) >= 46, f"not kept alive between the refusals: {seen}"
