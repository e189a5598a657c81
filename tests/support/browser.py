"""Headless Chromium cut off from the net, driven over the Chrome DevTools Protocol, for the pages nodes serve.

Chromium reaches loopback only: a host resolver that resolves nothing and a dead SOCKS proxy for the rest
(tests/schema/test_graphiql.py shows a CDN script failing to load under these flags).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

CHROMIUM = "/usr/bin/chromium"
# Everything but loopback fails: no name resolves, and any proxied connection goes to the discard port.
OFFLINE = [
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--proxy-server=socks5://127.0.0.1:9",
    "--proxy-bypass-list=127.0.0.1",
]
BROWSER = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    *OFFLINE,
]


def require_chromium() -> str:
    """Return Chromium's path; skip without it only when not root (as root, `make test` installs it)."""
    if not os.path.exists(CHROMIUM):
        if os.geteuid() != 0:
            pytest.skip(f"{CHROMIUM} is absent and not root to install it: apt-get install -y chromium")
        pytest.fail(f"{CHROMIUM} is absent; install it with: apt-get update && apt-get install -y chromium")
    return CHROMIUM


@contextmanager
def browser_page(chromium: str, profile: Path) -> Iterator[DevTools]:
    """Run Chromium (offline, its profile in profile) and yield the DevTools of its first page."""
    browser = subprocess.Popen(
        [chromium, *BROWSER, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with DevTools.open(profile / "DevToolsActivePort") as page:
            yield page
    finally:
        browser.terminate()
        browser.wait(timeout=30)


class DevTools:
    """The Chrome DevTools Protocol over the websocket of Chromium's first page (just what the tests need).

    The events that arrive between command results are kept in ``events`` (method, params), in order.
    """

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.next_id = 0
        self.events: list[tuple[str, dict[str, Any]]] = []

    @classmethod
    @contextmanager
    def open(cls, port_file: Path, timeout_s: float = 60) -> Iterator[DevTools]:
        """Connect to the page of the Chromium that writes port_file once it listens."""
        deadline = time.monotonic() + timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as listing:  # noqa: S310
            pages = [t for t in json.load(listing) if t["type"] == "page"]
        with connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as socket:
            yield cls(socket)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result, keeping the events in between."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return dict(message["result"])
            if "method" in message:
                self.events.append((message["method"], message.get("params", {})))

    def evaluate(self, expression: str) -> Any:
        """Return the value of a JavaScript expression in the page (null while the page is still loading)."""
        result = self.call(
            "Runtime.evaluate",
            expression=f"(() => {{ try {{ return {expression}; }} catch {{ return null; }} }})()",
            returnByValue=True,
        )
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60) -> None:
        """Wait until a JavaScript expression is true in the page."""
        deadline = time.monotonic() + timeout_s
        while self.evaluate(expression) is not True:
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            time.sleep(0.2)
