"""An ASGI app served by a real uvicorn in a thread of the test process, on loopback, with a deadline on every wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from iqgraph.streaming.broker import free_port


@contextmanager
def serve_in_thread(
    app: Any, *, host: str = "127.0.0.1", port: int | None = None, deadline_s: float = 30, **config: Any
) -> Iterator[str]:
    """Serve app with uvicorn in a daemon thread and yield its base URL (https when ``ssl_certfile`` is given).

    config: more ``uvicorn.Config`` options (log_level, default "error"; lifespan; ssl_certfile, ssl_keyfile ...).
    Fails with an AssertionError when the server has not started within deadline_s (or its thread ended before it
    did), and when it has not stopped within deadline_s of being asked to.
    """
    port = port or free_port()
    config.setdefault("log_level", "error")
    url = f"{'https' if config.get('ssl_certfile') else 'http'}://{host}:{port}"
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **config))
    thread = threading.Thread(target=server.run, name=f"uvicorn {url}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + deadline_s
        while not server.started:
            if not thread.is_alive():
                raise AssertionError(f"uvicorn for {url} ended before it started (its log says why)")
            if time.monotonic() > deadline:
                raise AssertionError(f"uvicorn for {url} did not start within {deadline_s} s")
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(deadline_s)
    if thread.is_alive():
        raise AssertionError(f"uvicorn for {url} did not stop within {deadline_s} s")


async def _healthz(request: Any) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"status": "alive", "peerUrl": str(request.base_url).rstrip("/")})


#: A stand-in peer's /healthz: its peer listener is itself (a node's is another port: app.http.server.peer_asgi).
def peer_healthz() -> Any:
    """Return the route telling a PeerClient that the stand-in serving it takes sub-requests at its own URL."""
    from starlette.routing import Route

    return Route("/healthz", _healthz, methods=["GET"])
