"""A response's head and body in one write (the node's HTTP protocol, ``app.http.connections._HeadWithBody``) beside
uvicorn's two writes, on the same app and protocol otherwise, measured side by side with wrk.

Two uvicorn servers in processes of their own serve the same small JSON endpoint with the node's uvicorn config
(``server_config(app, Hygiene())``); in the second the protocol's cycles write through uvicorn's own transport,
as before the change. wrk (``--connections``, 2 threads) loads each for ``--duration`` seconds, alternating,
``--rounds`` times; each run records the server process's user and system CPU time per request
(``/proc/<pid>/stat``). Prints every run and the medians.

Usage: ``.venv/bin/python bench/response_writes.py [--duration S] [--rounds R]`` (wrk on PATH: ``make bench-query``
installs it).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iqgraph.streaming.broker import free_ports  # noqa: E402


def serve(port: int, apart: bool) -> None:
    """Serve the endpoint on port with the node's uvicorn config (apart: uvicorn's own two writes)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from iqgraph.app.http import connections

    async def lookup(_: object) -> JSONResponse:
        return JSONResponse({"key": "customer-0001", "value": 2805})

    if apart:  # the protocol's cycles keep uvicorn's transport: head and body written apart

        def on_headers_complete(self: connections._BoundedProtocol) -> None:
            self._disarm()
            self._begun = False
            HttpToolsProtocol.on_headers_complete(self)

        connections._BoundedProtocol.on_headers_complete = on_headers_complete  # type: ignore[method-assign]
    app = Starlette(routes=[Route("/lookup", lookup)])
    config = connections.server_config(app, connections.Hygiene())
    uvicorn.run(app, host="127.0.0.1", port=port, http=config.http, log_level="warning")


def wait_serving(process: subprocess.Popen[bytes], port: int, timeout: float = 60) -> None:
    """Wait until the server on port answers (RuntimeError if it ended or did not within timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server on port {port} ended with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the server on port {port} did not start within {timeout:g} s")


def cpu(pid: int) -> tuple[float, float]:
    """Return the user and system CPU seconds process pid has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def load(url: str, pid: int, duration: float, connections: int) -> dict[str, float]:
    """Run wrk against url; return req/s and the server's user and system µs per request."""
    before = cpu(pid)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{duration:g}s", url], capture_output=True, text=True, check=True
    ).stdout
    after = cpu(pid)
    found = re.search(r"(\d+) requests in", out)
    requests = int(found.group(1)) if found else 0
    if requests == 0 or "Non-2xx" in out:
        raise RuntimeError(f"wrk failed against {url}:\n{out}")
    return {
        "rps": requests / duration,
        "user_us": (after[0] - before[0]) / requests * 1e6,
        "sys_us": (after[1] - before[1]) / requests * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each server, alternating")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--apart", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.apart)
        return
    ports = free_ports(2)
    servers = {
        name: (subprocess.Popen([sys.executable, __file__, "--serve", str(port), *flags]), port)
        for (name, flags), port in zip((("one write", []), ("apart", ["--apart"])), ports, strict=True)
    }
    try:
        for process, port in servers.values():
            wait_serving(process, port)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        for _ in range(args.rounds):
            for name, (process, port) in servers.items():
                result = load(f"http://127.0.0.1:{port}/lookup", process.pid, args.duration, args.connections)
                runs[name].append(result)
                print(f"  {name:<9} {result['rps']:>9,.0f} req/s  user {result['user_us']:5.1f} µs"
                      f"  system {result['sys_us']:5.1f} µs per request", flush=True)  # fmt: skip
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(10)
    for name, results in runs.items():
        median = {k: statistics.median(r[k] for r in results) for k in ("rps", "user_us", "sys_us")}
        total = median["user_us"] + median["sys_us"]
        print(f"{name:<9} medians: {median['rps']:,.0f} req/s, user {median['user_us']:.1f} µs, "
              f"system {median['sys_us']:.1f} µs, total {total:.1f} µs per request")  # fmt: skip


if __name__ == "__main__":
    main()
