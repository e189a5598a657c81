"""Connection hygiene (``app.http.connections``): sockets that send headers a line at a time, or nothing, or idle
after a response, are closed on time while a legitimate client keeps being answered; one connection past the cap
gets a coded 503 and is closed. The node's own uvicorn config (``server_config``), on loopback, bounded: at most 160
sockets and a few seconds."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from iqgraph.app.http.connections import Hygiene, server_config
from iqgraph.app.http.server import bind_listener
from iqgraph.streaming.broker import free_port
from tests.support.servers import serve_in_thread

HEADER_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 1


async def _hello(_: object) -> JSONResponse:
    return JSONResponse({"hello": "world"})


APP = Starlette(routes=[Route("/", _hello)])


def _serve(hygiene: Hygiene) -> Iterator[tuple[str, int]]:
    config = server_config(APP, hygiene)  # what a node's listener runs with
    with serve_in_thread(APP, http=config.http, timeout_keep_alive=config.timeout_keep_alive) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


@pytest.fixture
def bounded() -> Iterator[tuple[Hygiene, tuple[str, int]]]:
    hygiene = Hygiene(header_timeout_s=HEADER_TIMEOUT_S, keep_alive_timeout_s=KEEP_ALIVE_S, max_connections=150)
    for address in _serve(hygiene):
        yield hygiene, address


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    sock.settimeout(0.05)
    return sock


def _closed(sock: socket.socket) -> bool:
    """Return whether the server closed sock (what it sent before, a 408, is read and dropped)."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_slow_and_idle_sockets_are_closed_while_a_client_is_served(bounded: tuple[Hygiene, tuple[str, int]]) -> None:
    hygiene, address = bounded
    idle = [_connect(address) for _ in range(50)]  # connected, never send a byte
    slow = [_connect(address) for _ in range(40)]  # a header line every 0.2 s, never the blank line
    kept = _connect(address)  # one request, then idle on its kept-alive connection
    kept.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    answered, stop = [], threading.Event()

    def client() -> None:
        with httpx.Client(base_url=f"http://{address[0]}:{address[1]}", timeout=5) as http:
            while not stop.is_set():
                answered.append(http.get("/").json() == {"hello": "world"})
                time.sleep(0.05)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    for sock in slow:
        sock.sendall(b"GET / HTTP/1.1\r\n")
    started = time.monotonic()
    try:
        while time.monotonic() - started < HEADER_TIMEOUT_S + 2:
            for i, sock in enumerate(slow):
                try:
                    sock.sendall(f"x-slow-{i}: {time.monotonic()}\r\n".encode())
                except OSError:
                    pass  # closed already
            time.sleep(0.2)
        assert all(_closed(sock) for sock in idle), "a socket that sent nothing is still open"
        assert all(_closed(sock) for sock in slow), "a socket sending its headers a line at a time is still open"
        assert _closed(kept), "an idle kept-alive connection is still open"
    finally:
        stop.set()
        thread.join(10)
        for sock in (*idle, *slow, kept):
            sock.close()
    assert len(answered) >= 10 and all(answered), "the legitimate client was not served throughout"
    assert hygiene.refused["request headers not received in time"] == 90


def test_a_late_head_gets_408_and_one_connection_past_the_cap_gets_503() -> None:
    hygiene = Hygiene(header_timeout_s=HEADER_TIMEOUT_S, keep_alive_timeout_s=KEEP_ALIVE_S, max_connections=20)
    for address in _serve(hygiene):
        held = [_connect(address) for _ in range(20)]
        try:
            time.sleep(0.2)  # the server has accepted them all
            extra = socket.create_connection(address, timeout=5)
            refusal = b""
            while chunk := extra.recv(65536):
                refusal += chunk
            extra.close()
            head, _, body = refusal.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503")
            assert orjson.loads(body)["errors"][0]["extensions"]["code"] == "LIMIT_EXCEEDED"
            held[0].sendall(b"GET / HTTP/1.1\r\nhost: x\r\n")  # a request begun, its head never finished
            held[0].settimeout(HEADER_TIMEOUT_S + 5)
            late = held[0].recv(65536)  # the deadline's answer, then the close
            assert late.startswith(b"HTTP/1.1 408") and b'"code":"TIMEOUT"' in late
            held[1].settimeout(HEADER_TIMEOUT_S + 5)
            assert held[1].recv(65536) == b""  # sent nothing: closed without an answer to a request never made
        finally:
            for sock in held:
                sock.close()
    assert hygiene.refused["too many connections"] == 1


def test_each_listener_caps_its_own_connections() -> None:
    """A node's two listeners (clients', peers') in one uvicorn, each bounded by the Hygiene of its port: a full
    peers' listener refuses the next peer while clients are still served, and the other way round."""
    clients, peers = (Hygiene(HEADER_TIMEOUT_S, KEEP_ALIVE_S, max_connections=8) for _ in range(2))
    sockets = [bind_listener("127.0.0.1", free_port()) for _ in range(2)]
    client_port, peer_port = (s.getsockname()[1] for s in sockets)
    server = uvicorn.Server(server_config(APP, clients, {peer_port: peers}, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        for full, other in (((("127.0.0.1", peer_port)), ("127.0.0.1", client_port)),
                            ((("127.0.0.1", client_port)), ("127.0.0.1", peer_port))):  # fmt: skip
            held = [_connect(full) for _ in range(8)]
            try:
                time.sleep(0.2)  # the server has accepted them all
                with socket.create_connection(full, timeout=5) as extra:
                    assert extra.recv(65536).startswith(b"HTTP/1.1 503")
                assert httpx.get(f"http://{other[0]}:{other[1]}/", timeout=5).json() == {"hello": "world"}
            finally:
                for sock in held:
                    sock.close()
            time.sleep(0.2)  # closed on the server's side too
    finally:
        server.should_exit = True
        thread.join(15)
        for sock in sockets:
            sock.close()
    assert peers.refused["too many connections"] == 1 and clients.refused["too many connections"] == 1
    assert not peers.held and not clients.held


class _Recording(asyncio.Transport):
    """A transport recording each write the protocol makes (one write is one send on a socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _stream(_: object) -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first"
        await asyncio.sleep(0.05)
        yield b"second"

    return StreamingResponse(chunks(), media_type="text/event-stream")


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"body": (await request.body()).decode()})


async def _writes_of(request: bytes, until: bytes) -> list[bytes]:
    """Return the writes of the node's HTTP protocol (uvicorn's, bounded) answering request, once until was written."""
    app = Starlette(routes=[Route("/", _hello, methods=["GET", "HEAD", "POST"]), Route("/stream", _stream),
                          Route("/echo", _echo, methods=["POST"])])  # fmt: skip
    config = server_config(app, Hygiene())
    config.load()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=uvicorn.server.ServerState(), app_state={}
    )
    transport = _Recording()
    protocol.connection_made(transport)
    protocol.data_received(request)
    deadline = time.monotonic() + 5
    while until not in b"".join(transport.writes) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    protocol.connection_lost(None)
    return transport.writes


async def test_a_response_goes_out_in_one_write_and_an_interim_or_streamed_head_at_once() -> None:
    """uvicorn writes a response's head and body apart (two sends, two segments): the node's protocol writes them
    together, unless the head must go first (100 Continue, an event stream's head) or there is no body (HEAD)."""
    [one] = await _writes_of(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n", b'{"hello":"world"}')
    assert one.startswith(b"HTTP/1.1 200 OK\r\n") and one.endswith(b'\r\n\r\n{"hello":"world"}')
    [head] = await _writes_of(b"HEAD / HTTP/1.1\r\nhost: a\r\n\r\n", b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 17" in head and head.endswith(b"\r\n\r\n")
    expect = b"POST /echo HTTP/1.1\r\nhost: a\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
    interim = await _writes_of(expect, b"HTTP/1.1 100 Continue")
    assert interim == [b"HTTP/1.1 100 Continue\r\n\r\n"]  # at once: the client waits for it to send its body
    streamed = await _writes_of(b"GET /stream HTTP/1.1\r\nhost: a\r\n\r\n", b"second")
    assert streamed[0].startswith(b"HTTP/1.1 200 OK\r\n") and streamed[0].endswith(b"\r\n\r\n")  # the head alone
    assert b"first" in streamed[1] and b"second" in b"".join(streamed[2:])
